"""Run the test suite against the SGLang releases in ``matrix.txt``: selected, or every test.

One environment serves every release: the venv holds the base release (installed by
``make setup``); each other release is its wheel unzipped into ``.matrix/<release>/site``
plus an overlay of the libraries it pins, both put first on ``PYTHONPATH``
(``tools/release_env.py``). Every pytest run gets its own JUnit report, log and codes
file under ``.matrix/reports``; ``--jobs`` runs go at once, each output line prefixed
with its release.

Two ways to run, one per Makefile tier (``docs/releases.md#the-test-matrix``):

- ``--select`` (``make test``, what CI runs): every test on the base release, split into
  ``--jobs`` pytest runs by SGLang's ``auto_partition`` and traced
  (``tools/trace_drives.py``); then, on every other release, the tests whose key (a
  digest of the SGLang code each drove, ``tools/selection.py``) is not that of a release
  that ran them. A property test draws the profile's examples on the base release and
  on the oldest other release that runs it, the ``dev`` profile's elsewhere.
- the default (``make matrix``): every test on every release, the profile's examples on
  the oldest, the middle and the base release and ``dev`` elsewhere; with
  ``--sglang-ci``, also every file on the base release under SGLang's CI harness
  (``tools/sglang_ci.py``), as more jobs of the pool.

Both run the patch series (``tools/patched_tree.py``) on every release: ``make matrix``
after the release's suite, in its job; ``make test`` as jobs of their own.
A release fails when a test fails, errors or skips (a test that cannot run is a failure
here), when a property test that ran reported no statistics or drew fewer examples than
asked, or when a finding code of the guard's catalogue that the release can produce was
produced by no passing test (a test left out counts with what it produced on the
release that ran it). The summary is printed and written to ``.matrix/summary.md``.

``--durations`` reads the last run's JUnit reports: the 20 slowest tests and what each
process test costs (``tools/durations.py``); ``--est-times`` sets each test file's
``est_time`` from the last traced base run, by which ``--select`` splits that run.

Usage: ``python tools/matrix.py [--select] [--releases 0.5.16,0.5.23] [--jobs 2]
[--prepare-only] [--sglang-ci] [--durations] [--est-times] [--script benchmarks/bench_overhead.py] [-- ARGS]``
"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import durations
import judging
import patched_tree
import selection
import sglang_ci
from packaging.version import Version
from release_env import (
    ROOT,
    WORK,
    Release,
    Result,
    base_version,
    is_base,
    prepare,
    read_matrix,
    release_env,
    say,
    sglang_package,
)
from suite import PROCESS_TESTS, process_test, property_test

CODES_VARIABLE = "DSV4_GUARD_CODES_FILE"
# Jobs SGLang's auto_partition splits the harness run into (make matrix).
HARNESS_PARTS = 4
REPORTS = WORK / "reports"
# Pytest runs at once: one more than the CPUs, since the process tests wait on their
# children and on timers (two runs on two cores kept the CPUs 71% busy); at most eight,
# as each run holds SGLang, torch included, in memory (1-3 GB).
JOBS = min((os.cpu_count() or 1) + 1, 8)
DRIVES = WORK / "drives"
# What one release's patch series run takes (its ten tests and its pytest start-up), for
# the order of make test's jobs: the longest ready job first.
PATCHED_SECONDS = 40.0
# Seconds one pytest run may take (the longest, a traced part of the base release, takes
# about 600 on a 2-core machine).
RUN_TIMEOUT = 3600


def run(release: Release, pytest_args: list[str], profile: str, name: str = "",
        extra_env: dict[str, str] | None = None, result: Result | None = None) -> Result:
    """One pytest process on ``release`` with ``pytest_args`` (node ids, files, options),
    judged into ``result`` (a new one by default); ``name``: its report files' stem."""
    result = result or Result(release, profile=profile)
    stem = name or release.version
    REPORTS.mkdir(parents=True, exist_ok=True)
    junit, log_path = REPORTS / f"{stem}.xml", REPORTS / f"{stem}.log"
    codes_file = REPORTS / f"{stem}.codes"
    for stale in (junit, codes_file):  # never judge a run by an earlier run's files
        stale.unlink(missing_ok=True)
    env = release_env(release, HYPOTHESIS_PROFILE=profile, **{CODES_VARIABLE: str(codes_file)},
                      **(extra_env or {}))
    command = [sys.executable, "-m", "pytest", f"--junitxml={junit}", "-p", "no:cacheprovider",
               "--hypothesis-show-statistics", *pytest_args]
    shown = " ".join(command[2:]) if len(command) < 40 else \
        " ".join(command[2:7]) + f" ... ({len(pytest_args)} arguments)"
    say(release, f"===== SGLang {release.version} ({stem}, profile {profile}): {shown}")
    start = time.monotonic()
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc, \
            log_path.open("w") as log:
        assert proc.stdout is not None
        # A hung test stops its run, which then names the test it was in, before CI's
        # own limit stops everything and names nothing.
        watchdog = threading.Timer(RUN_TIMEOUT, proc.kill)
        watchdog.daemon = True
        watchdog.start()
        captured = []
        try:
            for line in proc.stdout:
                say(release, line)
                log.write(line)
                captured.append(line)
        finally:
            watchdog.cancel()
    result.seconds += time.monotonic() - start
    if time.monotonic() - start >= RUN_TIMEOUT:
        last = next((line.strip() for line in reversed(captured) if "::" in line
                     or line.startswith("tests/")), "(no test named in its output)")
        result.problems.append(f"{stem}: stopped after {RUN_TIMEOUT} s, hung; its last "
                               f"line naming a test: {last}")
    result.codes_files.append(codes_file)
    if proc.returncode != 0:
        result.problems.append(f"{stem}: pytest exited with {proc.returncode}")
    if not junit.exists():
        result.problems.append(f"{stem}: no JUnit report written")
        return result
    judging.judge(result, junit, "".join(captured), profile)
    return result


def full_example_releases(releases: list[Release]) -> set[str]:
    """``make matrix``: the releases whose property tests draw the profile's examples (the
    oldest, the middle and the base release of ``matrix.txt``); the dev profile's on the
    others."""
    ordered = sorted(releases, key=lambda r: Version(r.version))
    chosen = {ordered[0].version, ordered[len(ordered) // 2].version} if ordered else set()
    return chosen | {r.version for r in releases if is_base(r)}


def run_sglang_ci(release: Release, part: int = 1, parts: int = 1) -> Result:
    """Every test file on ``release`` (the base) under SGLang's own CI harness; with
    ``parts`` > 1, the ``part``-th of SGLang's ``auto_partition`` of them."""
    share = f" {part}/{parts}" if parts > 1 else ""
    result = Result(release, label=f"{release.version}, SGLang's CI harness{share}")
    log = REPORTS / (f"sglang-ci-{part}.log" if parts > 1 else "sglang-ci.log")
    codes_file = REPORTS / f"sglang-ci-{part}.codes"
    codes_file.unlink(missing_ok=True)  # never judge a run by an earlier run's file
    say(release, f"===== SGLang's CI harness{share}: tools/sglang_ci.py (collect_tests, "
                 "auto_partition, run_unittest_files)")
    start = time.monotonic()
    # The dev profile: example counts are judged on this release's pytest run. CI set: a
    # test that cannot run fails here too (GuardTestCase).
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "sglang_ci.py"), "--log",
                           str(log), "--part", f"{part}/{parts}"], cwd=ROOT,
                          env=release_env(release, HYPOTHESIS_PROFILE="dev", CI="true",
                                          **{CODES_VARIABLE: str(codes_file)}),
                          capture_output=True, text=True, check=False)
    result.seconds = time.monotonic() - start
    result.codes_files.append(codes_file)
    for line in (done.stdout + done.stderr).splitlines():
        say(release, line)
    found = re.search(r"(\d+) files collected", done.stdout)
    result.tests = int(found.group(1)) if found else 0
    result.failed = done.stdout.count("  failed: ")
    if done.returncode:
        result.problems.append(f"tools/sglang_ci.py exited with {done.returncode} "
                               f"(log: {log.relative_to(ROOT)})")
    return result


def run_all(releases: list[Release], jobs: int, profile: str, pytest_args: list[str],
            harness: Release | None) -> list[Result]:
    """``make matrix``: every test on every release (and the harness on the base)."""
    whole = not pytest_args
    full = full_example_releases(read_matrix())

    def job(release: Release) -> Result:
        mine = profile if not whole or release.version in full else "dev"
        result = run(release, pytest_args, mine)
        if whole:
            patched_tree.run_series(result, mine)
            judging.judge_codes(result, judging.produced_codes(REPORTS / f"{release.version}.codes"))
        return result

    with ThreadPoolExecutor(jobs) as pool:
        harness_runs = [pool.submit(run_sglang_ci, harness, k, HARNESS_PARTS)
                        for k in range(1, HARNESS_PARTS + 1) if harness is not None]
        futures = {r.version: pool.submit(job, r) for r in releases}
        results = [futures[r.version].result() for r in releases]
        results.extend(run.result() for run in harness_runs)
    return results


class _Pool:
    """``jobs`` worker threads taking the longest ready job first. ``make test``'s jobs
    become ready in two waves (the patch series at once, the other releases' suites once
    the selection is made), so the series fill the workers while the base release's
    last run and the selection finish, and the long suites never queue behind them."""

    def __init__(self, jobs: int) -> None:
        self._ready: list[tuple[float, int, Callable[[], Result], Future[Result]]] = []
        self._lock = threading.Condition()
        self._closed = False
        self._order = itertools.count()  # the earlier of two equally long jobs first
        self._workers = [threading.Thread(target=self._work, daemon=True) for _ in range(jobs)]
        for worker in self._workers:
            worker.start()

    def submit(self, seconds: float, job: Callable[[], Result]) -> Future[Result]:
        """Queue ``job`` (expected to take ``seconds``)."""
        future: Future[Result] = Future()
        with self._lock:
            heapq.heappush(self._ready, (-seconds, next(self._order), job, future))
            self._lock.notify()
        return future

    def close(self, cancel: bool = False) -> None:
        """No more jobs: the workers end when the queue is empty (at once with ``cancel``:
        the queued jobs are not started, their results raise ``CancelledError``)."""
        with self._lock:
            self._closed = True
            if cancel:
                for *_, future in self._ready:
                    future.cancel()
                self._ready.clear()
            self._lock.notify_all()
        for worker in self._workers:
            worker.join()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._ready and not self._closed:
                    self._lock.wait()
                if not self._ready:
                    return
                _, _, job, future = heapq.heappop(self._ready)
            try:
                future.set_result(job())
            except BaseException as exc:  # the caller's .result() raises it
                future.set_exception(exc)


def run_selected(releases: list[Release], base: Release, jobs: int, profile: str
                 ) -> tuple[list[Result], dict[str, float], list[str]]:
    """``make test``: the base release whole and traced, then on each other release the
    tests :func:`selection.plan` keeps; the tiers' times, and what the summary notes.
    The patch series (one pytest run per release, needing no trace) fill the workers
    meanwhile."""
    tiers: dict[str, float] = {}
    start = time.monotonic()
    shutil.rmtree(DRIVES, ignore_errors=True)
    DRIVES.mkdir(parents=True)
    for release in releases:
        prepare(release)  # before any job: the jobs and the selection read the trees
    parts = _parts(jobs)
    trace_env = {"DSV4_GUARD_DRIVES_DIR": str(DRIVES), "PYTHONPATH": str(ROOT / "tools")}
    others = sorted((r for r in releases if r != base), key=lambda r: Version(r.version))

    def series(release: Release) -> Result:
        result = Result(release, profile=profile)
        patched_tree.run_series(result, profile if release in (base, *others[:1]) else "dev")
        return result

    pool = _Pool(jobs)
    try:
        traced = [pool.submit(1e9 - k, functools.partial(
            run, base, ["-p", "trace_drives", *part], profile, f"{base.version}-{k}", trace_env))
            for k, part in enumerate(parts, 1)]
        patched = {r.version: pool.submit(PATCHED_SECONDS, functools.partial(series, r))
                   for r in [base, *others]}
        base_result = Result(base, profile=profile, label=f"{base.version} (every test, traced)")
        for done in traced:
            base_result.merge(done.result())
        tiers["base release, every test (traced)"] = time.monotonic() - start

        start = time.monotonic()
        # The traced runs' reports (not the patched tree's, whose tests run beside each
        # release's suite, not in it).
        seconds = durations.test_seconds(REPORTS / f"{base.version}-{k}.xml"
                                         for k in range(1, len(parts) + 1))
        traces = selection.read_traces(DRIVES, seconds)
        chosen = selection.plan(traces, base.version, [r.version for r in others],
                                {r.version: sglang_package(r) for r in [base, *others]})
        tiers["selection (digests of every release)"] = time.monotonic() - start
        reasons: dict[str, int] = {}
        for test in chosen.unplaced:
            reasons[traces[test].unplaced] = reasons.get(traces[test].unplaced, 0) + 1
        notes = [f"{len(chosen.unplaced)} of {len(traces)} tests could not be placed and ran "
                 "on every release" + "".join(f"; {n}: {why}" for why, n in sorted(reasons.items()))]
        base_result.problems += selection.undeclared_process_tests(traces)
        base_result.problems += selection.idle_process_entries(traces)
        oldest = selection.first_runs(chosen, [r.version for r in others])

        def runs_of(release: Release) -> list[tuple[str, list[str]]]:
            """(profile, node ids) of each pytest run of ``release``: its process tests
            in one (they wait on children: a run of their own packs the workers
            better), its in-process tests in one or two (the property tests this release
            is the first to run draw the profile's examples, the others dev's)."""
            tests = chosen.runs[release.version]
            full = [t for t in tests if property_test(t) and oldest.get(t) == release.version]
            dev = [t for t in tests if property_test(t) and t not in full]
            rest = [t for t in tests if not property_test(t) and not process_test(t)]
            groups = [("dev", [t for t in tests if process_test(t) and not property_test(t)])]
            groups += [(profile, full + rest), ("dev", dev)] if full else [("dev", rest + dev)]
            return [group for group in groups if group[1]]

        start = time.monotonic()
        suites = [(r, pool.submit(sum(seconds.get(t, 1.0) for t in nodes), functools.partial(
            run, r, nodes, mine, f"{r.version}-{k}"))) for r in others
            for k, (mine, nodes) in enumerate(runs_of(r), 1)]
        results = [base_result]
        for release in others:
            result = Result(release, profile=profile, covered=chosen.covered[release.version])
            for _, done in (s for s in suites if s[0] == release):
                result.merge(done.result())
            results.append(result)
        for result in results:
            result.merge(patched[result.release.version].result())
        tiers["other releases, selected tests (and the patch series)"] = time.monotonic() - start
    except BaseException:  # an error or Ctrl-C: no queued pytest run is started after it
        pool.close(cancel=True)
        raise
    pool.close()
    codes = {r.release.version: judging.runs_codes(r) for r in results}
    for result in results:
        judging.judge_codes(result, judging.counted_codes(result, codes))
    return results, tiers, notes


def run_fast(base: Release, jobs: int) -> list[Result]:
    """``make check-fast``: the in-process tests on the base release, in ``jobs`` runs,
    every process test (``PROCESS_TESTS``) left out."""
    leave_out = [f"--ignore={entry}" if "::" not in entry else f"--deselect={entry}"
                 if entry.count("::") == 2 else f"--deselect={entry}::" for entry in PROCESS_TESTS]
    result = Result(base, profile="dev", label=f"{base.version}, in-process tests")
    with ThreadPoolExecutor(jobs) as pool:
        for done in [pool.submit(run, base, [*leave_out, *part], "dev", f"fast-{k}")
                     for k, part in enumerate(_parts(jobs), 1)]:
            result.merge(done.result())
    return [result]


def _parts(jobs: int) -> list[list[str]]:
    """The test files in ``jobs`` parts, by SGLang's ``auto_partition`` of their
    ``est_time`` (as SGLang's CI splits a suite over runners)."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    if jobs == 1:
        return [files]
    parts = [[r.filename for r in sglang_ci.select(files, sglang_ci.SUITE, (k, jobs))[0]]
             for k in range(1, jobs + 1)]
    dropped = sorted(set(files) - {f for part in parts for f in part})
    if dropped:  # SGLang's harness leaves out a file registered with disabled=...
        raise SystemExit(f"tools/matrix.py: {', '.join(dropped)}: registered with "
                         "register_cpu_ci(..., disabled=...), so no make test run would "
                         "hold it; a tests/test_*.py file is a test file (a helper module "
                         "is named without test_)")
    # More runs than files leave some empty, and pytest given no file runs every file.
    return [part for part in parts if part]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", help="comma-separated subset of matrix.txt")
    parser.add_argument("--jobs", type=int, default=JOBS,
                        help="pytest runs at the same time (default: %(default)s)")
    parser.add_argument("--select", action="store_true",
                        help="every test on the base release, traced; on the others the "
                             "tests whose SGLang code differs (make test)")
    parser.add_argument("--fast", action="store_true",
                        help="the in-process tests on the base release only (make check-fast)")
    parser.add_argument("--prepare-only", action="store_true",
                        help="unzip wheels and build overlays, run nothing")
    parser.add_argument("--durations", action="store_true",
                        help="the 20 slowest tests and every process test's cost, from "
                             "the last run's JUnit reports")
    parser.add_argument("--est-times", action="store_true",
                        help="set each test file's est_time to its seconds in the last "
                             "make test's traced run of the base release")
    parser.add_argument("--script", help="run this Python script per release instead of pytest")
    parser.add_argument("--sglang-ci", action="store_true",
                        help="also run every file on the base release under SGLang's CI "
                             "harness (tools/sglang_ci.py), as more jobs of the pool")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest or --script (after --)")
    args = parser.parse_args(argv)
    if args.durations:
        text, slow = durations.report(sorted(REPORTS.glob("*.xml")))
        print(text)
        return 1 if slow else 0
    if args.est_times:
        if base_version() is None:
            parser.error("--est-times: sglang is not installed in this interpreter (make setup)")
        traced = sorted(REPORTS.glob(f"{base_version()}-[0-9]*.xml"))
        if not traced:
            parser.error(f"--est-times: no report of a traced run of {base_version()} in "
                         f"{REPORTS.relative_to(ROOT)} (run make test first)")
        print("\n".join(durations.write_est_times(traced, ROOT)) or "est_time: all current")
        return 0
    releases = read_matrix()
    if args.releases:
        wanted = [v.strip() for v in args.releases.split(",") if v.strip()]
        if not wanted:
            parser.error(f"--releases: {args.releases!r} names no release (a comma-separated "
                         f"subset of matrix.txt: {', '.join(r.version for r in releases)})")
        unknown = sorted(set(wanted) - {r.version for r in releases})
        if unknown:
            parser.error(f"--releases: {', '.join(unknown)} not in matrix.txt "
                         f"(listed: {', '.join(r.version for r in releases)})")
        releases = [r for r in releases if r.version in wanted]
    if args.jobs < 1:
        parser.error(f"--jobs: {args.jobs} is not a positive number of runs")
    if args.prepare_only:
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(prepare, releases))
        return 0
    if args.script:
        failed = []
        for release in releases:
            print(f"\n===== SGLang {release.version}: {args.script}", flush=True)
            done = subprocess.run([sys.executable, args.script, *args.pytest_args], cwd=ROOT,
                                  env=release_env(release), check=False)
            if done.returncode:
                failed.append(release.version)
        if failed:
            print(f"matrix: {args.script} failed on {', '.join(failed)}")
        return 1 if failed else 0
    profile = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    start = time.monotonic()
    # --durations and --est-times read the reports of the last run only.
    for stale in REPORTS.glob("*"):
        if stale.suffix in (".xml", ".log", ".codes") and stale.name not in (
                "prepare.log", "matrix.log"):  # the Makefile's, open while this runs
            stale.unlink()
    base = next((r for r in read_matrix() if is_base(r)), None)
    if (args.sglang_ci or args.select) and base is None:
        parser.error(f"the venv's sglang {base_version()} is not in matrix.txt")
    tiers, notes = None, None
    if args.fast:
        if base is None:
            parser.error(f"the venv's sglang {base_version()} is not in matrix.txt")
        results = run_fast(base, args.jobs)
    elif args.select:
        if args.pytest_args or base not in releases:
            parser.error("--select runs the whole suite, the base release included")
        results, tiers, notes = run_selected(releases, base, args.jobs, profile)
    else:
        harness = base if args.sglang_ci and base in releases else None
        results = run_all(releases, args.jobs, profile, args.pytest_args, harness)
    table = judging.summary(results, profile, time.monotonic() - start, tiers, notes)
    (WORK / "summary.md").write_text(table + "\n")
    print("\n" + table)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
