"""The DCP relayout decision a prefill rank makes when a decode rank registers.

The release's own ``CommonKVManager.requires_dcp_relayout`` (0.5.17+) runs on a bare
manager (``object.__new__``) holding the prefill's values, with the decode's DCP size and
rank as the registration message carries them. Mooncake, NIXL and MORI inherit it (the
Ascend backend overrides it: not judged here).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from sglang_dsv4_guard.findings import Finding, Phase
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.host.flags import flag_edit
from sglang_dsv4_guard.host.targets import PD_COMMON_MANAGER, PD_COMMON_MODULE, PD_RELAYOUT
from sglang_dsv4_guard.pd.contact_fixes import contact_fixes
from sglang_dsv4_guard.pd.endpoint import Endpoint, Value, pair_finding
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["CODE", "relayout_findings", "requires_relayout"]

CODE = "DSV4G036"
_OWN_RELAYOUT = ("ascend",)  # backends whose manager overrides the method


def _run(prefill: Endpoint, decode: Endpoint) -> tuple[bool | None, str | None, str | None]:
    """The release's ``requires_dcp_relayout`` for the servers' ``dcp_rank`` (rank 0 of
    each before launch; the registering ranks at run time): (its result,
    its message when it raises, why it could not be run)."""
    cls = getattr(importlib.import_module(  # unscanned: SGLang
        PD_COMMON_MODULE), PD_COMMON_MANAGER)
    function = getattr(cls, PD_RELAYOUT.attr, None)
    if function is None:
        return False, None, None  # the release has no DCP relayout (0.5.16)
    manager = object.__new__(cls)
    manager.dcp_size = int(prefill.get("dcp_size", 1) or 1)
    manager.dcp_rank = int(prefill.get("dcp_rank", 0) or 0)  # 0 before launch
    manager.is_mla_backend = bool(prefill.get("is_mla_backend", False))
    manager.is_hybrid_mla_backend = bool(prefill.get("is_hybrid_mla_backend", False))
    try:
        return bool(function(manager, int(decode.get("dcp_size", 1) or 1),
                             int(decode.get("dcp_rank", 0) or 0))), None, None
    except (AttributeError, TypeError) as exc:
        return None, None, (f"SGLang's {PD_RELAYOUT.qualname} read what this check does not "
                            f"set ({type(exc).__name__}: {exc})")
    except Exception as exc:
        return None, str(exc), None


def requires_relayout(prefill: Endpoint, decode: Endpoint) -> bool | None:
    """Whether the release's own ``requires_dcp_relayout`` asks for the relayout when rank 0
    of the decode registers with rank 0 of the prefill (``False`` on a release without
    it); ``None`` when it raises (DSV4G036: registration stops there) or cannot be run."""
    return _run(prefill, decode)[0]


def relayout_findings(prefill: Endpoint, decode: Endpoint, release: str,
                      env: Mapping[str, str] | None = None) -> tuple[list[Finding], list[str]]:
    """DSV4G036 when the release's relayout refuses the pair's DCP sizes, and unknowns
    (``env``: the prefill's environment, which sets its bootstrap timeout)."""
    backend = str(prefill.get("transfer_backend", "?"))
    if backend in _OWN_RELAYOUT:
        return [], [f"DSV4G036 ({release}): the {backend} backend decides the DCP relayout "
                    "itself; not judged here"]
    _, message, unknown = _run(prefill, decode)
    unknowns = [f"DSV4G036 ({release}): not judged: {unknown}"] if unknown else []
    dcp = int(decode.get("dcp_size", 1) or 1)
    if dcp > 1 and dcp == int(prefill.get("dcp_size", 1) or 1) and \
            prefill.get("attn_tp_size") != decode.get("attn_tp_size"):
        unknowns.append(f"DSV4G036 ({release}): with DCP {dcp} on both servers and different "
                        "attention TP, which prefill DCP rank each decode rank registers "
                        "with is decided at run time; only rank 0 of each was compared")
    if message is None:
        return [], unknowns
    # which DCP ranks were compared: the registering ones at run time, else rank 0
    ranks = (f"the registering ranks: prefill DCP rank {prefill.get('dcp_rank')}, decode DCP "
             f"rank {decode.get('dcp_rank')}" if prefill.has("dcp_rank") and decode.has("dcp_rank")
             else "rank 0 of each server")
    return [pair_finding(
        CODE, "decode rank registration with the prefill", (prefill, decode),
        ("dcp_size", "is_mla_backend"),
        (f"SGLang's own {PD_RELAYOUT.qualname} raised on the prefill's DCP size and pool kind "
         f"and the decode's DCP size ({ranks})",),
        _fixes(prefill, decode), message, when_of(Phase.REGISTRATION, backend, env))], unknowns


def _fixes(prefill: Endpoint, decode: Endpoint) -> tuple[Fix, ...]:
    """DCP off where a server sets it (:mod:`.contact_fixes`), then each server taking the
    other's DCP size where the release's relayout then accepts the pair: equal DCP sizes
    need none (``CommonKVManager.requires_dcp_relayout``, 0.5.17 - 0.5.23;
    ``pd_disaggregation_hook`` warns that a DCP prefill is supported with the decode's DCP
    layout)."""
    found = list(contact_fixes({}, ("dcp_size",), prefill, decode))
    for src, dst in ((prefill, decode), (decode, prefill)):
        size = int(src.get("dcp_size", 1) or 1)
        if size == 1 or size == int(dst.get("dcp_size", 1) or 1):
            continue
        ends = {"prefill": prefill, "decode": decode}
        ends[dst.role] = dst.with_values(dcp_size=Value(size, src.role))
        edit = flag_edit(dst.role, "dcp_size", size)
        if edit is not None and _run(ends["prefill"], ends["decode"])[1:] == (None, None):
            found.append(Fix(FixKind.FLAGS, f"launch the {dst.role} server with the "
                             f"{src.role}'s DCP size", field="dcp_size", edits=(edit,),
                             inputs=tuple(f"{e.role}: dcp_size {e.get('dcp_size')!r} from "
                                          f"{e.source('dcp_size')}" for e in (prefill, decode))))
    return tuple(found)
