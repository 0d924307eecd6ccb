"""Built-in checks DSV4G001-DSV4G005 and DSV4G010: SGLang's DSV4 draft block, all of it.

SGLang stops at its first failing check. These checks walk the same checks in the
same order and keep going, so the first error finding is SGLang's error and the
rest are the ones the operator would meet on the next launches.
"""

from __future__ import annotations

from typing import Any

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import LIST_CAP, STOPS_AT_START, Finding, Observation, Phase, Severity, When
from sglang_dsv4_guard.fixes import Fix
from sglang_dsv4_guard.hookmarkers import hookimpl
from sglang_dsv4_guard.host.releases import HostProfile
from sglang_dsv4_guard.state import pool_fixes as derive
from sglang_dsv4_guard.state.sharing import decide
from sglang_dsv4_guard.state.snapshot import (
    NotASequence,
    PoolSnapshot,
    StateContext,
    StatePair,
)

# The block's codes, by condition (the modules that name one import it from here).
RATIOS_CODE, MODES_CODE, RING_CODE, MAPPING_CODE, PAGED_CODE, INCOMPLETE_CODE = (
    "DSV4G001", "DSV4G002", "DSV4G003", "DSV4G004", "DSV4G005", "DSV4G010")
_RATIO_SOURCE = {
    "target pool": "usually the model config's compress_ratios (config.json)",
    "draft pool": "usually KVCacheConfigurator (is_draft_worker): COMPRESS_RATIO_NEXTN_LAYER "
    "(0) on every layer; values like these were built otherwise",
}
_UNIFIED_SOURCE = (
    "is_unified_kv_triton(): ROCm and env SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton, "
    "read once when the pool is built"
)
_RING_FIELDS = (
    ("window", "unified_swa_window", "model config sliding_window"),
    ("ring size", "unified_swa_ring_size",
     "sliding_window + (--speculative-num-draft-tokens - 1) when speculative"),
    ("pages", "unified_swa_pages", "DeepSeekV4UnifiedKVPool.swa_pages (unified KV ring pages)"),
)


def _finding(code: str, summary: str, subject: str, *, observations: tuple[Observation, ...] = (),
             details: tuple[str, ...] = (), fixes: tuple[Fix | str, ...] = (),
             severity: Severity = Severity.ERROR, host_message: str | None = None,
             when: When = STOPS_AT_START) -> Finding:
    return Finding(
        code=code, severity=severity, summary=summary, subject=subject,
        observations=observations, details=details,
        fixes=tuple(f if isinstance(f, Fix) else Fix.advice(f) for f in fixes),
        docs=docs_url(code), host_message=host_message, when=when,
    )


def _incomplete(snap: PoolSnapshot, name: str, context: StateContext) -> Finding:
    value = snap.get(name)
    return _finding(
        INCOMPLETE_CODE,
        f"the {snap.role} has no readable attribute {name!r}",
        f"{snap.role} ({snap.type_name})",
        observations=(Observation(snap.role, name, value, "pool attribute"),),
        details=("SGLang raises AttributeError when it reads this attribute",),
        fixes=derive.incomplete_fixes(snap, name, context),
    )


def _ratio_observations(pair: StatePair) -> tuple[Observation, ...]:
    return tuple(Observation(snap.role, "compression_ratios", snap.get("compression_ratios"),
                             _RATIO_SOURCE[snap.role]) for snap in (pair.draft, pair.target))


def _swa_only_error(pair: StatePair, context: StateContext, details: tuple[str, ...],
                    summary: str = CODES[RATIOS_CODE].title) -> list[Finding]:
    """SGLang's SWA-only error on the draft pool's ratios."""
    return [_finding(RATIOS_CODE, summary, "draft pool compression_ratios",
                     observations=_ratio_observations(pair), details=details,
                     fixes=derive.ratio_fixes(pair, context),
                     host_message=CODES[RATIOS_CODE].sglang_message)]


def _ratios_not_a_list(pair: StatePair, value: NotASequence,
                       context: StateContext) -> list[Finding]:
    """``compression_ratios`` is not a list: say what it is and what SGLang does with it."""
    what = f"compression_ratios is {value.text} ({value.type_name}), not a list of per-layer ratios"
    observations = _ratio_observations(pair)
    if value.one_shot:
        return [_finding(
            RATIOS_CODE, f"the draft pool's {what}", "draft pool compression_ratios",
            severity=Severity.WARNING, observations=observations,
            details=("a one-shot iterator: SGLang's SWA-only check consumes it, so the guard "
                     "does not read it and makes no prediction for this check; any later "
                     "reader sees it empty",),
            fixes=derive.incomplete_fixes(pair.draft, "compression_ratios", context),
            when=When(Phase.START_UP, "at start-up: SGLang's own check decides (the guard "
                      "makes no prediction)"),
        )]
    if value.truthy is False:  # SGLang: `not compression_ratios` -> its SWA-only error
        return _swa_only_error(pair, context, (
            f"SGLang tests `not compression_ratios`, which is true for {value.text}, and raises "
            "its SWA-only error",), f"the draft pool's {what}")
    why = (f"SGLang's `not compression_ratios` raises ({value.error})" if value.truthy is None
           else "SGLang raises TypeError iterating it")
    return [_finding(
        INCOMPLETE_CODE, f"the draft pool's {what}", f"draft pool ({pair.draft.type_name})",
        observations=observations, details=(why,),
        fixes=derive.incomplete_fixes(pair.draft, "compression_ratios", context),
    )]


def _check_ratios(pair: StatePair, context: StateContext) -> list[Finding]:
    draft = pair.draft
    if not draft.has("compression_ratios"):
        return [_incomplete(draft, "compression_ratios", context)]
    ratios: Any = draft.get("compression_ratios")
    if isinstance(ratios, NotASequence):
        return _ratios_not_a_list(pair, ratios, context)
    # Exactly SGLang's test, `not all(ratio == 0 for ratio in ratios)`: tuple.count compares
    # each element with == in C; then only the first LIST_CAP offenders are looked up, so a
    # million layers cost one C pass and allocate nothing per layer.
    offending: list[tuple[int, object]] = []
    try:
        count = len(ratios) - ratios.count(0)
    except Exception:  # some element's == raises: SGLang's all() may stop before it
        return _ordered_scan(pair, ratios, context)
    for i, r in enumerate(ratios):
        if len(offending) >= min(count, LIST_CAP):
            break
        if not r == 0:  # noqa: SIM201 - SGLang compares with ==
            offending.append((i, r))
    if ratios and not count:
        return []
    if offending:
        shown = ", ".join(f"layer {i}: ratio {r}" for i, r in offending)
        more = f" (+{count - LIST_CAP} more)" if count > LIST_CAP else ""
        details = (f"draft layers that are not SWA-only: {shown}{more}",)
    else:
        details = ("the draft pool lists no layers at all (compression_ratios is empty)",)
    return _swa_only_error(pair, context, details)


def _ordered_scan(pair: StatePair, ratios: tuple[object, ...],
                  context: StateContext) -> list[Finding]:
    """SGLang's ``all(ratio == 0 ...)`` step by step, for ratios whose comparison can raise:
    an element that raises before any non-zero ratio raises in SGLang too (incomplete);
    the first non-zero one decides SGLang's SWA-only error, as all() stops there."""
    for i, r in enumerate(ratios):
        try:
            zero = bool(r == 0)
        except Exception:  # SGLang's all() raises at this very element
            return [_incomplete(pair.draft, "compression_ratios", context)]
        if not zero:
            return _swa_only_error(pair, context, (
                f"draft layer {i} is not SWA-only: ratio {r} (SGLang's all() stops here; later "
                "layers were not compared)",))
    return []


def _check_unified(pair: StatePair, context: StateContext) -> tuple[list[Finding], bool]:
    """The unified-mode check; the bool says whether the geometry checks can go on."""
    missing = [_incomplete(snap, "_unified_kv", context) for snap in (pair.target, pair.draft)
               if not snap.has("_unified_kv")]
    if missing:
        return missing, False
    t, d = pair.target.get("_unified_kv"), pair.draft.get("_unified_kv")
    if t == d:
        return [], True
    unified = "target pool" if t else "draft pool"
    return [_finding(
        MODES_CODE, CODES[MODES_CODE].title, "_unified_kv",
        observations=(Observation("target pool", "_unified_kv", t, _UNIFIED_SOURCE),
                      Observation("draft pool", "_unified_kv", d, _UNIFIED_SOURCE)),
        details=(f"only the {unified} is unified; the geometry checks are skipped until "
                 "both pools use one mode",),
        fixes=derive.unified_fixes(pair, context),
        host_message=CODES[MODES_CODE].sglang_message,
    )], False


def _geometry_finding(code: str, message: str, fields: list[tuple[str, str, str, str]],
                      pair: StatePair, context: StateContext) -> Finding:
    observations: list[Observation] = []
    details: list[str] = []
    for label, t_attr, d_attr, source in fields:
        tv, dv = pair.target.get(t_attr), pair.draft.get(d_attr)
        observations += [
            Observation("target pool", t_attr, tv, derive.geometry_source(label, "target", source)),
            Observation("draft pool", d_attr, dv, derive.geometry_source(label, "draft", source))]
        mark = "differs" if tv != dv else "equal"
        details.append(f"{label}: target {t_attr}={tv!r}, draft {d_attr}={dv!r} ({mark})")
    return _finding(code, CODES[code].title, "SWA geometry", observations=tuple(observations),
                    details=tuple(details), host_message=message,
                    fixes=derive.geometry_fixes(pair, context, fields))


def _check_geometry(pair: StatePair, context: StateContext, unified: bool) -> list[Finding]:
    if unified:
        fields = [(label, attr, attr, source) for label, attr, source in _RING_FIELDS]
        code, prefix = RING_CODE, "DSV4 target and draft pools must share SWA ring geometry: "
    else:
        fields = [(f.name, f.target_attr, f.draft_attr, f.source)
                  for f in context.profile.paged_geometry]
        code, prefix = PAGED_CODE, context.profile.paged_geometry_prefix
    missing = [_incomplete(snap, attr, context) for _, t_attr, d_attr, _ in fields
               for snap, attr in ((pair.target, t_attr), (pair.draft, d_attr))
               if not snap.has(attr)]
    if missing:
        return missing
    target = tuple(pair.target.get(f[1]) for f in fields)
    draft = tuple(pair.draft.get(f[2]) for f in fields)
    if target == draft:
        return []
    return [_geometry_finding(code, f"{prefix}target={target}, draft={draft}", fields, pair,
                              context)]


def _never_registered(roles: list[str], profile: HostProfile) -> str:
    where = ", ".join(roles)
    if profile.mapping_always_set:
        return (f"no attribute full_to_swa_index_mapping on: {where}; SGLang "
                f"{profile.name} sets it to None in __init__, so this pool was not built "
                "by DeepSeekV4TokenToKVPool.__init__ (half-built or foreign); SGLang raises "
                "AttributeError reading it")
    return (f"never registered on: {where}; SGLang {profile.name} creates "
            "full_to_swa_index_mapping only in register_mapping(), so SGLang raises "
            "AttributeError reading it")


def _check_mapping(pair: StatePair, context: StateContext) -> list[Finding]:
    t, d = pair.target.mapping, pair.draft.mapping
    observations = tuple(Observation(snap.role, "full_to_swa_index_mapping", snap.mapping.describe(),
                                     derive.mapping_source(snap, context))
                         for snap in (pair.target, pair.draft))
    cmp = pair.mapping
    never = [snap.role for snap in (pair.target, pair.draft) if snap.mapping.kind == "missing"]
    if not never and cmp is not None and cmp.identical:
        if t.kind == "none" and pair.target.get("request_window.capacity") is None \
                and pair.draft.get("swa_req_ring_size") is None:
            return [_finding(
                MAPPING_CODE, "neither pool has an SWA index mapping registered",
                "full_to_swa_index_mapping", severity=Severity.WARNING,
                observations=observations,
                details=("SGLang accepts this (None is None), but a paged DSV4 pool without "
                         "a mapping cannot translate full-cache indices to SWA slots",),
                fixes=derive.mapping_fixes(pair, context, None, []),
                when=When(Phase.START_UP, "at start-up: SGLang accepts it; the server starts"),
            )]
        return []
    details: list[str] = []
    if never:
        details.append(_never_registered(never, context.profile))
    if cmp is not None and t.kind == d.kind == "tensor":
        details.append(f"same storage: {'yes' if cmp.same_storage else 'no'}; "
                       f"same memory layout: {'yes' if cmp.same_layout else 'no'}")
        if cmp.contents_equal is None:
            details.append(f"contents not comparable ({cmp.note or 'shape, dtype or device differ'})")
        elif cmp.contents_equal:
            details.append("contents equal (a copy or view of the target's tensor)")
        else:
            first = cmp.first_difference
            at = f", first at index {first[0]} (target={first[1]}, draft={first[2]})" if first else ""
            details.append(f"contents differ at {cmp.differing} position(s){at}")
    decision = decide(pair, context.profile)
    if not decision.share:
        details.append(f"auto-share would not help: {decision.reason}")
    fixes = derive.mapping_fixes(pair, context, decision, never)
    return [_finding(
        MAPPING_CODE, CODES[MAPPING_CODE].title, "full_to_swa_index_mapping",
        observations=observations, details=tuple(details), fixes=fixes,
        host_message=None if never else CODES[MAPPING_CODE].sglang_message,
    )]


# tryfirst: SGLang's own checks come first in every report, under pluggy's call order.
@hookimpl(tryfirst=True)
def sglang_dsv4_guard_check_state(pair: StatePair, context: StateContext) -> list[Finding]:
    """SGLang's DSV4 target/draft checks, every one of them, in SGLang's order."""
    if not pair.block_runs:
        return []
    findings = _check_ratios(pair, context)
    unified_findings, comparable = _check_unified(pair, context)
    findings += unified_findings
    if not comparable:
        return findings
    unified = bool(pair.target.get("_unified_kv"))
    if not unified:
        findings += _check_mapping(pair, context)
    findings += _check_geometry(pair, context, unified)
    return findings
