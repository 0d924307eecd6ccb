"""acme_guard_policy: a site-policy check for sglang-dsv4-guard (a complete example plug-in)."""

from __future__ import annotations

from sglang_dsv4_guard import (
    Edit,
    Finding,
    Fix,
    FixKind,
    Observation,
    Severity,
    StateContext,
    StatePair,
    hookimpl,
)

FLEET_PAGE_SIZE = 256


@hookimpl
def sglang_dsv4_guard_check_state(pair: StatePair, context: StateContext) -> list[Finding]:
    """ACME001: both DeepSeek-V4 pools use the fleet's KV page size."""
    findings = []
    for pool in (pair.target, pair.draft):
        if pool.has("page_size") and pool.get("page_size") != FLEET_PAGE_SIZE:
            findings.append(Finding(
                code="ACME001",
                severity=Severity.WARNING,
                summary=f"the {pool.role} does not use the fleet page size {FLEET_PAGE_SIZE}",
                subject=f"{pool.role} page_size",
                observations=(Observation(pool.role, "page_size", pool.get("page_size"),
                                          "server flag --page-size"),),
                # A fix as data: what to edit on this server, and the field it fixes.
                fixes=(Fix(FixKind.FLAGS, f"launch this server with --page-size {FLEET_PAGE_SIZE}",
                           field="page_size",
                           edits=(Edit("this server", "--page-size", str(FLEET_PAGE_SIZE)),)),),
            ))
    return findings
