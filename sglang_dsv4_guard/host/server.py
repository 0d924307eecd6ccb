"""This process' own resolved server arguments, when SGLang has published them.

In a scheduler SGLang publishes the process-wide ``ServerArgs`` in its runtime context
(:data:`~sglang_dsv4_guard.host.targets.RUNTIME_CONTEXT`) before it builds any pool, so a
runtime fix can quote this server's current value of a flag it names. Read only: the
module is read if SGLang imported it (the guard never imports it for this), and an unset
context (a test, a script) or a field the release lacks gives ``None``: say nothing.
"""

from __future__ import annotations

import sys

from sglang_dsv4_guard.host.targets import RUNTIME_CONTEXT, SERVER_ARGS_ACCESSOR

__all__ = ["server_args", "server_value"]


def server_args() -> object | None:
    """The published ``ServerArgs`` of this process, or ``None`` when there is none."""
    module = sys.modules.get(RUNTIME_CONTEXT)
    accessor = getattr(module, SERVER_ARGS_ACCESSOR, None)
    if not callable(accessor):
        return None
    try:
        return accessor()  # type: ignore[no-any-return]
    except Exception:  # SGLang: ValueError("Global server args is not set yet!")
        return None


def server_value(field: str) -> object | None:
    """``ServerArgs.<field>`` of this process, or ``None`` (unpublished, or no such field)."""
    args = server_args()
    if args is None:
        return None
    try:
        return getattr(args, field, None)
    except Exception:  # a property of SGLang's that raises: nothing to quote
        return None
