"""``check --fix``: every flag fix proven by re-running the whole check on edited lines.

For a pair with findings, each finding's ``FLAGS`` fixes are applied to the two lines
(:mod:`.edit`) and :func:`~.predict.run_check` runs again on them (SGLang's resolution
and every check). A fix is proven (``proven=True``) when its finding is gone and no
error appears that the pair did not have; otherwise ``False`` (a line the release's
parser or ``check`` cannot read counts as not fixed). A finding none of whose fixes is
proven gets a ``NO_FLAG_FIX`` fix saying why. Then the proven fixes are combined into
the corrected lines (:func:`_combine`). At most :data:`MAX_RUNS` re-runs are made; past
that a fix is left unproven (``None``) and the finding says the budget ran out.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sglang_dsv4_guard.check.offline.parse import CheckInputError
from sglang_dsv4_guard.check.predict import CheckResult, run_check
from sglang_dsv4_guard.check.server.edit import apply_edits, apply_env, lookup, typed_flags
from sglang_dsv4_guard.findings import Finding, Report, Severity
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind

__all__ = ["MAX_RUNS", "Deadline", "Fixed", "Lines", "fix_check"]

MAX_RUNS = 24


@dataclass(frozen=True)
class Lines:
    """Both servers' launch lines and environments, as ``check`` is given them."""

    prefill: str
    decode: str
    prefill_env: Mapping[str, str] = field(default_factory=dict)
    decode_env: Mapping[str, str] = field(default_factory=dict)

    def edited(self, edits: tuple[Edit, ...]) -> Lines:
        """These lines with ``edits`` applied (each to its server)."""
        return Lines(apply_edits(self.prefill, edits, "prefill"),
                     apply_edits(self.decode, edits, "decode"),
                     apply_env(self.prefill_env, edits, "prefill"),
                     apply_env(self.decode_env, edits, "decode"))

    def to_dict(self) -> dict[str, Any]:
        """``{prefill, decode, prefill_env, decode_env}``."""
        return {"prefill": self.prefill, "decode": self.decode,
                "prefill_env": dict(self.prefill_env), "decode_env": dict(self.decode_env)}

    def unset(self, given: Lines, role: str) -> tuple[str, ...]:
        """The variables of ``given``'s ``role`` environment that these lines no longer set."""
        now = getattr(self, f"{role}_env")
        return tuple(name for name in getattr(given, f"{role}_env") if name not in now)

    def to_fixed_dict(self, given: Lines) -> dict[str, Any]:
        """:meth:`to_dict` plus ``prefill_unset``/``decode_unset``: the variables of the
        given environments these lines unset (an environment lists only what is set)."""
        return {**self.to_dict(), **{f"{role}_unset": list(self.unset(given, role))
                                     for role in ("prefill", "decode")}}


@dataclass(frozen=True)
class Deadline:
    """When ``check --fix`` stops re-running the check (``time.monotonic()``), and how the
    report says so."""

    at: float
    text: str


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


def _key(finding: Finding) -> tuple[str, str]:
    return finding.code, finding.subject


def _errors(report: Report) -> set[tuple[str, str]]:
    return {_key(f) for f in report.by_severity(Severity.ERROR)}


class _Runner:
    """``run_check`` on edited lines, each distinct pair once, at most :data:`MAX_RUNS`."""

    def __init__(self, base: Lines, refusals: Callable[[], tuple[str, ...]],
                 deadline: Deadline | None = None) -> None:
        self.base, self.refusals, self.runs, self.exhausted = base, refusals, 0, False
        self.deadline = deadline
        self.cache: dict[str, CheckResult | None] = {}

    def out_of_time(self) -> bool:
        """Whether the deadline has passed."""
        return self.deadline is not None and time.monotonic() >= self.deadline.at

    def spent(self) -> str:
        """Which budget ran out, as the report says it."""
        if self.out_of_time() and self.deadline is not None:
            return self.deadline.text
        return f"{MAX_RUNS} re-runs of the check were the budget and it ran out"

    def run(self, lines: Lines) -> CheckResult | bool | None:
        """The check of ``lines``; ``None`` for lines it cannot read, ``False`` past the
        budget."""
        key = _cache_key(lines)
        if key in self.cache:
            return self.cache[key]
        if self.runs >= MAX_RUNS or self.out_of_time():
            self.exhausted = True
            return False
        self.runs += 1
        try:
            result: CheckResult | None = run_check(
                lines.prefill, lines.decode, lines.prefill_env, lines.decode_env,
                refusals=self.refusals, derive=False)
        except CheckInputError:
            result = None
        self.cache[key] = result
        return result


def _cache_key(lines: Lines) -> str:
    return repr(sorted(lines.to_dict().items()))


def _removes(result: CheckResult, finding: Finding, base_errors: set[tuple[str, str]]) -> bool:
    keys = {_key(f) for f in result.report.findings}
    return _key(finding) not in keys and not _errors(result.report) - base_errors


def _prove(finding: Finding, runner: _Runner, base_errors: set[tuple[str, str]]) -> Finding:
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


# A deprecated switch and the field the release now spells its feature with: removing the
# switch while setting that field keeps the feature (0.5.22's --attn-dp-size).
_RESPELLED = {"enable_dp_attention": "attn_dp_size"}


def _respelled(field: str, server: str, fix: Fix) -> bool:
    newer = _RESPELLED.get(field)
    return newer is not None and any(
        not e.remove and e.server == server and (f := lookup(e.name)) is not None
        and f.field == newer for e in fix.edits if not e.env)


def cost(fix: Fix, lines: Lines) -> tuple[int, int, int, int]:
    """How invasive ``fix`` is on ``lines``, least first: features it changes against the
    operator's line (a switch, or ``--speculative-algorithm``, switched on where it was
    not typed, or removed where it was typed: either changes what the operator asked the
    server to run; a deprecated switch removed for its newer spelling is no change), GPU
    counts it changes (--tp-size, --pp-size), servers it changes, edits."""
    typed = {role: typed_flags(shlex.split(getattr(lines, role)))
             for role in ("prefill", "decode")}
    switched = resized = 0
    for edit in fix.edits:
        found = None if edit.env else lookup(edit.name)
        if found is None:
            continue
        resized += found.field in ("tp_size", "pp_size")
        there = found.field in typed.get(edit.server, {})
        if (not found.takes_value or found.field == "speculative_algorithm") and there == edit.remove \
                and not (edit.remove and _respelled(found.field, edit.server, fix)):
            switched += 1
    return switched, resized, len({e.server for e in fix.edits}), len(fix.edits)


def _ranked(finding: Finding, lines: Lines) -> list[Fix]:
    """``finding``'s proven fixes, least invasive first (:func:`cost`)."""
    return sorted((f for f in finding.fixes if f.proven), key=lambda f: cost(f, lines))


def _one_fix(findings: list[Finding], runner: _Runner, start: Lines
             ) -> tuple[Lines, CheckResult] | None:
    """The least invasive single proven fix (its check already run) that leaves no error
    and the fewest findings: one edit that removes every finding beats a combination."""
    best: tuple[tuple[int, ...], Lines, CheckResult] | None = None
    for finding in findings:
        for fix in _ranked(finding, start):
            trial = start.edited(fix.edits)
            done = runner.cache.get(_cache_key(trial))
            if not isinstance(done, CheckResult) or _errors(done.report):
                continue
            rank = (len(done.report.findings), *cost(fix, start))
            if best is None or rank < best[0]:
                best = (rank, trial, done)
    return None if best is None or best[0][0] else (best[1], best[2])


def _together(findings: list[Finding], start: Lines) -> tuple[Edit, ...]:
    """The least invasive proven fix of each finding that edits nothing an earlier one
    edits."""
    edits: list[Edit] = []
    taken: set[tuple[str, str, bool]] = set()
    for finding in findings:
        fix = next((f for f in _ranked(finding, start)
                    if not any((e.server, e.name, e.env) in taken for e in f.edits)), None)
        if fix is not None:
            edits += fix.edits
            taken |= {(e.server, e.name, e.env) for e in fix.edits}
    return tuple(edits)


def _greedy(findings: list[Finding], runner: _Runner, base_errors: set[tuple[str, str]],
            start: Lines) -> tuple[Lines, CheckResult | None]:
    """Each finding's proven fixes added to ``start`` one at a time, each kept only if its
    finding goes, no new error comes and fewer findings remain."""
    lines, current = start, None
    for finding in findings:
        if current is not None and _key(finding) not in {
                _key(f) for f in current.report.findings}:
            continue
        for fix in _ranked(finding, start):
            trial = lines.edited(fix.edits)
            done = runner.run(trial)
            if isinstance(done, CheckResult) and _removes(done, finding, base_errors) and (
                    current is None
                    or len(done.report.findings) < len(current.report.findings)):
                lines, current = trial, done
                break
    return lines, current


def _combine(findings: list[Finding], runner: _Runner, base_errors: set[tuple[str, str]],
             start: Lines) -> tuple[Lines, CheckResult] | None:
    """The least invasive single fix that clears the pair, else the proven fixes applied
    together on ``start`` (greedily when together they fail)."""
    single = _one_fix(findings, runner, start)
    if single is not None:
        return single
    edits = _together(findings, start)
    if not edits:
        return None
    together = start.edited(edits)
    result = runner.run(together)
    if isinstance(result, CheckResult) and not _errors(result.report) - base_errors:
        return together, result
    lines, current = _greedy(findings, runner, base_errors, start)
    return (lines, current) if current is not None else None


# Rounds of fixes: what the first round's fixes leave is checked with fixes derived anew
# (a speculative flag fixed on one server is then copied to the other, for instance).
_ROUNDS = 2


def fix_check(lines: Lines, refusals: Callable[[], tuple[str, ...]] = tuple,
              deadline: Deadline | None = None) -> Fixed:
    """``check --fix`` on ``lines`` (see the module docstring); no re-run starts after
    ``deadline``."""
    base = run_check(lines.prefill, lines.decode, lines.prefill_env, lines.decode_env,
                     refusals=refusals)
    if not base.report.findings:
        return Fixed(base, None, None, 0, False, lines)
    runner = _Runner(lines, refusals, deadline)
    errors = _errors(base.report)
    findings = [_prove(f, runner, errors) for f in base.report.findings]
    result = replace(base, report=replace(base.report, findings=tuple(findings)))
    best = _combine(findings, runner, errors, lines)
    for _ in range(_ROUNDS - 1):
        if best is None or not best[1].report.findings or runner.runs >= MAX_RUNS \
                or runner.out_of_time():
            break
        runner.runs += 1  # a check with its fixes derived anew, on the lines so far
        again = run_check(best[0].prefill, best[0].decode, best[0].prefill_env,
                          best[0].decode_env, refusals=refusals)
        runner.base = best[0]  # the round's fixes are proven on the lines so far
        more = [_prove(f, runner, errors) for f in again.report.findings]
        better = _combine(more, runner, errors, best[0])
        if better is not None and len(better[1].report.findings) < len(
                best[1].report.findings):
            best = better
    corrected, checked = best if best is not None else (None, None)
    return Fixed(result, corrected, checked, runner.runs, runner.exhausted, lines,
                 runner.spent() if runner.exhausted else "")
