"""DSV4G059: the Mamba state's slice metadata differs between the prefill and the decode.

From 0.5.20 (MORI from 0.5.22) the per-request Mamba state transfer of Mooncake, NIXL and
MORI slices a state component by heads for a decode of another TP, and turns each of its
tensors into byte blocks with SGLang's ``compute_mamba_state_slice_byte_blocks``
(``disaggregation/utils.py``). That function refuses a tensor one server holds
replicated (its TP-sharded dimension in ``state_dim_per_tensor`` is 0) and the other
sharded ("Mamba state replication metadata differs between prefill and decode"), and a
replicated tensor whose item lengths differ ("Replicated Mamba state item lengths
differ"). Every request that carries Mamba state then fails.

It runs SGLang's own function, as the connector module SGLang imported binds it (a
backend whose module does not bind it has no such transfer), on the registration's
values: for each Mamba component the transfer slices (the prefill's state TP, or its
attention TP where the release has no state TP, differs from the decode's attention TP,
and both servers registered the per-tensor dimensions), in SGLang's entry pairing
(``build_transfer_entry_pairs``). ``check`` does not see the condition: which tensors
are replicated, and their item lengths, are known once the pools are built.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sglang_dsv4_guard.findings import Finding, Phase
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.host.targets import (
    MORI_MODULE,
    PD_ENTRY_PAIRS,
    PD_MAMBA_SLICE,
    PD_MOONCAKE_MODULE,
    PD_NIXL_MODULE,
)
from sglang_dsv4_guard.pd.attention_tp import attention_tp_fixes, layout_of
from sglang_dsv4_guard.pd.endpoint import Endpoint, pair_finding
from sglang_dsv4_guard.pd.nixl_state import nixl_state_findings
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["CODE", "mamba_slice_findings"]

CODE = "DSV4G059"
_MODULES = {"mooncake": PD_MOONCAKE_MODULE, "nixl": PD_NIXL_MODULE, "mori": MORI_MODULE}
# The backends that refuse a replicated prefill tensor first (:mod:`.mamba_state`).
_REPLICATED_FIRST = ("nixl", "mori")
_MESSAGES = ("Mamba state replication metadata differs",
             "Replicated Mamba state item lengths differ")


def mamba_slice_findings(prefill: Endpoint, decode: Endpoint, package: Path | None
                         ) -> tuple[list[Finding], list[str]]:
    """DSV4G059 for the pair, and what could not be judged (nothing: a value not known,
    or a refusal other than the function's own two messages, leaves the pair silently
    unjudged, as every server before its pools are built is)."""
    backend = str(prefill.get("transfer_backend"))
    module = sys.modules.get(_MODULES.get(backend, ""))  # never imported here
    compute = getattr(module, PD_MAMBA_SLICE.attr, None)
    if not callable(compute) or not prefill.has("state_types") or not all(
            e.has(n) for e in (prefill, decode)
            for n in ("attn_tp_size", "state_dim_per_tensor", "state_item_lens")):
        return [], []
    refusal = _refusal(backend, module, compute, prefill, decode)
    if refusal is None or (backend == "nixl" and nixl_state_findings(prefill, decode,
                                                                    package)[0]):
        return [], []  # NIXL 0.5.23 refuses a rejected state layout first (nixl_state.py)
    return [_finding(prefill, decode, backend, *refusal)], []


def _at(values: Sequence[Any], index: int) -> Sequence[Any]:
    return values[index] if index < len(values) and values[index] is not None else ()


def _refusal(backend: str, module: Any, compute: Callable[..., Any], prefill: Endpoint,
             decode: Endpoint) -> tuple[int, str] | None:
    """(the component, SGLang's message) of the first Mamba component the transfer
    refuses, ``None`` when it refuses none (or another refusal comes first)."""
    tp = int(prefill.get("state_tp_size") or prefill.get("attn_tp_size"))
    decode_tp = int(decode.get("attn_tp_size"))
    if tp == decode_tp:
        return None  # the whole item is copied: no slicing
    types = [str(t) for t in prefill.get("state_types") or ()]
    for i, state_type in enumerate(types):
        if state_type != "mamba":
            continue
        src_dims, dst_dims = (_at(e.get("state_dim_per_tensor"), i) for e in (prefill, decode))
        src_lens, dst_lens = (_at(e.get("state_item_lens"), i) for e in (prefill, decode))
        if backend in _REPLICATED_FIRST and 0 in src_dims:
            return None  # mamba_state's refusal ends the request at this component
        if not src_dims or not dst_dims:
            continue  # no dimensions registered: the whole item is copied
        try:
            for s, d in _pairs(module, prefill, decode, i, len(src_lens), len(dst_lens)):
                if backend == "nixl" and _empty(prefill, decode, i, s, d, src_lens):
                    continue  # NIXL sends no empty entry nor one without a pointer
                compute(src_item_len=int(src_lens[s]), dst_item_len=int(dst_lens[d]),
                        src_dim=int(src_dims[s]), dst_dim=int(dst_dims[d]), outer_count=1,
                        src_attn_tp_size=tp, dst_attn_tp_size=decode_tp,
                        dst_tp_rank_in_group=0, local_tp_rank_in_group=0,
                        conv_shard_groups=None)
        except ValueError as exc:
            if str(exc).startswith(_MESSAGES):
                return i, str(exc)
            return None
        except Exception:  # past SGLang's checks, on what is not known here
            return None
    return None


def _empty(prefill: Endpoint, decode: Endpoint, component: int, s: int, d: int,
           src_lens: Sequence[Any]) -> bool:
    """NIXL's skip of an entry: no length, or a null pointer on either side."""
    ptrs = [_at(e.get("state_data_ptrs") or (), component) for e in (prefill, decode)]
    return (not src_lens[s] or (s < len(ptrs[0]) and not ptrs[0][s])
            or (d < len(ptrs[1]) and not ptrs[1][d]))


def _pairs(module: Any, prefill: Endpoint, decode: Endpoint, component: int, src: int,
           dst: int) -> list[tuple[int, int]]:
    """SGLang's pairing of the component's entries (by layer id; by position where the
    release allows it), as the connector module binds it; else by position."""
    pair = getattr(module, PD_ENTRY_PAIRS.attr, None)
    if not callable(pair):
        return list(zip(range(src), range(dst), strict=False))
    layers = [list(_at(e.get("state_layer_ids") or (), component)) for e in (prefill, decode)]
    return list(pair(layers[0], layers[1], src, dst,
                     allow_positional_fallback=int(prefill.get("pp_size") or 1) == 1))


def _finding(prefill: Endpoint, decode: Endpoint, backend: str, component: int,
             message: str) -> Finding:
    names = ("state_types", "state_dim_per_tensor", "state_item_lens", "attn_tp_size",
             "state_tp_size")
    fixes: tuple[Fix, ...] = (Fix(
        FixKind.ADVICE, "run both servers with the same model and the same state-pool "
        f"flags: Mamba state component {component} is sharded by TP on one server and "
        "replicated on the other, or its replicated tensors differ in size "
        f"(prefill dimensions {list(_at(prefill.get('state_dim_per_tensor'), component))}, "
        f"decode {list(_at(decode.get('state_dim_per_tensor'), component))})",
        field="state_dim_per_tensor"),)
    # Equal attention TP copies whole items (where the slicing is by attention TP): that
    # fixes a tensor sharded on one side only, never replicated ones of other lengths
    # (then Mooncake refuses the slot size, and NIXL and MORI copy it misplaced).
    if message.startswith(_MESSAGES[0]) and (not prefill.has("state_tp_size") or prefill.get(
            "state_tp_size") == prefill.get("attn_tp_size")):
        fixes = attention_tp_fixes(layout_of(prefill), layout_of(decode)) + fixes
    return pair_finding(
        CODE, f"prefill -> decode {backend} transfer of the mamba state", (prefill, decode),
        names, (f"SGLang's {PD_MAMBA_SLICE} raises it on the prefill for every request that "
                f"carries Mamba state: component {component}, prefill TP "
                f"{prefill.get('state_tp_size') or prefill.get('attn_tp_size')}, decode "
                f"attention TP {decode.get('attn_tp_size')}",),
        fixes, message, when_of(Phase.PER_REQUEST, backend, prefill.env or {}))
