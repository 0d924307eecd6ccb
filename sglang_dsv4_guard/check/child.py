"""``check`` runs SGLang in a child process whose environment it controls.

Importing SGLang imports ``huggingface_hub`` and ``transformers``, which read
``HF_HUB_OFFLINE`` and their cache locations once, at import; so the offline switches
must be in the environment before the interpreter that imports SGLang starts. The
parent (the ``check`` command) never imports SGLang: it starts one child for both
servers (:func:`answer_in_child`) in :func:`child_environment`, behind the walls of
:mod:`.sandbox` (no network call, no write outside its scratch directory).

The request (both launch lines and environments) goes to the child as JSON on stdin;
the answer comes back as JSON on the child's own stdout descriptor (what SGLang prints
goes to stderr). :func:`answer` is the child's work and can run in any process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sglang_dsv4_guard.check.offline.causes import joined
from sglang_dsv4_guard.check.offline.parse import CheckInputError
from sglang_dsv4_guard.host.judgement import imported_package_dir, judge_imported

if TYPE_CHECKING:
    from sglang_dsv4_guard.check.prove import Fixed

__all__ = ["answer", "answer_in_child", "check_timeout", "child_environment", "fix_status"]

# Set in the child's environment before it starts (and so before SGLang is imported).
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
# Caches pointed into the scratch directory (SGLang's import sets the first five from
# SGLANG_CACHE_DIR when they are unset).
_SCRATCH_CACHES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH",
                   "TILELANG_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "SGLANG_CACHE_DIR",
                   "HF_MODULES_CACHE", "XDG_CACHE_HOME", "MPLCONFIGDIR")


def answer(request: Mapping[str, Any],
           refusals: Callable[[], tuple[str, ...]] = tuple) -> dict[str, Any]:
    """``run_check`` on ``request`` in this process: ``{"exit_status", "document", "text"}``,
    or ``{"exit_status": 2, "error": one line}`` for input it cannot read. What SGLang
    says meanwhile (its import's warnings too) is the document's ``sglang_output``, and
    follows the text with ``request["verbose"]``."""
    if "pairs" in request:  # many pairs, one import of SGLang: each answered on its own
        shared = {k: v for k, v in request.items() if k not in ("pairs", "started")}
        return {"pairs": [_one_of_many({**shared, **pair, "started": time.monotonic()},
                                       refusals) for pair in request["pairs"]]}
    # deferred: the child's work: the parent (the check command) never loads it
    from sglang_dsv4_guard.check.offline.chatter import capturing, recording

    with capturing(), recording() as outside:
        reply = _answer(request, refusals)
    checked = reply.pop("output", None)  # the check's own lines, per server
    if checked is not None:
        # deferred: the child's work (rendering)
        from sglang_dsv4_guard.check.text import render_output

        output = checked.after(outside.output())
        reply["document"]["sglang_output"] = output.to_dict()
        if request.get("verbose"):
            reply["text"] += "\n\n" + render_output(output)
    return reply


def _one_of_many(request: Mapping[str, Any], refusals: Callable[[], tuple[str, ...]]
                 ) -> dict[str, Any]:
    """One pair of many: a failure of ours on it is that pair's error line, and the other
    pairs are still answered."""
    try:
        return answer(request, refusals)
    except Exception as exc:  # a bug of ours on this pair: said on its line, never the run's
        return {"exit_status": 2, "error": f"the check failed on this pair ({type(exc).__name__}"
                                           f": {joined(str(exc))[:300]}): a bug of "
                                           "sglang-dsv4-guard"}


def _answer(request: Mapping[str, Any], refusals: Callable[[], tuple[str, ...]]
            ) -> dict[str, Any]:
    # when the command started the child (the system-wide monotonic clock), else now
    started = float(request.get("started") or time.monotonic())
    try:
        # deferred: the prediction imports SGLang: only the child runs it, inside the try
        from sglang_dsv4_guard.check.predict import run_check
        from sglang_dsv4_guard.check.text import render_check

        if request.get("prefill_route") is not None:  # check --prefill-bootstrap
            return _answer_bootstrap(request, refusals)
        request, notes = _live_lines(request)  # a server given by its server-info answer
        if request.get("fix"):
            return _answer_fixed(request, refusals, started, notes)
        result = run_check(request["prefill"], request["decode"],
                           request.get("prefill_env") or {}, request.get("decode_env") or {},
                           refusals=refusals, gpus=request.get("gpus"),
                           gpu_sources=request.get("gpu_sources"))
        result = replace(result, unknowns=result.unknowns + tuple(notes))
    except CheckInputError as exc:
        return {"exit_status": 2, "error": _relabeled(joined(str(exc)), request)}
    except ImportError as exc:
        return {"exit_status": 2, "error": f"sglang: cannot import the installed release "
                                           f"({joined(str(exc))})"}
    return {"exit_status": result.exit_status, "document": result.to_dict(),
            "text": render_check(result), "output": result.sglang_output}


def _live_lines(request: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``request`` with each server-info answer turned into its launch line, and the
    ``unknowns`` lines saying so (:mod:`.server.server_info`)."""
    if not any(f"{role}_server_info" in request for role in ("prefill", "decode")):
        return dict(request), []
    # deferred: the child's work (reads the release's parser)
    from sglang_dsv4_guard.check.server.server_info import as_launch_lines

    return as_launch_lines(request, judge_imported().name)


def _relabeled(error: str, request: Mapping[str, Any]) -> str:
    if not request.get("live_sources"):
        return error
    # deferred: the child's work, for a server given by a live option only
    from sglang_dsv4_guard.check.server.server_info import relabeled

    return relabeled(error, request)


def _answer_bootstrap(request: Mapping[str, Any], refusals: Callable[[], tuple[str, ...]]
                      ) -> dict[str, Any]:
    """``check --prefill-bootstrap``: the decode's line against the prefill's ``/route``
    answer (:mod:`.bootstrap`)."""
    # deferred: the child's work (imports SGLang)
    from sglang_dsv4_guard.check.bootstrap import render_bootstrap, run_bootstrap_check

    request, notes = _live_lines(request)  # the decode given by its server-info answer
    result = run_bootstrap_check(str(request.get("prefill_bootstrap")),
                                 request["prefill_route"], request["decode"],
                                 request.get("decode_env") or {}, refusals,
                                 request.get("gpus"), request.get("gpu_sources"))
    result = replace(result, unknowns=result.unknowns + tuple(notes))
    return {"exit_status": result.exit_status, "document": result.to_dict(),
            "text": render_bootstrap(result), "output": result.sglang_output}


def _answer_fixed(request: Mapping[str, Any], refusals: Callable[[], tuple[str, ...]],
                  started: float, notes: Sequence[str] = ()) -> dict[str, Any]:
    """``check --fix``: the check with each fix proven, and the corrected lines."""
    # deferred: the child's work (imports SGLang)
    from sglang_dsv4_guard.check.prove import fix_check
    from sglang_dsv4_guard.check.rerun import Deadline, Lines
    from sglang_dsv4_guard.check.server.edit import apply_edits
    from sglang_dsv4_guard.check.text import render_check, render_fixed

    limit = check_timeout()
    deadline = Deadline(started + limit / 2,
                        f"half of the check's time limit ({limit / 2:g} of {limit:g} s, "
                        f"{TIMEOUT_VARIABLE}) had passed, so no further re-run was started")
    fixed = fix_check(Lines(request["prefill"], request["decode"],
                            request.get("prefill_env") or {}, request.get("decode_env") or {},
                            gpus=request.get("gpus") or {},
                            gpu_sources=request.get("gpu_sources") or {},
                            keep=request.get("keep")),
                      refusals, deadline)
    fixed = replace(fixed, result=replace(fixed.result,
                                          unknowns=fixed.result.unknowns + tuple(notes)))
    document = fixed.result.to_dict()
    document["fixed"] = (fixed.lines.to_fixed_dict(fixed.given) if fixed.lines is not None
                         else None)
    document["fixed_check"] = (None if fixed.lines_result is None else {
        "exit_status": fixed.lines_result.exit_status,
        "findings": list(fixed.lines_result.report.codes)})
    document["fix_status"] = fix_status(fixed)
    document["fix_keep"] = request.get("keep")
    # the other nodes of each multi-node server (check -f): the same edits, on their lines
    nodes = request.get("nodes") or {}
    document["fixed_nodes"] = None if fixed.lines is None else {
        role: [apply_edits(line, fixed.lines.applied, role) for line in nodes.get(role, ())]
        for role in ("prefill", "decode")}
    document["fix_cost"] = None if fixed.cost is None else fixed.cost.to_dict()
    document["fix_runs"] = {"runs": fixed.runs, "budget_ran_out": fixed.exhausted,
                            "budget": fixed.spent or None}
    return {"exit_status": fixed.result.exit_status, "document": document,
            "text": render_check(fixed.result) + "\n\n" + render_fixed(fixed),
            "output": fixed.result.sglang_output}


def fix_status(fixed: Fixed) -> str:
    """``check --fix``'s outcome as JSON names it (docs/check.md): ``partial`` when the
    corrected lines' own check still fails (the search keeps the lines that leave the
    fewest errors); ``warnings_kept`` when the pair has only warnings and none of their
    proven fixes is cheap enough to apply (each changes only values, or it is not applied:
    the warnings are a bonus)."""
    if not fixed.result.report.findings:
        return "nothing_to_fix"
    if fixed.lines is None:
        return "warnings_kept" if fixed.result.exit_status == 0 else "not_proven"
    done = fixed.lines_result
    return "partial" if done is None or done.exit_status != 0 else "corrected"


def child_environment(scratch: str) -> dict[str, str]:
    """The child's environment: this process's with the offline switches, its ``sys.path``
    as ``PYTHONPATH``, and every home, temporary and cache directory in ``scratch``."""
    env = dict(os.environ)
    if "HF_HOME" not in env:  # where the Hub cache is now, read (never written) there
        cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        env["HF_HOME"] = os.path.join(cache, "huggingface")
    env.update(OFFLINE)
    env["HOME"] = env["TMPDIR"] = scratch
    env["PYTHONPATH"] = os.pathsep.join(entry for entry in sys.path if entry)
    for name in _SCRATCH_CACHES:
        env[name] = os.path.join(scratch, name.lower())
    return env


# The child's first statement: exactly this process's sys.path (``python -m`` or ``-c``
# alone would put the working directory first, where another ``sglang`` may be).
_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
         "from sglang_dsv4_guard.check.child import main; sys.exit(main())")


def _imports_the_same_sglang(expected: str | None) -> str | None:
    """``None`` when the child's ``sglang`` is the file the command would import; else the
    one-line error."""
    if expected is None:
        return None
    try:
        import sglang
    except BaseException as exc:  # a foreign package may raise anything, SystemExit too
        return f"sglang: cannot import the installed release ({type(exc).__name__}: {exc})"
    found = getattr(sglang, "__file__", None)
    if found is None or os.path.realpath(found) != os.path.realpath(expected):
        return (f"sglang: the check process imported SGLang from {found!r}, not {expected!r} "
                "which this command imports; nothing was checked")
    return None


TIMEOUT_VARIABLE = "SGLANG_DSV4_GUARD_CHECK_TIMEOUT"
DEFAULT_TIMEOUT = 600.0  # seconds; resolution takes a few
MAX_TIMEOUT = 86_400.0  # a day: more overflows the poll (and no resolution takes it)


def check_timeout() -> float:
    """The child's time limit: :data:`TIMEOUT_VARIABLE` (a bad value raises), else the default."""
    text = os.environ.get(TIMEOUT_VARIABLE, "")
    if not text.strip():
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_TIMEOUT:
        raise CheckInputError(TIMEOUT_VARIABLE, f"expected a number of seconds above 0 and "
                                                f"at most {MAX_TIMEOUT:g} (got {text!r})")
    return value


class _Stopped(Exception):
    """SIGTERM or SIGINT reached this process while the child ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, _frame: object) -> None:
    raise _Stopped(signum)


def _run_child(scratch: str, payload: str, timeout: float) -> tuple[int, str, str] | str:
    """The child in its own process group; its status, stdout and stderr, or the error
    line when it ran out of time. Killed (its whole group) on any way out."""
    proc = subprocess.Popen([sys.executable, "-c", _BOOT, scratch, json.dumps(sys.path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_environment(scratch),
                            start_new_session=True)
    try:
        out, err = proc.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        return (f"the check process (which imports SGLang) did not answer within {timeout:g} "
                f"s and was stopped (set {TIMEOUT_VARIABLE} to allow longer)")
    finally:
        if proc.poll() is None:
            with contextlib.suppress(OSError):  # it ended meanwhile
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err


def answer_in_child(request: Mapping[str, Any]) -> dict[str, Any]:
    """``answer`` in one child process started with :func:`child_environment`; the scratch
    directory is removed when it ends, also when SIGTERM or SIGINT stops this process
    (the child's process group is killed first). A child that dies without answering
    (:func:`_no_answer`) or runs out of time (:func:`check_timeout`) is an error line, exit 2."""
    try:
        # the limit is each pair's: many pairs in one process have it once per pair
        timeout = min(MAX_TIMEOUT, check_timeout() * max(1, len(request.get("pairs") or ())))
    except CheckInputError as exc:
        return {"exit_status": 2, "error": str(exc)}
    package = imported_package_dir()  # found, not imported: the child must import the same
    expected = None if package is None else str(package / "__init__.py")
    payload = json.dumps({**request, "sglang_file": expected,
                          "started": time.monotonic()})
    main = threading.current_thread() is threading.main_thread()  # signals reach it only
    handlers = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)
                if main}
    try:
        with tempfile.TemporaryDirectory(prefix="sglang-dsv4-guard-check-") as scratch:
            done = _run_child(scratch, payload, timeout)
    except OSError as exc:  # no usable temporary directory, or the interpreter cannot start
        return {"exit_status": 2, "error": f"cannot start the check process: "
                                           f"{type(exc).__name__}: {exc} (TMPDIR="
                                           f"{os.environ.get('TMPDIR', 'unset')})"}
    except _Stopped as stopped:  # the scratch directory is gone; end as the signal asks
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        signal.raise_signal(stopped.signum)
        return {"exit_status": 128 + stopped.signum, "error": "stopped by a signal"}
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if isinstance(done, str):
        return {"exit_status": 2, "error": done}
    returncode, out, err = done
    try:
        reply: dict[str, Any] = json.loads(out)
    except ValueError:
        return _no_answer(returncode, err, bool(request.get("verbose")))
    return reply


TAIL = 40  # SGLang's lines --verbose prints when the check process died without answering


def _no_answer(returncode: int, err: str, verbose: bool) -> dict[str, Any]:
    """The reply for a child that ended without answering: one error line with its last
    exception line (else its last line of output) and the last line SGLang said (the
    child mirrors what it captures to its stderr, :func:`~.chatter.mirrored`); with
    ``verbose``, SGLang's last :data:`TAIL` lines too (``output_tail``), never the child's
    traceback."""
    # deferred: the parent (the check command) loads only what it runs
    from sglang_dsv4_guard.check.offline.chatter import split_mirrored

    said, lines = split_mirrored(err)
    raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
    last = (raised or lines or ["no exception line" if said else "no output"])[-1][:500]
    error = (f"the check process (which imports SGLang) ended with status {returncode} "
             f"without an answer: {last}")
    if said:
        name, line = said[-1]
        error += (f"; SGLang's last line before it ended ({name}): {line[:300]} ("
                  f"{len(said)} line(s) captured; --verbose prints the last "
                  f"{min(TAIL, len(said))})")
    reply: dict[str, Any] = {"exit_status": 2, "error": error}
    if verbose and said:
        reply["output_tail"] = [
            f"SGLang's output before the check process ended (the last "
            f"{min(TAIL, len(said))} of {len(said)} captured line(s), by server):",
            *(f"  {name}: {line}" for name, line in said[-TAIL:])]
    return reply


_EXCEPTION_LINE = re.compile(r"^[\w.]*\w+(Error|Exception|Exit)\b")


def main() -> int:
    """The child: walls up, one request from stdin, one answer to the original stdout."""
    # deferred: only the child puts its walls up
    from sglang_dsv4_guard.check.offline import sandbox

    sandbox.install(sys.argv[1])
    # deferred: the capture is the child's only, imported behind its walls
    from sglang_dsv4_guard.check.offline.chatter import mirrored

    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what SGLang prints (Python or C) goes to stderr, not into the answer
    sys.stdout = sys.stderr
    request = json.loads(sys.stdin.read())
    wrong = _imports_the_same_sglang(request.pop("sglang_file", None))
    # what is captured is copied to stderr as it comes: the parent reads it if we die
    with os.fdopen(os.dup(2), "w") as mirror, mirrored(mirror):
        reply = ({"exit_status": 2, "error": wrong} if wrong is not None
                 else answer(request, sandbox.refusals))
    out.write(json.dumps(reply))
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
