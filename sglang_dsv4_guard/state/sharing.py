"""The auto-share rule: when rebinding the draft's SWA index mapping is provably safe.

Same memory (equal data_ptr, shape, stride, dtype, device): always safe. An equal
*copy*: safe only when no captured CUDA graph can hold the old tensor's pointer (SGLang's
``disable_cuda_graph`` is True, :mod:`sglang_dsv4_guard.state.cuda_graphs`) and nothing but the
draft pool references the old tensor (``TensorInfo.other_references == 0``: the
``sys.getrefcount`` surplus over a singly held object; anything else, or unknown, refuses).

A pure function of a :class:`~sglang_dsv4_guard.state.snapshot.StatePair`. It decides;
:mod:`sglang_dsv4_guard.autoshare.rebind` acts (``draft_pool.register_mapping``),
and the shared-mapping check (:mod:`.checks`) uses the same decision to offer, or not, the switch.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_dsv4_guard.host.releases import HostProfile
from sglang_dsv4_guard.state.snapshot import StatePair

__all__ = ["ShareDecision", "decide"]


@dataclass(frozen=True)
class ShareDecision:
    """Whether to share, why, and whether the case deserves a WARNING when done."""

    share: bool
    reason: str
    warn: bool = False


def decide(pair: StatePair, profile: HostProfile) -> ShareDecision:
    """Apply the rule. Only ``share=True`` decisions may lead to a rebinding."""
    t, d = pair.target, pair.draft
    if not pair.block_runs:
        return ShareDecision(False, "SGLang's DeepSeek-V4 draft check does not run for these pools")
    if t.get("_unified_kv") or d.get("_unified_kv"):
        return ShareDecision(False, "unified-KV mode addresses SWA by ring rows and reads no "
                             "index mapping")
    for snap in (t, d):
        if snap.mapping.kind != "tensor":
            return ShareDecision(False, f"the {snap.role} has no mapping tensor: "
                                        f"{snap.mapping.describe()}")
    cmp = pair.mapping
    if cmp is None:
        return ShareDecision(False, "the mappings were not compared")
    if cmp.identical:
        return ShareDecision(False, "the draft pool already holds the target's mapping")
    if cmp.same_layout:
        return ShareDecision(True, "both mappings are the same memory (equal data_ptr, shape, "
                             "stride, dtype and device): the draft already reads exactly the "
                             "target's entries")
    tm, dm = t.mapping, d.mapping
    for label, a, b in (("shape", tm.shape, dm.shape), ("dtype", tm.dtype, dm.dtype),
                        ("device", tm.device, dm.device)):
        if a != b:
            return ShareDecision(False, f"the mappings' {label} differs: target={a}, draft={b}")
    if cmp.contents_equal is None:
        return ShareDecision(False, f"the mappings' contents cannot be compared: {cmp.note}")
    if not cmp.contents_equal:
        first = cmp.first_difference
        where = f", first at index {first[0]} (target={first[1]}, draft={first[2]})" if first else ""
        return ShareDecision(False, f"the mappings' contents differ at {cmp.differing} "
                             f"position(s){where}: the draft would read and write other SWA "
                             "rows than the ones it was built for")
    if t.get("swa_size") != d.get("swa_size"):
        return ShareDecision(False, f"the SWA capacity differs (swa_size: target="
                             f"{t.get('swa_size')!r}, draft={d.get('swa_size')!r}): target "
                             "indices may not fit the draft's SWA pool")
    target_geometry = tuple(t.get(f.target_attr) for f in profile.paged_geometry)
    draft_geometry = tuple(d.get(f.draft_attr) for f in profile.paged_geometry)
    if target_geometry != draft_geometry:
        return ShareDecision(False, f"the paged SWA geometry differs (target={target_geometry}, "
                             f"draft={draft_geometry}); sharing would not make the pools agree")
    equal = ("the draft's mapping is a separate tensor with equal shape, dtype, device and "
             "contents, and both pools have equal SWA capacity and geometry")
    if pair.cuda_graphs.disabled is not True:
        return ShareDecision(False, f"{equal}, but a CUDA graph captured on the draft may hold "
                             "its old tensor's pointer and would keep reading the stale copy "
                             f"({pair.cuda_graphs.source}); a copy is shared only with CUDA "
                             "graphs disabled")
    others = d.mapping.other_references
    if others != 0:
        holders = "an unknown number of" if others is None else str(others)
        return ShareDecision(False, f"{equal}, but {holders} other reference(s) to the draft's "
                             "tensor exist besides the draft pool (e.g. the draft's own "
                             "allocator, which keeps updating it); rebinding would split the "
                             "draft's readers from its writer")
    return ShareDecision(True, f"{equal}; CUDA graphs are disabled ({pair.cuda_graphs.source}) "
                         "and nothing but the draft pool references the draft's tensor", warn=True)
