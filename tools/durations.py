"""Where the suite's time goes, from the JUnit reports of the last run (``.matrix/reports``).

``python tools/matrix.py --durations`` prints the 20 slowest tests (set-up, call and
tear-down together, as JUnit counts them) and what each process test class costs
(``PROCESS_TESTS`` in ``tools/suite.py``), summed over the runs that ran it. A test over
``SLOW`` seconds that is not a process test is named: it is made faster, or it starts
interpreters and belongs in ``PROCESS_TESTS`` with its reason.

``python tools/matrix.py --est-times`` sets each test file's ``est_time`` (its
``register_cpu_ci`` call) to what its tests took in the last ``make test``'s traced runs
of the base release, plus one cold interpreter start (what SGLang's harness adds, under
``make matrix``): ``make test`` splits that run by ``est_time`` (SGLang's
``auto_partition``), so the parts end together only while the values are the files' times.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from suite import PROCESS_TESTS, process_test

__all__ = ["COLD_START", "SLOW", "node_id", "report", "test_seconds", "write_est_times"]

SLOW = 20.0  # seconds: a test slower than this is a process test or is made faster


def node_id(case: ET.Element) -> str:
    """A JUnit ``testcase``'s pytest node id (``tests/test_x.py::Class::test``)."""
    module, _, cls = (case.get("classname") or "").rpartition(".")
    return f"{module.replace('.', '/')}.py::{cls}::{case.get('name')}"


def _cases(paths: Iterable[Path]) -> list[tuple[str, str, float]]:
    """(run, node id, seconds) of every test case in the reports at ``paths``."""
    cases: list[tuple[str, str, float]] = []
    for path in paths:
        try:
            root = ET.parse(path)
        except (OSError, ET.ParseError):
            continue
        cases.extend((path.stem, node_id(case), float(case.get("time") or 0.0))
                     for case in root.iter("testcase"))
    return cases


def test_seconds(paths: Iterable[Path]) -> dict[str, float]:
    """Seconds per node id in the reports at ``paths`` (summed where a test ran twice)."""
    found: dict[str, float] = {}
    for _, test, seconds in _cases(paths):
        found[test] = found.get(test, 0.0) + seconds
    return found


def report(paths: Iterable[Path]) -> tuple[str, list[str]]:
    """The slowest tests and the process tests' cost, as text, and the in-process tests
    slower than :data:`SLOW` (each is a fault: made faster, or a declared process test)."""
    cases = _cases(paths)
    if not cases:
        return "durations: no JUnit report in .matrix/reports (run make test or make matrix)", []
    lines = [f"The 20 slowest of {len(cases)} test runs:"]
    for run, test, seconds in sorted(cases, key=lambda c: -c[2])[:20]:
        kind = "process test" if process_test(test) else "in-process"
        lines.append(f"  {seconds:7.1f} s  {test}  [{run}; {kind}]")
    per_class: dict[str, tuple[float, int]] = {}
    for _, test, seconds in cases:
        entry = process_test(test)
        if entry:
            total, runs = per_class.get(entry, (0.0, 0))
            per_class[entry] = (total + seconds, runs + 1)
    lines.append("Process tests (PROCESS_TESTS), summed over the runs:")
    for entry, (total, runs) in sorted(per_class.items(), key=lambda e: -e[1][0]):
        lines.append(f"  {total:7.1f} s  {runs:3d} test runs  {entry}: {PROCESS_TESTS[entry].why}")
    slow = sorted({test for _, test, seconds in cases if seconds > SLOW and not process_test(test)})
    lines.append(f"In-process tests slower than {SLOW:.0f} s: "
                 + (", ".join(slow) if slow else "none"))
    return "\n".join(lines), slow


_EST_TIME = re.compile(r"(register_cpu_ci\(\s*est_time\s*=\s*)(\d+(?:\.\d*)?)")
# What SGLang's harness adds to a file's tests: its own interpreter, SGLang's import
# (tests/test_harness.py holds every est_time to at least this).
COLD_START = 30


def write_est_times(paths: Iterable[Path], root: Path) -> list[str]:
    """Set each test file's ``est_time`` under ``root`` to its tests' seconds in the
    reports at ``paths`` (rounded up) plus :data:`COLD_START`; what changed, a line a
    file, and a line for each measured file whose registry could not be found."""
    per_file: dict[str, float] = {}
    for test, seconds in test_seconds(paths).items():
        name = test.partition("::")[0]
        per_file[name] = per_file.get(name, 0.0) + seconds
    changed = []
    for name, seconds in sorted(per_file.items()):
        path = root / name
        if not path.is_file():
            changed.append(f"{name}: measured, but no such file under {root}")
            continue
        text = path.read_text(encoding="utf-8")
        found = _EST_TIME.search(text)
        wanted = COLD_START + math.ceil(seconds)
        if found is None:
            changed.append(f"{name}: no register_cpu_ci(est_time=...) call, left alone")
            continue
        if float(found.group(2)) == wanted:
            continue
        path.write_text(text[:found.start(2)] + str(wanted) + text[found.end(2):],
                        encoding="utf-8")
        changed.append(f"{name}: est_time {found.group(2)} -> {wanted}")
    return changed
