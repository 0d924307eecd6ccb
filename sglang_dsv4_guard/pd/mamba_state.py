"""NIXL's and MORI's per-request Mamba state transfer, judged for a registered decode peer.

From 0.5.20 both backends slice a Mamba state component by heads for a decode of another
TP, but not a component the prefill holds replicated (a tensor whose entry in
``kv_args.state_dim_per_tensor`` is 0): NIXL's ``maybe_send_extra`` and MORI's
``send_state`` raise "Replicated Mamba PD state transfer currently requires matching
prefill/decode attention TP sizes" for every request that carries Mamba state
(DSV4G058). Which TP the decode's must equal is the release's: both compare the
prefill's attention TP in 0.5.20 - 0.5.22 and its state TP in 0.5.23.
Mooncake has no such refusal.

The release's own method runs (unwrapped) on a half-built manager carrying the prefill's
state registration and the decode's TP, on a transfer of one Mamba slot. Its Mamba
senders (``PD_MAMBA_SENDERS``) are replaced *on that instance* by a stop, so past SGLang's
check nothing runs and SGLang logs nothing (a release that renamed them would run its own
on the half-built manager, which fails at its first read: not judged). Only SGLang's
own message counts as a refusal; anything else the method raises on the half-built
manager leaves the pair not judged (no report). Nothing here imports a connector: the
module SGLang imported is read from ``sys.modules``.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from sglang_dsv4_guard.host.targets import (
    PD_MAMBA_SENDERS,
    PD_MORI_SEND_STATE,
    PD_NIXL_SEND_EXTRA,
    PD_STATE_TYPE_MODULE,
)
from sglang_dsv4_guard.pd.endpoint import Endpoint

__all__ = ["MAMBA_CODE", "MambaRefusal", "mamba_refusal"]

MAMBA_CODE = "DSV4G058"
_PHRASE = "Replicated Mamba PD state transfer"
_MAMBA = "mamba"
#: Per backend: the method that refuses (its module, class and name).
_SENDS = {"nixl": PD_NIXL_SEND_EXTRA, "mori": PD_MORI_SEND_STATE}


@dataclass(frozen=True)
class MambaRefusal:
    """SGLang's refusal of every request's Mamba state to this decode."""

    message: str
    function: str
    # the prefill's TP the release compares the decode's with: ("attention" | "state", size)
    pairs_by: tuple[str, int]


class _Stop(Exception):
    """Raised by the stopped Mamba senders: SGLang's check let the transfer through."""


def _stop(*args: Any, **kwargs: Any) -> Any:
    raise _Stop


def _manager(cls: Any, prefill: Endpoint) -> Any:
    tp = int(prefill.get("attn_tp_size"))
    types = tuple(prefill.get("state_types") or ())
    enum = importlib.import_module(PD_STATE_TYPE_MODULE).StateType  # unscanned: targets
    manager = object.__new__(cls)
    empty: list[list[int]] = [[] for _ in types]
    manager.__dict__.update(
        attn_tp_size=tp, state_tp_size=int(prefill.get("state_tp_size") or tp),
        is_mla_backend=bool(prefill.get("is_mla_backend")),
        state_mem_descs=[[] for _ in types], _state_layout_rejections={},
        _prepared_state_plans={},
        kv_args=SimpleNamespace(
            state_types=[enum(s) if s in {e.value for e in enum} else s for s in types],
            state_data_ptrs=empty, state_item_lens=empty, state_layer_ids=empty,
            state_dim_per_tensor=[list(d) for d in prefill.get("state_dim_per_tensor")],
            state_conv_shard_groups=[], state_slice_outer_counts=[]))
    for name in PD_MAMBA_SENDERS:  # the release's own senders, if it has them
        setattr(manager, name, _stop)
    return manager


def _run(backend: str, method: Any, manager: Any, decode_tp: int, types: tuple[str, ...]
         ) -> str | None:
    """SGLang's message when its method refuses the Mamba slots; ``None`` when it lets
    them through (a stopped sender) or fails otherwise on the half-built manager."""
    slots = [np.array([0], dtype=np.int32) if st == _MAMBA else None for st in types]
    try:
        if backend == "mori":
            peer = SimpleNamespace(decode_tp_size=decode_tp,
                                   dst_state_mem_descs=[[] for _ in types],
                                   dst_state_item_lens=[], dst_state_dim_per_tensor=[],
                                   dst_state_layer_ids=[])
            method(manager, peer, slots, [s.copy() if s is not None else None for s in slots])
        else:
            values = {"peer_name": "decode", "prefill_state_indices": slots,
                      "dst_state_data_ptrs": [[] for _ in types],
                      "dst_state_indices": [[0] for _ in types], "dst_gpu_id": 0,
                      "notif": "room", "decode_tp_size": decode_tp}
            names = list(inspect.signature(method).parameters)[1:]
            result = method(manager, **{n: values[n] for n in names if n in values})
            if inspect.isgenerator(result):  # 0.5.23 yields each state handle
                for _ in result:
                    pass
    except RuntimeError as exc:
        return str(exc) if _PHRASE in str(exc) else None
    except Exception:  # a stopped sender, or past the check on what is half-built
        return None
    return None


def mamba_refusal(backend: str, prefill: Endpoint, decode: Endpoint) -> MambaRefusal | None:
    """What the release's transfer does with Mamba state for this decode: its refusal,
    or ``None`` (it sends, the release has no such check, or a value is not known)."""
    if backend not in _SENDS or not all((
            prefill.has("attn_tp_size"), prefill.has("state_types"),
            prefill.has("state_dim_per_tensor"), decode.has("attn_tp_size"))):
        return None
    types = tuple(str(s) for s in prefill.get("state_types") or ())
    if _MAMBA not in types:
        return None
    target = _SENDS[backend]
    class_name, method_name = target.qualname.split(".")
    module = sys.modules.get(target.module)  # never imported here
    cls = getattr(module, class_name, None)
    method = vars(cls).get(method_name) if isinstance(cls, type) else None
    if method is None:
        return None
    method = inspect.unwrap(method)
    decode_tp = int(decode.get("attn_tp_size"))
    manager = _manager(cls, prefill)
    message = _run(backend, method, manager, decode_tp, types)
    if message is None:
        return None
    pairs_by = ("attention", manager.attn_tp_size)
    for label, size in (("attention", manager.attn_tp_size), ("state", manager.state_tp_size)):
        if _run(backend, method, manager, int(size), types) is None:  # this TP is accepted
            pairs_by = (label, int(size))
            break
    return MambaRefusal(message, str(target), pairs_by)
