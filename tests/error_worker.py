"""Raised in a process-pool worker by ``test_errors_and_inputs``: cheap to import (no sglang)."""

from __future__ import annotations

from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.errors import (
    DSV4GuardError,
    DSV4GuardInstallError,
    DSV4GuardStartupRefused,
    SettingError,
)
from sglang_dsv4_guard.findings import STOPS_AT_START, Finding, Observation, Report, Severity

# SGLang's run_suite.py collects every *.py next to the tests and requires a registry in
# each; a disabled one marks a helper module (listed as skipped, never run).
register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")


def sample_errors() -> dict[str, BaseException]:
    """One of each guard exception, with a report that has a finding, keyed by type name."""
    finding = Finding("DSV4G004", Severity.ERROR, "mapping not shared", "full_to_swa_index_mapping",
                      observations=(Observation("draft pool", "page_size", 64, "--page-size"),),
                      fixes=("share it",), host_message="DSV4 x", when=STOPS_AT_START)
    report = Report.of([finding], {"function": "f", "mode": "on"}, host_error="DSV4 x")
    host = RuntimeError("DSV4 target and draft pools must share the SWA index mapping")
    guard = DSV4GuardError(str(host), report, "rendered report", host)
    install = DSV4GuardInstallError("no _add_remote_peer", "mori.conn:MoriKVManager")
    return {
        "DSV4GuardError": guard,
        "SettingError": SettingError("SGLANG_DSV4_GUARD", "loud", ("on", "strict"), "stays inert"),
        "DSV4GuardInstallError": install,
        "DSV4GuardStartupRefused": DSV4GuardStartupRefused(install),
    }


def raise_sample(name: str) -> None:
    """Raise the sample exception ``name`` (run in a worker process)."""
    raise sample_errors()[name]


def raise_given(exc: BaseException) -> None:
    """Raise ``exc`` (sent from the parent, so it crosses the process boundary twice)."""
    raise exc
