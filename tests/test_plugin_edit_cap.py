"""A plug-in's fix is applied as a whole: when it carries more edits than the guard keeps
(``LIST_CAP``), the guard does not silently keep the first ones as if they were the fix;
it refuses the finding (``DSV4G090``) or keeps every edit. The guard's real plug-in manager
through ``check_pools``, pools by ``build_pair``."""

from __future__ import annotations

import unittest
from typing import Any

from helpers import GuardTestCase, guard_logs_off
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import Edit, Finding, Fix, FixKind, Severity, hookimpl
from sglang_dsv4_guard.findings import LIST_CAP
from sglang_dsv4_guard.testing import build_pair, check_pools

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

_EDITS = LIST_CAP + 4


class _ManyEdits:
    """A plug-in whose one fix sets LIST_CAP + 4 variables at once."""

    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: Any, context: Any) -> list[Finding]:
        edits = tuple(Edit("decode", f"ACME_VAR_{i}", "1", env=True) for i in range(_EDITS))
        return [Finding(code="ACME004", severity=Severity.WARNING, summary="s", subject="x",
                        fixes=(Fix(FixKind.FLAGS, "set all of them", edits=edits),))]


class TestPluginEditCap(GuardTestCase):
    """More edits in one fix than the guard's list cap."""

    def test_fix_not_silently_cut(self) -> None:
        """The ACME004 fix keeps all its edits, or the finding is refused as DSV4G090."""
        with guard_logs_off():
            report = check_pools(*build_pair(), _ManyEdits())
        kept = [len(fix.edits) for f in report.findings if f.code == "ACME004"
                for fix in f.fixes if fix.text == "set all of them"]
        self.assertTrue(kept == [_EDITS] or "DSV4G090" in report.codes, (kept, report.codes))


if __name__ == "__main__":
    unittest.main()
