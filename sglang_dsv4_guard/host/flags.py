"""The installed release's flag table, as its own parser defines it.

``ServerArgs.add_cli_args(parser)`` is the release's table of launch flags. A fix may
name a flag only if this table has it (:func:`accepts`); ``check --fix`` edits a line
with the arity and choices it gives (:func:`flag`). The table is built once per
process, on first use (a failure path or a ``check`` run, never at import).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping
from dataclasses import dataclass

from sglang_dsv4_guard.host.targets import SERVER_ARGS_MODULE

__all__ = ["Flag", "accepts", "flag", "flag_for_field", "flag_table"]


@dataclass(frozen=True)
class Flag:
    """One launch flag: its option strings, the ServerArgs field it sets, its arity."""

    option: str  # the first ``--long`` spelling
    options: tuple[str, ...]
    field: str
    takes_value: bool
    choices: tuple[str, ...] | None
    nargs: int | str | None = None  # argparse's: None (one value), '?', '+', '*', or a count


class _Quiet(argparse.ArgumentParser):
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
    parser = _Quiet(add_help=False)
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


def accepts(option: str) -> bool:
    """Whether the installed release's parser has ``option``."""
    return option in flag_table()


def flag_for_field(field: str) -> Flag | None:
    """The flag that sets ServerArgs field ``field`` in the installed release, or ``None``."""
    for found in flag_table().values():
        if found.field == field:
            return found
    return None
