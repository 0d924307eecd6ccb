"""How a run of the test matrix is judged and summed up (``tools/matrix.py``).

A release fails when a test fails, errors or skips (a test that cannot run is a failure
here), when a property test that ran reported no statistics or drew fewer examples than
asked (``tools/suite.py``), or when a finding code of the guard's catalogue that the
release can produce was produced by no passing test: ``tests/produced_codes.py`` writes
``<test id>\t<code>`` for every code the guard published during a passing test, and a
test ``make test`` left out counts with what it produced on the release that ran it.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import durations
from release_env import PROFILE_EXAMPLES, ROOT, Result, examples_drawn, examples_exhausted
from suite import examples_asked, property_test

sys.path.insert(0, str(ROOT))

from sglang_dsv4_guard.codes import CODES

__all__ = ["catalogue", "counted_codes", "judge", "judge_codes", "produced_codes",
           "runs_codes", "summary"]


def produced_codes(codes_file: Path) -> dict[str, set[str]]:
    """Codes passing tests produced, by test: ``codes_file``'s lines (conftest.py)."""
    found: dict[str, set[str]] = {}
    if codes_file.exists():
        for line in codes_file.read_text().splitlines():
            test, tab, code = line.partition("\t")
            if tab:
                found.setdefault(test, set()).add(code.strip())
    return found


def catalogue(release: str | None = None) -> list[str]:
    """Every code, or those whose check ``release``'s SGLang code has (``CodeInfo.
    sglang_releases``): a release without a check cannot produce its code."""
    return sorted(c for c, info in CODES.items() if release is None or info.applies_to(release))


def judge(result: Result, junit: Path, log: str, profile: str) -> None:
    """Fold one run's JUnit report and log into ``result``: its tests, and the examples
    of every property test that ran (each must report statistics and draw enough)."""
    ran_properties = set()
    for case in ET.parse(junit).iter("testcase"):
        outcomes = {child.tag for child in case}
        result.tests += 1
        result.failed += bool(outcomes & {"failure", "error"})
        result.skipped += "skipped" in outcomes
        if (prop := property_test(durations.node_id(case))) is not None:
            ran_properties.add(prop)
    if result.skipped:
        result.problems.append(f"{result.skipped} test(s) skipped: a test that cannot run fails")
    drawn = examples_drawn(log)
    result.examples.update(drawn)
    wanted = PROFILE_EXAMPLES.get(profile)
    whole_space = examples_exhausted(log)
    for test, count in drawn.items():
        if test in whole_space:
            continue  # hypothesis drew every example there is
        if (asked := examples_asked(test, profile)) is not None:
            if count < asked:
                result.problems.append(f"{test} drew {count} examples, it asks {asked} "
                                       f"(profile {profile})")
        elif wanted is not None and count < wanted:
            result.problems.append(f"{test} drew {count} examples, profile {profile} asks {wanted}")
    for test in sorted(ran_properties - set(drawn)):
        result.problems.append(f"{test} reported no hypothesis statistics")


def judge_codes(result: Result, produced: dict[str, set[str]]) -> None:
    """Every code ``result``'s release owes was produced by a passing test (``produced``:
    the codes of the tests that count for it, by test)."""
    found = set().union(*produced.values()) if produced else set()
    result.codes_missing = sorted(set(catalogue(result.release.version)) - found)
    if result.codes_missing:
        result.problems.append("no passing test produced " + ", ".join(result.codes_missing))
    if phaseless := sorted(c for c in found if c.endswith(" (no when)")):  # produced_codes
        result.problems.append("produced without a when (phase and effect): "
                               + ", ".join(phaseless))


def counted_codes(result: Result, codes: dict[str, dict[str, set[str]]]) -> dict[str, set[str]]:
    """The codes that count for ``result``'s release, by test: those its own runs'
    passing tests produced, and for each test it left out, what that test produced on
    the release that ran it (``codes``: by release, by test)."""
    produced = dict(codes.get(result.release.version, {}))
    for test, where in result.covered.items():
        produced[test] = codes.get(where, {}).get(test, set())
    return produced


def runs_codes(result: Result) -> dict[str, set[str]]:
    """The codes ``result``'s runs recorded, by test."""
    found: dict[str, set[str]] = {}
    for path in result.codes_files:
        for test, codes in produced_codes(path).items():
            found.setdefault(test, set()).update(codes)
    return found


def summary(results: list[Result], profile: str, total: float,
            tiers: dict[str, float] | None = None, notes: list[str] | None = None) -> str:
    """The table ``make test`` and ``make matrix`` print."""
    lines = [f"SGLang test matrix (hypothesis profile {profile}); {total:.0f} s in all", ""]
    if tiers or notes:
        lines += [f"- {name}: {seconds:.0f} s" for name, seconds in (tiers or {}).items()]
        lines += [f"- {note}" for note in notes or []] + [""]
    lines += ["| release | tests run | left out (same code ran on) | failed | skipped "
              "| property examples | codes produced | job seconds (share) | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    spent = sum(r.seconds for r in results) or 1.0
    for r in results:
        codes = ("not checked (the base release's pytest run is)" if "harness" in r.label
                 else "not checked (partial run)" if r.codes_missing is None
                 else "missing " + ", ".join(r.codes_missing) if r.codes_missing
                 else f"all {len(catalogue(r.release.version))} of this release")
        verdict = "ok" if r.ok else "FAILED: " + "; ".join(r.problems)
        where: dict[str, int] = {}
        for covering in r.covered.values():
            where[covering] = where.get(covering, 0) + 1
        left = ", ".join(f"{n} ({w})" for w, n in sorted(where.items())) or "0"
        tests = f"{r.tests} files" if "harness" in r.label else str(r.tests)
        examples = ", ".join(f"{n} x{c}" for c, n in sorted(_counts(r.examples).items())) or "-"
        lines.append(f"| {r.label or r.release.version} | {tests} | {left} | {r.failed} "
                     f"| {r.skipped} | {examples} | {codes} | {r.seconds:.0f} ({r.seconds / spent:.0%}) "
                     f"| {verdict} |")
    return "\n".join(lines)


def _counts(examples: dict[str, int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for n in examples.values():
        counts[n] = counts.get(n, 0) + 1
    return counts
