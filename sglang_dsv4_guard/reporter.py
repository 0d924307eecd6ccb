"""The built-in reporter: every report goes to the ``sglang_dsv4_guard`` logger."""

from __future__ import annotations

import logging

from sglang_dsv4_guard.findings import Report, Severity
from sglang_dsv4_guard.hookspecs import hookimpl
from sglang_dsv4_guard.render import render_report

__all__ = ["LogReporter"]

logger = logging.getLogger("sglang_dsv4_guard")


class LogReporter:
    """Logs each report once: as text, or as one JSON object with ``log_format="json"``.

    The level follows the worst finding: ERROR, WARNING, else INFO.
    """

    def __init__(self, log_format: str = "text") -> None:
        self.log_format = log_format

    @hookimpl
    def sglang_dsv4_guard_report(self, report: Report) -> None:
        """Log ``report`` unless it is empty."""
        if not report.findings:
            return
        if report.by_severity(Severity.ERROR):
            level = logging.ERROR
        elif report.by_severity(Severity.WARNING):
            level = logging.WARNING
        else:
            level = logging.INFO
        text = report.to_json() if self.log_format == "json" else render_report(report)
        logger.log(level, "%s", text)
