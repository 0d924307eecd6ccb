"""The decode allocation policy comparison the decode's receiver makes for each request.

``CommonKVReceiver.init`` (``disaggregation/common/conn.py``, 0.5.22 - 0.5.23) reads the
``decode_allocation_policy`` the prefill's bootstrap server answered (the prefill's
``--disaggregation-decode-allocation-policy``) and the decode's own, and records a failure
for the request when they differ ("Disaggregation decode allocation policy mismatch")
or when ``prefill_complete`` meets a prefill whose attention TP, CP or PP is not 1. The
release's own method runs here on a bare receiver state and a bare manager (their
constructors open sockets), holding the prefill's ``PrefillServerInfo`` as the
release builds it from the ``/route`` answer (:func:`.first_contact.route_answer`) and
the decode's policy read through the conn module's ``get_disagg``; it stops right after
the comparison (the manager's response table refuses the next write). It runs only when
the comparison's digest is one a known release has (``host/pd_digests.json``); a release
without it has no such row.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_dsv4_guard.findings import Finding, Phase
from sglang_dsv4_guard.host.pd_digests import NotJudged, known_sites
from sglang_dsv4_guard.host.targets import (
    PD_COMMON_MANAGER,
    PD_COMMON_MODULE,
    PD_RECEIVER_INIT,
    PD_SERVER_INFO,
)
from sglang_dsv4_guard.pd.endpoint import Endpoint, pair_finding
from sglang_dsv4_guard.pd.first_contact import BOOTSTRAP_ADDRESS, route_answer
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["CODE", "SITE_KEYS", "allocation_findings", "receiver_failure"]

CODE = "DSV4G037"
SITE_KEYS = ("receiver.allocation_policy", "receiver.prefill_complete_peer")
POLICY = "decode_allocation_policy"


class _PastTheComparison(Exception):
    """Raised by the manager's first write after the policy comparison: it passed."""


class _StopTable(dict[Any, Any]):
    def __setitem__(self, key: Any, value: Any) -> None:
        raise _PastTheComparison


def receiver_failure(prefill: Endpoint, decode: Endpoint) -> str | None:
    """SGLang's recorded failure for a request of the pair, ``None`` when the receiver's
    comparison passes. Raises :class:`NotJudged` when the method cannot be run here."""
    module: Any = importlib.import_module(PD_COMMON_MODULE)  # unscanned: SGLang
    owner, method = PD_RECEIVER_INIT.qualname.split(".")
    info_cls = getattr(module, PD_SERVER_INFO)
    missing: list[str] = []
    info = info_cls(**route_answer(prefill, decode, info_cls, missing))
    manager = object.__new__(getattr(module, PD_COMMON_MANAGER))
    manager.prefill_info_table = {BOOTSTRAP_ADDRESS: info}
    manager.failure_lock, manager.failure_records = threading.Lock(), {}
    manager.request_status, manager.deferred_bootstrap = {}, None
    manager.required_prefill_response_num_table = _StopTable()
    # The method on a plain receiver state: the class is abstract in 0.5.22 (its backends
    # add failure_exception), and init reads only these before the comparison.
    receiver = SimpleNamespace(conclude_state=None, bootstrap_addr=BOOTSTRAP_ADDRESS,
                               bootstrap_room=0, kv_mgr=manager)
    # the conn module's get_disagg answers the decode's policy for the call
    saved, policy = module.get_disagg, str(decode.get(POLICY, "early"))
    module.get_disagg = lambda: SimpleNamespace(disaggregation_decode_allocation_policy=policy)
    try:
        getattr(getattr(module, owner), method)(receiver, 0)
    except _PastTheComparison:
        return None
    except Exception as exc:  # it read what this check does not set
        raise NotJudged(f"SGLang's {PD_RECEIVER_INIT.qualname} did not run on check's "
                        f"values ({type(exc).__name__}: {exc})") from None
    finally:
        module.get_disagg = saved
    failure = manager.failure_records.get(0)
    if failure is None:
        raise NotJudged(f"SGLang's {PD_RECEIVER_INIT.qualname} returned without a verdict")
    return str(failure)


def allocation_findings(prefill: Endpoint, decode: Endpoint, release: str,
                        package: Path | None) -> tuple[list[Finding], list[str]]:
    """DSV4G037 when the release's receiver fails every request of the pair."""
    if decode.get("transfer_backend") == "fake":
        return [], []  # FakeKVReceiver is not a CommonKVReceiver: it compares nothing
    try:
        sites = known_sites(package, SITE_KEYS)
    except NotJudged as exc:
        return [], [f"{CODE}: not judged: {exc}"]
    if all(site is None for site in sites.values()):
        return [], []  # the release has no decode allocation policy (before 0.5.22)
    if not (prefill.has(POLICY) and decode.has(POLICY)):
        return [], [f"{CODE} ({release}): not judged: a server's decode allocation policy "
                    "is not known"]
    try:
        failure = receiver_failure(prefill, decode)
    except (NotJudged, LookupError) as exc:  # LookupError: a /route field not derived
        return [], [f"{CODE} ({release}): not judged: {exc}"]
    if failure is None:
        return [], []
    names = (POLICY, "attn_tp_size", "attn_cp_size", "pp_size") \
        if "peer attention" in failure else (POLICY,)
    return [pair_finding(
        CODE, "the decode's receiver for each request", (prefill, decode), names,
        (f"SGLang's own {PD_RECEIVER_INIT.qualname} recorded this failure on the prefill's "
         "bootstrap answer and the decode's policy",), (), failure,
        when_of(Phase.RECEIVER, str(decode.get("transfer_backend", "?"))),
        unknown_too=True)], []
