"""Environment variables as the installed SGLang reads them (``sglang/srt/environ.py``).

One home for what a server's ``NAME=value`` means to the release (its ``EnvField`` parse,
or the default when the parse refuses it) and for the edit that gives another server the
same reading. ``check`` reads launch lines' environments through it; the run-time
snapshots read the live process's.
"""

from __future__ import annotations

import importlib
from typing import Any

from sglang_dsv4_guard.fixes import Edit
from sglang_dsv4_guard.host.targets import ENVIRON_MODULE

__all__ = ["env_copy", "env_reading"]


def _accepted(field: Any) -> str:
    """The spellings the field's own ``parse`` compares with (the string tuples its code
    holds: ``EnvBool.parse``'s ``["true", "1", "yes", "y"]`` ...), '' when it holds none."""
    code = getattr(getattr(type(field), "parse", None), "__code__", None)
    groups = [", ".join(c) for c in (code.co_consts if code is not None else ())
              if isinstance(c, tuple) and c and all(isinstance(x, str) for x in c)]
    return f"; it accepts {' | '.join(groups)}" if groups else ""


def env_reading(name: str, value: str | None) -> tuple[Any, str | None]:
    """What the release reads for ``name=value`` (unset: its default) and, when SGLang's
    own parse refuses the value, why: sglang/srt/environ.py ``EnvField.get`` catches the
    field's ``parse`` ``ValueError``, warns and returns the default (every release). A
    name SGLang does not declare is read as typed."""
    envs = importlib.import_module(ENVIRON_MODULE)  # unscanned: SGLang's environ
    field = vars(envs.Envs).get(name)
    if field is None or not hasattr(field, "parse"):
        return value, None
    default = field.default() if callable(field.default) else field.default
    if value is None:
        return default, None
    try:
        return field.parse(value), None
    except ValueError as exc:
        return default, (f"SGLang's {type(field).__name__} refuses {name}={value} ({exc}): "
                         f"it warns and reads {default} (the default){_accepted(field)}")


def env_copy(role: str, name: str, value: str | None) -> Edit:
    """The edit giving ``role`` what SGLang reads for ``name=value``: the value itself,
    or unset when SGLang refuses it (it then reads its default, as unset does) — never a
    value SGLang refuses."""
    if value is None or env_reading(name, value)[1] is not None:
        return Edit(role, name, remove=True, env=True)
    return Edit(role, name, value, env=True)
