"""pytest-only additions. Everything a test needs to run (hypothesis profiles, the
clean-state checks) lives in ``helpers.py`` and ``GuardTestCase``, because SGLang's CI
runs each file as ``python3 <file>``, where this conftest does not run."""

from __future__ import annotations

import os

import produced_codes
import pytest

# tests/patched_tree/ runs only on a patched copy of SGLang, which tools/patched_tree.py
# builds and names in DSV4_GUARD_PATCHED_TREE (make test runs it for every release).
collect_ignore = [] if os.environ.get("DSV4_GUARD_PATCHED_TREE") else ["patched_tree"]


# The codes passing tests produced, for tools/matrix.py (produced_codes.py).
RECORDING = produced_codes.record("pytest")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """In CI a test that cannot run fails: a skip is turned into a failure there."""
    report = yield
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which counts as a failure: {report.longrepr}"
    if RECORDING and report.when == "setup":
        produced_codes.test_started()
    elif RECORDING and report.when == "call":
        produced_codes.test_ended(item.nodeid, report.passed)
    return report
