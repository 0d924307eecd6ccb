"""Shared test set-up: hypothesis profiles, and proof that no test leaves SGLang patched."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=2000, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# tests/ holds helpers.py and mori_stub.py, imported by the test modules.
sys.path.insert(0, os.path.dirname(__file__))


# tools/matrix.py names a file here; every code in a report the guard published during
# a test that passed is appended to it ("<test id>\t<code>"), so the matrix counts the
# codes tests produced, not test names.
CODES_FILE = os.environ.get("DSV4_GUARD_CODES_FILE")
_produced: list[str] = []


def _record_published_codes() -> None:
    from sglang_dsv4_guard.runtime import Runtime

    publish = Runtime.publish

    def recording_publish(self: Runtime, report: object) -> None:
        _produced.extend(getattr(report, "codes", ()))
        publish(self, report)  # type: ignore[arg-type]

    Runtime.publish = recording_publish  # type: ignore[method-assign]


if CODES_FILE:
    _record_published_codes()


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


@pytest.fixture(autouse=True)
def _nothing_stays_patched() -> Iterator[None]:
    """Every test starts unpatched and must leave SGLang exactly as it found it."""
    import sglang.srt.disaggregation.decode as decode
    import sglang.srt.disaggregation.prefill as prefill
    import sglang.srt.disaggregation.utils as utils

    import sglang_dsv4_guard

    original = utils.setup_state_kv_args
    assert not hasattr(original, "__sglang_dsv4_guard_original__"), "a test left SGLang patched"
    yield
    sglang_dsv4_guard.uninstall()
    assert utils.setup_state_kv_args is original
    assert prefill.setup_state_kv_args is original
    assert decode.setup_state_kv_args is original
    mori = sys.modules.get("sglang.srt.disaggregation.mori.conn")
    if mori is not None:
        for name in ("_send_swa_dsa_state", "_add_remote_peer"):
            method = vars(mori.MoriKVManager)[name]
            assert not hasattr(method, "__sglang_dsv4_guard_original__"), name
