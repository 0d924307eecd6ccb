"""``check --fix``: the cheapest proven change, found by re-running the whole check on
edited lines.

For a pair with findings, each finding's ``FLAGS`` fixes are applied to the two lines
(:mod:`.edit`) and :func:`~.predict.run_check` runs again on them (SGLang's resolution
and every check). A fix is proven (``proven=True``) when its finding is gone and no
error appears that the pair did not have; otherwise ``False`` (a line the release's
parser or ``check`` cannot read counts as not fixed). A finding none of whose fixes is
proven gets a ``NO_FLAG_FIX`` fix saying why.

Then the fixes are combined jointly (:func:`_combine`): every combination of at most
:data:`MAX_COMBINED` fixes that, by what each removed alone, covers the errors, in the
cost order of :class:`~sglang_dsv4_guard.fixes.Cost`, until one clears them; it is made
minimal (:func:`_minimal`), and warnings get only value-changing fixes on top
(:func:`_bonus`). What that leaves is checked again with fixes derived anew, while each
round leaves fewer errors (at most :data:`MAX_ROUNDS`). A finding the corrected lines
clear is credited with their change (:func:`_credited`). At most
:data:`~.rerun.MAX_RUNS` re-runs are made (:mod:`.rerun`); past that a fix is left
unproven (``None``) and the finding says the budget ran out.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sglang_dsv4_guard.check.fixing.cost import priced, with_dependents
from sglang_dsv4_guard.check.predict import CheckResult, run_check
from sglang_dsv4_guard.check.rerun import (
    MAX_RUNS,
    Deadline,
    Lines,
    Runner,
    cache_key,
    cost,
    errors_of,
    finding_key,
)
from sglang_dsv4_guard.findings import Finding, Severity
from sglang_dsv4_guard.fixes import Cost, Edit, Fix, FixKind

__all__ = ["MAX_COMBINED", "MAX_ROUNDS", "Fixed", "changes", "fix_check"]

# The most fixes the joint search combines (one per error, usually), and the most rounds
# of fixes derived anew on what the previous round's change leaves.
MAX_COMBINED = 3
MAX_ROUNDS = 4


@dataclass(frozen=True)
class Fixed:
    """What ``check --fix`` found: the check with each fix's proof, the corrected lines
    (``None`` when nothing is to fix or no fix was proven) and their own check."""

    result: CheckResult
    lines: Lines | None
    lines_result: CheckResult | None
    runs: int
    exhausted: bool
    given: Lines = field(default_factory=lambda: Lines("", ""))
    spent: str = ""  # which budget ran out, when ``exhausted``

    @property
    def cost(self) -> Cost | None:
        """What the corrected lines change against the given ones (``None``: no lines)."""
        return None if self.lines is None else cost(self.lines.applied, self.given)


def _removes(result: CheckResult, finding: Finding, base_errors: set[tuple[str, str]]) -> bool:
    keys = {finding_key(f) for f in result.report.findings}
    return finding_key(finding) not in keys and not errors_of(result.report) - base_errors


def _prove(finding: Finding, runner: Runner, base_errors: set[tuple[str, str]]) -> Finding:
    fixes, tried, budget = [], 0, False
    for fix in finding.fixes:
        if fix.kind is not FixKind.FLAGS or not fix.edits:
            fixes.append(fix)
            continue
        result = runner.run(runner.base.edited(fix.edits))
        if result is False:
            budget = True
            fixes.append(fix)
            continue
        tried += 1
        fixes.append(fix.with_proof(isinstance(result, CheckResult)
                                    and _removes(result, finding, base_errors)))
    if not any(f.proven for f in fixes) and not any(
            f.kind is FixKind.NO_FLAG_FIX for f in fixes):
        why = ("no flag edit was derived for it from the two lines" if not tried
               and not budget else f"none of its {tried} flag fix(es) removed it without "
               "bringing a new error, on the release's resolution and every check")
        text = f"no flag change fixes this: {why}"
        if budget:  # a fix left untried is not known not to work: say it is unproven
            text = (f"not proven by check ({tried} of its flag fix(es) re-checked, none "
                    f"removed it): {runner.spent()}")
        fixes.append(Fix(FixKind.NO_FLAG_FIX, text, field=fixes[0].field if fixes else ""))
    return replace(finding, fixes=tuple(fixes))


@dataclass(frozen=True)
class _Candidate:
    """A fix the joint search may combine: its edits and the base errors its own re-run
    removed (with or without bringing others)."""

    edits: tuple[Edit, ...]
    removes: frozenset[tuple[str, str]]


def _candidates(findings: list[Finding], runner: Runner, start: Lines,
                errors: set[tuple[str, str]]) -> list[_Candidate]:
    """Every flag fix of ``findings`` whose own re-run removed at least one of ``errors``."""
    out: dict[tuple[Edit, ...], _Candidate] = {}
    for finding in findings:
        for fix in finding.fixes:
            if fix.kind is not FixKind.FLAGS or not fix.edits or fix.edits in out \
                    or not start.allows(fix.edits):
                continue
            done = runner.cache.get(cache_key(start.edited(fix.edits)))
            if isinstance(done, CheckResult):
                removes = frozenset(errors - errors_of(done.report))
                if removes:
                    out[fix.edits] = _Candidate(fix.edits, removes)
    return list(out.values())


def _merged(parts: tuple[_Candidate, ...]) -> tuple[Edit, ...] | None:
    """The edits of ``parts`` together; ``None`` when two edit one flag differently."""
    edits: dict[tuple[str, str, bool], Edit] = {}
    for edit in (e for part in parts for e in part.edits):
        key = (edit.server, edit.name, edit.env)
        if key in edits and edits[key] != edit:
            return None
        edits[key] = edit
    return tuple(edits.values())


def _combinations(candidates: list[_Candidate], target: set[tuple[str, str]], start: Lines
                  ) -> list[tuple[tuple[int, ...], tuple[Edit, ...]]]:
    """Every combination of at most :data:`MAX_COMBINED` candidates that covers
    ``target`` (by what each removed alone) and edits no flag twice, cheapest first
    (:meth:`~sglang_dsv4_guard.fixes.Cost.key`), each edit set once."""
    found: dict[tuple[Edit, ...], tuple[int, ...]] = {}
    for size in range(1, min(MAX_COMBINED, len(candidates)) + 1):
        for parts in itertools.combinations(candidates, size):
            if not target <= frozenset().union(*(p.removes for p in parts)):
                continue
            if any(not (p.removes - frozenset().union(*(q.removes for q in parts if q is not p)))
                   for p in parts if size > 1):
                continue  # a part whose errors the others remove anyway: not minimal
            edits = _merged(parts)
            if edits is not None:
                key = tuple(sorted(edits, key=repr))
                found.setdefault(key, cost(edits, start).key())
    return sorted(((rank, edits) for edits, rank in found.items()), key=lambda x: x[0])


def _clears(result: CheckResult | bool | None, target: set[tuple[str, str]],
            base_errors: set[tuple[str, str]]) -> bool:
    """Whether ``result`` leaves none of ``target`` and no error the pair did not have."""
    return isinstance(result, CheckResult) and not (
        errors_of(result.report) & target or errors_of(result.report) - base_errors)


def changes(edits: tuple[Edit, ...], lines: Lines) -> list[tuple[Edit, ...]]:
    """``edits`` as the changes an operator makes: each edit alone, except that a removal
    and the flags it takes with it (:func:`~.fixing.cost.with_dependents`) are one."""
    units: list[tuple[Edit, ...]] = []
    taken: set[Edit] = set()
    for edit in edits:
        if edit in taken:
            continue
        group = tuple(e for e in with_dependents((edit,), lines.by_role()) if e in edits)
        taken.update(group)
        units.append(group)
    return units


def _minimal(edits: tuple[Edit, ...], runner: Runner, start: Lines,
             target: set[tuple[str, str]], base_errors: set[tuple[str, str]]
             ) -> tuple[Edit, ...]:
    """``edits`` without each change (most expensive first) whose removal still clears
    ``target`` at no higher cost: no proper subset of what is left, one change less,
    passes as cheaply (dropping ``--tp-size 8`` from ``--pp-size 2 --tp-size 8`` may still
    pass, but halves the GPU count: the subset costs more, and the change stays)."""
    units = sorted(changes(edits, start), key=lambda u: cost(u, start).key(), reverse=True)
    kept = list(units)
    for unit in units:
        if len(kept) == 1:
            break
        trial = tuple(e for u in kept if u is not unit for e in u)
        if cost(trial, start).given_up() > cost(tuple(e for u in kept for e in u),
                                                 start).given_up():
            continue  # cheaper in edits but dearer in what it gives up
        result = runner.run(start.edited(trial))
        if result is False:
            break
        if _clears(result, target, base_errors):
            kept = [u for u in kept if u is not unit]
    return tuple(e for u in kept for e in u)


def _bonus(findings: list[Finding], runner: Runner, given: Lines, lines: Lines,
           current: CheckResult) -> tuple[Lines, CheckResult]:
    """Warnings left on ``lines`` cleared where a proven fix of theirs changes only values
    (cost tier 2 or less) and brings no error: a bonus, never a condition."""
    for finding in findings:
        if finding_key(finding) not in {finding_key(f) for f in current.report.findings}:
            continue
        for fix in sorted((f for f in finding.fixes if f.proven and f.edits
                           and lines.allows(f.edits) and cost(f.edits, given).tier <= 2),
                          key=lambda f: cost(f.edits, given).key()):
            trial = lines.edited(fix.edits, bonus=True)
            done = runner.run(trial)
            if isinstance(done, CheckResult) and not errors_of(done.report) and len(
                    done.report.findings) < len(current.report.findings):
                lines, current = trial, done
                break
    return lines, current


def _combine(findings: list[Finding], runner: Runner, base_errors: set[tuple[str, str]],
             start: Lines, given: Lines) -> tuple[Lines, CheckResult] | None:
    """The cheapest combination of fixes (:func:`_combinations`) that clears every error
    any fix removes, made minimal (:func:`_minimal`); among combinations of one cost, the
    one leaving the fewest findings. Without one, the combination that leaves the fewest
    errors (for another round: it may bring errors of its own, whose fixes the next round
    derives; lines with an error the pair did not have are never the answer)."""
    errors = {finding_key(f) for f in findings if f.severity is Severity.ERROR}
    if not errors:  # warnings only: the bonus alone, on the lines as they are
        current = runner.cache.get(cache_key(start))
        if not isinstance(current, CheckResult):
            return None
        lines, kept = _bonus(findings, runner, given, start, current)
        return None if kept is current else (lines, kept)
    candidates = _candidates(findings, runner, start, errors)
    target = errors & frozenset().union(*(c.removes for c in candidates)) if candidates \
        else set()
    if not target:
        return None
    chosen: tuple[tuple[int, ...], tuple[Edit, ...], CheckResult] | None = None
    partial: tuple[tuple[int, ...], Lines, CheckResult] | None = None
    for rank, edits in _combinations(candidates, target, start):
        if chosen is not None and rank > chosen[0]:
            break
        run = runner.run(start.edited(edits))
        if run is False:
            break
        if not isinstance(run, CheckResult):
            continue
        result = run
        if _clears(result, target, base_errors):
            if chosen is None or len(result.report.findings) < len(chosen[2].report.findings):
                chosen = (rank, edits, result)
        else:  # for another round: fewest new errors, then fewest errors, then cost
            left = (len(errors_of(result.report) - base_errors), len(errors_of(result.report)),
                    *rank)
            if partial is None or left < partial[0]:
                partial = (left, start.edited(edits), result)
    if chosen is None:
        return None if partial is None else (partial[1], partial[2])
    edits = _minimal(chosen[1], runner, start, target, base_errors)
    lines, last = start.edited(edits), runner.run(start.edited(edits))
    if not isinstance(last, CheckResult):
        lines, last = start.edited(chosen[1]), chosen[2]
    return _bonus(findings, runner, given, lines, last)


def _credited(finding: Finding, edits: tuple[Edit, ...], given: Lines) -> Finding:
    """``finding``, which the corrected lines (``edits`` on ``given``) no longer have, with
    the fixes those lines apply marked proven; where none of its own is among them, one
    fix naming the combined changes replaces any "no flag change fixes this" (so nothing
    in the output says no flag change fixes a finding that ``--fix`` clears)."""
    applied = set(edits)
    fixes = [fix.with_proof(True) if fix.kind is FixKind.FLAGS and fix.edits
             and set(fix.edits) <= applied else fix for fix in finding.fixes]
    kept = [fix for fix in fixes if fix.kind is not FixKind.NO_FLAG_FIX]
    if any(fix.proven for fix in kept):
        return replace(finding, fixes=tuple(kept))
    together = priced(Fix(FixKind.FLAGS, "the corrected lines' changes, which clear it (found "
                          "by the joint search over every finding's fixes)", field=", ".join(
                              dict.fromkeys(f.field for f in finding.fixes if f.field)),
                          edits=edits, proven=True), given.by_role(), given.envs())
    return replace(finding, fixes=(together, *kept))


def fix_check(lines: Lines, refusals: Callable[[], tuple[str, ...]] = tuple,
              deadline: Deadline | None = None) -> Fixed:
    """``check --fix`` on ``lines`` (see the module docstring); no re-run starts after
    ``deadline``."""
    base = run_check(lines.prefill, lines.decode, lines.prefill_env, lines.decode_env,
                     refusals=refusals, gpus=lines.gpus, gpu_sources=lines.gpu_sources)
    if not base.report.findings:
        return Fixed(base, None, None, 0, False, lines)
    runner = Runner(lines, refusals, deadline)
    runner.cache[cache_key(lines)] = base
    errors = errors_of(base.report)
    findings = [_prove(f, runner, errors) for f in base.report.findings]
    best = _combine(findings, runner, errors, lines, lines)
    for _ in range(MAX_ROUNDS - 1):  # what a round leaves, with fixes derived anew
        if best is None or not errors_of(best[1].report) or runner.runs >= MAX_RUNS \
                or runner.out_of_time():
            break
        runner.runs += 1  # a check with its fixes derived anew, on the lines so far
        again = run_check(best[0].prefill, best[0].decode, best[0].prefill_env,
                          best[0].decode_env, refusals=refusals, gpus=lines.gpus,
                          gpu_sources=lines.gpu_sources)
        runner.base = best[0]  # the round's fixes are proven on the lines so far
        known = errors | errors_of(best[1].report)
        more = [_prove(f, runner, known) for f in again.report.findings]
        better = _combine(more, runner, known, best[0], lines)
        if better is None or (len(errors_of(better[1].report)), len(
                better[1].report.findings)) >= (len(errors_of(best[1].report)),
                                                len(best[1].report.findings)):
            break  # no progress: another round would derive the same fixes
        best = better
    if best is not None and errors_of(best[1].report) - errors:
        best = None  # a change that brings an error of its own is no fix
    corrected, checked = best if best is not None else (None, None)
    if corrected is not None and checked is not None:
        edits = corrected.applied
        left = {finding_key(f) for f in checked.report.findings}
        findings = [f if finding_key(f) in left else _credited(f, edits, lines) for f in findings]
    result = replace(base, report=replace(base.report, findings=tuple(findings)))
    return Fixed(result, corrected, checked, runner.runs, runner.exhausted, lines,
                 runner.spent() if runner.exhausted else "")
