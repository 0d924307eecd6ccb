"""``check --fix``'s re-runs: the two servers' lines as edits change them (:class:`Lines`),
and the check run again on edited lines, each distinct pair once, at most :data:`MAX_RUNS`
times and never past a :class:`Deadline` (:class:`Runner`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_dsv4_guard.check.fixing.cost import price
from sglang_dsv4_guard.check.offline.parse import CheckInputError
from sglang_dsv4_guard.check.predict import CheckResult, run_check
from sglang_dsv4_guard.check.server.edit import apply_edits, apply_env
from sglang_dsv4_guard.findings import Finding, Report, Severity
from sglang_dsv4_guard.fixes import Cost, Edit

__all__ = ["MAX_RUNS", "Deadline", "Lines", "Runner", "cache_key", "cost", "errors_of",
           "finding_key"]

MAX_RUNS = 32


@dataclass(frozen=True)
class Lines:
    """Both servers' launch lines and environments, as ``check`` is given them."""

    prefill: str
    decode: str
    prefill_env: Mapping[str, str] = field(default_factory=dict)
    decode_env: Mapping[str, str] = field(default_factory=dict)
    # the edits that made these lines from the given ones (a later edit of a flag last),
    # and those of them added for warnings only (the bonus, :func:`_bonus`)
    applied: tuple[Edit, ...] = field(default=(), compare=False)
    bonus: tuple[Edit, ...] = field(default=(), compare=False)
    # the GPU each server runs on, and where each name came from (run_check's gpus and
    # gpu_sources): no edit changes them
    gpus: Mapping[str, str | None] = field(default_factory=dict, compare=False)
    gpu_sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    # the server whose settings are the intended ones (``check --keep``): the search
    # applies no fix that edits it
    keep: str | None = field(default=None, compare=False)

    def allows(self, edits: tuple[Edit, ...]) -> bool:
        """Whether ``edits`` leave the kept server (:attr:`keep`) as it is."""
        return self.keep is None or all(e.server != self.keep for e in edits)

    def edited(self, edits: tuple[Edit, ...], bonus: bool = False) -> Lines:
        """These lines with ``edits`` applied (each to its server); ``bonus``: edits made
        for warnings only."""
        later = {(e.server, e.name, e.env) for e in edits}
        kept = [e for e in self.applied if (e.server, e.name, e.env) not in later]
        return Lines(apply_edits(self.prefill, edits, "prefill"),
                     apply_edits(self.decode, edits, "decode"),
                     apply_env(self.prefill_env, edits, "prefill"),
                     apply_env(self.decode_env, edits, "decode"),
                     (*kept, *edits),
                     tuple(e for e in self.bonus if e in kept) + (edits if bonus else ()),
                     self.gpus, self.gpu_sources, self.keep)

    @property
    def clearing(self) -> tuple[Edit, ...]:
        """The applied edits that are not the warnings' bonus: the change that clears the
        errors."""
        return tuple(e for e in self.applied if e not in self.bonus)

    def by_role(self) -> dict[str, str]:
        """``{"prefill": line, "decode": line}``."""
        return {"prefill": self.prefill, "decode": self.decode}

    def envs(self) -> dict[str, Mapping[str, str]]:
        """``{"prefill": env, "decode": env}``."""
        return {"prefill": self.prefill_env, "decode": self.decode_env}

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


def finding_key(finding: Finding) -> tuple[str, str]:
    """A finding as the search tells findings apart: its code and subject."""
    return finding.code, finding.subject


def errors_of(report: Report) -> set[tuple[str, str]]:
    """The error findings of ``report``, as :func:`finding_key` s."""
    return {finding_key(f) for f in report.by_severity(Severity.ERROR)}


class Runner:
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
        key = cache_key(lines)
        if key in self.cache:
            return self.cache[key]
        if self.runs >= MAX_RUNS or self.out_of_time():
            self.exhausted = True
            return False
        self.runs += 1
        try:
            result: CheckResult | None = run_check(
                lines.prefill, lines.decode, lines.prefill_env, lines.decode_env,
                refusals=self.refusals, derive=False, gpus=lines.gpus,
                gpu_sources=lines.gpu_sources)
        except CheckInputError:
            result = None
        self.cache[key] = result
        return result


def cache_key(lines: Lines) -> str:
    """The key of ``lines`` in :attr:`Runner.cache`."""
    return repr(sorted(lines.to_dict().items()))


def cost(edits: tuple[Edit, ...], lines: Lines) -> Cost:
    """What ``edits`` change against ``lines`` (:func:`~.fixing.cost.price`)."""
    return price(edits, lines.by_role(), lines.envs())
