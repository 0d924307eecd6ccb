"""A plug-in's ``Edit`` whose ``remove``/``env`` is truthy but not exactly ``bool`` (``1``,
a NumPy bool) is refused at the boundary (``DSV4G090``) or kept as what it says; it is
never turned into the opposite edit (a removal shown as setting the flag). The guard's real
plug-in manager through ``check_pools``, pools by ``build_pair``."""

from __future__ import annotations

import unittest
from typing import Any

from helpers import GuardTestCase, guard_logs_off
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import Edit, Finding, Fix, FixKind, Severity, hookimpl
from sglang_dsv4_guard.testing import build_pair, check_pools

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")


class _RemovesAFlag:
    """A plug-in whose one fix removes --enable-foo, with ``remove=1``."""

    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: Any, context: Any) -> list[Finding]:
        edit = Edit("decode", "--enable-foo", remove=1)  # type: ignore[arg-type]
        return [Finding(code="ACME002", severity=Severity.WARNING, summary="foo is on",
                        subject="foo", fixes=(Fix(FixKind.FLAGS, "turn foo off",
                                                  edits=(edit,)),))]


class TestPluginEditFlags(GuardTestCase):
    """The boundary's handling of an Edit's switches."""

    def test_truthy_remove_never_becomes_a_set(self) -> None:
        """remove=1: the report holds no edit that sets --enable-foo."""
        with guard_logs_off():
            report = check_pools(*build_pair(), _RemovesAFlag())
        sets = [e.describe() for f in report.findings for fix in f.fixes for e in fix.edits
                if e.name == "--enable-foo" and not e.remove]
        self.assertEqual(sets, [])

    def test_truthy_remove_refused_naming_the_field(self) -> None:
        """remove=1 (not an exact bool): the finding is refused as DSV4G090, whose detail
        names the field, what it held and what is accepted."""
        with guard_logs_off():
            report = check_pools(*build_pair(), _RemovesAFlag())
        details = [d for f in report.findings if f.code == "DSV4G090" for d in f.details]
        self.assertTrue([d for d in details if "fixes[0].edits[0].remove must be True or False "
                         "(got int 1)" in d], details)


if __name__ == "__main__":
    unittest.main()
