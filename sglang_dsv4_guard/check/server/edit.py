"""Applying a fix's :class:`~sglang_dsv4_guard.fixes.Edit` s to one server's launch line.

The line is split as ``check`` splits it (``shlex``); a launcher prefix (``python -m
sglang.launch_server``, ``sglang serve``) is kept in front. Flags are read as the
installed release's parser reads them (:func:`lookup`): an option string or a unique
prefix of one (argparse's ``allow_abbrev``, which SGLang's parser keeps), ``--flag=value``,
and the flag's own ``nargs`` (one value; ``'?'`` takes the next token only when it is not
an option; ``'+'``/``'*'`` take every following token up to the next option; a count
takes that many). Setting a flag replaces its value at its first occurrence (later ones
removed) or appends it; removing a flag removes every occurrence and its value.
Environment edits set or unset one variable.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

from sglang_dsv4_guard.check.offline.parse import strip_launcher
from sglang_dsv4_guard.fixes import Edit
from sglang_dsv4_guard.host.flags import Flag, flag, flag_table

__all__ = ["apply_edits", "apply_env", "launcher_prefix", "lookup", "occurrences",
           "typed_flags"]

# argparse reads a token like this as a value, not an option (no SGLang option looks so).
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def launcher_prefix(argv: list[str]) -> int:
    """How many leading tokens of ``argv`` are the launcher (``check`` drops them)."""
    return len(argv) - len(strip_launcher("--line", argv)) if argv else 0


def lookup(option: str) -> Flag | None:
    """The flag ``option`` names for the release's parser: an exact option string, else the
    one option string it is a prefix of (``--tp`` for ``--tp-size``); ``None`` for no flag
    or an ambiguous prefix (argparse refuses it)."""
    exact = flag(option)
    if exact is not None or not option.startswith("--") or len(option) < 3:
        return exact
    matches = [name for name in flag_table() if name.startswith(option)]
    return flag(matches[0]) if len(matches) == 1 else None


def _is_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NEGATIVE.match(token)


def _values_after(argv: list[str], i: int, found: Flag) -> int:
    """How many tokens after ``argv[i]`` are ``found``'s values (its ``nargs``)."""
    nargs = found.nargs
    if not found.takes_value:
        return 0
    following = 0
    while i + 1 + following < len(argv) and not _is_option(argv[i + 1 + following]):
        following += 1
    if nargs in ("+", "*"):
        return following
    if isinstance(nargs, int):
        return min(nargs, following)
    return min(1, following)  # one value (None) or an optional one ('?')


def _span(argv: list[str], i: int) -> tuple[Flag | None, int]:
    """The flag at ``argv[i]`` (``None`` for a token that is not one) and its token count."""
    name, eq, _ = argv[i].partition("=")
    found = lookup(name) if name.startswith("--") else (
        flag(name) if name.startswith("-") else None)
    if found is None:
        return None, 1
    return found, 1 if eq else 1 + _values_after(argv, i, found)


def occurrences(argv: list[str], wanted: Flag) -> list[tuple[int, int]]:
    """``(index, token count)`` of every occurrence of ``wanted`` in ``argv``."""
    spans, i = [], 0
    while i < len(argv):
        found, width = _span(argv, i)
        if found is not None and found.field == wanted.field:
            spans.append((i, width))
        i += width
    return spans


def typed_flags(argv: list[str]) -> dict[str, tuple[Flag, str | None]]:
    """Every flag of ``argv`` (after any launcher) by field: its :class:`Flag` and the
    value as typed (``None`` for a switch); the last occurrence wins, as in argparse."""
    args = argv[launcher_prefix(argv):]
    typed: dict[str, tuple[Flag, str | None]] = {}
    i = 0
    while i < len(args):
        found, width = _span(args, i)
        if found is not None:
            _, eq, inline = args[i].partition("=")
            value = inline if eq else (shlex.join(args[i + 1:i + width]) if width > 1
                                       else None)
            typed[found.field] = (found, value)
        i += width
    return typed


def _apply(argv: list[str], edit: Edit) -> list[str]:
    wanted = lookup(edit.name)
    if wanted is None:
        raise ValueError(f"{edit.name} is not a flag of the installed release's parser")
    spans = occurrences(argv, wanted)
    several = wanted.nargs in ("+", "*") or (isinstance(wanted.nargs, int) and wanted.nargs > 1)
    values = [] if edit.value is None else (shlex.split(edit.value) if several
                                            else [edit.value])
    new = [] if edit.remove else [edit.name, *values]
    if not spans:
        return argv + new
    out = list(argv)
    for index, width in reversed(spans):
        out[index:index + width] = new if index == spans[0][0] else []
    return out


def apply_edits(line: str, edits: Iterable[Edit], server: str) -> str:
    """``line`` with the flag edits of ``edits`` for ``server`` applied, shell-quoted."""
    argv = shlex.split(line)
    head = launcher_prefix(argv)
    prefix, args = argv[:head], argv[head:]
    for edit in edits:
        if edit.server == server and not edit.env:
            args = _apply(args, edit)
    return shlex.join(prefix + args)


def apply_env(env: Mapping[str, str], edits: Iterable[Edit], server: str) -> dict[str, str]:
    """``env`` with the environment edits of ``edits`` for ``server`` applied."""
    out = dict(env)
    for edit in edits:
        if edit.server == server and edit.env:
            if edit.remove:
                out.pop(edit.name, None)
            else:
                out[edit.name] = edit.value or ""
    return out
