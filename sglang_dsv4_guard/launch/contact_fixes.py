"""The fixes of ``check``'s first-contact and DCP relayout findings: what each server would
be launched with so that SGLang's condition holds, derived from the two servers' values
(never the row's text), filtered by the release's parser (``accepted_fix``) and proven by
``check --fix``. DSV4G022's page-size fixes are :mod:`~sglang_dsv4_guard.launch.flag_fixes`'s."""

from __future__ import annotations

from sglang_dsv4_guard.findings import Finding
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.envs import env_copy
from sglang_dsv4_guard.host.flags import flag_edit
from sglang_dsv4_guard.launch.contract_run import ContractRun
from sglang_dsv4_guard.launch.derive import Side
from sglang_dsv4_guard.launch.edit import typed_flags
from sglang_dsv4_guard.launch.flag_fixes import (
    accepted_fix,
    attention_tp_fixes,
    copy_pairs,
    flag_fix,
)
from sglang_dsv4_guard.launch.kv_layout_env import LAYOUT_ENV
from sglang_dsv4_guard.pd.endpoint import Value
from sglang_dsv4_guard.pd.relayout import CODE, relayout_raise

__all__ = ["contact_fixes"]


# What each fix gives the edited server, by the value SGLang's condition reads.
_LABELS = {"kv_cache_dtype_str": "the {src}'s KV cache dtype string",
           "pp_size": "the {src}'s pipeline-parallel size",
           "attn_cp_size": "attention context parallel size 1",
           "dcp_size": "decode context parallel size 1",
           "enable_kv_cache_sharding": "KV cache sharding off",
           "kv_layout": "the {src}'s DeepSeek-V4 KV layout variables"}


def _edits(name: str, src: Side, dst: Side, run: ContractRun) -> list[Edit | None]:
    """The edits giving ``dst`` a value of ``name`` that satisfies the condition."""
    other = run.prefill if src is run.prefill_side else run.decode
    if name == "kv_cache_dtype_str":
        return [flag_edit(dst.role, "kv_cache_dtype", other.get(name))]
    if name == "pp_size" and dst.role == "decode":
        return [flag_edit(dst.role, "pp_size", other.get(name))]
    if name in ("attn_cp_size", "dcp_size", "enable_kv_cache_sharding"):
        own = (run.decode if dst is run.decode_side else run.prefill).get(name)
        if name in typed_flags(list(dst.args.argv)) and own not in (None, False, 1):
            return [flag_edit(dst.role, name, None)]  # back to the release's default (1 / off)
        return []
    if name == "kv_layout":
        return [env_copy(dst.role, key, src.args.env.get(key)) for key in LAYOUT_ENV
                if src.args.env.get(key) != dst.args.env.get(key)] or [None]
    return []


def _dcp_taken(src: Side, dst: Side, run: ContractRun) -> list[Edit | None]:
    """``dst`` launched with ``src``'s DCP size, when the release's relayout accepts the
    pair then: equal DCP sizes need no relayout (``CommonKVManager.requires_dcp_relayout``,
    0.5.17 - 0.5.23; ``pd_disaggregation_hook`` warns that a DCP prefill is supported with
    the decode's DCP layout). The first-contact conditions are proven by ``check --fix``."""
    ends = {"prefill": run.prefill, "decode": run.decode}
    size = int(ends[src.role].get("dcp_size", 1) or 1)
    if size == int(ends[dst.role].get("dcp_size", 1) or 1) or size == 1:
        return []
    ends[dst.role] = ends[dst.role].with_values(dcp_size=Value(size, src.role))
    if relayout_raise(ends["prefill"], ends["decode"]) != (None, None):
        return []
    return [flag_edit(dst.role, "dcp_size", size)]


def contact_fixes(finding: Finding, run: ContractRun) -> tuple[Fix, ...]:
    p, d = run.prefill_side, run.decode_side
    sides = {"prefill": p, "decode": d}
    names = list(dict.fromkeys(o.name for o in finding.observations))
    candidates: list[Fix | None] = []
    if "attn_tp_size" in names:
        candidates += attention_tp_fixes(p, d)
    for name in names:
        inputs = tuple(f"{e.role}: {name} {e.get(name)!r} from {e.source(name)}"
                       for e in (run.prefill, run.decode))
        for src, dst in copy_pairs(p, d):
            edits = _edits(name, src, dst, run)
            if edits:
                label = _LABELS.get(name, name).format(src=src.role)
                candidates.append(flag_fix(f"launch the {dst.role} server with {label}", name,
                                       edits, *inputs))
            taken = (_dcp_taken(src, dst, run) if (name, finding.code) == ("dcp_size", CODE)
                     else [])  # the relayout's own condition: DSV4G036
            if taken:
                candidates.append(flag_fix(f"launch the {dst.role} server with the {src.role}'s "
                                       "DCP size", name, taken, *inputs))
    fixes = tuple(dict.fromkeys(f for f in (accepted_fix(c, sides) for c in candidates)
                                if f is not None))
    return fixes or (Fix(FixKind.NO_FLAG_FIX, "no flag change of either line that the "
                                              "release accepts fixes this"),)
