"""MORI's per-request state transfer, judged for a registered decode peer.

``MoriKVManager.send_state`` refuses, per request, a decode that registered another
number of state components (``state component count mismatch``, every release:
DSV4G057), and ``_send_swa_dsa_state`` a decode whose TP differs for state it cannot
reslice: MiniMax sparse state (:mod:`.send_extra`'s code, ``check``'s) and, from
0.5.20, QSA state, paired by the prefill's attention TP (0.5.20 - 0.5.22) or state TP
(0.5.23) (DSV4G056). The non-MLA ``swa`` TP rule there is MORI's own hook
(:mod:`sglang_dsv4_guard.mori.checks`); a refusal of one server alone (PP > 1 for sparse
state) compares nothing and is not reported here.

The release's own methods run (unwrapped) on a half-built manager with the prefill's
values and a peer with the decode's, on an empty transfer (one state slot, no memory
descriptors: past the checks nothing is submitted). Their source is digested with MORI's
(``host/digests.json``). Nothing here imports the connector: it is judged once SGLang
imported it (a MORI registration).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from sglang_dsv4_guard.findings import Finding, Phase
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.host.targets import MORI_MODULE, MORI_SEND, PD_BASE_MODULE
from sglang_dsv4_guard.pd.attention_tp import pairing_fixes
from sglang_dsv4_guard.pd.endpoint import PEER, Endpoint, Refusal, pair_finding
from sglang_dsv4_guard.pd.send_extra import MINIMAX_CODE
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["mori_peer", "mori_state_findings", "mori_state_refusals"]

_TP = "heterogeneous TP not supported"
_COUNT = "state component count mismatch"
_SWA = "TP-mismatched non-MLA SWA"  # MORI's own hook (mori/checks.py)
_QSA = ("qsa_pending", "qsa_compressed")


def _manager(cls: Any, prefill: Endpoint) -> Any:
    tp = int(prefill.get("attn_tp_size"))
    enum = importlib.import_module(PD_BASE_MODULE).StateType  # unscanned: targets
    manager = object.__new__(cls)
    manager.__dict__.update(
        attn_tp_size=tp, state_tp_size=int(prefill.get("state_tp_size") or tp),
        is_mla_backend=bool(prefill.get("is_mla_backend")),
        pp_size=int(prefill.get("pp_size") or 1),
        state_mem_descs=[[] for _ in range(int(prefill.get("state_components") or 0))],
        kv_args=SimpleNamespace(
            state_types=[enum(s) for s in prefill.get("state_types") or ()
                         if s in {e.value for e in enum}],
            state_item_lens=[], state_dim_per_tensor=[], state_layer_ids=[]))
    return manager


def mori_peer(decode_tp: int, components: int) -> SimpleNamespace:
    """A decode peer as MORI's manager holds its registration: its TP and ``components``
    state components, without memory (past SGLang's checks nothing is submitted)."""
    return SimpleNamespace(decode_tp_size=decode_tp,
                           dst_state_mem_descs=[[] for _ in range(components)],
                           dst_state_item_lens=[], dst_state_dim_per_tensor=[],
                           dst_state_layer_ids=[])


def _raised(fn: Any, *args: Any, **kwargs: Any) -> str | None:
    try:
        fn(*args, **kwargs)
    except RuntimeError as exc:
        return str(exc)
    except Exception:  # past SGLang's checks, on a transfer this manager cannot make
        return None
    return None


def mori_state_refusals(prefill: Endpoint, decode: Endpoint) -> list[Refusal]:
    """What MORI's transfer will refuse for every request to this decode, in the order it
    meets them; ``[]`` when a value it reads is not known."""
    if not (prefill.has("attn_tp_size") and decode.has("attn_tp_size")
            and prefill.has("state_types")):
        return []
    module = sys.modules.get(MORI_MODULE)  # never imported here: it needs AMD's mori
    if module is None:
        return []
    cls = module.MoriKVManager
    manager = _manager(cls, prefill)
    peer = mori_peer(int(decode.get("attn_tp_size")), int(decode.get("state_components") or 0))
    found: list[Refusal] = []
    if prefill.has("state_components") and decode.has("state_components"):
        send_state = inspect.unwrap(vars(cls)["send_state"])
        message = _raised(send_state, manager, peer, [], [])
        if message is not None and _COUNT in message:
            return [Refusal("DSV4G057", message, f"{MORI_MODULE}.MoriKVManager.send_state")]
    send = inspect.unwrap(vars(cls)[MORI_SEND.qualname.split(".")[1]])
    names = list(inspect.signature(send).parameters)[1:]
    one = np.array([0], dtype=np.int32)
    for st in prefill.get("state_types") or ():
        if st == "mamba":  # another method (_send_mamba_state), not these checks
            continue
        values = {"peer_info": peer, "src_state_indices": one, "dst_state_indices": one.copy(),
                  "src_state_mem_descs": [], "src_state_item_lens": [],
                  "dst_state_mem_descs": [], "dst_state_item_lens": [], "state_type": st,
                  "src_layer_ids": [], "dst_layer_ids": []}
        kwargs = {n: values[n] for n in names if n in values}
        message = _raised(send, manager, **kwargs)
        if message is None or _SWA in message or _TP not in message:
            continue
        code = "DSV4G056" if st in _QSA else MINIMAX_CODE
        found.append(Refusal(code, message, str(MORI_SEND), st,
                             _pairs_by(send, manager, peer, kwargs)))
    return found


def _pairs_by(send: Any, manager: Any, peer: Any, kwargs: dict[str, Any]
              ) -> tuple[str, int] | None:
    """Which of the prefill's TP sizes the release's check accepts as the decode's, tried
    with its own method."""
    tried = peer.decode_tp_size
    try:
        for label, size in (("attention", manager.attn_tp_size),
                            ("state", manager.state_tp_size)):
            peer.decode_tp_size = size
            again = _raised(send, manager, **kwargs)
            if again is None or _TP not in again:
                return label, int(size)
    finally:
        peer.decode_tp_size = tried
    return None


def mori_state_findings(prefill: Endpoint, decode: Endpoint, package: Path | None
                        ) -> tuple[list[Finding], list[str]]:
    """The pair condition: MORI's per-request state refusals for a registering decode peer
    (MiniMax's, DSV4G056, 057; run time: ``check``'s child never imports MORI's connector)."""
    del package
    if prefill.get("transfer_backend") != "mori" or not decode.has(PEER):
        return [], []
    found = []
    for r in mori_state_refusals(prefill, decode):
        if r.code == "DSV4G057":
            fixes: tuple[Fix, ...] = (Fix(
                FixKind.ADVICE, "give both servers the same state pools (the same model and "
                f"the flags that add state, e.g. speculative decoding): the decode registered "
                f"{decode.get('state_components')} state components, the prefill has "
                f"{prefill.get('state_components')}", field="state_components"),)
        else:
            fixes = pairing_fixes(prefill, decode, str(r.state_type), r.pairs_by)
        what = f"{r.state_type} state" if r.state_type else "state"
        found.append(pair_finding(
            r.code, f"prefill -> decode MORI transfer of the {what}", (prefill, decode),
            ("attn_tp_size", "state_tp_size", "state_components", "state_types",
             "is_mla_backend"),
            (f"every request that carries {what} will fail", f"SGLang's {r.function} raises it"),
            fixes, r.message, when_of(Phase.PER_REQUEST, "mori", prefill.env or {})))
    return found, []
