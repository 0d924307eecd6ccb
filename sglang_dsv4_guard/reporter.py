"""The built-in reporter: reports to the ``sglang_dsv4_guard`` logger, once per problem.

What the text log shows for one occurrence of a report:

- the first time in this launch (see :mod:`sglang_dsv4_guard.dedup`): the full
  report, always, also when it is raised, and written before the exception rises: SGLang
  may kill the process (its process group, on another scheduler's exception) before a
  traceback prints. The exception (or note) carries the full report too, except when
  SGLang's own handler that logs the traceback is on the stack (``Delivery.printed_by``:
  the scheduler's ``run_scheduler_process``): its text is then SGLang's first line and
  one line pointing at the logged report (``err.report`` keeps the data). Once the log
  call returned, the process records the proof that it printed the report
  (:meth:`~sglang_dsv4_guard.dedup.markers.ServerDedup.printed`);
- again in this process, or already printed by another process of the launch (with
  that proof): one line naming the fingerprint and the codes (raised or not);
- claimed by another process that showed no proof of printing it within a second:
  the full report again, saying why in one line;
- a repeat the caller marks ``quiet`` (a MORI peer with a mismatch already reported):
  nothing above DEBUG; the caller logs a running count sparsely.

With ``log_format="json"`` every occurrence, quiet ones included, is one record whose
message is that same readable text and whose ``extra`` carries the whole report as
structured data under ``record.sglang_dsv4_guard``. Exact counts:
:meth:`LogReporter.summary_lines`, shown by :func:`sglang_dsv4_guard.summary`.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sglang_dsv4_guard.dedup.markers import PROOF_SECONDS, Seen, ServerDedup, fingerprint
from sglang_dsv4_guard.findings import Phase, Report, Severity
from sglang_dsv4_guard.hookmarkers import hookimpl
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.render import render_report
from sglang_dsv4_guard.undo import Undo, nothing_to_undo

__all__ = ["EXTRA_KEY", "Delivery", "LogReporter", "Recorder", "delivering", "headline",
           "pointer", "prints_in_full"]

logger = logging.getLogger(LOGGER_NAME)
EXTRA_KEY = "sglang_dsv4_guard"


@dataclass
class Delivery:
    """How one occurrence travels, set by the caller; the log reporter fills in the rest.

    ``raised``: the report rides in an exception SGLang prints; ``carrier`` names it (the
    DSV4GuardError, or a note on SGLang's own exception). ``quiet``: a repeat the
    text log need not show. ``note``: a line added to the text. ``extra``: more
    structured data for the JSON record (counts). ``printed_by``: SGLang's own handler
    that logs the raised exception's traceback (the scheduler's), if one is on the stack:
    the exception then carries one line pointing at the logged report instead of a second
    full copy. ``fingerprint``, ``seen`` and ``logged_full`` (the full report went to an
    enabled logger) are set by :class:`LogReporter` (``None``/``False`` if it did not run).
    ``phase`` and ``role``: where the report is made (start-up, first contact, registration,
    per request) and by which server, as the metrics label it (:mod:`sglang_dsv4_guard.metrics`).
    """

    raised: bool = False
    carrier: str = "the DSV4GuardError raised to SGLang"
    printed_by: str | None = None
    quiet: bool = False
    note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    phase: Phase | None = None
    role: str = "unknown"
    fingerprint: str | None = None
    seen: Seen | None = None
    logged_full: bool = False


_DELIVERY: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar(
    "sglang_dsv4_guard_delivery", default=None)


@contextlib.contextmanager
def delivering(delivery: Delivery) -> Iterator[Delivery]:
    """Publish a report inside this block to say how it travels."""
    token = _DELIVERY.set(delivery)
    try:
        yield delivery
    finally:
        _DELIVERY.reset(token)


def prints_in_full(seen: Seen | None) -> bool:
    """Whether an occurrence carries the full report: the first in the server, one whose
    claimant showed no proof of printing it, or one the log reporter did not see
    (deduplication fails open)."""
    return seen in (None, Seen.FIRST, Seen.UNPROVEN)


def _level(report: Report) -> int:
    if report.by_severity(Severity.ERROR):
        return logging.ERROR
    if report.by_severity(Severity.WARNING):
        return logging.WARNING
    return logging.INFO


def headline(report: Report) -> str:
    """The report's first line (``sglang-dsv4-guard: 3 errors in ...``) plus its codes."""
    rendered = render_report(report) or "sglang-dsv4-guard: no findings"
    return f"{rendered.splitlines()[0]} [{', '.join(dict.fromkeys(report.codes))}]"


def pointer(report: Report, fp: str, seen: Seen | None) -> str:
    """One line for a report printed in full elsewhere."""
    where = ("by another process of this launch" if seen is Seen.ELSEWHERE
             else "earlier by this process")
    return f"{headline(report)}: same report as printed in full {where} (fingerprint {fp})"


_WHERE = {Seen.FIRST: "printed in full here",
          Seen.UNPROVEN: "printed in full here (the claimant showed no proof of printing it)",
          Seen.ELSEWHERE: "printed in full by another process of this launch",
          Seen.HERE: "not printed: a repeat of a mismatch reported above"}


@dataclass
class _Count:
    codes: tuple[str, ...]
    headline: str
    first: Seen  # what the first occurrence in this process was
    occurrences: int = 0


class LogReporter:
    """Logs reports as described in the module docstring; the level follows the worst
    finding (ERROR, WARNING, else INFO)."""

    def __init__(self, log_format: str = "text", dedup: ServerDedup | None = None) -> None:
        self.log_format = log_format
        self.dedup = dedup or ServerDedup()
        self._lock = threading.Lock()
        self.counts: dict[str, _Count] = {}

    def _text(self, report: Report, full: str, fp: str, d: Delivery) -> str:
        if d.seen in (Seen.FIRST, Seen.UNPROVEN) and not d.quiet:
            # Logged even when raised: the traceback may never print (see the docstring).
            if not d.raised:
                also = ""
            elif d.printed_by:
                also = f"; {d.carrier}, whose traceback {d.printed_by} logs, points here"
            else:
                also = f"; also carried by {d.carrier}"
            text = f"{full}\n    (fingerprint {fp}{also})"
            if d.seen is Seen.UNPROVEN:
                text += ("\n    printed here too: another process of this launch claimed this "
                         "report but showed no proof of printing it within "
                         f"{PROOF_SECONDS:g} s (it may have been killed before it printed)")
        else:
            text = pointer(report, fp, d.seen)
        return f"{text}\n    {d.note}" if d.note else text

    @hookimpl
    def sglang_dsv4_guard_report(self, report: Report) -> None:
        """Log ``report`` unless it is empty."""
        if not report.findings:
            return
        d = _DELIVERY.get() or Delivery()
        fp = d.fingerprint = fingerprint(report)
        # Rendered before the claim: the window from claim to print stays short.
        full = render_report(report) or headline(report)
        # A quiet repeat was reported in full before (here or elsewhere): claim nothing.
        d.seen = Seen.HERE if d.quiet else self.dedup.seen(fp)
        with self._lock:
            count = self.counts.setdefault(fp, _Count(report.codes, headline(report), d.seen))
            count.occurrences += 1
        level = _level(report)
        text = self._text(report, full, fp, d)
        if self.log_format != "json":
            level = logging.DEBUG if d.quiet else level
            logger.log(level, "%s", text)
        else:  # every occurrence is a record at the report's level, quiet ones included
            data = {"fingerprint": fp, "codes": list(report.codes), "seen": d.seen.value,
                    "raised": d.raised, "pid": os.getpid(), **d.extra,
                    "report": report.to_dict()}
            logger.log(level, "%s", text, extra={EXTRA_KEY: data})
        d.logged_full = d.seen in (Seen.FIRST, Seen.UNPROVEN) and not d.quiet \
            and logger.isEnabledFor(level)
        if d.logged_full:
            self.dedup.printed(fp)  # the proof others wait for; then the sweep
        else:
            self.dedup.sweep_once()

    def summary_lines(self) -> list[str]:
        """One line per distinct report: occurrences, and where it was printed in full."""
        with self._lock:
            return [f"{fp}: {c.occurrences} occurrence(s) in this process, {_WHERE[c.first]}: "
                    f"{c.headline}" for fp, c in self.counts.items()]


class Recorder:
    """A reporter plug-in that keeps every report it is handed.

    ``undo`` unregisters it from the guard it was registered on by
    :func:`sglang_dsv4_guard.testing.record` (``False``: nothing to undo).
    """

    def __init__(self) -> None:
        self.reports: list[Report] = []
        self.undo: Undo = nothing_to_undo

    @hookimpl
    def sglang_dsv4_guard_report(self, report: Report) -> None:
        """Keep ``report``."""
        self.reports.append(report)

    @property
    def codes(self) -> list[str]:
        """Every code of every report received, in order."""
        return [code for r in self.reports for code in r.codes]
