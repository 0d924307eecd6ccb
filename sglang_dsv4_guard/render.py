"""Rendering reports as text. Pure functions: data in, ``str`` (or ``None``) out."""

from __future__ import annotations

from sglang_dsv4_guard.findings import (
    LIST_CAP,
    Finding,
    Report,
    Severity,
    capped_lines,
    capped_repr,
    cut_text,
)
from sglang_dsv4_guard.fixes import Fix
from sglang_dsv4_guard.host.targets import MORI_SEND, PD_FIRST_CONTACT, STATE

__all__ = ["render_finding", "render_report"]

_HEADINGS = {
    str(STATE): "the DeepSeek-V4 target/draft KV pools",
    MORI_SEND.qualname: "the MORI state transfer",
    PD_FIRST_CONTACT.qualname: "decode's first contact with the prefill",
}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _fix_lines(fixes: tuple[Fix, ...]) -> list[str]:
    """``fix:`` for a need's first fix, ``or fix:`` for each alternative after it, ``step
    N of M`` when several needs each need a fix (``Fix.need``), the field named when the
    fixes address several, ``(proven by check)`` / ``(check: did not fix it)`` when check
    tried it; then its edits one per line, and what it costs where ``check`` priced it
(:class:`~sglang_dsv4_guard.fixes.Cost`). The first :data:`LIST_CAP` fixes and a count
    of the rest."""
    lines: list[str] = []
    several = len({fix.field for fix in fixes}) > 1
    needs = list(dict.fromkeys(fix.need for fix in fixes))
    seen: set[str] = set()
    for fix in fixes[:LIST_CAP]:
        label = "or fix" if fix.need in seen else "fix"
        seen.add(fix.need)
        if len(needs) > 1:
            label += f" (step {needs.index(fix.need) + 1} of {len(needs)})"
        if several and fix.field:
            label += f" [{fix.field}]"
        mark = ("" if fix.proven is None
                else " (proven by check)" if fix.proven else " (check: did not fix it)")
        lines.append(f"    {label}{mark}: {cut_text(fix.text)}")
        lines += [f"         {cut_text(edit.describe())}" for edit in fix.edits[:LIST_CAP]]
        if fix.cost is not None:
            lines.append(f"         cost: {cut_text(fix.cost.describe())}")
    if len(fixes) > LIST_CAP:
        lines.append(f"    ... +{len(fixes) - LIST_CAP} more fixes ({len(fixes)} in all)")
    return lines


def render_finding(finding: Finding) -> str:
    """One finding: headline, per-role values with their sources, details, fixes, docs."""
    lines = [cut_text(f"[{finding.code}] {finding.severity.value}: {finding.summary}")]
    observations = finding.observations[:LIST_CAP]
    width = min(max((len(f"{o.role} {o.name}") for o in observations), default=0), 80)
    for obs in observations:
        label = cut_text(f"{obs.role} {obs.name}").ljust(width)
        lines.append(f"    {label} = {capped_repr(obs.value)}")
        lines.append(f"    {' ' * width}   from: {cut_text(obs.source)}")
    if len(finding.observations) > LIST_CAP:
        lines.append(f"    ... +{len(finding.observations) - LIST_CAP} more observations "
                     f"({len(finding.observations)} in all)")
    if finding.when:
        lines.append(f"    when: {cut_text(finding.when.effect)}")
    lines += [f"    {detail}" for detail in capped_lines(finding.details)]
    lines += _fix_lines(finding.fixes)
    if finding.origin and not finding.origin.startswith("builtin"):
        lines.append(f"    reported by plug-in: {finding.origin}")
    if finding.docs:
        lines.append(f"    docs: {finding.docs}")
    return "\n".join(lines)


def render_report(report: Report) -> str | None:
    """The whole report as text, or ``None`` when there is nothing to say."""
    if not report.findings:
        return None
    ctx = report.context
    errors = len(report.by_severity(Severity.ERROR))
    warnings = len(report.by_severity(Severity.WARNING))
    counts = ", ".join(_plural(n, word) for n, word in ((errors, "error"), (warnings, "warning"))
                       if n) or _plural(len(report.findings), "note")
    where = _HEADINGS.get(ctx.get("function", ""), ctx.get("function", "the guarded call"))
    about = ", ".join(f"{key} {ctx[key]}" for key in ("caller", "peer", "sglang", "mode")
                      if ctx.get(key))
    header = f"sglang-dsv4-guard: {counts} in {where}" + (f" ({about})" if about else "")
    body = "\n\n".join(render_finding(f) for f in report.findings)
    return f"{header}\n\n{body}"
