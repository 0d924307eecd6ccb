"""The installed release's flag table, as its own parser defines it.

``ServerArgs.add_cli_args(parser)`` is the release's table of launch flags. A fix may
name a flag only if this table has it (:func:`accepts`); ``check --fix`` edits a line
with the arity and choices it gives (:func:`flag`). The table is built once per
process, on first use (a failure path or a ``check`` run, never at import).

The table is an aid to the fixes, never to the checks: when it cannot be built (the
release's ``add_cli_args`` raising in this process), :func:`accepts` and
:func:`flag_for_field` answer "no such flag" with one debug line, so only the flag edits
are lost and every finding is still reported.
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from sglang_dsv4_guard.fixes import Edit
from sglang_dsv4_guard.host.targets import SERVER_ARGS_MODULE
from sglang_dsv4_guard.log import LOGGER_NAME

__all__ = ["Flag", "accepts", "flag", "flag_edit", "flag_for_field", "flag_table", "refusal",
           "vetted"]

logger = logging.getLogger(LOGGER_NAME)
_NOTED: list[bool] = []  # the table's failure was logged (once per process)


@dataclass(frozen=True)
class Flag:
    """One launch flag: its option strings, the ServerArgs field it sets, its arity."""

    option: str  # the first ``--long`` spelling
    options: tuple[str, ...]
    field: str
    takes_value: bool
    choices: tuple[str, ...] | None
    nargs: int | str | None = None  # argparse's: None (one value), '?', '+', '*', or a count


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


def _flag(action: argparse.Action) -> Flag | None:
    longs = tuple(o for o in action.option_strings if o.startswith("--"))
    if not longs:
        return None
    choices = tuple(str(c) for c in action.choices) if action.choices is not None else None
    return Flag(longs[0], tuple(action.option_strings), action.dest, action.nargs != 0,
                choices, action.nargs)


@functools.lru_cache(maxsize=1)
def flag_table() -> Mapping[str, Flag]:
    """Every option string of the installed release's parser -> its :class:`Flag`."""
    import importlib  # deferred: SGLang's server_args, only when a table is needed

    server_args = importlib.import_module(SERVER_ARGS_MODULE)  # unscanned: host/targets' name
    parser = _RaisingParser(add_help=False)
    server_args.ServerArgs.add_cli_args(parser)
    table: dict[str, Flag] = {}
    for action in parser._actions:
        found = _flag(action)
        if found is not None:
            table.update(dict.fromkeys(found.options, found))
    return table


def flag(option: str) -> Flag | None:
    """The flag spelled ``option`` in the installed release, or ``None``."""
    return flag_table().get(option)


def _table_or_empty() -> Mapping[str, Flag]:
    """The flag table, or an empty one (with a debug line) when it cannot be built."""
    try:
        return flag_table()
    except Exception as exc:  # SGLang's add_cli_args raising: no flag is vetted, none named
        if not _NOTED:
            _NOTED.append(True)
            logger.debug("sglang-dsv4-guard: the release's flag table could not be built "
                         "(ServerArgs.add_cli_args: %s: %s); fixes name no flag",
                         type(exc).__name__, exc)
        return {}


def accepts(option: str) -> bool:
    """Whether the installed release's parser has ``option`` (``False`` without a table)."""
    return option in _table_or_empty()


def flag_for_field(field: str) -> Flag | None:
    """The flag that sets ServerArgs field ``field`` in the installed release, or ``None``
    (also without a table)."""
    for found in _table_or_empty().values():
        if found.field == field:
            return found
    return None


def flag_edit(role: str, field: str, value: object) -> Edit | None:
    """``role``'s edit setting ServerArgs field ``field`` to ``value`` (``None``: remove
    the flag), spelled as the installed release spells it; ``None`` when it has no flag."""
    found = flag_for_field(field)
    if found is None:
        return None
    return Edit(role, found.option, None if value is None else str(value),
                remove=value is None)


def refusal(edit: Edit) -> str | None:
    """Why the installed release's parser refuses ``edit``, or ``None`` when it takes it
    (a variable always passes): an unknown flag, a value for a switch, no value for a
    flag that takes one, or a value outside the flag's choices."""
    if edit.env:
        return None
    found = _table_or_empty().get(edit.name)
    if found is None:
        return f"the installed release's parser has no {edit.name}"
    if edit.remove:
        return None
    if not found.takes_value and edit.value is not None:
        return f"{edit.name} takes no value (got {edit.value!r})"
    if found.takes_value and edit.value is None:
        return f"{edit.name} takes a value (none given)"
    if found.choices is not None and edit.value is not None and edit.value not in found.choices:
        return f"{edit.name} accepts {', '.join(found.choices)} (got {edit.value!r})"
    return None


def vetted(*candidates: Edit, origin: str = "fix") -> tuple[Edit, ...]:
    """``candidates`` the installed release's parser accepts (:func:`refusal`); each one
    dropped is said in a debug line. Built-in fixes and plug-ins' go through this one."""
    kept = []
    for edit in candidates:
        why = refusal(edit)
        if why is None:
            kept.append(edit)
        else:
            logger.debug("sglang-dsv4-guard: %s edit %s dropped: %s", origin,
                         edit.describe(), why)
    return tuple(kept)
