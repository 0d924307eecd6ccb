"""A server's flags the release's resolution refuses (DSV4G026): the finding, and its
fixes, flag edits found by re-running the release's resolution.

SGLang's refusal names what it wants: an option string (``--page-size``), a ServerArgs
field (``cfg.speculative_num_steps``, in the condition of a bare ``assert``), or the
flag's words with a value (``topk == 1``, ``Only EAGLE and DSPARK speculative
algorithms``). Each named flag gives candidates: the values the message gives it, the
other server's value, for a whole-number flag given none the release's own choice then
``1``, and removing it when the line sets it (a switch is never turned on, but one the
line types may be removed; a removal takes the flags that depend on the removed one with
it, :func:`~.cost.with_dependents`); a flag is also named by the value the line gives it
(``mxfp8 is not supported``); a variable of the server's environment the
message names is unset. Each candidate line is resolved by the release (the same
``parse_launch`` as ``check``); a candidate refused with a new message extends with that
message's candidates (breadth first, at most :data:`MAX_DEPTH` edits), and at most
:data:`MAX_RESOLUTIONS` resolutions are run per refusal (the release-choice resolutions
of a count included). Only lines the release accepts become fixes.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sglang_dsv4_guard.check.fixing.cost import price, with_dependents
from sglang_dsv4_guard.check.offline.parse import CheckInputError, LaunchArgs, parse_launch
from sglang_dsv4_guard.check.offline.probes import Device
from sglang_dsv4_guard.check.server.edit import apply_edits, apply_env, typed_flags
from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import STOPS_AT_START, Finding, Observation, Severity
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.flags import Flag, flag, flag_for_field, flag_table

__all__ = ["CODE", "MAX_DEPTH", "MAX_RESOLUTIONS", "Search", "refusal_finding", "refusal_fixes"]

CODE = "DSV4G026"

MAX_RESOLUTIONS = 24
MAX_DEPTH = 3
_MAX_FIXES = 3
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_OPTION = re.compile(r"--[a-z][a-z0-9-]*")
# What makes the line a prefill or decode server of this pair: never edited by a fix.
_NEVER_EDITED = ("disaggregation_mode",)


def _field_type(field: str) -> str:
    """The declared type of ServerArgs field ``field`` (``Optional[int]``), its
    ``Annotated`` help text left out; ``""`` when not declared."""
    from sglang.srt.server_args import ServerArgs

    for cls in ServerArgs.__mro__:
        declared = inspect.get_annotations(cls).get(field)
        if declared is None:
            continue
        if isinstance(declared, str):  # postponed annotations (older releases)
            return declared.split(",")[0] if declared.startswith("Annotated") else declared
        if getattr(declared, "__metadata__", None) is not None:
            return str(typing.get_args(declared)[0])
        return str(declared)
    return ""


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") and len(word) > 4 else word


def named_flags(message: str, typed: Mapping[str, tuple[Flag, str | None]] | None = None
                ) -> list[Flag]:
    """The flags ``message`` names: by option string, by ServerArgs field, by the words
    of its option (its last word and at least half of them), in the release's parser, or
    by the value the line gives it (``mxfp8 is not supported`` names ``--kv-cache-dtype``
    on a line typed with ``--kv-cache-dtype mxfp8``); each once, in the order found."""
    words = [_singular(w.lower()) for w in _WORD.findall(message)]
    found: dict[str, Flag] = {}  # by field, the first found
    named = [flag(option) for option in _OPTION.findall(message)]
    named += [flag_for_field(word) for word in _WORD.findall(message) if "_" in word]
    for item in named:
        if item is not None:
            found.setdefault(item.field, item)
    for candidate in {f.field: f for f in flag_table().values()}.values():
        parts = candidate.option[2:].split("-")
        if candidate.field in found or len(parts[-1]) < 4 or parts[-1] not in words:
            continue
        if 2 * sum(part in words for part in parts) > len(parts):
            found[candidate.field] = candidate
    exact = set(_WORD.findall(message))
    for field, (typed_flag, value) in (typed or {}).items():
        if value is not None and len(value) >= 3 and value in exact:
            found.setdefault(field, typed_flag)
    return list(found.values())


# The counts the release's speculative auto-choice sets, in the order it returns them.
_AUTO_COUNTS = ("speculative_num_steps", "speculative_eagle_topk",
                "speculative_num_draft_tokens")


def _architecture(line: str) -> str | None:
    path = typed_flags(shlex.split(line)).get("model_path", (None, None))[1]
    try:
        with open(os.path.join(str(path), "config.json"), encoding="utf-8") as handle:
            found = (json.load(handle).get("architectures") or [None])[0]
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return str(found) if found else None


class _Exhausted(Exception):
    """The search's resolution budget ran out."""


class _Counted:
    """``parse_launch`` (as ``gpu``, the server's named GPU) counted: at most
    :data:`MAX_RESOLUTIONS` calls, then :class:`_Exhausted`."""

    def __init__(self, gpu: Device | None = None) -> None:
        self.runs, self.gpu = 0, gpu

    def __call__(self, role: str, line: str, env: Mapping[str, str]) -> LaunchArgs:
        if self.runs >= MAX_RESOLUTIONS:
            raise _Exhausted
        self.runs += 1
        return parse_launch(role, line, env, self.gpu)


def release_choice(role: str, line: str, env: Mapping[str, str], named: Flag,
                   resolve: Callable[[str, str, Mapping[str, str]], LaunchArgs] | None = None
                   ) -> str | None:
    """The value the release's resolution chooses for ``named`` when it is not typed: the
    resolved value of ``line`` without it, when the release accepts that line; else, for
    a speculative count, what the release's own auto-choice of speculative parameters
    (``_auto_choose_speculative_params``, 0.5.16 to 0.5.23) gives this model and algorithm
    (DeepSeek-V4 refuses EAGLE before it runs, so its own resolution never reaches it)."""
    without = apply_edits(line, [Edit(role, named.option, remove=True)], role)
    try:
        side = (resolve or parse_launch)(role, without, env)
    except CheckInputError:
        return None
    if side.resolution_error is None and side.get(named.field) is not None:
        return str(side.get(named.field))
    algorithm = typed_flags(shlex.split(line)).get("speculative_algorithm", (None, None))[1]
    if named.field not in _AUTO_COUNTS or algorithm is None:
        return None
    try:
        # deferred: SGLang's resolution helper, read only for a refused speculative line
        from sglang.srt.arg_groups.speculative_hook import _auto_choose_speculative_params

        chosen = _auto_choose_speculative_params(
            types.SimpleNamespace(speculative_algorithm=algorithm), _architecture(line) or "")
        return str(int(chosen[_AUTO_COUNTS.index(named.field)]))
    except Exception:  # an older or changed helper: no release choice, the search goes on
        return None


def _values(message: str, named: Flag, typed: Mapping[str, tuple[Flag, str | None]],
            other: Mapping[str, tuple[Flag, str | None]], choice: str | None = None
            ) -> list[str]:
    """The values to try for ``named``: what the message gives it, the other server's,
    and for a count given none, the release's own choice (:func:`release_choice`) then 1."""
    last = named.option[2:].split("-")[-1]
    values = re.findall(rf"\b{re.escape(last)}s?\s*(?:==|=|to|must be)\s*([\w.-]+)", message,
                        re.IGNORECASE)
    kind = _field_type(named.field)
    if "str" in kind and named.takes_value:
        values += [w for w in _WORD.findall(message) if len(w) >= 3 and w.isupper()]
    if named.field in other and other[named.field][1] is not None:
        values.append(str(other[named.field][1]))
    if not values and "int" in kind and named.takes_value:
        values += [v for v in (choice, "1") if v is not None]  # the release's, the least
    current = typed.get(named.field, (named, None))[1]
    return list(dict.fromkeys(v for v in values if v != current))


def _candidates(role: str, message: str, line: str, env: Mapping[str, str],
                other: Mapping[str, tuple[Flag, str | None]], resolve: _Counted
                ) -> list[tuple[Edit, ...]]:
    typed = typed_flags(shlex.split(line))
    out: list[tuple[Edit, ...]] = []
    for named in named_flags(message, typed):
        if named.field in _NEVER_EDITED:
            continue
        if named.takes_value:  # a switch is never turned on to satisfy a check
            kind = _field_type(named.field)
            choice = (release_choice(role, line, env, named, resolve) if "int" in kind
                      and named.field not in typed else None)
            out += [(Edit(role, named.option, value),)
                    for value in _values(message, named, typed, other, choice)]
        if named.field in typed:  # removed, with the flags that depend on it
            out.append(with_dependents([Edit(role, named.option, remove=True)], {role: line}))
    # a variable of the server's environment the message names ("... is no longer
    # supported. Unset it."): unset
    out += [(Edit(role, name, remove=True, env=True),) for name in sorted(env)
            if re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message)]
    return out


@dataclass(frozen=True)
class Search:
    """What the search found: accepted edit lists, resolutions run, whether it ran out."""

    accepted: tuple[tuple[Edit, ...], ...]
    resolutions: int
    exhausted: bool


def search(role: str, line: str, env: Mapping[str, str], refusal: str,
           other: Mapping[str, tuple[Flag, str | None]], gpu: Device | None = None) -> Search:
    """Breadth-first over candidate edits (see the module docstring), each line resolved
    as ``gpu`` (the server's named GPU; this machine's answers when ``None``)."""
    frontier: list[tuple[tuple[Edit, ...], str]] = [((), refusal)]
    seen, resolve = {(line, tuple(sorted(env.items())))}, _Counted(gpu)
    accepted: list[tuple[Edit, ...]] = []
    try:
        for _ in range(MAX_DEPTH):
            following: list[tuple[tuple[Edit, ...], str]] = []
            for edits, message in frontier:
                for extra in _candidates(role, message, apply_edits(line, edits, role),
                                         apply_env(env, edits, role), other, resolve):
                    tried = edits + extra
                    text, tried_env = apply_edits(line, tried, role), apply_env(env, tried, role)
                    if (text, tuple(sorted(tried_env.items()))) in seen:
                        continue
                    seen.add((text, tuple(sorted(tried_env.items()))))
                    try:
                        side = resolve(role, text, tried_env)
                    except CheckInputError:
                        continue
                    if side.machine_refusal is not None:
                        continue
                    if side.resolution_error is None:
                        accepted.append(tried)
                    elif side.resolution_error != message:
                        following.append((tried, side.resolution_error))
            frontier = following
            if len(accepted) >= _MAX_FIXES or not frontier:
                break
    except _Exhausted:
        return Search(tuple(accepted), resolve.runs, True)
    return Search(tuple(accepted), resolve.runs, False)


def refusal_finding(args: LaunchArgs, other: LaunchArgs) -> Finding:
    """The release's resolution raised for this server's flags (fixes: :func:`refusal_fixes`);
    it says when the other server is refused the same way."""
    same = ((f"the {other.role} server's flags are refused with the same message (its own "
             f"{CODE}): both servers need the fix",)
            if other.resolution_error == args.resolution_error else ())
    return Finding(
        code=CODE, severity=Severity.ERROR, summary=CODES[CODE].title,
        subject=f"{args.role} server flags", when=STOPS_AT_START,
        observations=(Observation(args.role, "resolution", args.resolution_error,
                                  "ServerArgs resolution of the installed release" + (
                                      "" if args.gpu is None else
                                      f", its GPU probes answering as {args.gpu.name}")),),
        details=(f"the {args.role} server's flags: {' '.join(args.argv)}",
                 f"what this check derives for the {args.role} server (its page size, "
                 "speculative settings, attention TP, the pools it builds) comes from its "
                 "flags as parsed, without the model defaults and checks SGLang's "
                 "resolution would have applied", *same),
        docs=docs_url(CODE))


def refusal_fixes(role: str, argv: tuple[str, ...], env: Mapping[str, str], refusal: str,
                  other_argv: tuple[str, ...], gpu: Device | None = None) -> tuple[Fix, ...]:
    """The refusal's fixes for the ``role`` server: the edit lists the release accepts
    (as ``gpu``, the server's named GPU) (those that set a flag before those that only
    remove), or why there are none."""
    found = search(role, shlex.join(argv), env, refusal, typed_flags(list(other_argv)), gpu)
    inputs = (f"SGLang's resolution of the {role} server's flags: {refusal}",)
    lines = {role: shlex.join(argv)}
    ranked = sorted(found.accepted, key=lambda e: price(e, lines, {role: env}).key())
    fixes = tuple(Fix(FixKind.FLAGS, f"the {role} server's flags"
                                     + (" and environment" if any(x.env for x in edits) else "")
                                     + " that SGLang's resolution "
                                     f"accepts ({len(edits)} change(s); found in "
                                     f"{found.resolutions} resolution(s) of its lines)",
                      field=", ".join(dict.fromkeys(
                          f.field for x in edits if (f := flag(x.name)) is not None)),
                      edits=edits, inputs=inputs)
                  for edits in ranked[:_MAX_FIXES])
    if fixes:
        return fixes
    if found.exhausted:  # a change left untried is not known not to work
        return (Fix(FixKind.NO_FLAG_FIX, f"not found: none of the {found.resolutions} "
                                         "changed lines tried from SGLang's message was "
                                         "accepted by its resolution before the budget of "
                                         f"{MAX_RESOLUTIONS} resolutions ran out",
                    inputs=inputs),)
    return (Fix(FixKind.NO_FLAG_FIX, f"no flag change fixes this: none of the "
                                     f"{found.resolutions} changed lines tried from SGLang's "
                                     "message was accepted by its resolution",
                inputs=inputs),)
