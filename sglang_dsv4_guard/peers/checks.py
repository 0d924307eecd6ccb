"""Built-in registration check: the DCP relayout a decode peer's registration decides
(:mod:`..pd.relayout`), on the endpoints the registration snapshot built from the live
manager and the decode's ``KVArgsRegisterInfo``. Pure apart from running SGLang's function
on a half-built object.
"""

from __future__ import annotations

from sglang_dsv4_guard.findings import Finding
from sglang_dsv4_guard.hookmarkers import hookimpl
from sglang_dsv4_guard.host.judgement import imported_package_dir
from sglang_dsv4_guard.host.pd_digests import SITES, locate
from sglang_dsv4_guard.pd.relayout import relayout_findings
from sglang_dsv4_guard.peers.snapshot import Registration, RegistrationContext

__all__ = ["sglang_dsv4_guard_check_registration", "with_peer"]


def _relayouts(reg: Registration) -> bool:
    """Whether the backend's registration decides the DCP relayout: Mooncake's and
    NIXL's (0.5.17+), MORI's from 0.5.22 (its ``_add_remote_peer`` calls it)."""
    if reg.backend != "mori":
        return True
    package = imported_package_dir()
    return package is not None and locate(package, SITES["peers.mori_relayout"]) is not None


def with_peer(reg: Registration, finding: Finding) -> Finding:
    """``finding`` with the registering peer named first in its details."""
    line = f"decode peer: {reg.peer} at {reg.address} ({reg.backend})"
    return Finding(**{**finding.__dict__, "details": (line, *finding.details)})


# tryfirst: SGLang's own checks come first in every report, under pluggy's call order.
@hookimpl(tryfirst=True)
def sglang_dsv4_guard_check_registration(registration: Registration,
                                         context: RegistrationContext) -> list[Finding]:
    """The DCP relayout SGLang refuses for this decode peer, if any."""
    del context
    if not _relayouts(registration):
        return []
    found, _ = relayout_findings(registration.prefill, registration.decode, "this release",
                                 registration.env)
    return [with_peer(registration, f) for f in found]
