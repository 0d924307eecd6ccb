"""NIXL's registration (``_prepare_payload_xfer``: HiSparse on the decode, DSV4G042/043; a
draft pool on the prefill only, DSV4G046) and the decode's first request with HiSparse
(``pop_preallocated``, DSV4G044).

``_prepare_payload_xfer`` runs for real, on a half-built ``NixlKVManager`` (no agent: the
checks come before any transfer handle is made) with the prefill's values and the decode's
registration as the flags imply it: one KV region per target pool entry on each side, more
on the side that alone has a draft; the decode's regions in host memory (``DRAM``)
with HiSparse, a draft's (on a decode that has one) on the GPU. Past the checks, the function goes on to build
transfer handles, which the half-built manager cannot: that is "accepted".

``pop_preallocated``'s check sits in the decode's scheduler loop: its digested condition
(:mod:`sglang_dsv4_guard.host.pd_digests`) is evaluated on a half-built queue.

:func:`payload_finding` also builds ``check``'s DSV4G044.
"""

from __future__ import annotations

import importlib
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_dsv4_guard.findings import Finding, Phase
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.flags import flag_for_field
from sglang_dsv4_guard.host.pd_digests import SITES, NotJudged, locate, unjudged_sites, with_globals
from sglang_dsv4_guard.host.targets import DSV4_POOL, PD_NIXL_PAYLOAD, STATE
from sglang_dsv4_guard.pd.attention_tp import attention_tp_fixes, layout_of
from sglang_dsv4_guard.pd.endpoint import PEER, Endpoint, Refusal, pair_finding
from sglang_dsv4_guard.pd.relayout import requires_relayout
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["HISPARSE_CODE", "PAYLOAD_SITES", "PREFILL_DRAFT_CODE", "REGIONS", "decode_kv_kinds",
           "hisparse_backend_refusal", "nixl_payload_findings", "payload_finding",
           "payload_refusal"]

#: The digested sites of NIXL's registration payload checks.
PAYLOAD_SITES = ("nixl.hisparse_spec", "nixl.direct_to_host", "nixl.fewer_regions")

REGIONS = 2  # KV regions of a target pool in the miniature registration
HISPARSE_CODE, PREFILL_DRAFT_CODE = "DSV4G044", "DSV4G046"
_PHRASES = {"decode-only speculative": "DSV4G042", "direct-to-host": "DSV4G043",
            "registered fewer KV regions": PREFILL_DRAFT_CODE}


def decode_kv_kinds(decode: Endpoint, decode_only_draft: bool) -> list[str]:
    """The memory kinds of the decode's KV regions: host memory for the HiSparse target
    pool, the GPU's for the rest (and for a draft pool)."""
    target = "DRAM" if decode.get("enable_hisparse") else "VRAM"
    return [target] * REGIONS + (["VRAM"] * REGIONS if decode_only_draft else [])


def payload_refusal(prefill: Endpoint, decode: Endpoint) -> Refusal | None:
    """SGLang's ``_prepare_payload_xfer`` on the pair's registration: its refusal, if any.

    The peer carries the release's own ``requires_dcp_relayout`` result, as NIXL's
    ``NixlKVManager._add_remote_peer`` sets it just before (0.5.17+,
    sglang/srt/disaggregation/nixl/conn.py); with it, ``_prepare_payload_xfer`` takes its
    DCP branch first and returns before either HiSparse check (0.5.17 - 0.5.23). When the
    relayout itself raises (:mod:`.relayout`), registration stops there: no refusal here."""
    relayout = requires_relayout(prefill, decode)
    if relayout is None:
        return None
    module = importlib.import_module(PD_NIXL_PAYLOAD.module)  # unscanned: targets
    owner, method = PD_NIXL_PAYLOAD.qualname.split(".")
    cls = getattr(module, owner)
    only_decode = bool(decode.get("speculative_algorithm")) and not prefill.get(
        "speculative_algorithm")
    # At run time the decode's registration gives its regions' memory kinds and the
    # prefill's manager its region count (``kv_mem_kinds``, ``kv_regions``); before
    # launch they are implied by the flags.
    kinds = list(decode.get("kv_mem_kinds") or decode_kv_kinds(decode, only_decode))
    # A prefill with a draft pool registers its regions after the target's (prefill.py
    # PrefillBootstrapQueue._init_kv_manager); a decode without one registers fewer.
    only_prefill = bool(prefill.get("speculative_algorithm")) and not decode.get(
        "speculative_algorithm")
    sources = int(prefill.get("kv_regions") or REGIONS * (2 if only_prefill else 1))
    manager = object.__new__(cls)
    manager.__dict__.update(
        attn_tp_size=int(prefill.get("attn_tp_size")), src_mem_kind="VRAM",
        is_mla_backend=bool(prefill.get("is_mla_backend")),
        is_hybrid_mla_backend=bool(prefill.get("is_hybrid_mla_backend", False)),
        prep_handles={}, kv_args=SimpleNamespace(
            kv_item_lens=[64] * sources, kv_data_mem_kinds=["VRAM"] * sources,
            kv_data_ptrs=[0] * sources, kv_layer_ids=list(range(sources)), gpu_id=0))
    peer = SimpleNamespace(
        dst_kv_item_lens=[64] * len(kinds), dst_kv_mem_kinds=kinds,
        dst_kv_ptrs=[0] * len(kinds), decode_tp_size=int(decode.get("attn_tp_size")),
        requires_dcp_relayout=relayout, agent_name="decode", gpu_id=0, dst_num_slots=None,
        dst_kv_layer_ids=list(range(len(kinds))), dst_dcp_size=int(decode.get("dcp_size", 1) or 1))
    try:
        getattr(cls, method)(manager, peer)
    except (NotImplementedError, ValueError) as exc:
        for phrase, code in _PHRASES.items():
            if phrase in str(exc):
                return Refusal(code, str(exc), str(PD_NIXL_PAYLOAD))
    except Exception:  # past the checks: the transfer handles this manager cannot build
        return None
    return None


def _is_fake_transfer(utils: Any, backend: str) -> Any:
    """SGLang's own ``_is_fake_transfer`` (``disaggregation/utils.py``), its code run with
    the decode's transfer backend where it reads the server's (0.5.17 - 0.5.20: the
    ``server_args`` the call passes; 0.5.21+: ``get_disagg()``, given here)."""
    real = getattr(utils, "_is_fake_transfer", None)
    if not isinstance(real, types.FunctionType):
        raise NotJudged(f"{STATE.module} has no _is_fake_transfer function")
    disagg = SimpleNamespace(disaggregation_transfer_backend=backend)
    return with_globals(real, get_disagg=lambda: disagg)


def _names(decode: Endpoint) -> dict[str, Any]:
    """The names ``pop_preallocated``'s test reads, for the decode's first request: routed
    from a prefill (``bootstrap_host`` set) on a real backend; without a bootstrap host on
    the ``fake`` backend (decode-only: no prefill to name), so SGLang's own
    ``_is_fake_transfer`` holds there and the check is skipped."""
    pools = importlib.import_module(DSV4_POOL.module)  # unscanned: targets
    pool_cls = getattr(pools, DSV4_POOL.qualname)
    utils = importlib.import_module(STATE.module)  # unscanned: targets (TransferBackend)
    name = str(decode.get("transfer_backend"))
    backend = utils.TransferBackend(name)
    args = SimpleNamespace(disaggregation_transfer_backend=name)
    req = SimpleNamespace(bootstrap_host=None if name == "fake" else "prefill.bootstrap.host")
    queue = SimpleNamespace(
        scheduler=SimpleNamespace(enable_hisparse=bool(decode.get("enable_hisparse")),
                                  server_args=args),
        token_to_kv_pool=object.__new__(pool_cls) if decode.get("is_dsv4") else object(),
        draft_token_to_kv_pool=object() if decode.get("speculative_algorithm") else None,
        transfer_backend=backend)
    return {"self": queue, "DeepSeekV4TokenToKVPool": pool_cls,
            "TransferBackend": utils.TransferBackend, "decode_req": SimpleNamespace(req=req),
            "_is_fake_transfer": _is_fake_transfer(utils, name)}


def hisparse_backend_refusal(decode: Endpoint, package: Path) -> Refusal | None:
    """``pop_preallocated``'s HiSparse backend check for the decode; ``None`` when the
    release has none or it holds not. Raises :class:`NotJudged`."""
    site = locate(package, SITES["decode.hisparse_mooncake"])
    if site is None:
        return None
    names = _names(decode)
    if not site.holds(names):
        return None
    return Refusal(HISPARSE_CODE, site.message(names), str(site.spec.target))


def nixl_payload_findings(prefill: Endpoint, decode: Endpoint, package: Path | None
                          ) -> tuple[list[Finding], list[str]]:
    """DSV4G042/043/046: NIXL's registration of the decode (both servers on NIXL), and
    what could not be judged. Judged where the decode's HiSparse is known (from its launch
    line, or the memory kinds its registration carries) and, from launch lines, both DCP
    sizes; a registration without one is of a release without DCP (size 1)."""
    if not prefill.get("transfer_backend") == decode.get("transfer_backend", "nixl") == "nixl":
        return [], []
    if not decode.has("enable_hisparse") or (not decode.has(PEER) and not (
            prefill.has("dcp_size") and decode.has("dcp_size"))):
        return [], []  # a value it reads was not derived: the endpoint's note says why
    changed = unjudged_sites(package, PAYLOAD_SITES, "DSV4G042/DSV4G043/DSV4G046")
    if changed:
        return [], [changed]
    refusal = payload_refusal(prefill, decode)
    return ([payload_finding(prefill, decode, refusal, Phase.REGISTRATION)]
            if refusal else []), []


def payload_finding(prefill: Endpoint, decode: Endpoint, refusal: Refusal,
                    phase: Phase) -> Finding:
    """The finding of a NIXL payload refusal (and of HiSparse off Mooncake, DSV4G044)."""
    names = (("transfer_backend", "speculative_algorithm", "kv_regions")
             if refusal.code == PREFILL_DRAFT_CODE else (
        "transfer_backend", "enable_hisparse", "kv_mem_kinds", "speculative_algorithm",
        "is_dsv4", *(("attn_tp_size", "is_mla_backend") if refusal.code == "DSV4G043" else ())))
    return pair_finding(
        refusal.code, ("decode peer's NIXL registration" if refusal.code == PREFILL_DRAFT_CODE
                       else "decode server HiSparse transfer"), (prefill, decode), names,
        (_details(prefill, decode, refusal),), _fixes(prefill, decode, refusal),
        refusal.message, when_of(phase, str(prefill.get("transfer_backend")),
                                   prefill.env or {}))


def _details(prefill: Endpoint, decode: Endpoint, refusal: Refusal) -> str:
    d = decode
    if refusal.code == PREFILL_DRAFT_CODE:
        return (f"SGLang's {refusal.function} raises it: the prefill runs "
                f"{prefill.get('speculative_algorithm')} and registers its draft pool's "
                "KV regions after the target's (PrefillBootstrapQueue._init_kv_manager); the "
                "decode, without speculative decoding, registers only the target's")
    if refusal.code == HISPARSE_CODE:
        # decode.py DecodePreallocQueue.pop_preallocated (0.5.17+; a draft pool from 0.5.22)
        pools = " and ".join(n for n, on in (("a DeepSeek-V4 KV pool", d.get("is_dsv4")), (
            "a draft KV pool", d.get("speculative_algorithm"))) if on)
        return (f"SGLang's {refusal.function} raises it: the decode runs HiSparse with "
                f"{pools or 'the pool the release tests'} on the "
                f"{d.get('transfer_backend')} backend, and its HiSparse transfer is "
                "Mooncake's only")
    draft = (", its draft's on the GPU" if d.get("speculative_algorithm") else "")
    return (f"SGLang's {refusal.function} raises it; the decode's HiSparse KV is in host "
            f"memory (DRAM){draft} (the memory kinds NIXL reads from the registration, as "
            "HiSparse allocates them)")


def _fixes(prefill: Endpoint, decode: Endpoint, refusal: Refusal) -> tuple[Fix, ...]:
    """DSV4G046: the speculative decoding of both servers alike (said here; ``check``
    derives the flag edits from both lines). DSV4G042-044: the decode without HiSparse;
    where attention TP differs (DSV4G043), equal attention TP first; else Mooncake on
    both servers, whose transfer takes HiSparse."""
    if refusal.code == PREFILL_DRAFT_CODE:
        regions = ("" if not (prefill.has("kv_regions") and decode.has("kv_regions")) else
                   f": the decode registered {decode.get('kv_regions')} KV regions, the "
                   f"prefill has {prefill.get('kv_regions')}")
        return (Fix(FixKind.ADVICE, "run the decode with the prefill's speculative decoding "
                    f"({prefill.get('speculative_algorithm') or 'its draft model'}), or the "
                    f"prefill without it{regions}", field="speculative_algorithm"),)
    tp = refusal.code == "DSV4G043"
    found: list[Fix] = list(attention_tp_fixes(layout_of(prefill), layout_of(decode))
                            if tp else ())
    hisparse, backend = flag_for_field("enable_hisparse"), flag_for_field(
        "disaggregation_transfer_backend")
    if hisparse is not None:
        found.append(Fix(FixKind.FLAGS, "run the decode without HiSparse", field="enable_hisparse",
                         edits=(Edit("decode", hisparse.option, remove=True),)))
    if backend is not None and not tp:
        found.append(Fix(FixKind.FLAGS, "use the Mooncake transfer backend on both servers",
                         field="transfer_backend", edits=tuple(
                             Edit(e.role, backend.option, "mooncake") for e in (prefill, decode))))
    return tuple(found)
