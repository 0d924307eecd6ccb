"""The ``check`` command: its inputs (two launch lines, or deployment files), one check
process for every pair (:mod:`.child`), and its output in the format asked (:mod:`.formats`).

The command never imports SGLang: the pairs are read here (:mod:`.inputs`, plain files),
answered in one child process that imports SGLang once, and rendered here.
"""

from __future__ import annotations

import argparse
import sys

from sglang_dsv4_guard.check.formats import render
from sglang_dsv4_guard.check.from_files import Answerer, command_error, run_files
from sglang_dsv4_guard.check.live import live_request, live_roles
from sglang_dsv4_guard.check.offline.parse import CheckInputError
from sglang_dsv4_guard.check.outcome import Checked, exit_status
from sglang_dsv4_guard.check.requests import model_path_map, request_of

__all__ = ["run_command"]

def _version() -> str:
    # deferred: the package's version only where an output names it
    from sglang_dsv4_guard import __version__

    return __version__


def run_command(args: argparse.Namespace, answerer: Answerer | None = None) -> int:
    """``check``: the pairs from ``args`` answered (by :func:`~.child.answer_in_child`
    unless ``answerer`` is given) and printed; the exit status (docs/check.md)."""
    if answerer is None:
        # deferred: the parent starts the child only when it has pairs to check
        from sglang_dsv4_guard.check.child import answer_in_child

        answerer = answer_in_child
    if getattr(args, "keep", None) and not (args.fix or args.format == "patch"):
        return command_error(f"--keep {args.keep} says which server --fix leaves as typed: give "
                      "it with --fix")
    files = [*(getattr(args, "file", None) or ()), *(getattr(args, "paths", None) or ())]
    try:  # a server given running: --prefill-server-info, --decode-server-info, --prefill-bootstrap
        live = live_roles(args)
    except CheckInputError as exc:
        return command_error(str(exc))
    typed = args.prefill is not None or args.decode is not None or bool(live)
    if files and typed:
        return command_error("give either -f PATH... or --prefill and --decode, not both")
    if not files:
        if any(getattr(args, role) is None and role not in live for role in ("prefill", "decode")):
            return command_error("give --prefill ARGS and --decode ARGS (the two launch lines; or "
                          "a running server's --prefill-server-info, --decode-server-info, "
                          "--prefill-bootstrap), or -f PATH... (deployment files to read "
                          "the pairs from)")
        return _typed_pair(args, answerer)
    return run_files(args, files, answerer, _version())


def _typed_pair(args: argparse.Namespace, answerer: Answerer) -> int:
    if args.format == "patch":
        return command_error("--format patch edits deployment files: give them with -f PATH...")
    try:
        request = live_request(args, request_of(args),
                               model_path_map(getattr(args, "model_path_map", None) or ()))
    except CheckInputError as exc:
        return command_error(str(exc))
    reply = answerer(request)
    checked = Checked("the pair", reply)
    if reply.get("error") is not None and args.format == "text":
        print(f"sglang-dsv4-guard check: error: {reply['error']}", file=sys.stderr)
        for line in reply.get("output_tail", ()):  # --verbose, the child died: SGLang's lines
            print(line, file=sys.stderr)
        return int(reply.get("exit_status", 2))
    if reply.get("error") is not None and args.format == "json":
        return command_error(str(reply["error"]))
    print(render(args.format, [checked], args.fail_on, _version(), quiet=args.quiet))
    if reply.get("error") is not None:
        return int(reply.get("exit_status", 2))
    return exit_status([checked], args.fail_on)
