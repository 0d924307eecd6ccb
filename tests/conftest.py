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

# tests/patched_tree/ runs only on a patched copy of SGLang, which tools/patched_tree.py
# builds and names in DSV4_GUARD_PATCHED_TREE (make test runs it for every release).
collect_ignore = [] if os.environ.get("DSV4_GUARD_PATCHED_TREE") else ["patched_tree"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """In CI a test that cannot run fails: a skip is turned into a failure there."""
    report = yield
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which counts as a failure: {report.longrepr}"
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
