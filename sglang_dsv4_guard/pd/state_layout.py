"""Mooncake's verdict on a registering decode peer's state layout (DSV4G050), 0.5.22+.

When a decode rank registers, the prefill's ``MooncakeKVManager._validate_peer_state_layout``
compares each generic state component's entries (their item lengths: the stride the transfer
writes the decode at) with the decode's; 0.5.23 also rejects a CP/TP-sharing DFLASH pair of
different physical TP. A reason is not raised: SGLang logs "Rejecting state transfers to
decode session ...", records it, and every later request to that decode rank fails with it.

The release's own method (digested with the stride comparison it calls, site
``mooncake.state_layout``; a release whose digest no known release has is not judged) runs
on a bare manager (``object.__new__``) holding the prefill's values and a registration
holding the decode's, as :mod:`.relayout` runs ``requires_dcp_relayout``. It reads the
published speculative and memory configs (``get_spec``, ``get_memory``) as SGLang's call
does: in a server process, that server's. ``check`` does not call it: the item lengths
are the built pools', which its miniature pools do not have.
"""

from __future__ import annotations

import importlib
import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_dsv4_guard.findings import Finding, Phase, When
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.host.pd_digests import NotJudged, known_sites
from sglang_dsv4_guard.host.targets import (
    PD_BASE_MODULE,
    PD_STATE_TYPE,
    PEERS_MOONCAKE_VALIDATE,
)
from sglang_dsv4_guard.pd.endpoint import PEER, Endpoint, nested_lists, pair_finding

__all__ = ["CODE", "LOGGED", "SITE", "mooncake_state_refusal", "state_layout_findings"]

CODE = "DSV4G050"
SITE = "mooncake.state_layout"
LOGGED = "Rejecting state transfers to decode session"  # SGLang's log line's head
_STATE = ("state_types", "state_data_ptrs", "state_item_lens")


def mooncake_state_refusal(prefill: Endpoint, decode: Endpoint, package: Path | None,
                           session: str = "decode") -> tuple[str | None, str | None]:
    """(SGLang's reason, ``None``) when the release's own ``_validate_peer_state_layout``
    rejects the decode's state layout; (``None``, ``None``) when it accepts or the release
    has no such check; (``None``, why) when it cannot be run on what the endpoints hold."""
    module = importlib.import_module(PEERS_MOONCAKE_VALIDATE.module)  # unscanned: SGLang
    owner, attr = PEERS_MOONCAKE_VALIDATE.qualname.split(".")
    cls = getattr(module, owner)
    function = getattr(cls, attr, None)
    if function is None:
        return None, None  # before 0.5.22: no registration-time state check
    try:
        known_sites(package, (SITE,))
    except NotJudged as exc:
        return None, str(exc)
    if not all(prefill.has(n) for n in _STATE) or not decode.has("state_item_lens"):
        return None, "the registration carries no state layout"
    state_type = getattr(importlib.import_module(PD_BASE_MODULE),  # unscanned: SGLang
                         PD_STATE_TYPE)
    manager: Any = object.__new__(cls)
    manager.kv_args = SimpleNamespace(
        state_types=[state_type(v) for v in prefill.get("state_types")],
        state_data_ptrs=nested_lists(prefill, "state_data_ptrs"),
        state_item_lens=nested_lists(prefill, "state_item_lens"),
        state_layer_ids=nested_lists(prefill, "state_layer_ids"))
    attn_tp = prefill.get("attn_tp_size")
    manager.__dict__.update(
        is_mla_backend=bool(prefill.get("is_mla_backend", False)),
        is_hybrid_mla_backend=bool(prefill.get("is_hybrid_mla_backend", False)),
        pp_size=int(prefill.get("pp_size", 1) or 1), attn_tp_size=attn_tp,
        state_tp_size=prefill.get("state_tp_size", attn_tp))
    info = SimpleNamespace(
        mooncake_session_id=session, dst_attn_tp_size=decode.get("attn_tp_size"),
        dst_state_data_ptrs=nested_lists(decode, "state_data_ptrs"),
        dst_state_item_lens=nested_lists(decode, "state_item_lens"),
        dst_state_layer_ids=nested_lists(decode, "state_layer_ids"))
    log = logging.getLogger(PEERS_MOONCAKE_VALIDATE.module)  # SGLang's module logger
    ident = threading.get_ident()

    def quiet(record: logging.LogRecord) -> bool:
        """Drops this thread's lines (the method's "Could not pre-check ..." warning, which
        SGLang's own call of it logged already); other threads' lines pass."""
        return record.thread != ident

    log.addFilter(quiet)
    try:
        _, reason = function(manager, info)
    except Exception as exc:  # the bare manager lacks what this release reads
        return None, (f"SGLang's {PEERS_MOONCAKE_VALIDATE.qualname} read what this check "
                      f"does not set ({type(exc).__name__}: {exc})")
    finally:
        log.removeFilter(quiet)
    return (str(reason) if reason is not None else None), None


def state_layout_findings(prefill: Endpoint, decode: Endpoint, package: Path | None
                          ) -> tuple[list[Finding], list[str]]:
    """The pair condition: Mooncake's own verdict on the decode's state layout (0.5.22+),
    judged where the decode's registration carries its state layout (run time)."""
    if prefill.get("transfer_backend") != "mooncake" or not decode.has("state_item_lens"):
        return [], []
    reason, unknown = mooncake_state_refusal(prefill, decode, package,
                                             str(decode.get(PEER, "decode")))
    if reason is None:
        return [], [f"{CODE} (mooncake): not judged: {unknown}"] if unknown else []
    fix = Fix(FixKind.ADVICE, "run both servers with the same model, attention TP and "
              "state-pool flags: the decode registered state item lengths "
              f"{decode.get('state_item_lens')}, the prefill has "
              f"{prefill.get('state_item_lens')} (state components "
              f"{prefill.get('state_types')})", field="state_item_lens")
    return [pair_finding(
        CODE, "decode peer's Mooncake state layout", (prefill, decode),
        ("state_types", "state_item_lens", "attn_tp_size"),
        (f"SGLang's MooncakeKVManager._validate_peer_state_layout rejects it: {reason}",),
        (fix,), reason, When(Phase.REGISTRATION, "when a decode rank registers with the "
                             f"prefill: SGLang logs \"{LOGGED} ...\" and every later request "
                             "to that decode rank fails with the reason; both servers keep "
                             "running"))], []
