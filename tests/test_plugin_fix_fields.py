"""A plug-in's fix is taken as data the guard checks, never as the guard's own word: it
cannot mark itself proven (only ``check --fix`` proves), an edit whose name or value does
not fit the guard's string cap is refused (``DSV4G090``) rather than silently cut, and an
edit's server must be one the guard knows. The guard's real plug-in manager through
``check_pools``, pools by ``build_pair``."""

from __future__ import annotations

import unittest
from typing import Any

from helpers import GuardTestCase, guard_logs_off
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import Edit, Finding, Fix, FixKind, Severity, hookimpl
from sglang_dsv4_guard.findings import STRING_CAP
from sglang_dsv4_guard.render import render_report
from sglang_dsv4_guard.testing import build_pair, check_pools

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")


class _OneFix:
    """A plug-in whose one finding (ACME007) carries ``fix``."""

    def __init__(self, fix: Fix) -> None:
        self.fix = fix

    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: Any, context: Any) -> list[Finding]:
        return [Finding(code="ACME007", severity=Severity.WARNING, summary="s", subject="x",
                        fixes=(self.fix,))]


def _g090_details(report: Any) -> str:
    return "\n".join(d for f in report.findings if f.code == "DSV4G090" for d in f.details)


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

    def test_long_edit_value_is_refused_not_cut(self) -> None:
        """An edit value longer than STRING_CAP makes the finding a DSV4G090 naming the
        edit's ``value`` field; no cut value reaches the report as an edit."""
        long = "x" * (STRING_CAP + 10)
        with guard_logs_off():
            report = check_pools(*build_pair(), _OneFix(Fix(
                FixKind.FLAGS, "set it", edits=(Edit("decode", "ACME_VAR", long, env=True),))))
        self.assertNotIn("ACME007", report.codes)
        self.assertIn("fixes[0].edits[0].value", _g090_details(report))

    def test_unknown_edit_server_is_refused(self) -> None:
        """An edit for server "both" makes the finding a DSV4G090 naming the value and the
        servers accepted."""
        with guard_logs_off():
            report = check_pools(*build_pair(), _OneFix(Fix(
                FixKind.FLAGS, "set it", edits=(Edit("both", "ACME_VAR", "1", env=True),))))
        self.assertNotIn("ACME007", report.codes)
        details = _g090_details(report)
        self.assertIn("'both'", details)
        self.assertIn("'this server'", details)


if __name__ == "__main__":
    unittest.main()
