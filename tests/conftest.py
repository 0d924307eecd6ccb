"""pytest-only additions. Everything a test needs to run (hypothesis profiles, the
clean-state checks) lives in ``helpers.py`` and ``GuardTestCase``, because SGLang's CI
runs each file as ``python3 <file>``, where this conftest does not run."""

from __future__ import annotations

import os

import pytest

# tests/patched_tree/ runs only on a patched copy of SGLang, which tools/patched_tree.py
# builds and names in DSV4_GUARD_PATCHED_TREE (make test runs it for every release).
collect_ignore = [] if os.environ.get("DSV4_GUARD_PATCHED_TREE") else ["patched_tree"]


# tools/matrix.py names a file here; every code in a report the guard built during a
# test that passed is appended to it ("<test id>\t<code>"), so the matrix counts the
# codes tests produced, not test names. Every report (a wrapper's, check's, testing's)
# is built by Report.of.
CODES_FILE = os.environ.get("DSV4_GUARD_CODES_FILE")
_produced: list[str] = []


def _record_produced_codes() -> None:
    from sglang_dsv4_guard.findings import Report

    build = Report.of.__func__  # type: ignore[attr-defined]

    def recording_of(cls: type[Report], *args: object, **kwargs: object) -> Report:
        report: Report = build(cls, *args, **kwargs)
        _produced.extend(report.codes)
        return report

    Report.of = classmethod(recording_of)  # type: ignore[method-assign, assignment]


if CODES_FILE:
    _record_produced_codes()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """In CI a test that cannot run fails: a skip is turned into a failure there."""
    report = yield
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which counts as a failure: {report.longrepr}"
    if CODES_FILE and report.when == "setup":
        _produced.clear()
    elif CODES_FILE and report.when == "call":
        if report.passed and _produced:
            with open(CODES_FILE, "a", encoding="utf-8") as out:
                out.writelines(f"{item.nodeid}\t{code}\n" for code in sorted(set(_produced)))
        _produced.clear()
    return report
