"""The built-in prefill/decode contract conditions, as one implementation of the pair hook.

Each condition is a function ``(prefill, decode, package) -> (findings, unknowns)`` of
its own module; :data:`CONDITIONS` lists them in the order SGLang meets them. They run
through ``sglang_dsv4_guard_check_pair`` like a third-party plug-in's condition: in
``check`` on the endpoints two launch lines imply, and at run time at each decode peer's
registration, so each finding is built in one place. ``check`` keeps the fixes the
release's parser accepts and ``--fix`` proves them; at run time they are shown unproven.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from sglang_dsv4_guard.findings import Finding
from sglang_dsv4_guard.hookmarkers import hookimpl
from sglang_dsv4_guard.host.judgement import imported_package_dir
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.pd.asymmetry import asymmetry_findings
from sglang_dsv4_guard.pd.aux_count import aux_count_findings
from sglang_dsv4_guard.pd.endpoint import Endpoint, PairContext
from sglang_dsv4_guard.pd.mamba_slice import mamba_slice_findings
from sglang_dsv4_guard.pd.mamba_state import mamba_findings
from sglang_dsv4_guard.pd.mori_send import mori_state_findings
from sglang_dsv4_guard.pd.nixl_payload import nixl_payload_findings
from sglang_dsv4_guard.pd.nixl_state import nixl_state_findings
from sglang_dsv4_guard.pd.send_extra import send_extra_findings
from sglang_dsv4_guard.pd.state_layout import state_layout_findings

__all__ = ["CONDITIONS", "sglang_dsv4_guard_check_pair"]

log = logging.getLogger(LOGGER_NAME)

Condition = Callable[[Endpoint, Endpoint, "Path | None"], tuple[list[Finding], list[str]]]

#: The built-in conditions, in the order SGLang meets them.
CONDITIONS: tuple[Condition, ...] = (
    # at registration: NIXL's payload, Mooncake's state layout, NIXL's prepared state
    nixl_payload_findings, state_layout_findings, nixl_state_findings,
    # per request: the state transfer (Mooncake/NIXL, MORI, Mamba), the metadata buffers
    send_extra_findings, mori_state_findings, mamba_findings, mamba_slice_findings,
    aux_count_findings,
    # never compared by SGLang: what only check's endpoints carry
    asymmetry_findings)


_FAILED: set[tuple[str, str]] = set()
_LOCK = threading.Lock()


def _failed(name: str, exc: Exception) -> None:
    """Log a condition's failure (a guard bug) once per condition and exception type, per
    process: at run time it would otherwise repeat for every registering peer."""
    with _LOCK:
        first = (name, type(exc).__name__) not in _FAILED
        _FAILED.add((name, type(exc).__name__))
    if first:
        log.warning("the %s condition failed (a guard bug; please report it; logged once "
                    "per process): %s: %s", name, type(exc).__name__, exc, exc_info=True)


# tryfirst: SGLang's own conditions come first in every report, under pluggy's call order.
@hookimpl(tryfirst=True)
def sglang_dsv4_guard_check_pair(prefill: Endpoint, decode: Endpoint,
                                 context: PairContext) -> list[Finding]:
    """Every built-in condition's findings for the pair; what could not be judged goes to
    ``context``."""
    package = imported_package_dir()
    found: list[Finding] = []
    for condition in CONDITIONS:
        try:
            findings, unknowns = condition(prefill, decode, package)
        except Exception as exc:  # our bug: that condition is not judged, the others run
            _failed(condition.__qualname__, exc)
            context.not_judged(f"{condition.__qualname__}: not judged: the guard's own "
                               f"check failed ({type(exc).__name__}: {exc}); a guard bug, "
                               "please report it")
            continue
        found.extend(findings)
        for line in unknowns:
            context.not_judged(line)
    return found
