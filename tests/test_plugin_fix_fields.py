"""A plug-in's fix is taken as data the guard checks, never as the guard's own word: it
cannot mark itself proven (only ``check --fix`` proves). The guard's real plug-in manager
through ``check_pools``, pools by ``build_pair``."""

from __future__ import annotations

import unittest
from typing import Any

from helpers import GuardTestCase, guard_logs_off
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import Finding, Fix, FixKind, Severity, hookimpl
from sglang_dsv4_guard.render import render_report
from sglang_dsv4_guard.testing import build_pair, check_pools

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")


class _OneFix:
    """A plug-in whose one finding (ACME007) carries ``fix``."""

    def __init__(self, fix: Fix) -> None:
        self.fix = fix

    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: Any, context: Any) -> list[Finding]:
        return [Finding(code="ACME007", severity=Severity.WARNING, summary="s", subject="x",
                        fixes=(self.fix,))]


class TestPluginFixFields(GuardTestCase):
    """What the guard keeps of a plug-in's Fix and Edit fields."""

    def test_plugin_fix_is_never_proven(self) -> None:
        """A plug-in fix marked ``proven=True`` or ``proven=1`` is kept unproven: its
        ``proven`` is ``None`` and the report never says "(proven by check)"."""
        for claimed in (True, 1, False):
            with self.subTest(proven=claimed), guard_logs_off():
                report = check_pools(*build_pair(), _OneFix(
                    Fix(FixKind.ADVICE, "trust me", proven=claimed)))  # type: ignore[arg-type]
                [fix] = [x for f in report.findings if f.code == "ACME007" for x in f.fixes]
                self.assertIsNone(fix.proven)
                self.assertNotIn("proven by check", render_report(report) or "")


if __name__ == "__main__":
    unittest.main()
