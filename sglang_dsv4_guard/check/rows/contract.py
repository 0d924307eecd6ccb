"""``check``'s prefill/decode contract rows: every comparison SGLang makes between the two
servers at run time, on the endpoints the two launch lines imply.

Each row is a function of its own module, named in :data:`ROWS`;
:func:`contract_findings` runs them all, so one failing row never hides another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sglang_dsv4_guard.assembly import build_plugins
from sglang_dsv4_guard.check.fixing.flag_fixes import accepted_fixes
from sglang_dsv4_guard.check.offline.chatter import section
from sglang_dsv4_guard.check.offline.parse import offline_env
from sglang_dsv4_guard.check.rows.allocation_row import allocation_row
from sglang_dsv4_guard.check.rows.aux_width import aux_width_row
from sglang_dsv4_guard.check.rows.contact import contact_row
from sglang_dsv4_guard.check.rows.contract_run import ContractRun
from sglang_dsv4_guard.check.rows.kv_layout_env import kv_layout_env_row
from sglang_dsv4_guard.check.rows.kv_setup import kv_setup_row
from sglang_dsv4_guard.check.rows.transfer_rows import hisparse_backend_row
from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.check.server.endpoint_values import endpoint_of
from sglang_dsv4_guard.findings import Finding
from sglang_dsv4_guard.hookmarkers import PAIR_HOOK
from sglang_dsv4_guard.host.releases import HostProfile
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.pd.endpoint import PairContext

__all__ = ["ROWS", "ContractRun", "contract_findings", "pair_conditions"]

log = logging.getLogger(LOGGER_NAME)


# name -> (run -> (findings, unknowns)). A row that cannot be judged on this release says
# so in its unknowns; it never guesses.
ROWS: dict[str, Callable[[ContractRun], tuple[list[Finding], list[str]]]] = {
    "transfer.aux_row_widths": aux_width_row,
    "transfer.hisparse_backend": hisparse_backend_row,
    "start-up.dsv4_kv_layout": kv_layout_env_row, "start-up.kv_setup": kv_setup_row,
    "first contact": contact_row, "receiver.allocation_policy": allocation_row,
}


def contract_findings(prefill: DerivedServer, decode: DerivedServer, release: str, derive: bool = True,
                      profile: HostProfile | None = None) -> tuple[list[Finding], list[str]]:
    """Every row's findings and unknowns for the pair. What SGLang says while one server's
    values are derived (its own pools' log lines, its environment's parse warnings)
    is that server's (:func:`~.chatter.section`); what it says while a row compares the
    two is no one server's, so it stays under ``import``."""
    with section(prefill.role):
        first = endpoint_of(prefill)
    with section(decode.role):
        second = endpoint_of(decode)
    run = ContractRun(first, second, prefill, decode, release, derive)
    findings: list[Finding] = []
    unknowns: list[str] = [*run.prefill.notes, *run.decode.notes]
    for name, row in ROWS.items():
        try:
            found, unknown = row(run)
        except Exception as exc:  # our bug: that row is unknown, the others still run
            log.warning("check: the %s row failed (a guard bug; please report it): %s: %s",
                        name, type(exc).__name__, exc, exc_info=True)
            unknowns.append(f"{name}: not judged: the guard's own check failed "
                            f"({type(exc).__name__}: {exc}); a guard bug, please report it")
            continue
        findings.extend(found)
        unknowns.extend(unknown)
    found, unknown = pair_conditions(run, profile)
    return findings + found, unknowns + unknown


def pair_conditions(run: ContractRun, profile: HostProfile | None = None
                    ) -> tuple[list[Finding], list[str]]:
    """The contract conditions of the pair hook (the built-in ones, ``pd/conditions.py``,
    and every plug-in's), in the prefill's environment, as at run time; each flag fix kept
    only when the release's parser accepts its edits (``--fix`` then proves it)."""
    context = PairContext("check", str(run.prefill.get("transfer_backend")), profile)
    with offline_env(run.prefill_side.args.env):
        found = build_plugins().collect(PAIR_HOOK, {
            "prefill": run.prefill, "decode": run.decode, "context": context})
    return [accepted_fixes(f, run.prefill_side, run.decode_side, run.derive)
            for f in found], list(context.unknowns)

