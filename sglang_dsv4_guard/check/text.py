"""Rendering a :class:`~sglang_dsv4_guard.check.predict.CheckResult` as text (pure)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from sglang_dsv4_guard.check.fixing.refusal import CODE as REFUSAL_CODE
from sglang_dsv4_guard.findings import Severity
from sglang_dsv4_guard.render import render_finding

if TYPE_CHECKING:
    from sglang_dsv4_guard.check.offline.chatter import Output
    from sglang_dsv4_guard.check.predict import CheckResult
    from sglang_dsv4_guard.check.prove import Fixed
    from sglang_dsv4_guard.check.server.derive import DerivedServer

__all__ = ["render_check", "render_fixed", "render_output"]


def _said(result: CheckResult, side: DerivedServer) -> list[str]:
    """A line per SGLang line that explains values it chose for ``side`` (one line may
    explain two values: DeepSeek-V4's attention backend and page size)."""
    by_line: dict[str, list[str]] = {}
    for said in result.said(side):
        typed = f" (typed {said.option} {said.typed})" if said.typed is not None else ""
        by_line.setdefault(said.line, []).append(f"{said.label} {said.value}{typed}")
    return [f"    {', '.join(values)}: SGLang said \"{line}\"" for line, values in by_line.items()]


def _side(side: DerivedServer, said: list[str]) -> str:
    m = side.model
    kind = ", ".join(part for part in (
        "MLA pool" if m.uses_mla_pool else f"{m.attention_arch} pool",
        "hybrid SWA" if m.is_hybrid_swa else "",
        "DeepSeek-V4" if m.is_dsv4 else "") if part)
    a = side.args
    draft = side.draft.architecture if side.draft else "?"
    tokens = side.num_draft_tokens if side.num_draft_tokens is not None else "default"
    spec = (f"speculative {side.speculative_algorithm} (draft {draft}, draft tokens {tokens})"
            if side.speculative_algorithm else "no speculative decoding")
    lines = [
        f"{side.role}: {m.path} ({m.architecture}; {kind})",
        f"    attention TP {side.attn_tp_size} (tp {a.get('tp_size')}, attention DP "
        f"{side.attn_dp_size}, attention CP {a.get('attn_cp_size') or 1})",
        f"    page size {side.page_size} ({side.page_size_source}); {spec}",
        f"    transfer backend {side.transfer_backend}; swa state {'yes' if side.swa_state else 'no'}"
        f"; unified KV {'yes' if side.unified_kv else 'no'}",
    ]
    lines += said
    if a.deprecated:
        lines.append(f"    deprecated flags (resolved as the release does): {', '.join(a.deprecated)}")
    return "\n".join(lines)


def _gpus(result: CheckResult) -> str:
    """The GPUs the servers were checked as, said once (nothing when none was named)."""
    named = {s.role: s.gpu for s in (result.prefill, result.decode)}
    if not any(named.values()):
        return ""
    if named["prefill"] == named["decode"] and named["prefill"] is not None:
        return f"\nGPU: {named['prefill'].describe()}, both servers"
    return "\nGPU: " + "; ".join(f"{role} {gpu.describe() if gpu else 'not named'}"
                                 for role, gpu in named.items())


def render_check(result: CheckResult) -> str:
    """Derived values per server, every finding, what flags cannot tell, the outcome line."""
    parts = [f"sglang-dsv4-guard check (SGLang {result.release})" + _gpus(result),
             *(_side(s, _said(result, s)) for s in (result.prefill, result.decode))]
    refused = {s.role for s in (result.prefill, result.decode)
               if s.args.resolution_error is not None}
    for run in result.pool_runs:
        outcome = run.host_error or ("not run" if run.build_error else "accepted")
        built = (" built from the flags as parsed (SGLang's resolution refused them, "
                 f"{REFUSAL_CODE})" if run.role in refused else "")
        parts.append(f"{run.role}: SGLang's setup_state_kv_args on miniature real "
                     f"pools{built}: {outcome}")
    parts += [render_finding(f) for f in result.report.findings]
    if result.unknowns:
        parts.append("not knowable from the flags:\n" +
                     "\n".join(f"    - {u}" for u in result.unknowns))
    errors = len(result.report.by_severity(Severity.ERROR))
    warnings = len(result.report.by_severity(Severity.WARNING))
    parts.append(f"check: {errors} error(s), {warnings} warning(s)" if errors or warnings
                 else "check: OK (no findings)")
    return "\n\n".join(parts)


def render_fixed(fixed: Fixed) -> str:
    """``check --fix``'s corrected lines, shell-quoted, with what the check says of them."""
    if not fixed.result.report.findings:
        return "check --fix: nothing to fix"
    budget = f"; stopped: {fixed.spent}" if fixed.exhausted else ""
    if fixed.lines is None or fixed.lines_result is None:
        if fixed.result.exit_status == 0:
            return (f"check --fix: the lines are unchanged: the pair has only warnings, and "
                    f"each of their proven fixes turns a feature on or off or changes a GPU "
                    f"count or checkpoint ({fixed.runs} re-run(s) of the check{budget}); "
                    "apply one from a finding's fix lines if you want it")
        kept = (f" that leaves the {fixed.given.keep} as typed (--keep {fixed.given.keep})"
                if fixed.given.keep else "")
        return (f"check --fix: no proven flag change{kept} ({fixed.runs} re-run(s) of the "
                f"check{budget}); the lines are unchanged")
    after = fixed.lines_result
    codes = ", ".join(after.report.codes) or "no findings"
    lines = [f"check --fix: corrected lines ({fixed.runs} re-run(s) of the check{budget}; "
             f"check on them: exit {after.exit_status}, {codes}):"]
    if fixed.given.keep:
        lines.append(f"    kept as typed: the {fixed.given.keep} (--keep {fixed.given.keep})")
    if fixed.cost is not None:
        lines.append(f"    what it changes: {fixed.cost.describe()}")
    for role in ("prefill", "decode"):
        env = dict(getattr(fixed.lines, f"{role}_env"))
        lines.append(f"    {role}: {getattr(fixed.lines, role)}")
        if env:
            lines.append(f"    {role} env: " + " ".join(
                f"{k}={shlex.quote(v)}" for k, v in env.items()))
        lines += [f"    {role} env: unset {name}" for name in fixed.lines.unset(fixed.given, role)]
    return "\n".join(lines)


def render_output(output: Output) -> str:
    """``check --verbose``: every line SGLang printed, warned or logged, per server."""
    doc = output.to_dict()
    parts = [f"SGLang's output during the check ({sum(map(len, doc.values()))} line(s), "
             "captured, not printed without --verbose):"]
    for name, lines in doc.items():
        parts.append(f"  {name}:" + ("" if lines else " (nothing)"))
        parts += [f"    {line}" for line in lines]
    return "\n".join(parts)
