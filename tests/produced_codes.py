"""The finding codes passing tests produced, for ``tools/matrix.py``.

``tools/matrix.py`` names a file in ``DSV4_GUARD_CODES_FILE``; every code in a report the
guard built during a test that passed is appended to it (``<test id>\\t<code>``), so the
matrix counts the codes tests produced, not test names. A built-in finding without a
``when`` (its phase and effect) is written ``<code> (no when)``, which the matrix refuses
(``tools/judging.py``). Every report (a wrapper's, check's, testing's) is built by
``Report.of``. Two runners feed it: pytest
(``conftest.py``) and SGLang's CI harness, where each file runs as ``python3 <file>``
under unittest and no conftest runs (``helpers.py`` calls :func:`under_unittest`).
"""

from __future__ import annotations

import os
import sys
import unittest
from pathlib import Path
from typing import Any

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")

CODES_FILE = os.environ.get("DSV4_GUARD_CODES_FILE")
NO_WHEN = "%s (no when)"  # tools/judging.py reads this mark
_produced: list[str] = []
_runner: str | None = None  # who reports each test's end: "pytest" or "unittest"


def record(runner: str) -> bool:
    """Collect the codes of every report built from now on (once per process), for
    ``runner`` to flush at each test's end; ``False`` when no codes file is named or
    another runner records them."""
    global _runner
    if not CODES_FILE or _runner not in (None, runner):
        return False
    if _runner is None:
        from sglang_dsv4_guard.findings import Report

        build = Report.of.__func__  # type: ignore[attr-defined]

        def recording_of(cls: type[Report], *args: object, **kwargs: object) -> Report:
            report: Report = build(cls, *args, **kwargs)
            _produced.extend(f.code if f.when or f.origin != "builtin" else NO_WHEN % f.code
                             for f in report.findings)
            return report

        Report.of = classmethod(recording_of)  # type: ignore[method-assign, assignment]
        _runner = runner
    return True


def test_started() -> None:
    """A test begins: what earlier tests produced is not its."""
    _produced.clear()


def test_ended(test_id: str, passed: bool) -> None:
    """A test ended: a passing one's codes go to the file."""
    if passed and _produced and CODES_FILE:
        with open(CODES_FILE, "a", encoding="utf-8") as out:
            out.writelines(f"{test_id}\t{code}\n" for code in sorted(set(_produced)))
    _produced.clear()


def under_unittest() -> None:
    """Under SGLang's harness (unittest, no pytest): record through unittest's result.

    ``startTest`` and ``addSuccess`` of :class:`unittest.TestResult` are wrapped once per
    process; ``CustomTestCase``'s retries happen inside one test, so a test that passed on
    its retry counts once, with what its passing attempt produced too."""
    if not record("unittest") or getattr(unittest.TestResult, "_dsv4_codes", False):
        return
    start, success = unittest.TestResult.startTest, unittest.TestResult.addSuccess

    def startTest(self: unittest.TestResult, test: unittest.TestCase) -> None:
        test_started()
        start(self, test)

    def addSuccess(self: unittest.TestResult, test: unittest.TestCase) -> None:
        test_ended(test.id().replace("__main__", Path(sys.argv[0]).stem, 1), passed=True)
        success(self, test)

    patched: dict[str, Any] = {"startTest": startTest, "addSuccess": addSuccess,
                               "_dsv4_codes": True}
    for name, value in patched.items():
        setattr(unittest.TestResult, name, value)
