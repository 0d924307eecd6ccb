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

# On ROCm, SGLang keeps DeepSeek-V4's SWA state in a unified-KV ring when this variable is
# unified_kv_triton; the ACME fleet serves the paged layout only.
UNIFIED_VARIABLE = "SGLANG_HACK_FLASHMLA_BACKEND"


@hookimpl
def sglang_dsv4_guard_check_state(pair: StatePair, context: StateContext) -> list[Finding]:
    """ACME001: both DeepSeek-V4 pools use the fleet's paged SWA layout."""
    findings = []
    for pool in (pair.target, pair.draft):
        if pool.get("_unified_kv") is True:
            findings.append(Finding(
                code="ACME001",
                severity=Severity.WARNING,
                summary=f"the {pool.role} does not use the fleet's paged SWA layout",
                subject=f"{pool.role} _unified_kv",
                observations=(Observation(pool.role, "_unified_kv", True,
                                          f"{UNIFIED_VARIABLE}=unified_kv_triton on ROCm"),),
                # A fix as data: what to change on this server, and the field it fixes.
                fixes=(Fix(FixKind.FLAGS, f"launch this server without {UNIFIED_VARIABLE}",
                           field="_unified_kv",
                           edits=(Edit("this server", UNIFIED_VARIABLE, remove=True, env=True),)),),
            ))
    return findings
