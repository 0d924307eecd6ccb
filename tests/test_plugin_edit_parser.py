"""A plug-in's flag edit is held to the installed release's parser, as the built-in fixes
are: a flag that ``ServerArgs.add_cli_args`` does not define never reaches the report as a
flag edit. The guard's real plug-in manager through ``check_pools``; the parser is
SGLang's own (``host.flags``)."""

from __future__ import annotations

import unittest
from typing import Any

from helpers import GuardTestCase, guard_logs_off
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import Edit, Finding, Fix, FixKind, Severity, hookimpl
from sglang_dsv4_guard.host.flags import accepts
from sglang_dsv4_guard.testing import build_pair, check_pools

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

_BOGUS = "--acme-no-such-sglang-flag"


class _SuggestsABogusFlag:
    """A plug-in whose one fix sets a flag no SGLang release has."""

    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: Any, context: Any) -> list[Finding]:
        return [Finding(code="ACME003", severity=Severity.WARNING, summary="s", subject="x",
                        fixes=(Fix(FixKind.FLAGS, "set it",
                                   edits=(Edit("decode", _BOGUS, "1"),)),))]


class _SetsASwitchToAValue:
    """A plug-in with a fix giving a switch a value, and a free-text fix."""

    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: Any, context: Any) -> list[Finding]:
        edit = Edit("decode", "--enable-dp-attention", "yes")
        return [Finding(code="ACME005", severity=Severity.WARNING, summary="s", subject="x",
                        fixes=(Fix(FixKind.FLAGS, "set it", edits=(edit,)),
                               "keep this one"))]


class TestPluginEditParser(GuardTestCase):
    """Plug-in flag edits against the release's flag table."""

    def test_unknown_flag_not_kept_as_an_edit(self) -> None:
        """An edit naming a flag the release's parser lacks is not in the report's edits."""
        self.assertFalse(accepts(_BOGUS))  # the premise, on SGLang's own parser
        with guard_logs_off():
            report = check_pools(*build_pair(), _SuggestsABogusFlag())
        names = [e.name for f in report.findings for fix in f.fixes for e in fix.edits]
        self.assertNotIn(_BOGUS, names)

    def test_refused_value_drops_the_fix_keeps_the_finding(self) -> None:
        """An edit whose value the release's parser refuses (a value for the store-true
        --enable-dp-attention): that fix is dropped whole, the plug-in's finding is kept."""
        self.assertTrue(accepts("--enable-dp-attention"))  # the premise, on SGLang's parser
        with guard_logs_off():
            report = check_pools(*build_pair(), _SetsASwitchToAValue())
        [finding] = [f for f in report.findings if f.code == "ACME005"]
        self.assertEqual([fix.text for fix in finding.fixes], ["keep this one"])


if __name__ == "__main__":
    unittest.main()
