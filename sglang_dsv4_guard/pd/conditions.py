"""The built-in prefill/decode contract conditions, as one implementation of the pair hook.

Each condition is a function ``(prefill, decode, package) -> (findings, unknowns)`` of
its own module; :data:`CONDITIONS` lists them in the order SGLang meets them. They run
through ``sglang_dsv4_guard_check_pair`` like a third-party plug-in's condition: in
``check`` on the endpoints two launch lines imply, and at run time at each decode peer's
registration, so each finding is built in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sglang_dsv4_guard.findings import Finding
from sglang_dsv4_guard.hookmarkers import hookimpl
from sglang_dsv4_guard.host.verdict import imported_package_dir
from sglang_dsv4_guard.pd.aux_count import aux_count_findings
from sglang_dsv4_guard.pd.endpoint import Endpoint, PairContext
from sglang_dsv4_guard.pd.mamba_slice import mamba_slice_findings
from sglang_dsv4_guard.pd.nixl_payload import nixl_payload_findings
from sglang_dsv4_guard.pd.send_extra import send_extra_findings

__all__ = ["CONDITIONS", "sglang_dsv4_guard_check_pair"]

Condition = Callable[[Endpoint, Endpoint, "Path | None"], tuple[list[Finding], list[str]]]

#: The built-in conditions, in the order SGLang meets them.
CONDITIONS: tuple[Condition, ...] = (nixl_payload_findings, send_extra_findings,
                                      mamba_slice_findings, aux_count_findings)


# tryfirst: SGLang's own conditions come first in every report, under pluggy's call order.
@hookimpl(tryfirst=True)
def sglang_dsv4_guard_check_pair(prefill: Endpoint, decode: Endpoint,
                                 context: PairContext) -> list[Finding]:
    """Every built-in condition's findings for the pair; what could not be judged goes to
    ``context``."""
    package = imported_package_dir()
    found: list[Finding] = []
    for condition in CONDITIONS:
        findings, unknowns = condition(prefill, decode, package)
        found.extend(findings)
        for line in unknowns:
            context.not_judged(line)
    return found
