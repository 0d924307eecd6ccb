"""The installed guard's state, shared by the wrappers: settings, plug-ins, release.

Built by :mod:`sglang_dsv4_guard.lifecycle` (``install()``), or not installed by
:func:`sglang_dsv4_guard.assembly.standalone_runtime` (for ``check`` and tests), and
handed to the wrappers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Finding, Report
from sglang_dsv4_guard.host.releases import HostProfile
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.metrics import Exporter
from sglang_dsv4_guard.reporter import Delivery, LogReporter
from sglang_dsv4_guard.settings import Mode, Settings

__all__ = ["Hooks", "Runtime", "add_note"]

logger = logging.getLogger(LOGGER_NAME)


class Hooks(Protocol):
    """What the wrappers call on the plug-in manager (:class:`sglang_dsv4_guard.plugins.
    GuardPlugins`, built where the guard is assembled): declared here, so that a wrapper
    never imports the manager, whose hook specs name its package's snapshot types."""

    @property
    def log_reporter(self) -> LogReporter | None:
        """The built-in log reporter (``None`` if it could not be registered)."""

    def collect_each(self, hook: str, kwargs: Mapping[str, Any]
                     ) -> Iterator[tuple[str, list[Finding]]]:
        """Per implementation of ``hook``, in call order: its name and checked findings."""

    def collect(self, hook: str, kwargs: Mapping[str, Any]) -> list[Finding]:
        """Every implementation's findings for ``hook``, each called on its own."""

    def report(self, report: Report) -> list[Finding]:
        """Hand ``report`` to every reporter; the reporters that failed, as findings."""


@dataclass
class Runtime:
    """What the wrappers need. ``active`` turns False on uninstall, so a wrapper that
    somebody still holds passes straight through to SGLang. ``metrics`` counts what is
    reported (off unless the installation turned it on: :mod:`sglang_dsv4_guard.metrics`)."""

    settings: Settings
    plugins: Hooks
    profile: HostProfile
    active: bool = True
    metrics: Exporter = field(default_factory=Exporter)

    @property
    def strict(self) -> bool:
        """Whether the guard runs in strict mode."""
        return self.settings.mode.value is Mode.STRICT

    def internal_error(self, stage: str, exc: BaseException) -> None:
        """Log a bug of ours. SGLang goes on as if the guard were absent, unless strict."""
        logger.warning(
            "sglang-dsv4-guard internal error while %s (%s: %s); SGLang's call is unaffected",
            stage, type(exc).__name__, exc, exc_info=exc,
        )
        self.metrics.failure()
        if self.strict:
            report = Report.of((), {"stage": stage})
            raise DSV4GuardError(
                f"sglang-dsv4-guard (strict mode) failed internally while {stage}: "
                f"{type(exc).__name__}: {exc}", report, None) from exc

    def publish(self, report: Report, delivery: Delivery | None = None) -> None:
        """Send ``report`` to every reporter; log reporters that fail. Then count it as
        ``delivery`` (published around this call, filled in by the log reporter) says."""
        for failure in self.plugins.report(report):
            logger.warning("%s: %s", failure.summary, "; ".join(failure.details))
            self.metrics.failure(failure.code)
        self.metrics.count(report, delivery)


def add_note(exc: BaseException, note: str) -> None:
    """PEP 678 ``add_note``, with the 3.10 fallback of setting ``__notes__`` by hand."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]

