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
senders (``PD_MAMBA_SENDERS``) are replaced *on that instance* by a stop that sends
nothing, so past SGLang's check nothing runs and SGLang logs nothing, and every Mamba
component is checked. The refusal is digested (``nixl.mamba_replicated``,
``mori.mamba_replicated``): a release whose check no known release has is not judged.
Nothing here imports a connector: the module SGLang imported is read from ``sys.modules``.
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
from sglang_dsv4_guard.host.pd_digests import NotJudged, known_sites
from sglang_dsv4_guard.host.targets import (
    PD_BASE_MODULE,
    PD_MAMBA_SENDERS,
    PD_MORI_SEND_STATE,
    PD_NIXL_SEND_EXTRA,
)
from sglang_dsv4_guard.pd.attention_tp import pairing_fixes
from sglang_dsv4_guard.pd.endpoint import Endpoint, Refusal, pair_finding
from sglang_dsv4_guard.pd.mori_send import mori_peer
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["MAMBA_CODE", "mamba_findings", "mamba_refusal"]

MAMBA_CODE = "DSV4G058"
_PHRASE = "Replicated Mamba PD state transfer"
_MAMBA = "mamba"
#: Per backend: the method that refuses (its module, class and name).
_SENDS = {"nixl": PD_NIXL_SEND_EXTRA, "mori": PD_MORI_SEND_STATE}


def _manager(cls: Any, tp: int, state_tp: int, types: tuple[str, ...],
             dims: list[list[int | None]], components: int) -> Any:
    enum = importlib.import_module(PD_BASE_MODULE).StateType  # unscanned: targets
    manager = object.__new__(cls)
    empty: list[list[int]] = [[] for _ in types]
    manager.__dict__.update(
        attn_tp_size=tp, state_tp_size=state_tp,
        state_mem_descs=[[] for _ in range(components)], _state_layout_rejections={},
        _prepared_state_plans={},
        kv_args=SimpleNamespace(
            state_types=[enum(s) if s in {e.value for e in enum} else s for s in types],
            state_data_ptrs=empty, state_item_lens=empty, state_layer_ids=empty,
            state_dim_per_tensor=dims, state_conv_shard_groups=[],
            state_slice_outer_counts=[]))
    for name in PD_MAMBA_SENDERS:  # the release's own senders, if it has them: send nothing
        setattr(manager, name, lambda *args, **kwargs: [])
    return manager


def _run(backend: str, method: Any, manager: Any, decode_tp: int, types: tuple[str, ...],
         dst_components: int) -> str | None:
    """SGLang's message when its method refuses a Mamba slot; ``None`` when it lets every
    one through (to the stopped senders), or fails otherwise on the half-built manager."""
    slots = [np.array([0], dtype=np.int32) if st == _MAMBA else None for st in types]
    try:
        if backend == "mori":
            method(manager, mori_peer(decode_tp, dst_components), slots,
                   [s.copy() if s is not None else None for s in slots])
        else:
            values = {"peer_name": "decode", "prefill_state_indices": slots,
                      "dst_state_data_ptrs": [[] for _ in types],
                      "dst_state_indices": [[0] for _ in types], "dst_gpu_id": 0,
                      "notif": "room", "decode_tp_size": decode_tp}
            names = list(inspect.signature(method).parameters)[1:]
            result = method(manager, **{n: values[n] for n in names if n in values})
            if inspect.isgenerator(result):  # 0.5.23 yields each state handle
                list(result)
    except RuntimeError as exc:
        return str(exc) if _PHRASE in str(exc) else None
    except Exception:  # past the check, on what is half-built
        return None
    return None


def _values(backend: str, prefill: Endpoint, decode: Endpoint
            ) -> tuple[int, int, int, list[list[int | None]], int, int] | None:
    """The values the method reads, or ``None`` when one is not known or not a size."""
    try:
        tp = int(prefill.get("attn_tp_size"))
        state_tp = int(prefill.get("state_tp_size") or tp)
        decode_tp = int(decode.get("attn_tp_size"))
        dims = [[None if x is None else int(x) for x in c]
                for c in prefill.get("state_dim_per_tensor")]
    except (TypeError, ValueError):
        return None
    types = prefill.get("state_types") or ()
    # MORI's send_state compares the registered state components first (mori_send.py),
    # as the pair's own: a count mismatch stops it there, as SGLang's does
    components = int(prefill.get("state_components") or 0) if (
        backend == "mori" and prefill.has("state_components")) else len(types)
    dst = int(decode.get("state_components") or 0) if (
        backend == "mori" and decode.has("state_components")) else components
    return tp, state_tp, decode_tp, dims, components, dst


def mamba_refusal(backend: str, prefill: Endpoint, decode: Endpoint, package: Path
                  ) -> Refusal | None:
    """What the release's transfer does with Mamba state for this decode: its refusal,
    or ``None`` (it sends, the release has no such check, or a value is not known).
    Raises :class:`NotJudged` for a release whose check no known release has."""
    if backend not in _SENDS or not all((
            prefill.has("attn_tp_size"), prefill.has("state_types"),
            prefill.has("state_dim_per_tensor"), decode.has("attn_tp_size"))):
        return None
    types = tuple(str(s) for s in prefill.get("state_types") or ())
    if _MAMBA not in types:
        return None
    key = f"{backend}.mamba_replicated"
    if known_sites(package, (key,))[key] is None:  # a release without it (before 0.5.20)
        return None
    target = _SENDS[backend]
    class_name, method_name = target.qualname.split(".")
    module = sys.modules.get(target.module)  # never imported here
    cls = getattr(module, class_name, None)
    method = vars(cls).get(method_name) if isinstance(cls, type) else None
    values = _values(backend, prefill, decode)
    if method is None or values is None:
        return None
    method = inspect.unwrap(method)
    tp, state_tp, decode_tp, dims, components, dst = values
    manager = _manager(cls, tp, state_tp, types, dims, components)
    message = _run(backend, method, manager, decode_tp, types, dst)
    if message is None:
        return None
    # which prefill TP the release compares the decode's with: its own method, on a copy
    # whose state TP differs from its attention TP
    probe = object.__new__(type(manager))
    probe.__dict__.update(manager.__dict__, state_tp_size=tp + 1)
    label = "attention" if _run(backend, method, probe, tp, types, dst) is None else "state"
    return Refusal(MAMBA_CODE, message, str(target), _MAMBA,
                   (label, tp if label == "attention" else state_tp))


def mamba_findings(prefill: Endpoint, decode: Endpoint, package: Path | None
                   ) -> tuple[list[Finding], list[str]]:
    """The pair condition: NIXL's and MORI's per-request refusal of replicated Mamba state
    for a decode of another TP (0.5.20+), judged where the prefill's per-tensor dimensions
    are known (run time)."""
    backend = str(prefill.get("transfer_backend"))
    if package is None or backend not in _SENDS or not prefill.has("state_dim_per_tensor"):
        return [], []
    try:
        refusal = mamba_refusal(backend, prefill, decode, package)
    except NotJudged as exc:
        return [], [f"{MAMBA_CODE} ({backend}): not judged: {exc}"]
    if refusal is None:
        return [], []
    return [pair_finding(
        MAMBA_CODE, f"prefill -> decode {backend} transfer of the mamba state",
        (prefill, decode), ("attn_tp_size", "state_tp_size", "state_types",
                            "state_dim_per_tensor"),
        ("every request that carries mamba state will fail",
         f"SGLang's {refusal.function} raises it"),
        pairing_fixes(prefill, decode, "mamba", refusal.pairs_by), refusal.message,
        when_of(Phase.PER_REQUEST, backend, prefill.env or {}))], []
