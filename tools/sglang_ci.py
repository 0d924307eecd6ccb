"""Run the test files the way SGLang's own CI runs them, with SGLang's own CI code.

1. ``sglang.test.ci.ci_register.collect_tests`` parses every ``tests/*.py`` but
   ``conftest.py``, as SGLang's ``test/run_suite.py`` does for ``test/registered/`` (a
   ``register_cpu_ci`` call is required in each, and an ``if __name__ == "__main__":``
   block in each enabled one); the enabled files of the suite are kept;
2. with ``--part K/N``, ``sglang.test.ci.ci_register.auto_partition`` keeps the K-th of N
   parts, balanced by each file's ``est_time`` (longest-processing-time first), as SGLang's
   ``run_suite.py --auto-partition-id/--auto-partition-size`` splits a suite over runners;
   the N parts together run every file (``tools/matrix.py`` runs them as jobs of its pool);
3. ``sglang.test.ci.ci_utils.run_unittest_files`` runs each registered file as
   ``python3 <cwd>/<file> -f`` (no pytest, no conftest), with the timeout SGLang derives
   from its ``est_time``. Where the release has it (0.5.23), with SGLang's own preloaded
   fork worker (``fork_worker_batch_size``, ``sglang/test/ci/fork_test_worker.py``): one
   interpreter per part imports the expensive stack once and forks a fresh child for
   each file, which runs it as ``python3 <file> -f`` would. SGLang's worker preloads
   numpy, pytest, scipy, torch and triton; the ``python3`` this runner starts it with
   also imports, before SGLang's worker code runs, the SGLang modules every test file
   imports (``PRELOAD``: SGLang's ``test_utils``, and the disaggregation modules of
   ``tests/helpers.py``), ~15 s of CPU per file otherwise. Nothing of the guard's is
   preloaded; tests that need a fresh interpreter start their own, as before.

As in SGLang's CI, ``CustomTestCase`` retries a failed test method once
(``SGLANG_TEST_MAX_RETRY=1``; SGLang's CI gets the same from ``SGLANG_IS_IN_CI``, which
here would also try to import SGLang's serving engine before every test class).
``python3`` is this interpreter (its directory goes first on ``PATH``). The runner's
output goes to ``--log``; one summary line is printed.

Usage: ``python tools/sglang_ci.py [--log FILE] [--suite stage-a-test-cpu] [--part K/N] [FILE ...]``
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SUITE = "stage-a-test-cpu"
# SGLang modules every test file imports, imported once by the fork worker (see above).
PRELOAD = ("sglang.test.test_utils", "sglang.srt.disaggregation.decode",
           "sglang.srt.disaggregation.prefill", "sglang.srt.disaggregation.utils")
# SGLang's fork worker, as run_unittest_files starts it: ``python3 <this file> ...``.
_WORKER = "sglang/test/ci/fork_test_worker.py"
_SHIM = """#!/bin/sh
# python3 for SGLang's CI runner (tools/sglang_ci.py): its fork worker gets the SGLang
# modules every test imports preloaded; anything else runs as the interpreter itself.
case "$1" in
  */{worker})
    exec {python} -c 'import runpy, sys
for name in sys.argv.pop(1).split(","):
    __import__(name)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")' {preload} "$@" ;;
esac
exec {python} "$@"
"""


def fork_worker_options(shim_dir: Path) -> dict[str, Any]:
    """``run_unittest_files`` keywords for SGLang's preloaded fork worker, with a
    ``python3`` in ``shim_dir`` (first on ``PATH``) that preloads ``PRELOAD`` in it;
    none where the release's runner has no fork worker (it then starts a fresh
    interpreter per file)."""
    import inspect

    from sglang.test.ci.ci_utils import run_unittest_files

    if "fork_worker_batch_size" not in inspect.signature(run_unittest_files).parameters:
        return {}
    shim = shim_dir / "python3"
    shim.write_text(_SHIM.format(worker=_WORKER, python=shlex.quote(sys.executable),
                                 preload=",".join(PRELOAD)))
    shim.chmod(0o755)
    return {"fork_worker_batch_size": 1_000}


def _part(text: str) -> tuple[int, int]:
    """``K/N`` (1 <= K <= N) as ``(K, N)``; anything else is an argparse error naming it."""
    found = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not found or not 1 <= int(found.group(1)) <= int(found.group(2)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a part K/N with 1 <= K <= N")
    return int(found.group(1)), int(found.group(2))


def select(files: list[str], suite: str, part: tuple[int, int] = (1, 1)) -> tuple[list[Any], int]:
    """The registries SGLang's ``collect_tests`` reads from ``files`` that its CPU suite
    ``suite`` runs, of them ``part`` (K, N) by SGLang's ``auto_partition``, and how many
    the suite runs in all; a rejected file or one not registered raises ``ValueError``."""
    from sglang.test.ci.ci_register import HWBackend, auto_partition, collect_tests

    try:
        registered = collect_tests(files)
    except ValueError as exc:
        raise ValueError(f"collect_tests rejected the tests: {exc}") from exc
    chosen = [r for r in registered if r.backend is HWBackend.CPU
              and r.effective_suite == suite and r.disabled is None and not r.nightly]
    helpers = {r.filename for r in registered if r.disabled is not None}
    missing = sorted(set(files) - helpers - {r.filename for r in chosen})
    if missing:
        raise ValueError(f"not registered for CPU suite {suite}: {', '.join(missing)}")
    k, n = part
    return (auto_partition(chosen, k - 1, n) if n > 1 else chosen), len(chosen)


def main(argv: list[str] | None = None) -> int:
    """Collect, run, summarise; 0 when every file passed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="test files relative to the project root")
    parser.add_argument("--log", type=Path, default=ROOT / ".matrix" / "reports" / "sglang-ci.log")
    parser.add_argument("--suite", default=SUITE)
    parser.add_argument("--part", type=_part, default=(1, 1), metavar="K/N",
                        help="run the K-th of N parts (SGLang's auto_partition), 1-based")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    files = args.files or sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/*.py")
                                 if p.name not in ("conftest.py", "__init__.py"))
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent),
                                          os.environ.get("PATH", "")])
    os.environ.setdefault("SGLANG_TEST_MAX_RETRY", "1")
    os.environ.setdefault("HYPOTHESIS_PROFILE", "dev")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                             os.environ.get("PYTHONPATH")]))

    try:
        chosen, total = select(files, args.suite, args.part)
    except ValueError as exc:  # SGLang's harness rejects a file: name it, in one line
        print(f"sglang CI harness: {exc}")
        return 1
    part, parts = args.part

    args.log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    summary = os.dup(1)
    with open(args.log, "w") as log:  # the runner and its children write to fds 1 and 2
        sys.stdout.flush()
        sys.stderr.flush()
        saved_err = os.dup(2)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            from sglang.test.ci.ci_utils import run_unittest_files

            with tempfile.TemporaryDirectory(prefix="dsv4-harness-") as shim_dir:
                options = fork_worker_options(Path(shim_dir))
                os.environ["PATH"] = os.pathsep.join([shim_dir, os.environ["PATH"]])
                code = run_unittest_files(chosen, continue_on_error=True, **options)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(summary, 1)
            os.dup2(saved_err, 2)
    verdict = "all passed" if code == 0 else "FAILED"
    share = f" (part {part}/{parts} of {total}, by auto_partition)" if parts > 1 else ""
    print(f"sglang CI harness: {len(chosen)} files collected by collect_tests{share}, "
          f"run by run_unittest_files: {verdict} in {time.monotonic() - start:.0f}s "
          f"(log: {args.log.relative_to(ROOT) if args.log.is_relative_to(ROOT) else args.log})")
    if code != 0:
        failed = [line.strip() for line in args.log.read_text(errors="replace").splitlines()
                  if "(exit code" in line or "(timeout" in line]
        for line in failed:
            print(f"  failed: {line}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
