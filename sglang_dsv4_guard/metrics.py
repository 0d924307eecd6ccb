"""The guard's counts on SGLang's own ``/metrics``, for fleets that watch Prometheus.

SGLang launched with ``--enable-metrics`` sets ``PROMETHEUS_MULTIPROC_DIR`` in its launcher
(``set_prometheus_multiproc_dir``); every scheduler inherits it, and the HTTP server's
``/metrics`` serves a ``MultiProcessCollector`` over that directory
(``add_prometheus_middleware``). A counter any scheduler process writes there appears on the
server's own endpoint, summed over its processes. The guard writes, through the real
``prometheus_client`` in multiprocess mode (names in SGLang's style, :data:`METRICS`):

- ``sglang:dsv4_guard_occurrences_total{code,severity,phase,role}``: every occurrence of a
  finding the guard reported: a full report, a one-line pointer to one printed before, a
  quiet repeat (a MORI or registration peer with a mismatch already reported, a MORI
  transfer failing again);
- ``sglang:dsv4_guard_problems_total{code,severity,phase,role}``: the distinct problems, once
  per server: the occurrences printed in full (:mod:`sglang_dsv4_guard.dedup` decides, so
  more than once only where it fails open);
- ``sglang:dsv4_guard_failures_total{code}``: the guard's own failures: the findings of its
  ``guard`` phase by code (a plug-in that failed; its prediction differing from SGLang's
  verdict), and ``internal`` (a bug of ours, logged as "sglang-dsv4-guard internal error");
- ``sglang:dsv4_guard_info{version,mode,sglang,judgement}`` 1: the guard's version and mode,
  the release whose checks it runs, and its judgement of the imported SGLang.

``phase`` is where the guard reported (``start_up``, ``first_contact``, ``registration``,
``per_request``), ``role`` the reporting server (``prefill``, ``decode``; where the report
does not say, the server's published ``--disaggregation-mode``; else ``unknown``).
Labels are bounded: codes of the guard's catalogue, plus at most :data:`FOREIGN_CODES`
codes of plug-ins per process (``other`` after that); never a peer address or free text.

Whether a process exports is decided once, at the first event after SGLang published its
server arguments (:meth:`Exporter.ready`): ``SGLANG_DSV4_GUARD_METRICS`` ``off`` never,
``on`` wherever the directory is set, ``auto`` (the default) where the server's own
``enable_metrics`` is true and the directory is set. Nothing is imported or written
otherwise. A ``prometheus_client`` that is missing, was imported before the directory was
set (its values would be this process's own, which ``/metrics`` cannot see), or fails, is
one warning; the guard runs on without metrics. Counting never changes what prints.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_dsv4_guard.codes import CODES
from sglang_dsv4_guard.findings import LIST_CAP, Finding, Phase, Report, Severity, failure_text
from sglang_dsv4_guard.host.judgement import HostJudgement
from sglang_dsv4_guard.host.server import server_args, server_value
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.reporter import Delivery, prints_in_full
from sglang_dsv4_guard.settings import ENV_METRICS

__all__ = ["DIRECTORY_VARIABLE", "FAILURES", "FOREIGN_CODES", "INFO", "LABELS", "METRICS",
           "OCCURRENCES", "PHASE_LABELS", "PROBLEMS", "Decision", "Exporter", "code_label",
           "counts_as_problem", "decide",
           "guard_version", "judgement_label", "phase_label", "role_label"]

logger = logging.getLogger(LOGGER_NAME)

#: The variable SGLang's ``set_prometheus_multiproc_dir`` sets (``prometheus_client``'s).
DIRECTORY_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
OCCURRENCES = "sglang:dsv4_guard_occurrences_total"
PROBLEMS = "sglang:dsv4_guard_problems_total"
FAILURES = "sglang:dsv4_guard_failures_total"
INFO = "sglang:dsv4_guard_info"
LABELS = ("code", "severity", "phase", "role")
INFO_LABELS = ("version", "mode", "sglang", "judgement")
#: Every metric: its name, kind, labels and what it counts (docs/operating.md quotes these).
METRICS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    (OCCURRENCES, "counter", LABELS,
     "Occurrences of findings the guard reported (full reports, pointers and quiet repeats)."),
    (PROBLEMS, "counter", LABELS,
     "Distinct problems the guard reported, once per server (the reports printed in full)."),
    (FAILURES, "counter", ("code",),
     "The guard's own failures: plug-in failures and self-check findings by code, and "
     "internal (a bug of the guard)."),
    (INFO, "gauge", INFO_LABELS,
     "1: the guard runs in this server, with this version, mode and judgement of SGLang."),
)
#: Where the guard reports, as the ``phase`` label says it.
PHASE_LABELS = {Phase.START_UP: "start_up", Phase.FIRST_CONTACT: "first_contact",
                Phase.REGISTRATION: "registration", Phase.PER_REQUEST: "per_request"}
_ROLES = ("prefill", "decode")
#: Codes outside the guard's catalogue (plug-ins') kept as labels per process; then ``other``.
FOREIGN_CODES = LIST_CAP
#: What a plug-in's code must look like to be a label (else ``other``): a word, as the
#: catalogue's are; never a peer address, free text or characters a scrape cannot encode.
_LABEL_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
INTERNAL = "internal"  # the failures counter's code for a bug of ours (no catalogue code)
_FOREIGN: set[str] = set()  # the plug-in codes this process labels (every installation's)
_FOREIGN_LOCK = threading.Lock()


def code_label(code: str) -> str:
    """The ``code`` label of ``code``: itself for the catalogue's, ``internal`` and the
    first :data:`FOREIGN_CODES` plug-in codes of this process that are words; else ``other``."""
    if code in CODES or code == INTERNAL:
        return code
    if not isinstance(code, str) or not _LABEL_CODE.fullmatch(code):
        return "other"
    with _FOREIGN_LOCK:
        if code in _FOREIGN:
            return code
        if len(_FOREIGN) < FOREIGN_CODES:
            _FOREIGN.add(code)
            return code
    return "other"


def phase_label(phase: Phase | None) -> str:
    """The ``phase`` label of a report made at ``phase`` (``unknown``: not said)."""
    return PHASE_LABELS.get(phase, "unknown") if phase is not None else "unknown"


def role_label(role: object) -> str:
    """The ``role`` label: ``prefill``, ``decode`` or ``unknown``."""
    return role if isinstance(role, str) and role in _ROLES else "unknown"


def judgement_label(host: HostJudgement) -> str:
    """The info metric's ``judgement``: ``supported`` (the code of the release its label
    names), ``guarded_as_known`` (other code with a known release's checks: a new label, a
    patched tree, a label that disagrees), ``not_judged`` (no known release's checks: the
    guard stays inert and exports nothing, so this value is never written)."""
    if host.behaves_as is None:
        return "not_judged"
    if host.version == host.behaves_as and not host.message:
        return "supported"
    return "guarded_as_known"


def _server_role() -> str:
    """This server's ``--disaggregation-mode`` as its published server args say, as a
    ``role`` label (a report whose caller did not name its side: a start-up report from
    a caller other than SGLang's bootstrap queues)."""
    value = _published("disaggregation_mode")
    return role_label(str(getattr(value, "value", value)))


def guard_version() -> str:
    """The installed distribution's version (``unknown`` when it has no metadata)."""
    try:
        return importlib.metadata.version("sglang-dsv4-guard")
    except Exception:  # a source tree on sys.path without metadata
        return "unknown"


@dataclass(frozen=True)
class Decision:
    """Whether this process exports (``export``), why (``reason``, one line), whether that
    reason is a warning for the operator (``warn``), and ``final``: ``False`` while the
    server's ``enable_metrics`` is not published yet (asked again later)."""

    export: bool
    reason: str
    warn: bool = False
    final: bool = True


def counts_as_problem(delivery: Delivery) -> bool:
    """Whether an occurrence published as ``delivery`` says counts as a distinct problem:
    it printed the full report (not a quiet repeat, not a pointer)."""
    return not delivery.quiet and prints_in_full(delivery.seen)


def _published(field: str) -> object | None:
    """``ServerArgs.<field>`` as this scheduler published it: the value in effect, else the
    published arguments' own (a release whose resolved bags do not hold the field);
    ``None``: not published in this process."""
    value = server_value(field)
    if value is None:
        value = getattr(server_args(), field, None)
    return value


def _enable_metrics() -> bool | None:
    """The server's own ``enable_metrics`` (``None``: not published in this process)."""
    value = _published("enable_metrics")
    return None if value is None else bool(value)


def decide(setting: str, environ: Mapping[str, str],
           enable_metrics: Callable[[], bool | None] = _enable_metrics) -> Decision:
    """Whether a process with ``setting`` (``auto``, ``on``, ``off``) and ``environ``
    exports, before ``prometheus_client`` is looked at."""
    if setting == "off":
        return Decision(False, f"{ENV_METRICS}=off")
    directory = environ.get(DIRECTORY_VARIABLE)
    if setting == "auto":
        enabled = enable_metrics()
        if enabled is None:
            return Decision(False, "SGLang has not published this server's arguments yet",
                            final=False)
        if not enabled:
            return Decision(False, "the server runs without --enable-metrics (set "
                            f"{ENV_METRICS}=on to export anyway)")
    why = "the server runs with --enable-metrics" if setting == "auto" else f"{ENV_METRICS}=on"
    if not directory:
        return Decision(False, f"{why}, but {DIRECTORY_VARIABLE} is not set in this process: "
                        "SGLang's /metrics could not see a counter made here", warn=True)
    if not os.path.isdir(directory):
        return Decision(False, f"{why}, but {DIRECTORY_VARIABLE}={directory!r} is not a "
                        "directory", warn=True)
    return Decision(True, f"{why}; written under {DIRECTORY_VARIABLE}={directory}")


@dataclass
class _Families:
    """The metric objects, one set per process (two objects of one name would overwrite
    each other's counts in the shared file)."""

    occurrences: Any
    problems: Any
    failures: Any
    info: Any


_FAMILIES: _Families | None = None
_FAMILIES_LOCK = threading.Lock()


def _families() -> _Families:
    """Create the metric objects once per process; raise why they cannot be (import,
    a ``prometheus_client`` already imported in single-process mode, a file)."""
    global _FAMILIES
    with _FAMILIES_LOCK:
        if _FAMILIES is not None:
            return _FAMILIES
        client = importlib.import_module("prometheus_client")  # unscanned: not ours
        values = importlib.import_module("prometheus_client.values")  # unscanned: not ours
        value_class = getattr(values, "ValueClass", None)
        if not (getattr(value_class, "_multiprocess", False)
                or getattr(value_class, "__name__", "") == "MmapedValue"):
            raise RuntimeError(
                "prometheus_client was imported in this process before "
                f"{DIRECTORY_VARIABLE} was set, so its values stay in this process, where "
                "SGLang's /metrics cannot see them")
        docs = {name: text for name, _, _, text in METRICS}
        # registry=None: the multiprocess files are what /metrics reads; nothing is
        # registered in this process's default registry, so no name can clash there.
        _FAMILIES = _Families(
            client.Counter(OCCURRENCES, docs[OCCURRENCES], LABELS, registry=None),
            client.Counter(PROBLEMS, docs[PROBLEMS], LABELS, registry=None),
            client.Counter(FAILURES, docs[FAILURES], ("code",), registry=None),
            client.Gauge(INFO, docs[INFO], INFO_LABELS, registry=None,
                         multiprocess_mode="max"))
        return _FAMILIES


@dataclass
class Exporter:
    """One installation's metrics: decided once per process, then counted where a report
    is made. ``mode``, ``sglang`` and ``judgement`` are the info metric's labels.
    ``pending``: failures met before the decision (plug-ins that failed to load), counted
    once it exports. No method raises: a failure of ours here is one warning, and the
    export ends (counting never changes what the guard or SGLang does)."""

    setting: str = "off"
    mode: str = "on"
    sglang: str = "unknown"
    judgement: str = "unknown"
    pending: Iterable[Finding] = ()
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    decision: Decision | None = None
    _live: _Families | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ready(self, at_report: bool = True) -> bool:
        """Whether this process exports; decides at the first call that can (cheap after).

        ``at_report`` false: an early point (SGLang importing a connector module, its
        start-up call), where the process may not be set up yet (a launcher sets the
        directory after it loaded the plug-ins): a missing directory is then neither
        decided nor warned about; the next report decides."""
        decision = self.decision
        if decision is not None and decision.final:
            return self._live is not None
        try:
            pending = self._decide(at_report)
        except Exception as exc:
            self._stop("deciding", exc)
            return False
        for finding in pending:
            self.failure(finding.code)
        return self._live is not None

    def _decide(self, at_report: bool) -> list[Finding]:
        with self._lock:
            if self.decision is not None and self.decision.final:
                return []
            decision = decide(self.setting, self.environ)
            if decision.warn and not at_report:
                return []  # the directory may come later: say nothing yet
            if decision.export:
                try:
                    self._live = _families()
                    self._live.info.labels(*self._info_labels()).set(1)
                except Exception as exc:
                    self._live = None
                    decision = Decision(False, "prometheus_client could not be used "
                                        f"({failure_text(exc)})", warn=True)
            self.decision = decision
            if decision.warn:
                logger.warning("sglang-dsv4-guard exports no metrics: %s; the guard runs on",
                               decision.reason)
            elif decision.final:
                logger.debug("sglang-dsv4-guard metrics: %s", decision.reason)
            if not decision.final:
                return []
            pending, self.pending = list(self.pending), ()
            return pending

    def _stop(self, what: str, exc: BaseException) -> None:
        """The export ends at the first failure: one warning; the info series goes to 0 if
        it still can (so a dashboard sees the counts stopped)."""
        live, self._live = self._live, None
        if live is not None:
            with contextlib.suppress(Exception):
                live.info.labels(*self._info_labels()).set(0)
        self.decision = Decision(False, f"{what} failed ({failure_text(exc)})")
        logger.warning("sglang-dsv4-guard stops exporting metrics: %s failed (%s); the "
                       "guard runs on", what, failure_text(exc))

    def _info_labels(self) -> tuple[str, ...]:
        return (guard_version(), self.mode, self.sglang, self.judgement)

    def _write(self, what: str, write: Callable[[_Families], None]) -> None:
        live = self._live
        if live is None:
            return
        try:
            write(live)
        except Exception as exc:
            self._stop(what, exc)

    def count(self, report: Report, delivery: Delivery | None) -> None:
        """Count one occurrence of ``report`` as ``delivery`` published it (``None``: a
        report published with no delivery)."""
        if not report.findings or not self.ready():
            return

        def write(live: _Families) -> None:
            d = delivery or Delivery()
            phase, role = phase_label(d.phase), role_label(d.role)
            if role == "unknown":
                role = _server_role()
            full = counts_as_problem(d)
            ours = [f for f in report.findings if f.when is not None and f.when.phase is Phase.GUARD]
            for code, severity in dict.fromkeys((f.code, f.severity.value)
                                                for f in report.findings if f not in ours):
                labels = (code_label(code), severity, phase, role)
                live.occurrences.labels(*labels).inc()
                if full:
                    live.problems.labels(*labels).inc()
            for f in ours:
                live.failures.labels(code_label(f.code)).inc()
        self._write("counting a report", write)

    def occurrence(self, code: str, severity: Severity, phase: Phase, role: str) -> None:
        """Count one occurrence of a finding met again where no report is published (a
        prefill thread dying of a mismatch reported at registration)."""
        if self.ready():
            labels = (code_label(code), severity.value, phase_label(phase), role_label(role))
            self._write("counting an occurrence",
                        lambda live: live.occurrences.labels(*labels).inc())

    def failure(self, code: str = INTERNAL) -> None:
        """Count one failure of the guard's own (a plug-in's code, or a bug of ours)."""
        if self.ready():
            self._write("counting a failure",
                        lambda live: live.failures.labels(code_label(code)).inc())

    def retire(self) -> None:
        """At uninstall: this installation's info series goes to 0 in this process."""
        if self._live is not None:
            self._write("retiring the info series",
                        lambda live: live.info.labels(*self._info_labels()).set(0))
