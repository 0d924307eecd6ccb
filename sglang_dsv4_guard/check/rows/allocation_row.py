"""``check``'s decode allocation policy row (:mod:`..pd.allocation`): the policy
each server runs with, the row, and its fixes.

The policy is ``--disaggregation-decode-allocation-policy`` (0.5.22+) as the release's
resolution leaves it (the line's value, else the release's default): the prefill's
bootstrap server publishes it in its ``/route`` answer (``CommonKVManager``'s
registration payload, ``disaggregation/common/conn.py``, 0.5.22 - 0.5.23) and the
decode's receiver reads its own from ``get_disagg()``.
"""

from __future__ import annotations

from dataclasses import replace

from sglang_dsv4_guard.check.fixing.flag_fixes import copy_pairs, kept_fixes
from sglang_dsv4_guard.check.rows.contract_run import ContractRun
from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.check.server.edit import typed_flags
from sglang_dsv4_guard.check.server.endpoint_values import CONTRIBUTORS, resolved_value, typed_source
from sglang_dsv4_guard.findings import Finding
from sglang_dsv4_guard.fixes import Fix, FixKind, flag_fix
from sglang_dsv4_guard.host.flags import flag_edit, flag_for_field
from sglang_dsv4_guard.host.judgement import imported_package_dir
from sglang_dsv4_guard.pd.allocation import CODE, POLICY, allocation_findings
from sglang_dsv4_guard.pd.endpoint import Value

__all__ = ["allocation_row"]

FIELD = "disaggregation_decode_allocation_policy"


def _policy(side: DerivedServer, values: dict[str, Value]) -> dict[str, Value]:
    """The server's decode allocation policy, where the release has the flag."""
    found = flag_for_field(FIELD)
    if found is None:
        return {}  # before 0.5.22: no policy, nothing published or compared
    value = resolved_value(side, FIELD, None)  # resolution does not change the line's value
    if value is None:
        return {}
    return {POLICY: Value(str(value), typed_source(side, FIELD, found.option))}


def _fixes(run: ContractRun) -> tuple[Fix, ...]:
    """One server launched with the other's policy: its flag removed when the other runs
    the release's default, else set to the other's value."""
    p, d = run.prefill_side, run.decode_side
    ends = {"prefill": run.prefill, "decode": run.decode}
    inputs = tuple(f"{e.role}: {POLICY} {e.get(POLICY)!r} from {e.source(POLICY)}"
                   for e in (run.prefill, run.decode))
    candidates: list[Fix | None] = []
    for src, dst in copy_pairs(p, d):
        if FIELD in typed_flags(list(src.args.argv)):
            edit = flag_edit(dst.role, FIELD, ends[src.role].get(POLICY))
        elif FIELD in typed_flags(list(dst.args.argv)):
            edit = flag_edit(dst.role, FIELD, None)  # back to the release's default, as src
        else:
            continue
        candidates.append(flag_fix(f"launch the {dst.role} server with the {src.role}'s decode "
                               "allocation policy", FIELD, [edit], *inputs))
    fixes = tuple(dict.fromkeys(kept_fixes(candidates, p, d)))
    return fixes or (Fix(FixKind.NO_FLAG_FIX, "no flag change of either line that the "
                                              "release accepts fixes this"),)


def allocation_row(run: ContractRun) -> tuple[list[Finding], list[str]]:
    """The allocation policy's finding for the pair, with its fixes."""
    findings, unknowns = allocation_findings(run.prefill, run.decode, run.release,
                                             imported_package_dir())
    if run.derive:
        findings = [replace(f, fixes=_fixes(run)) if f.code == CODE else f for f in findings]
    return findings, unknowns


CONTRIBUTORS.append(_policy)
