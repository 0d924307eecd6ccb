"""NIXL's prepared state transfer (``NixlKVManager._prepare_state_xfer``, 0.5.23+): DSV4G055.

When a decode rank registers, NIXL's ``_add_remote_peer`` plans the state components the
prefill prepares (on CUDA with the UCX backend, PP, CP and DCP 1: its
``_prepared_state_components``). A component whose decode slot stride
(``dst_state_item_lens``) differs from the prefill's (``kv_args.state_item_lens``) has no
correct transfer path: SGLang records the rejection and logs "NIXL state layout rejected:
peer=...", the bootstrap thread goes on, and every request to that peer then fails in
``maybe_send_extra`` ("NIXL state layout rejected for <peer>: ..."). Releases before 0.5.23
have no such preparation: nothing to judge.

The release's own method runs, with the helpers it calls, on a half-built manager carrying
the prefill's state registration and a peer carrying the decode's, its log lines silenced
(the real registration already logged them) and its strided-descriptor plan skipped (no
NIXL agent here); the per-request message is built by ``maybe_send_extra``'s own
expression. Both sites are digested (``host/pd_digests.json``): a changed release is not
judged. ``check``'s launch lines carry no state slot strides (they exist once the pools are
allocated), so before launch every value here is unknown and nothing is reported.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_dsv4_guard.findings import Finding, Phase
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.host.pd_digests import NotJudged, known_sites, with_globals
from sglang_dsv4_guard.host.targets import PD_BASE_MODULE, PD_NIXL_STATE
from sglang_dsv4_guard.pd.endpoint import PEER, Endpoint, nested_lists, pair_finding
from sglang_dsv4_guard.pd.nixl_payload import payload_refusal
from sglang_dsv4_guard.pd.relayout import requires_relayout
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["KEYS", "StateLayoutRefusal", "nixl_state_findings", "nixl_state_refusal"]

KEYS = ("nixl.state_layout", "nixl.state_rejected")
#: What each side must carry to be judged (else: not known, nothing judged).
PREFILL_NEEDS = ("prepared_state_components", "state_types", "state_item_lens",
                 "attn_tp_size")
DECODE_NEEDS = ("state_item_lens", "attn_tp_size")


@dataclass(frozen=True)
class StateLayoutRefusal:
    """SGLang's rejection: its recorded reason, the per-request message, and the
    components whose strides differ as (index, state type, prefill's, decode's)."""

    rejection: str
    message: str
    function: str
    components: tuple[tuple[int, str, tuple[int, ...], tuple[int, ...]], ...]


class _SilentLogger:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def nixl_state_refusal(prefill: Endpoint, decode: Endpoint, package: Path,
                       peer: str = "decode") -> StateLayoutRefusal | None:
    """SGLang's ``_prepare_state_xfer`` on the pair's state registration: its rejection,
    or ``None`` (accepted, a release without it, or a value not known). Raises
    :class:`NotJudged` for a release whose code no known release has."""
    if not all(prefill.has(n) for n in PREFILL_NEEDS) or not all(
            decode.has(n) for n in DECODE_NEEDS):
        return None
    sites = known_sites(package, KEYS)
    state, rejected = sites["nixl.state_layout"], sites["nixl.state_rejected"]
    if state is None or rejected is None:
        return None
    module = importlib.import_module(PD_NIXL_STATE.module)  # unscanned: targets
    cls = getattr(module, PD_NIXL_STATE.qualname.split(".")[0])
    method = with_globals(vars(cls)["_prepare_state_xfer"], logger=_SilentLogger())
    enum = importlib.import_module(PD_BASE_MODULE).StateType  # unscanned: targets
    types_ = [enum(s) for s in prefill.get("state_types")]
    tp = int(prefill.get("attn_tp_size"))
    manager = object.__new__(cls)
    manager.__dict__.update(
        _prepared_state_plans={}, _state_layout_rejections={}, _use_strided_descs=False,
        _prepared_state_components=frozenset(prefill.get("prepared_state_components")),
        attn_tp_size=tp, state_tp_size=int(prefill.get("state_tp_size") or tp),
        is_mla_backend=bool(prefill.get("is_mla_backend")),
        pp_size=int(prefill.get("pp_size") or 1),
        kv_args=SimpleNamespace(
            state_types=types_, state_data_ptrs=nested_lists(prefill, "state_data_ptrs"),
            state_item_lens=nested_lists(prefill, "state_item_lens"),
            state_data_lens=nested_lists(prefill, "state_data_lens"),
            state_layer_ids=nested_lists(prefill, "state_layer_ids"),
            mla_compression_ratios=prefill.get("mla_compression_ratios"), gpu_id=0))
    relayout = requires_relayout(prefill, decode)
    info = SimpleNamespace(
        agent_name=peer, dst_dcp_size=int(decode.get("dcp_size") or 1),
        requires_dcp_relayout=bool(relayout), decode_tp_size=int(decode.get("attn_tp_size")),
        dst_state_data_ptrs=nested_lists(decode, "state_data_ptrs"),
        dst_state_item_lens=nested_lists(decode, "state_item_lens"),
        dst_state_data_lens=nested_lists(decode, "state_data_lens"),
        dst_state_layer_ids=nested_lists(decode, "state_layer_ids"), gpu_id=0)
    try:
        method(manager, info)
    except Exception as exc:
        raise NotJudged(f"SGLang's {PD_NIXL_STATE} on the registration's values raised "
                        f"{type(exc).__name__}: {exc}") from exc
    rejection = manager._state_layout_rejections.get(peer)
    if rejection is None:
        return None
    src, dst = nested_lists(prefill, "state_item_lens"), nested_lists(decode, "state_item_lens")
    differ = tuple((i, str(getattr(types_[i], "value", types_[i])),
                    tuple(src[i]), tuple(dst[i]) if i < len(dst) else ())
                   for i in sorted(manager._prepared_state_components)
                   if i < len(src) and (i >= len(dst) or src[i] != dst[i]))
    message = rejected.message({"peer_name": peer, "rejection": rejection})
    return StateLayoutRefusal(rejection, message, str(rejected.spec.target), differ)


def nixl_state_findings(prefill: Endpoint, decode: Endpoint, package: Path | None
                        ) -> tuple[list[Finding], list[str]]:
    """The pair condition: NIXL's prepared state transfer (0.5.23+) rejecting a decode
    whose state slot strides differ, judged where the prefill's prepared components are
    known (run time). NIXL prepares the state only once the payload was prepared: a
    refusal there (:mod:`.nixl_payload`) ends the registration first."""
    if package is None or prefill.get("transfer_backend") != "nixl" \
            or not prefill.has("prepared_state_components") \
            or (decode.has("kv_mem_kinds") and payload_refusal(prefill, decode)):
        return [], []
    try:
        refusal = nixl_state_refusal(prefill, decode, package,
                                     str(decode.get(PEER, "decode")))
    except NotJudged as exc:
        return [], [f"DSV4G055 (nixl): not judged: {exc}"]
    if refusal is None:
        return [], []
    differ = "; ".join(f"component {i} ({st}): prefill {list(p)}, decode {list(d)}"
                       for i, st, p, d in refusal.components)
    fix = Fix(FixKind.ADVICE, "give the decode the prefill's state pool geometry (the same "
              "model, state dtypes and state TP share on both servers): the slot strides in "
              f"bytes differ for {differ or refusal.rejection}", field="state_item_lens")
    return [pair_finding(
        "DSV4G055", "decode peer's NIXL state registration", (prefill, decode),
        ("state_item_lens", "state_types", "prepared_state_components", "attn_tp_size",
         "is_mla_backend"),
        (f"SGLang logs \"NIXL state layout rejected\" and every request to this peer will "
         f"fail ({refusal.rejection})", f"SGLang's {refusal.function} raises it"),
        (fix,), refusal.message, when_of(Phase.PER_REQUEST, "nixl", prefill.env or {}))], []
