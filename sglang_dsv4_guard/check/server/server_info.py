"""A running server's ``/get_server_info`` answer turned into the launch line ``check`` reads.

The answer holds the server's resolved arguments (``dataclasses.asdict(server_args)`` up
to 0.5.18, ``ServerArgs.resolved_dict()`` from 0.5.19) next to what the server adds
(its scheduler's state, ``version``, ``launch_command`` ...). Each field the installed
release's parser has a flag for becomes that flag with the value (:func:`info_line`),
read by the release's own flag table: a switch typed when it is on (``--no-X`` for a
``BooleanOptionalAction`` that is off), a list as the flag's values, a mapping or a
JSON-typed value as JSON, anything else as ``--flag=value``. A value equal to the
parser's default is left out: the parser gives it without the flag.

Every flag is proven by the release's parser: the line is parsed back and each field
must read as the answer has it; a flag the parser refuses or reads otherwise is left
out and said (``unreadable``). Fields the parser has no flag for (and deprecated
spellings, whose field another flag gives) are dropped and listed (``dropped``).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_dsv4_guard.check.offline.parse import CheckInputError, server_parser

__all__ = ["InfoLine", "as_launch_lines", "checked_info", "info_line", "info_notes", "relabeled"]

# The most field names one unknowns line lists (the rest are counted).
_LISTED = 40
# Value types the parser reads from JSON text (SGLang's json.loads, json_list_type, the
# CUDA-graph config's parser); any mapping is typed as JSON too.
_JSON_TYPES = ("loads", "json_list_type", "parse_cuda_graph_config_arg")


@dataclass(frozen=True)
class InfoLine:
    """The launch line a server-info answer stands for, and what it leaves out."""

    argv: tuple[str, ...]
    # Fields of the answer the release's parser has no flag for, in the answer's order.
    dropped: tuple[str, ...]
    # Fields with a flag whose value the flag cannot give: "name (why)".
    unreadable: tuple[str, ...]
    # The running server's SGLang version, as the answer states it (None: not stated).
    version: str | None


def _plain(value: Any) -> Any:
    """``value`` as JSON carries it (tuples as lists), for comparing."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def _same(a: Any, b: Any) -> bool:
    a, b = _plain(a), _plain(b)
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, int | float) and isinstance(b, int | float)
                and not isinstance(a, bool) and not isinstance(b, bool)
                and math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0))
    return bool(a == b)


def _text(value: Any, action: argparse.Action) -> str:
    """One value as the flag's text."""
    kind = getattr(action.type, "__name__", "")
    if isinstance(value, dict | list) or kind in _JSON_TYPES:
        return json.dumps(value)
    return str(value)


def _tokens(action: argparse.Action, value: Any) -> list[str] | str:
    """The tokens typing ``value`` with ``action``'s flag, or why none does."""
    option = action.option_strings[0]
    if action.nargs == 0:
        if isinstance(action, argparse.BooleanOptionalAction):
            if value is None:
                return "None, which the switch cannot type"
            return [option if value else action.option_strings[1]]
        if value == action.const:
            return [option]
        return f"{value!r}, and the switch {option} types only {action.const!r}"
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        if not isinstance(value, list | tuple):
            return f"{type(value).__name__} {value!r}, and {option} takes a list"
        if not value and action.nargs != "*":
            return f"an empty list, and {option} takes one value or more"
        return [option, *(_text(item, action) for item in value)]
    if value is None:
        return "None, which no value of the flag types"
    return [f"{option}={_text(value, action)}"]


def _reads_back(parser: argparse.ArgumentParser, base: Sequence[str], tokens: Sequence[str],
                dest: str, value: Any) -> str | None:
    """``None`` when the release's parser reads ``tokens`` (after ``base``, the flags it
    requires) into ``dest`` as ``value``, else why not."""
    try:
        namespace = parser.parse_args([*base, *tokens])
    except Exception as exc:  # the release's parser refuses the value (its own words)
        return f"the release's parser refuses {' '.join(tokens)[:120]} ({str(exc)[:300]})"
    read = getattr(namespace, dest, None)
    if not _same(read, value):
        return f"the release's parser reads {' '.join(tokens)[:120]} as {read!r:.200}"
    return None


def info_line(info: Mapping[str, Any], parser: argparse.ArgumentParser | None = None
              ) -> InfoLine:
    """The launch line ``info`` (a ``/get_server_info`` answer) stands for, read with the
    installed release's flag table (``parser``; the release's own by default)."""
    parser = parser or server_parser()
    actions: dict[str, argparse.Action] = {}
    deprecated: set[str] = set()
    for action in parser._actions:
        if not action.option_strings or action.dest == argparse.SUPPRESS:
            continue
        if type(action).__name__.startswith("Deprecated"):
            deprecated.add(action.dest)
            continue
        actions.setdefault(action.dest, action)
    argv: list[str] = []
    dropped: list[str] = []
    unreadable: list[str] = []
    base: list[str] = []  # the flags the parser requires, read back with every other one
    for action in actions.values():
        tokens = _tokens(action, info.get(action.dest)) if action.required else []
        base += tokens if isinstance(tokens, list) else []
    for name, value in info.items():
        flag = actions.get(name)
        if flag is None:
            dropped.append(name + (" (a deprecated spelling)" if name in deprecated else ""))
            continue
        if _same(value, parser.get_default(name)):
            continue  # the parser gives it without the flag
        tokens = _tokens(flag, value)
        why = tokens if isinstance(tokens, str) else _reads_back(parser, base, tokens, name, value)
        if why is not None:
            unreadable.append(f"{name} ({why})")
            continue
        argv += tokens
    version = info.get("version")
    return InfoLine(tuple(argv), tuple(dropped), tuple(unreadable),
                    None if version is None else str(version))


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


def info_notes(role: str, source: str, line: InfoLine, release: str) -> list[str]:
    """The ``unknowns`` lines of a server read from its server-info answer: what it is
    read as, the fields dropped, the values no flag gives, and a release that differs."""
    notes = [f"{role}: read from its running server's resolved arguments ({source}), each "
             "as the flag the installed release's parser has for it; its environment "
             f"(SGLANG_* variables) is not in that answer: --{role}-env gives it"]
    if line.dropped:
        notes.append(f"{role}: {len(line.dropped)} field(s) of {source} have no flag in the "
                     f"installed release's parser and were not read: {_listed(line.dropped)}")
    if line.unreadable:
        notes.append(f"{role}: {len(line.unreadable)} value(s) of {source} were not typed, "
                     f"as no flag gives them: {'; '.join(line.unreadable[:_LISTED])}")
    if line.version is not None and line.version != release:
        notes.append(f"{role}: the running server is SGLang {line.version}, and this check "
                     f"read its arguments and ran its conditions with the installed "
                     f"release, {release}")
    return notes


def checked_info(option: str, info: Any) -> Mapping[str, Any]:
    """``info`` when it looks like a server-info answer (a JSON object with a model path),
    else :class:`CheckInputError` naming ``option``."""
    if not isinstance(info, dict):
        raise CheckInputError(option, f"expected a JSON object (SGLang's /get_server_info "
                                      f"answer), got {type(info).__name__}")
    if not isinstance(info.get("model_path"), str):
        raise CheckInputError(option, "not a /get_server_info answer: it has no model_path "
                                      f"(its fields: {_listed(sorted(map(str, info)))})")
    return info


def as_launch_lines(request: Mapping[str, Any], release: str) -> tuple[dict[str, Any], list[str]]:
    """``request`` with each server given by its server-info answer
    (``prefill_server_info``/``decode_server_info``) given by the launch line it stands
    for, and the ``unknowns`` lines saying so (``release``: the installed SGLang's
    version). A value that is no server-info answer raises :class:`CheckInputError`
    naming where it came from (``live_sources``)."""
    out = dict(request)
    notes: list[str] = []
    sources = request.get("live_sources") or {}
    for role in ("prefill", "decode"):
        info = out.pop(f"{role}_server_info", None)
        if info is None:
            continue
        source = str(sources.get(role) or f"--{role}-server-info")
        line = info_line(checked_info(source, info))
        out[role] = shlex.join(line.argv)
        notes += info_notes(role, source, line, release)
    return out, notes


def relabeled(error: str, request: Mapping[str, Any]) -> str:
    """``error`` naming ``--prefill``/``--decode``, for a server given by a live option,
    naming that option and its value instead (the line is the one its answer stands
    for), with how to give a model path that is not on this machine."""
    for role, source in (request.get("live_sources") or {}).items():
        head = f"--{role}: "
        if error.startswith(head):
            error = f"{source} (the {role}'s resolved arguments as a launch line): " \
                    f"{error[len(head):]}"
            if "no config.json in" in error:
                error += ("; the running server's model path is read on this machine: "
                          "--model-path-map PATH=DIR names the local directory with its "
                          "config.json")
    return error
