"""Run the whole test suite against every SGLang release in ``matrix.txt``.

One environment serves every release: the venv holds the base release (installed by
``make setup``); each other release is its wheel unzipped into ``.matrix/<release>/site``
plus an overlay of the libraries it pins (``.matrix/overlays/<hash>``, shared by releases
with the same pins), both put first on ``PYTHONPATH``. Each release
gets its own pytest process, JUnit report, log and codes file under ``.matrix/reports``;
``--jobs`` releases (default: one per CPU) are prepared and run at the same time, each
output line prefixed with its release.

Tests that spawn fresh SGLang interpreters (``PROCESS_TESTS``) exercise process machinery:
SGLang's plug-in loader, its hook registry, its CI harness, logging, spawn pools. What the
wrapped functions do on each release is tested in-process on every release; a process
test runs once per distinct version of the SGLang code it drives (digested from each
release's files) and is left out, named in the table, on releases with the same code.
``--sglang-ci`` runs every file on the base release with SGLang's own CI harness
(``tools/sglang_ci.py``) as more jobs of the pool; that run counts for the base's
code, and pytest takes the rest, oldest release first. On the base release pytest then
runs only what the harness cannot judge, the property tests' drawn examples; the codes
passing tests produced are recorded under both runners (``tests/produced_codes.py``).
Property tests draw the profile's examples on the oldest, the middle and the base
release of a whole run, the dev profile's on the others (:func:`full_example_releases`).

A release fails when a test fails, errors or skips (a test that cannot run is a failure
here), when a property test in ``PROPERTY_TESTS`` reported no statistics or drew fewer
examples than the hypothesis profile asks for, or when some finding code in the guard's
catalogue was not produced by a passing test (tests/conftest.py writes every code the
guard published during a passing test into ``DSV4_GUARD_CODES_FILE``). The summary
table is printed and written to ``.matrix/summary.md``.

Usage: ``python tools/matrix.py [--releases 0.5.16,0.5.23] [--jobs 2] [--prepare-only]
[--sglang-ci] [--script benchmarks/bench_overhead.py] [-- ARGS]``
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import patched_tree
from packaging.version import Version
from release_env import (
    PROFILE_EXAMPLES,
    ROOT,
    WORK,
    Release,
    Result,
    base_version,
    examples_drawn,
    examples_exhausted,
    is_base,
    prepare,
    read_matrix,
    release_env,
    say,
    sglang_package,
)

# Every property test (module::test): a full run without statistics from one of them fails.
PROPERTY_TESTS = ("test_parity_property::TestParity::test_guard_agrees_with_sglang",
                  "test_mori::TestMoriParity::test_parity",
                  "test_autoshare::TestAutoshareHidesNothing::test_other_rejections_unchanged",
                  "test_check_fix_property::TestCheckFixProperty::test_fixed_lines_pass_or_say_no_flag_fix",
                  "test_fixes_runtime::TestFlagsAccepted::test_every_flag_accepted",
                  "test_pd_conditions::TestParityWithSGLang::test_runner_agrees_with_one_real_call",
                  "test_pd_transfer::TestSendExtraParity::test_parity",
                  "test_pd_contract_property::TestContractAgreesWithSGLang::test_rows_agree_with_sglang",
                  "test_peers::TestNixlRegistrationParity::test_parity",
                  "test_peers::TestMooncakeRegistrationParity::test_parity",
                  "test_mori::TestMoriRegistrationParity::test_parity",
                  "test_first_contact_runtime::TestFirstContactParity::test_parity")
# Property tests that draw a fixed, small number of examples whatever the profile (each
# example costs several SGLang resolutions), with that number.
FIXED_EXAMPLES = {
    "test_check_fix_property::TestCheckFixProperty::test_fixed_lines_pass_or_say_no_flag_fix": 12,
    "test_pd_contract_property::TestContractAgreesWithSGLang::test_rows_agree_with_sglang": 20,
    "test_peers::TestNixlRegistrationParity::test_parity": 40,
    "test_peers::TestMooncakeRegistrationParity::test_parity": 30,
    "test_mori::TestMoriRegistrationParity::test_parity": 24,
    "test_first_contact_runtime::TestFirstContactParity::test_parity": 25}
CODES_VARIABLE = "DSV4_GUARD_CODES_FILE"
# Jobs SGLang's auto_partition splits the harness run (every file, one interpreter each,
# ~40 minutes of CPU) into, so that it spreads over both job slots like the releases.
HARNESS_PARTS = 4
# Test classes that spawn fresh SGLang interpreters (and three in-process ones whose
# subject is the guard's own tools, marked below), by the SGLang code their process
# machinery drives: a path under the ``sglang`` package, or ``path::name`` for one
# top-level function or class of it (SGLang's big modules change every release; the
# function used may not; a change only in what it calls is not seen). An empty tuple:
# only the guard's own code. What their children get from the wrapped functions is
# asserted in-process on every release instead: the pool pairs they use by
# test_process_fixtures.py, the MORI peer by test_mori.TestMoriReporting, the host
# verdicts TestHostInAFreshProcess acts on by test_host.TestJudgedByCode.
_LOADER = ("srt/plugins/__init__.py", "srt/plugins/hook_registry.py")
PROCESS_TESTS: dict[str, tuple[str, ...]] = {
    **{f"tests/test_report_once.py::{name}": _LOADER for name in (
        "TestFingerprintAndMarkers", "TestHostileMarkerDirectory", "TestAtExit",
        "TestSpawnedSchedulers")},
    **{f"tests/test_launch_identity.py::{name}": _LOADER for name in (
        "TestLaunchIdentityRule", "TestSweep", "TestPreStartedPool", "TestTwoPidNamespaces",
        "TestManyStaleLaunches", "TestTwoServersRunningFromOneLauncher")},
    "tests/test_sglang_loader.py::TestLoadPlugins": _LOADER,
    **{f"tests/test_scheduler_handler.py::{name}": (
        "srt/managers/scheduler.py::run_scheduler_process",) for name in (
        "TestSchedulerPrintsTheReportOnce", "TestKilledLaunchStillPrintsTheReport")},
    "tests/test_host_hooks.py::TestHookRegistry": _LOADER,
    # Why no connector method is registered with SGLang's registry: what its loader and
    # registry do with such a hook (the scheduler's own imports were read on 0.5.16,
    # 0.5.18, 0.5.21 and 0.5.23: none imports the NIXL, Mooncake or MORI connector).
    "tests/test_host_hooks.py::TestConnectorsStayLazy": _LOADER,
    "tests/test_plugin_example.py::TestExamplePlugin": _LOADER,
    "tests/test_host.py::TestHostInAFreshProcess": _LOADER,
    "tests/test_host_sources.py::TestUnreadableSourceInAFreshProcess": _LOADER,
    # SGLANG_PLUGINS is read by the loader (the same code in every release).
    "tests/test_doctor_plugins.py::TestDoctorReadsSglangPlugins": _LOADER,
    "tests/test_json_logs.py::TestJsonThroughSGLangLoggingConfig": (
        "srt/utils/common.py::configure_logger",),
    "tests/test_harness.py::TestMoriImportRetried": ("srt/disaggregation/mori/conn.py",),
    "tests/test_mori.py::TestLazyPatch": ("srt/disaggregation/mori/conn.py",),
    "tests/test_harness.py::TestSkipsFailInCi": ("test/test_utils.py::CustomTestCase",
                                                 "srt/utils/common.py::retry"),
    "tests/test_errors_and_inputs.py::TestErrorsTravel": (),
    "tests/test_errors_and_inputs.py::TestUnpicklablePluginValueTravels": (),
    "tests/test_doctor_isolation.py::TestDoctorIsolatesPlugins": (),
    # What SGLang's resolution may fetch or write: the whole of ServerArgs and ModelConfig.
    "tests/test_check_process.py::TestCheckProcessTouchesNothing": (
        "srt/server_args.py", "srt/configs/model_config.py",
        "srt/arg_groups/serving_hook.py::handle_crash_dump_env",
        "srt/arg_groups/model_path_hook.py::handle_modelscope_paths",
        "srt/utils/hf_transformers_utils.py"),
    "tests/test_check_process.py::TestDoctorProcessTouchesNothing": _LOADER,
    # doctor in a fresh interpreter: SGLang's loader; the series line is the guard's own
    # (each release's series is asserted in-process by TestPatchesCommand everywhere).
    "tests/test_patch_series.py::TestDoctorPatchesLine": _LOADER,
    # In-process, but their subject is the guard's own tools: the layering tool run as a
    # command, and SGLang's collect_tests/auto_partition splitting the harness run.
    "tests/test_layers.py::TestPackageLayers": (),
    "tests/test_matrix_tool.py::TestHarnessParts": ("test/ci/ci_register.py",
                                                     "test/ci/ci_utils.py::run_unittest_files"),
    # The check child's import path, time limit and SIGTERM: the guard's own code.
    "tests/test_check_process.py::TestCheckChildLifecycle": (),
    # The warnings SGLang's import emits once per process (check keeps them under "import").
    "tests/test_check_output.py::TestImportWarningsInAFreshProcess": (
        "srt/layers/quantization/awq/awq.py", "srt/layers/quantization/gguf.py"),
    # The check child dies at the decode's "No IB devices specified" warning (logged by
    # ServerArgs' Mooncake validation: server_args.py, later arg_groups/validation_hook.py).
    # What is tested is the guard's child and parent (a child that dies mid-check keeps
    # what it captured); SGLang only supplies a log line to die on.
    "tests/test_check_output.py::TestChildDiedKeepsOutput": (),
}


def code_digest(package: Path, drives: tuple[str, ...]) -> str:
    """A digest of the code ``drives`` names in ``package`` (see ``PROCESS_TESTS``):
    ``ast.dump`` of the file or of one top-level definition (comments and formatting do
    not count); absent ones count as absent."""
    digest = hashlib.sha256()
    for item in drives:
        rel, _, name = item.partition("::")
        path = package / rel
        if not path.is_file():
            digest.update(f"{item}\0absent\n".encode())
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))  # code, not its formatting
        if not name:
            digest.update(f"{item}\0{ast.dump(tree)}\n".encode())
            continue
        found = [ast.dump(node) for node in tree.body if getattr(node, "name", None) == name]
        digest.update(f"{item}\0{found[-1] if found else 'absent'}\n".encode())
    return digest.hexdigest()


def plan(releases: list[Release], packages: dict[str, Path],
         harness: Release | None = None) -> dict[str, dict[str, str]]:
    """Per release, the process tests it skips and where the same code runs.

    Releases are taken oldest first; each process test runs on the first release with
    each distinct digest of the code it drives (``packages``: release -> its ``sglang``).
    With ``harness`` (the base release, every file run by SGLang's CI harness), that
    run counts first: pytest runs a process test only on code the harness did not.
    """
    skips: dict[str, dict[str, str]] = {r.version: {} for r in releases}
    for test, drives in PROCESS_TESTS.items():
        first: dict[str, str] = {}
        if harness is not None:
            first[code_digest(packages[harness.version], drives)] = f"{harness.version} " \
                "(SGLang's CI harness)"
        for release in sorted(releases, key=lambda r: Version(r.version)):
            key = code_digest(packages[release.version], drives)
            if key in first:
                skips[release.version][test] = first[key]
            else:
                first[key] = release.version
    return skips


def _produced_codes(codes_file: Path) -> set[str]:
    """Codes passing tests produced: the second column of ``codes_file`` (conftest.py)."""
    if not codes_file.exists():
        return set()
    return {line.split("\t")[1].strip() for line in codes_file.read_text().splitlines()
            if "\t" in line}


def catalogue(release: str | None = None) -> list[str]:
    """Every code, or those whose check ``release``'s SGLang code has (``CodeInfo.
    sglang_releases``): a release without a check cannot produce its code."""
    from sglang_dsv4_guard.codes import CODES

    return sorted(c for c, info in CODES.items() if release is None or info.applies_to(release))


def run(release: Release, pytest_args: list[str], profile: str,
        skips: dict[str, str] | None = None, only: list[str] | None = None) -> Result:
    """Prepare ``release``, run pytest for it in its own process and judge the outcome;
    ``skips``: the process tests left out (each ran on the named release, same code);
    ``only``: the whole suite's judgement on just these node ids (the base release's
    property tests, when SGLang's harness runs every file on it: :func:`main`)."""
    result = Result(release, covered=dict(skips or {}), profile=profile)
    # A class's node id and "::" after it: a prefix would also drop TestXSomething.
    leave_out = [f"--ignore={t}" if "::" not in t else f"--deselect={t}::"
                 for t in result.covered]
    out = WORK / "reports"
    out.mkdir(parents=True, exist_ok=True)
    junit, log_path = out / f"{release.version}.xml", out / f"{release.version}.log"
    codes_file = out / f"{release.version}.codes"
    for stale in (junit, codes_file):  # never judge a run by an earlier run's files
        stale.unlink(missing_ok=True)
    env = release_env(release, HYPOTHESIS_PROFILE=profile, **{CODES_VARIABLE: str(codes_file)})
    command = [sys.executable, "-m", "pytest", f"--junitxml={junit}",
               "--hypothesis-show-statistics", *leave_out, *(only or []), *pytest_args]
    say(release, f"===== SGLang {release.version}: {' '.join(command[2:])}")
    start = time.monotonic()
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc, \
            log_path.open("w") as log:
        assert proc.stdout is not None
        captured = []
        for line in proc.stdout:
            say(release, line)
            log.write(line)
            captured.append(line)
    result.seconds = time.monotonic() - start
    if proc.returncode != 0:
        result.problems.append(f"pytest exited with {proc.returncode}")
    if not junit.exists():
        result.problems.append("no JUnit report written")
        return result
    judge(result, junit, "".join(captured), profile, full=not pytest_args)
    if not pytest_args and only is None:
        judge_codes(result, [codes_file])
    return result


def judge(result: Result, junit: Path, log: str, profile: str, full: bool) -> None:
    """Fill ``result`` from one run's JUnit report and log.

    A partial run (``-k``, a file) cannot be expected to run every property test, so
    that is judged on full runs only (and the codes, by :func:`judge_codes`)."""
    for case in ET.parse(junit).iter("testcase"):
        outcomes = {child.tag for child in case}
        result.tests += 1
        result.failed += bool(outcomes & {"failure", "error"})
        result.skipped += "skipped" in outcomes
    if result.skipped:
        result.problems.append(f"{result.skipped} test(s) skipped: a test that cannot run fails")
    result.examples = examples_drawn(log)
    wanted = PROFILE_EXAMPLES.get(profile)
    whole_space = examples_exhausted(log)
    for test, count in result.examples.items():
        if test in whole_space:
            continue  # hypothesis drew every example there is
        if test in FIXED_EXAMPLES:
            if count < FIXED_EXAMPLES[test]:
                result.problems.append(f"{test} drew {count} examples, it asks "
                                       f"{FIXED_EXAMPLES[test]}")
        elif wanted is not None and count < wanted:
            result.problems.append(f"{test} drew {count} examples, profile {profile} asks {wanted}")
    if full:
        for test in PROPERTY_TESTS:
            if test not in result.examples:
                result.problems.append(f"{test} reported no hypothesis statistics")


def judge_codes(result: Result, codes_files: list[Path]) -> None:
    """Every code ``result``'s release owes was produced by a passing test, in one of
    ``codes_files`` (pytest's, and SGLang's harness's on the base release)."""
    produced: set[str] = set().union(*(_produced_codes(f) for f in codes_files))
    result.codes_missing = sorted(set(catalogue(result.release.version)) - produced)
    if result.codes_missing:
        result.problems.append("no passing test produced " + ", ".join(result.codes_missing))


def _examples_cell(examples: dict[str, int], profile: str = "") -> str:
    if not examples:
        return "-"
    counts = sorted(set(examples.values()))
    where = f" (profile {profile})" if profile else ""
    if len(counts) == 1:
        return f"{len(examples)} properties, {counts[0]} each{where}"
    return ", ".join(f"{name} {n}" for name, n in examples.items()) + where


def _process_cell(r: Result) -> str:
    if r.label:
        return "all (SGLang's runner)"
    if r.codes_missing is None:
        return "- (partial run)"
    if not r.covered:
        return f"all {len(PROCESS_TESTS)}"
    by: dict[str, list[str]] = {}
    for test, where in r.covered.items():
        by.setdefault(where, []).append(test.removeprefix("tests/"))
    ran = len(PROCESS_TESTS) - len(r.covered)
    return f"{ran} of {len(PROCESS_TESTS)}; the others' declared SGLang code ran on " + "; ".join(
        f"{where}: {', '.join(sorted(tests))}" for where, tests in sorted(by.items()))


def summary(results: list[Result], profile: str, total: float) -> str:
    lines = [
        f"SGLang test matrix (hypothesis profile {profile}); {total:.0f} s in all",
        "",
        "| release | tests | failed | skipped | property examples | codes produced "
        "| process tests run | seconds | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        codes = ("recorded; counted on the base release's row" if r.label
                 else "not checked (partial run)" if r.codes_missing is None
                 else "missing " + ", ".join(r.codes_missing) if r.codes_missing
                 else f"all {len(catalogue(r.release.version))} of this release")
        verdict = "ok" if r.ok else "FAILED: " + "; ".join(r.problems)
        tests = f"{r.tests} files" if r.label else str(r.tests)
        lines.append(f"| {r.label or r.release.version} | {tests} | {r.failed} | {r.skipped} "
                     f"| {_examples_cell(r.examples, r.profile)} | {codes} | {_process_cell(r)} "
                     f"| {r.seconds:.0f} | {verdict} |")
    return "\n".join(lines)


def harness_codes_file(part: int) -> Path:
    """Where SGLang's harness part ``part`` records the codes its passing tests produced
    (``tests/produced_codes.py``, through unittest's result)."""
    return WORK / "reports" / f"sglang-ci-{part}.codes"


def property_node_ids() -> list[str]:
    """``PROPERTY_TESTS`` as pytest node ids."""
    return [f"tests/{test.replace('::', '.py::', 1)}" for test in PROPERTY_TESTS]


def full_example_releases(releases: list[Release]) -> set[str]:
    """The releases whose property tests draw the profile's examples on a whole run: the
    oldest, the middle and the base release of ``matrix.txt`` (issue 5's bar: 2,000
    examples each on at least 0.5.16, 0.5.20 and 0.5.23). The others draw the dev
    profile's: the same properties on every release, at a tenth of the CPU. The code
    under test differs in every release, so a digest (as for ``PROCESS_TESTS``) would
    pick them all."""
    ordered = sorted(releases, key=lambda r: Version(r.version))
    chosen = {ordered[0].version, ordered[len(ordered) // 2].version} if ordered else set()
    return chosen | {r.version for r in releases if is_base(r)}


def run_sglang_ci(release: Release, part: int = 1, parts: int = 1) -> Result:
    """Every test file on ``release`` (the base) under SGLang's own CI harness; with
    ``parts`` > 1, the ``part``-th of SGLang's ``auto_partition`` of them."""
    share = f" {part}/{parts}" if parts > 1 else ""
    result = Result(release, label=f"{release.version}, SGLang's CI harness{share}")
    log = WORK / "reports" / (f"sglang-ci-{part}.log" if parts > 1 else "sglang-ci.log")
    codes_file = harness_codes_file(part)
    codes_file.unlink(missing_ok=True)  # never judge a run by an earlier run's file
    say(release, f"===== SGLang's CI harness{share}: tools/sglang_ci.py (collect_tests, "
                 "auto_partition, run_unittest_files)")
    start = time.monotonic()
    # The dev profile: example counts are judged on this release's pytest run; this job
    # shows that every file runs under SGLang's runner, and runs the process tests. CI
    # set: a test that cannot run fails here too (GuardTestCase), where no JUnit report
    # counts skips (the base release's tests are judged here alone).
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "sglang_ci.py"), "--log",
                           str(log), "--part", f"{part}/{parts}"], cwd=ROOT,
                          env=release_env(release, HYPOTHESIS_PROFILE="dev", CI="true",
                                          **{CODES_VARIABLE: str(codes_file)}),
                          capture_output=True, text=True, check=False)
    result.seconds = time.monotonic() - start
    for line in (done.stdout + done.stderr).splitlines():
        say(release, line)
    found = re.search(r"(\d+) files collected", done.stdout)
    result.tests = int(found.group(1)) if found else 0
    result.failed = done.stdout.count("  failed: ")
    if done.returncode:
        result.problems.append(f"tools/sglang_ci.py exited with {done.returncode} "
                               f"(log: {log.relative_to(ROOT)})")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", help="comma-separated subset of matrix.txt")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="releases prepared and run at the same time (default: %(default)s)")
    parser.add_argument("--prepare-only", action="store_true",
                        help="unzip wheels and build overlays, run nothing")
    parser.add_argument("--script", help="run this Python script per release instead of pytest")
    parser.add_argument("--sglang-ci", action="store_true",
                        help="also run every file on the base release under SGLang's CI "
                             "harness (tools/sglang_ci.py), as more jobs of the pool")
    parser.add_argument("--harness-parts", type=int, default=HARNESS_PARTS,
                        help="jobs SGLang's auto_partition splits the harness run into "
                             "(default: %(default)s)")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest or --script (after --)")
    args = parser.parse_args(argv)
    releases = read_matrix()
    if args.releases:
        wanted = [v.strip() for v in args.releases.split(",") if v.strip()]
        unknown = sorted(set(wanted) - {r.version for r in releases})
        if unknown:
            parser.error(f"--releases: {', '.join(unknown)} not in matrix.txt "
                         f"(listed: {', '.join(r.version for r in releases)})")
        releases = [r for r in releases if r.version in wanted]
    if args.jobs < 1:
        parser.error(f"--jobs: {args.jobs} is not a positive number of releases")
    if args.harness_parts < 1:
        parser.error(f"--harness-parts: {args.harness_parts} is not a positive number")
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
    whole = not args.pytest_args  # the whole suite: also the patch series (patches/)
    base = next((r for r in read_matrix() if is_base(r)), None)
    if args.sglang_ci and base is None:
        parser.error(f"--sglang-ci: the venv's sglang {base_version()} is not in matrix.txt")
    # A --releases subset without the base release is a quick loop: no harness run.
    harness = base if args.sglang_ci and base in releases else None
    packages = {r.version: sglang_package(r) for r in {*releases, *filter(None, [harness])}}
    skips = (plan(releases, packages, harness) if whole
             else {r.version: {} for r in releases})
    # On a whole run, the lighter profile where the full one is not asked (the quick loops
    # keep the profile they name); SGLang's harness runs every file on the base release,
    # so its pytest run is only what the harness cannot judge: the property tests' drawn
    # examples (the codes passing tests produced are recorded by both runners).
    full = full_example_releases(read_matrix())

    def job(release: Release) -> Result:
        mine = profile if not whole or release.version in full else "dev"
        only = property_node_ids() if whole and release == harness else None
        result = run(release, args.pytest_args, mine, skips[release.version], only)
        if whole:
            patched_tree.run_series(result, mine)
        return result

    # Longest-processing-time first, so that both job slots end together: the harness
    # parts (each about a release's run or longer), then the releases by how many process
    # tests they run (each spawns interpreters; the plainest releases fill the end).
    order = sorted(releases, key=lambda r: len(skips[r.version]))
    parts = args.harness_parts
    with ThreadPoolExecutor(args.jobs) as pool:
        harness_runs = [pool.submit(run_sglang_ci, harness, k, parts)
                        for k in range(1, parts + 1) if harness is not None]
        futures = {r.version: pool.submit(job, r) for r in order}
        results = [futures[r.version].result() for r in releases]
        results.extend(run.result() for run in harness_runs)
    if harness is not None and whole:
        base_result = results[releases.index(harness)]
        judge_codes(base_result, [WORK / "reports" / f"{harness.version}.codes",
                                  *(harness_codes_file(k) for k in range(1, parts + 1))])
    table = summary(results, profile, time.monotonic() - start)
    (WORK / "summary.md").write_text(table + "\n")
    print("\n" + table)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
