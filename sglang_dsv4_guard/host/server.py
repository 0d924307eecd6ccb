"""This process' resolved server arguments, when SGLang has published them.

In a scheduler SGLang publishes the process-wide ``ServerArgs`` in its runtime context
(:data:`~sglang_dsv4_guard.host.targets.RUNTIME_CONTEXT`) before it builds any pool, so a
runtime fix can quote this server's current value of a flag it names. The value quoted is
the one in effect: from the resolved namespace bags
(:data:`~sglang_dsv4_guard.host.targets.RESOLVED_BAG_ACCESSORS`, ``get_schedule()`` ...)
where the release has them, since from 0.5.20 ``get_server_args()`` is the operator's raw
input (SGLang's retired ``get_global_server_args`` says so); only a release without the
bags (0.5.16, whose published ``ServerArgs`` is resolved in place) is read through
``get_server_args()``. A field no bag holds is not quoted. Read only: the module is read
if SGLang imported it (the guard never imports it for this); an unset context (a test, a
script) or a field the release lacks gives ``None``: say nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import ModuleType

from sglang_dsv4_guard.host.targets import (
    RESOLVED_BAG_ACCESSORS,
    RUNTIME_CONTEXT,
    SERVER_ARGS_ACCESSOR,
)

__all__ = ["server_args", "server_value"]

_MISSING = object()


def _call(module: ModuleType | None, name: str) -> object | None:
    accessor = getattr(module, name, None)
    if not callable(accessor):
        return None
    try:
        return accessor()  # type: ignore[no-any-return]
    except Exception:  # SGLang: ValueError("... not set yet" / "not published")
        return None


def server_args() -> object | None:
    """The published ``ServerArgs`` of this process, or ``None`` when there is none."""
    return _call(sys.modules.get(RUNTIME_CONTEXT), SERVER_ARGS_ACCESSOR)


def _bags(bag: object, depth: int = 0) -> Iterator[object]:
    """``bag`` and its sub-bags (real instance attributes of SGLang's ``_ConfigBag``)."""
    yield bag
    if depth > 4:
        return
    for value in vars(bag).values():
        if type(value) is type(bag):
            yield from _bags(value, depth + 1)


def _resolved(module: ModuleType, field: str) -> object:
    """``field`` from the first published bag holding it, or ``_MISSING``."""
    for name in RESOLVED_BAG_ACCESSORS:
        top = _call(module, name)
        if top is None:
            continue
        for bag in _bags(top):
            if field in bag:  # type: ignore[operator]
                return getattr(bag, field)
    return _MISSING


def server_value(field: str) -> object | None:
    """The value of ``ServerArgs.<field>`` in effect in this process, or ``None``
    (unpublished, no such field, or a release whose bags do not hold it)."""
    module = sys.modules.get(RUNTIME_CONTEXT)
    if module is None:
        return None
    try:
        if any(callable(getattr(module, n, None)) for n in RESOLVED_BAG_ACCESSORS):
            value = _resolved(module, field)
            return None if value is _MISSING else value
        args = server_args()
        return None if args is None else getattr(args, field, None)
    except Exception:  # a bag or property of SGLang's that raises: nothing to quote
        return None
