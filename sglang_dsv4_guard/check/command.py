"""The ``check`` command: its inputs (two launch lines, or deployment files), one check
process for every pair (:mod:`.child`), and its output in the format asked (:mod:`.formats`).

The command never imports SGLang: the pairs are read here (:mod:`.inputs`, plain files),
answered in one child process that imports SGLang once, and rendered here.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sglang_dsv4_guard.check.formats import render
from sglang_dsv4_guard.check.live import live_request, live_roles
from sglang_dsv4_guard.check.offline.parse import CheckInputError, parse_env
from sglang_dsv4_guard.check.outcome import Checked, exit_status
from sglang_dsv4_guard.check.server.gpu_models import gpu_model

if TYPE_CHECKING:
    from sglang_dsv4_guard.check.inputs import Inputs, Invocation, Pair

__all__ = ["gpus_of", "model_path_map", "pair_request", "request_of", "run_command"]

Answerer = Callable[[Mapping[str, Any]], dict[str, Any]]


def request_of(args: argparse.Namespace) -> dict[str, Any]:
    """The child's request for a pair typed as ``--prefill``/``--decode``; a malformed
    ``--*-env`` item raises :class:`~.parse.CheckInputError` naming it."""
    gpus, sources, _ = gpus_of(args)
    return {"prefill": args.prefill, "decode": args.decode,
            "prefill_env": parse_env("--prefill-env", args.prefill_env),
            "decode_env": parse_env("--decode-env", args.decode_env),
            "gpus": gpus, "gpu_sources": sources, **_shared(args)}


def gpus_of(args: argparse.Namespace, pair: Pair | None = None
            ) -> tuple[dict[str, str | None], dict[str, str], list[str]]:
    """Each server's GPU and what named it: ``--prefill-gpu``/``--decode-gpu``, else
    ``--gpu`` (a name :func:`~.server.gpu_models.gpu_model` cannot read raises, before the
    child starts), else the GPU its manifest states (``pair``'s invocation; a label it
    cannot read is a note, and that server is judged on every GPU model). Also the notes."""
    gpus: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []
    for role in ("prefill", "decode"):
        gpus[role] = None
        for option in (f"--{role}-gpu", "--gpu"):
            text = getattr(args, option[2:].replace("-", "_"), None)
            if text is not None:
                gpu_model(text, option)
                gpus[role], sources[role] = text, option
                break
        invocation = None if pair is None else (pair.prefill if role == "prefill" else pair.decode)
        if gpus[role] is None and invocation is not None and invocation.gpu:
            where = f"{invocation.file}:{invocation.line} (the pod's GPU label)"
            try:
                gpu_model(invocation.gpu, where)
            except CheckInputError as exc:
                notes.append(f"{role}: {exc}; judged on every GPU model")
                continue
            gpus[role], sources[role] = invocation.gpu, where
    return gpus, sources, notes


def _shared(args: argparse.Namespace) -> dict[str, Any]:
    """What every pair's request has from the command line."""
    return {"fix": bool(getattr(args, "fix", False)),
            "verbose": bool(getattr(args, "verbose", False))}


def model_path_map(items: Sequence[str]) -> dict[str, str]:
    """``--model-path-map PATH=DIR`` items: a model path as the deployment writes it, and
    the local directory holding its ``config.json``; a malformed item raises
    :class:`~.parse.CheckInputError` naming it."""
    mapping: dict[str, str] = {}
    for item in items:
        path, eq, local = item.partition("=")
        if not eq or not path.strip() or not local.strip():
            raise CheckInputError("--model-path-map", f"expected PATH=DIR, a model path as the "
                                                      f"deployment writes it and a local "
                                                      f"directory with its config.json (got "
                                                      f"{item!r})")
        mapping[path.strip()] = local.strip()
    return mapping


# Variables a workload controller sets in each pod when it starts (LeaderWorkerSet, RBG)
# or that the pod's own address fills: a pair is checked as its group's leader pod, with
# these values (none of them enters a prefill/decode comparison), and says so.
POD_VARIABLES = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_WORKER_INDEX": "0",
                 "RBG_LWP_LEADER_ADDRESS": "127.0.0.1", "RBG_LWP_WORKER_INDEX": "0",
                 "POD_IP": "127.0.0.1"}
_REFERENCE = re.compile(r"\$\((\w+)\)|\$\{(\w+)\}|\$(\w+)")


def variables(items: Sequence[str]) -> dict[str, str]:
    """``--var NAME=VALUE`` items: a value for a variable the deployment files leave
    without one; a malformed item raises :class:`~.parse.CheckInputError` naming it."""
    values: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise CheckInputError("--var", f"expected NAME=VALUE, a variable's name and the "
                                           f"value to read it as (got {item!r})")
        values[name] = value
    return values


def _substituted(argv: Sequence[str], given: Mapping[str, str], used: dict[str, str]
                 ) -> list[str]:
    """``argv`` with each reference the reader left (``$(X)``, ``${X}``, ``$X``) to a
    variable of ``given`` or :data:`POD_VARIABLES` replaced by its value (``used``
    records which)."""
    def value(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        found = given.get(name, POD_VARIABLES.get(name))
        if found is None:
            return match.group(0)
        used[name] = found
        return found
    return [_REFERENCE.sub(value, token) if "$" in token else token for token in argv]


def _mapped(argv: Sequence[str], mapping: Mapping[str, str]) -> list[str]:
    """``argv`` with each value that is a mapped model path (alone or as ``--flag=PATH``)
    replaced by its local directory."""
    out = []
    for token in argv:
        flag, eq, value = token.partition("=")
        if token in mapping:
            token = mapping[token]
        elif eq and flag.startswith("--") and value in mapping:
            token = f"{flag}={mapping[value]}"
        out.append(token)
    return out


def pair_request(pair: Pair, args: argparse.Namespace,
                 models: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The child's request for one pair read from files: each server's arguments as one
    shell-quoted line (the check splits it back into the same tokens), model paths mapped
    to local directories by ``models``, each server's environment and GPU (:func:`gpus_of`)."""
    models = models or {}
    given = variables(getattr(args, "var", None) or ())
    gpus, sources, _ = gpus_of(args, pair)
    used: dict[str, str] = {}
    argv = {role: _mapped(_substituted(invocation.argv, given, used), models)
            for role, invocation in (("prefill", pair.prefill), ("decode", pair.decode))}
    return {"name": pair.name, "gpus": gpus, "gpu_sources": sources,
            "prefill": shlex.join(argv["prefill"]), "decode": shlex.join(argv["decode"]),
            "prefill_env": dict(pair.prefill.env), "decode_env": dict(pair.decode.env),
            "variables": used}


def _version() -> str:
    # deferred: the package's version only where an output names it
    from sglang_dsv4_guard import __version__

    return __version__


def _error(text: str) -> int:
    print(f"sglang-dsv4-guard check: error: {text}", file=sys.stderr)
    return 2


def run_command(args: argparse.Namespace, answerer: Answerer | None = None) -> int:
    """``check``: the pairs from ``args`` answered (by :func:`~.child.answer_in_child`
    unless ``answerer`` is given) and printed; the exit status (docs/check.md)."""
    if answerer is None:
        # deferred: the parent starts the child only when it has pairs to check
        from sglang_dsv4_guard.check.child import answer_in_child

        answerer = answer_in_child
    files = list(getattr(args, "file", None) or ())
    try:  # a server given running: --prefill-server-info, --decode-server-info, --prefill-bootstrap
        live = live_roles(args)
    except CheckInputError as exc:
        return _error(str(exc))
    typed = args.prefill is not None or args.decode is not None or bool(live)
    if files and typed:
        return _error("give either -f PATH... or --prefill and --decode, not both")
    if not files:
        if any(getattr(args, role) is None and role not in live for role in ("prefill", "decode")):
            return _error("give --prefill ARGS and --decode ARGS (the two launch lines; or "
                          "a running server's --prefill-server-info, --decode-server-info, "
                          "--prefill-bootstrap), or -f PATH... (deployment files to read "
                          "the pairs from)")
        return _typed_pair(args, answerer)
    return _from_files(args, files, answerer)


def _typed_pair(args: argparse.Namespace, answerer: Answerer) -> int:
    try:
        request = live_request(args, request_of(args),
                               model_path_map(getattr(args, "model_path_map", None) or ()))
    except CheckInputError as exc:
        return _error(str(exc))
    reply = answerer(request)
    checked = Checked("the pair", reply)
    if reply.get("error") is not None and args.format == "text":
        print(f"sglang-dsv4-guard check: error: {reply['error']}", file=sys.stderr)
        for line in reply.get("output_tail", ()):  # --verbose, the child died: SGLang's lines
            print(line, file=sys.stderr)
        return int(reply.get("exit_status", 2))
    if reply.get("error") is not None and args.format == "json":
        return _error(str(reply["error"]))
    print(render(args.format, [checked], args.fail_on, _version(), quiet=args.quiet))
    if reply.get("error") is not None:
        return int(reply.get("exit_status", 2))
    return exit_status([checked], args.fail_on)


def _unpaired(inputs: Inputs) -> list[str]:
    return [f"{invocation.file}:{invocation.line} ({invocation.where}): {why}"
            for invocation, why in inputs.unpaired]


def _notes(invocations: Sequence[Invocation]) -> tuple[str, ...]:
    return tuple(f"{inv.file}:{inv.line}: {note}" for inv in invocations for note in inv.unresolved)


def _from_files(args: argparse.Namespace, files: list[str], answerer: Answerer) -> int:
    # deferred: only -f reads files (the reader imports the YAML library)
    from sglang_dsv4_guard.check.inputs import read_inputs

    try:
        models = model_path_map(getattr(args, "model_path_map", None) or ())
        given = variables(getattr(args, "var", None) or ())
        gpus_of(args)  # a GPU name that cannot be read: exit 2 before reading anything
        inputs = read_inputs(files, sys.stdin)
    except CheckInputError as exc:
        return _error(str(exc))
    if not inputs.pairs:
        found = "; ".join(_unpaired(inputs)) or "no SGLang server invocation"
        return _error(f"no prefill/decode pair in {', '.join(files)}: {found}"[:2000])
    requests = [pair_request(pair, args, models) for pair in inputs.pairs]
    reply = answerer({"pairs": requests, **_shared(args)})
    replies = reply.get("pairs")
    if not isinstance(replies, list) or len(replies) != len(inputs.pairs):
        # the check process ended without answering: every pair has its error line
        replies = [reply] * len(inputs.pairs)
    checked = [Checked(pair.name, _located(answer, pair, given), pair.prefill, pair.decode,
                       _notes((pair.prefill, pair.decode)) + tuple(gpus_of(args, pair)[2])
                       + _read_as(request.get("variables") or {}, given))
               for pair, answer, request in zip(inputs.pairs, replies, requests, strict=True)]
    print(render(args.format, checked, args.fail_on, _version(), quiet=args.quiet,
                 unpaired=_unpaired(inputs), notes=inputs.notes))
    return exit_status(checked, args.fail_on)


def _read_as(used: Mapping[str, str], given: Mapping[str, str]) -> tuple[str, ...]:
    """A note per variable the check read with a value the files do not give."""
    return tuple(f"${{{name}}} read as {value!r} (" + (
        "--var" if name in given else "the group's leader pod; --var "
        f"{name}=VALUE to choose") + ")" for name, value in used.items())


def _located(reply: Mapping[str, Any], pair: Pair, given: Mapping[str, str]
             ) -> Mapping[str, Any]:
    """``reply`` with an error line that names ``--prefill``/``--decode`` naming the file
    and line of that server instead, and saying how to give what the files leave
    unresolved (a model path, a variable)."""
    error = reply.get("error")
    if error is None:
        return reply
    text = str(error)
    for role, invocation in (("prefill", pair.prefill), ("decode", pair.decode)):
        if text.startswith(f"--{role}: "):
            text = f"{invocation.file}:{invocation.line} ({role}): {text[len(role) + 4:]}"
        if "no config.json in" in text and f"({role})" in text:
            text += ("; a model path in a deployment is read on this machine: "
                     "--model-path-map PATH=DIR names the local directory with its config.json")
    left = sorted({next(g for g in m.groups() if g) for m in _REFERENCE.finditer(text)}
                  - set(given))
    if left:
        text += f"; {', '.join(left)} has no value in the files: give it with --var NAME=VALUE"
    return {**reply, "error": text}
