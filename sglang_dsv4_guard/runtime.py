"""The installed guard's state, shared by the wrappers: settings, plug-ins, release.

Built by :mod:`sglang_dsv4_guard.lifecycle` (``install()``, or ``standalone_runtime()``
for ``check`` and tests) and handed to the wrappers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Report
from sglang_dsv4_guard.host.releases import HostProfile
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.plugins import GuardPlugins
from sglang_dsv4_guard.settings import Mode, Settings

__all__ = ["Runtime", "add_note"]

logger = logging.getLogger(LOGGER_NAME)


@dataclass
class Runtime:
    """What the wrappers need. ``active`` turns False on uninstall, so a wrapper that
    somebody still holds passes straight through to SGLang."""

    settings: Settings
    plugins: GuardPlugins
    profile: HostProfile
    active: bool = True

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
        if self.strict:
            report = Report.of((), {"stage": stage})
            raise DSV4GuardError(
                f"sglang-dsv4-guard (strict mode) failed internally while {stage}: "
                f"{type(exc).__name__}: {exc}", report, None) from exc

    def publish(self, report: Report) -> None:
        """Send ``report`` to every reporter; log reporters that fail."""
        for failure in self.plugins.report(report):
            logger.warning("%s: %s", failure.summary, "; ".join(failure.details))


def add_note(exc: BaseException, note: str) -> None:
    """PEP 678 ``add_note``, with the 3.10 fallback of setting ``__notes__`` by hand."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]

