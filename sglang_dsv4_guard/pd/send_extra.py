"""Mooncake's and NIXL's per-request state transfer (``maybe_send_extra``): heterogeneous TP.

The prefill's transfer sends each state type its pool registered; for a non-MLA model
with a different attention TP on the decode, the release either refuses the state type
("PD Disaggregation does NOT support PD different TP sizes for non-MLA {ST} hybrid models
yet.", DSV4G040) or, from 0.5.22 for SWA, slices it by heads, which refuses pipeline
parallelism and a prefill SWA KV cache not in the NHD layout (the unified memory pool's
``page_major``) in ``_get_mha_head_slice_blocks``. MiniMax sparse state refuses a different
attention TP on every release (DSV4G041). These checks sit in a transfer thread that
cannot be driven here, so the release's own conditions are evaluated
(:mod:`sglang_dsv4_guard.host.pd_digests`) on a half-built manager carrying the prefill's
values and the decode's registration: SGLang's tests, and SGLang's message.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Phase
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.flags import flag_for_field
from sglang_dsv4_guard.host.pd_digests import SITES, NotJudged, locate, unjudged_sites
from sglang_dsv4_guard.host.targets import PD_BASE_MODULE
from sglang_dsv4_guard.pd.attention_tp import attention_tp_fixes, layout_of
from sglang_dsv4_guard.pd.endpoint import Endpoint, Refusal
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["BACKENDS", "MINIMAX_CODE", "send_extra_findings", "send_extra_refusals"]

MINIMAX_CODE = "DSV4G041"  # also the first contact's and MORI's transfer's refusal of it

#: The backends whose ``maybe_send_extra`` these rows read (MORI's: :mod:`.mori_send`).
BACKENDS = ("mooncake", "nixl")


def _names(prefill: Endpoint, decode: Endpoint, st: Any, enum: Any) -> dict[str, Any]:
    """The names SGLang's conditions read, as the prefill's manager and the decode's
    registration hold them."""
    tp = int(prefill.get("attn_tp_size"))
    # the state TP where the prefill's manager has one (0.5.23 pairs QSA state by it; a
    # launch line gives none: the attention TP, as SGLang's manager defaults it)
    manager = SimpleNamespace(
        attn_tp_size=tp, state_tp_size=int(prefill.get("state_tp_size") or tp),
        is_mla_backend=bool(prefill.get("is_mla_backend")),
        is_hybrid_mla_backend=bool(prefill.get("is_hybrid_mla_backend", False)),
        pp_size=int(prefill.get("pp_size") or 1))
    layout = prefill.get("swa_kv_cache_layout")
    if layout is not None:  # else reading it is not judged
        manager.kv_args = SimpleNamespace(swa_kv_cache_layout=layout)
    dst = int(decode.get("attn_tp_size"))
    return {"self": manager, "st": st, "StateType": enum, "decode_tp_size": dst,
            "_layout_unknown": (prefill.source("swa_kv_cache_layout")
                                if prefill.has("swa_kv_cache_layout") and layout is None
                                else None),
            "target_rank_registration_info": SimpleNamespace(dst_attn_tp_size=dst,
                                                             dst_tp_rank=0)}


def _one(package: Path, backend: str, names: dict[str, Any]) -> Refusal | None:
    """The refusal of one state type, if any. Raises :class:`NotJudged` where SGLang's
    transfer refuses the state before the TP comparison for another reason (MiniMax with
    PP > 1: a check of its own, not these rows')."""
    st = str(names["st"].value)
    before = locate(package, SITES[f"{backend}.minimax_pp"])
    if before is not None and before.holds(names):
        raise NotJudged(f"SGLang's {before.spec.target} refuses this state before comparing "
                        f"TP sizes: {before.message(names)!r} (per request; a check these "
                        "rows do not report)")
    for key, code in ((f"{backend}.hetero_tp", "DSV4G040"), (f"{backend}.minimax", MINIMAX_CODE)):
        site = locate(package, SITES[key])
        if site is not None and site.holds(names):
            return Refusal(code, site.message(names), str(site.spec.target), st)
    sliced = locate(package, SITES[f"{backend}.swa_slice"])
    if sliced is None or not sliced.holds(names):  # not sliced by heads for this decode
        return None
    # the head slicing's refusals, in order (the SWA layout as setup_state_kv_args copies it)
    for key in ("head_slice.pp", "head_slice.layout"):
        site = locate(package, SITES[key])
        if site is not None and key == "head_slice.layout" and names["_layout_unknown"]:
            raise NotJudged(f"the prefill's SWA KV cache layout is {names['_layout_unknown']}")
        if site is not None and site.holds({"self": names["self"]}):
            return Refusal("DSV4G040", site.message({"self": names["self"]}),
                           str(site.spec.target), st)
    return None


def send_extra_refusals(prefill: Endpoint, decode: Endpoint, backend: str, package: Path,
                        state_types: Sequence[str]) -> tuple[list[Refusal], list[str]]:
    """Each state type the prefill sends that SGLang's ``maybe_send_extra`` on ``backend``
    refuses for this decode, and what could not be judged (a release whose sites differ
    from every known one, a condition reading a value not derived)."""
    keys = (f"{backend}.hetero_tp", f"{backend}.swa_slice", f"{backend}.minimax",
            f"{backend}.minimax_pp", "head_slice.pp", "head_slice.layout")
    changed = unjudged_sites(package, keys, f"DSV4G040/DSV4G041 ({backend})")
    if changed:
        return [], [changed]
    enum = importlib.import_module(PD_BASE_MODULE).StateType  # unscanned: targets
    refusals: list[Refusal] = []
    unknowns: list[str] = []
    for value in state_types:
        try:
            st = enum(value)
            refusal = _one(package, backend, _names(prefill, decode, st, enum))
        except (NotJudged, ValueError) as exc:
            unknowns.append(f"DSV4G040 ({backend}, state type {value}): not judged: {exc}")
            continue
        if refusal is not None:
            refusals.append(refusal)
    return refusals, unknowns


def send_extra_findings(prefill: Endpoint, decode: Endpoint, package: Path | None
                        ) -> tuple[list[Finding], list[str]]:
    """DSV4G040/041 for the pair (both servers on Mooncake or on NIXL), and what could not
    be judged. State types one branch refuses with one message (0.5.21+: MiniMax's index
    and dense KV) are one refusal: the transfer raises at the first of them."""
    backend = prefill.get("transfer_backend")
    if backend not in BACKENDS or decode.get("transfer_backend", backend) != backend \
            or not (prefill.has("attn_tp_size") and decode.has("attn_tp_size")):
        return [], []
    if package is None:
        return [], ["DSV4G040: not judged: the imported SGLang's source was not found"]
    if not prefill.has("state_types"):
        if prefill.get("attn_tp_size") != decode.get("attn_tp_size") \
                and not prefill.get("is_mla_backend"):
            return [], [f"DSV4G040 ({backend}): not judged: the state types of the prefill's "
                        "pool (a pool this check does not build) are not known, and attention "
                        f"TP differs ({prefill.get('attn_tp_size')} vs "
                        f"{decode.get('attn_tp_size')})"]
        return [], []
    refusals, unknowns = send_extra_refusals(prefill, decode, backend, package,
                                             prefill.get("state_types"))
    # 0.5.23 refuses MiniMax at decode's first contact: that condition reports it.
    minimax_first = locate(package, SITES["first_contact.minimax"]) is not None
    merged: dict[tuple[str, str], Refusal] = {}
    for v in refusals:
        if v.code == MINIMAX_CODE and minimax_first:
            continue
        first = merged.get((v.code, v.message))
        merged[(v.code, v.message)] = v if first is None else replace(
            first, state_type=f"{first.state_type} and {v.state_type}")
    return [_finding(prefill, decode, backend, v) for v in merged.values()], unknowns


def _finding(prefill: Endpoint, decode: Endpoint, backend: str, refusal: Refusal
             ) -> Finding:
    pp = "pipeline parallelism" in refusal.message
    layout = "KV cache layout" in refusal.message
    names = ["attn_tp_size", "is_mla_backend", "state_types", *(["pp_size"] if pp else []),
             *(["swa_kv_cache_layout"] if layout else [])]
    observed = [*((prefill, n) for n in names), (decode, "attn_tp_size"),
                (prefill, "transfer_backend"), (decode, "transfer_backend")]
    return Finding(
        code=refusal.code, severity=CODES[refusal.code].severity, summary=CODES[refusal.code].title,
        subject=f"prefill -> decode {backend} transfer of the {refusal.state_type} state",
        observations=tuple(e.observation(n) for e, n in observed if e.has(n)),
        details=(f"SGLang's {refusal.function} raises it on the prefill for every request "
                 f"that carries {refusal.state_type} state: the prefill has attention TP "
                 f"{prefill.get('attn_tp_size')}, the decode {decode.get('attn_tp_size')}",),
        fixes=_fixes(prefill, decode, pp, layout), docs=docs_url(refusal.code),
        host_message=refusal.message,
        when=when_of(Phase.PER_REQUEST, backend, prefill.env or {}))


def _fixes(prefill: Endpoint, decode: Endpoint, pp: bool, layout: bool) -> tuple[Fix, ...]:
    """Equal attention TP sizes (:mod:`.attention_tp`); for a head-sliced transfer that
    refuses the prefill's PP or SWA layout, those first."""
    found: list[Fix] = []
    pp_flag = flag_for_field("pp_size")
    roles = [e.role for e in (prefill, decode) if int(e.get("pp_size") or 1) > 1]
    if pp and not decode.has("pp_size"):  # a registering decode: its PP is not known
        found.append(Fix(FixKind.ADVICE, "run the prefill without pipeline parallelism "
                         "(head-sliced SWA transfer needs the prefill's PP 1), and the "
                         "decode with PP 1 (a decode's PP must equal the prefill's or be 1; "
                         "its PP is not known here)", field="pp_size"))
    elif pp and pp_flag is not None and roles:
        # the decode's PP: the first contact asserts it equal to the prefill's or 1 (0.5.23)
        found.append(Fix(FixKind.FLAGS, "run " + " and ".join(f"the {r}" for r in roles)
                         + " without pipeline parallelism (head-sliced SWA transfer needs "
                         "the prefill's PP 1, and a decode's PP must equal it or be 1)",
                         field="pp_size", edits=tuple(Edit(r, pp_flag.option, "1")
                                                      for r in roles)))
    unified = flag_for_field("enable_unified_memory")
    if layout and unified is not None and prefill.get("enable_unified_memory"):
        # the plain SWAKVPool's SWA layout is NHD, which the head-sliced transfer takes
        found.append(Fix(FixKind.FLAGS, "run the prefill without the unified memory pool "
                                        "(its page_major SWA layout cannot be head-sliced)",
                         field="swa_kv_cache_layout",
                         edits=(Edit("prefill", unified.option, remove=True),)))
    return (*found, *attention_tp_fixes(layout_of(prefill), layout_of(decode)))
