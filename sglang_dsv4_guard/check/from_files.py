"""``check -f``: every pair the deployment files hold, checked in one check process, with
errors that name the file and line, and (``--fix``) one proven patch for the files
(:mod:`.file_fixes`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sglang_dsv4_guard.check.file_fixes import fix_files, nodes_of
from sglang_dsv4_guard.check.formats import render
from sglang_dsv4_guard.check.inputs import Inputs, Invocation, Pair, read_inputs
from sglang_dsv4_guard.check.offline.parse import CheckInputError
from sglang_dsv4_guard.check.outcome import Checked, exit_status
from sglang_dsv4_guard.check.requests import (
    REFERENCE,
    gpus_of,
    model_path_map,
    pair_request,
    prepared,
    shared,
    variables,
)

__all__ = ["Answerer", "command_error", "run_files"]

Answerer = Callable[[Mapping[str, Any]], dict[str, Any]]


def command_error(text: str) -> int:
    """``check``'s one error line on stderr; exit status 2."""
    print(f"sglang-dsv4-guard check: error: {text}", file=sys.stderr)
    return 2


def _unpaired(inputs: Inputs) -> list[str]:
    return [f"{invocation.file}:{invocation.line} ({invocation.where}): {why}"
            for invocation, why in inputs.unpaired]


def _notes(invocations: Sequence[Invocation]) -> tuple[str, ...]:
    return tuple(f"{inv.file}:{inv.line}: {note}" for inv in invocations for note in inv.unresolved)


def run_files(args: argparse.Namespace, files: list[str], answerer: Answerer, version: str
              ) -> int:
    """``check -f files``: read, answered by ``answerer``, printed; the exit status."""
    try:
        models = model_path_map(getattr(args, "model_path_map", None) or ())
        given = variables(getattr(args, "var", None) or ())
        gpus_of(args)  # a GPU name that cannot be read: exit 2 before reading anything
        inputs = read_inputs(files, sys.stdin)
    except CheckInputError as exc:
        return command_error(str(exc))
    if not inputs.pairs:  # nothing to judge is no failure (a commit of other YAML files)
        found = _unpaired(inputs)
        print(f"check: no prefill/decode pair in {', '.join(files)}: "
              + ("; ".join(found) if found else "no SGLang server found") + "; nothing checked")
        for note in inputs.notes:
            print(f"note: {note}")
        return 0
    fix = bool(args.fix) or args.format == "patch"
    requests = [pair_request(pair, args, models, {
        "prefill": nodes_of(inputs, pair.prefill), "decode": nodes_of(inputs, pair.decode)}
        if fix else None) for pair in inputs.pairs]
    reply = answerer({"pairs": requests, **shared(args), "fix": fix})
    replies = reply.get("pairs")
    if not isinstance(replies, list) or len(replies) != len(inputs.pairs):
        # the check process ended without answering: every pair has its error line
        replies = [reply] * len(inputs.pairs)
    used = {name for request in requests for name in request.get("variables") or {}}
    unused = [f"--var {name}: not used (the files give it a value, or a default, wherever "
              "the pairs read it; or they never read it)" for name in given if name not in used]
    checked = [Checked(pair.name, _located(answer, pair, given), pair.prefill, pair.decode,
                       _notes((pair.prefill, pair.decode)) + tuple(gpus_of(args, pair)[2])
                       + _read_as(request.get("variables") or {}, given))
               for pair, answer, request in zip(inputs.pairs, replies, requests, strict=True)]
    patch = None
    if fix:
        patch = fix_files(files, inputs, checked, requests, models,
                          lambda argv: prepared(argv, args, models))
    if args.format == "patch":
        assert patch is not None
        sys.stdout.write(patch[0])
        for c in checked:
            if c.error is not None:
                print(f"sglang-dsv4-guard check: {c.name}: not checked: {c.error}",
                      file=sys.stderr)
        for note in patch[1]:
            print(f"sglang-dsv4-guard check: not in the patch: {note}", file=sys.stderr)
    else:
        print(render(args.format, checked, args.fail_on, version, quiet=args.quiet,
                     unpaired=_unpaired(inputs), notes=(*inputs.notes, *unused), patch=patch))
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
    left = sorted({next(g for g in m.groups() if g) for m in REFERENCE.finditer(text)}
                  - set(given))
    if left:
        text += f"; {', '.join(left)} has no value in the files: give it with --var NAME=VALUE"
    return {**reply, "error": text}
