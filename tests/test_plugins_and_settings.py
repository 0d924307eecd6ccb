"""Third-party plug-ins cannot change SGLang's verdict; bad settings are named clearly."""

from __future__ import annotations

import unittest

import sglang.srt.disaggregation.utils as utils
from helpers import UNWRAPPED, GuardTestCase, outcome
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import DSV4GuardError, Finding, Severity, hookimpl
from sglang_dsv4_guard.settings import Mode, settings_from_env
from sglang_dsv4_guard.testing import PoolSpec, build_pair, record, register

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")


class Raising:
    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: object, context: object) -> list[Finding]:
        raise ZeroDivisionError("plug-in bug")


class Garbage:
    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: object) -> object:
        return "not a list"


class Extra:
    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: object) -> list[Finding]:
        return [Finding("ACME001", Severity.WARNING, "site policy", "draft pool")]


class TestThirdPartyPlugins(GuardTestCase):
    """A broken plug-in becomes a DSV4G090 finding; SGLang's verdict stands."""

    def _install_with(self, *plugins: object) -> None:
        self.install_guard("on", load_entry_points=False)
        register(*plugins)

    def test_g090_raising_plugin_on_passing_pair(self) -> None:
        """A check that raises does not fail a pair SGLang accepts (mode on)."""
        pair = build_pair()
        expected = outcome(UNWRAPPED, *pair)
        self._install_with(Raising())
        recorder = record()
        self.assertEqual(outcome(utils.setup_state_kv_args, *pair), expected)
        [failure] = [f for f in recorder.reports[0].findings if f.code == "DSV4G090"]
        self.assertIn("ZeroDivisionError: plug-in bug", failure.details[0])

    def test_garbage_and_extra_on_failing_pair(self) -> None:
        """Garbage is reported, a good plug-in's finding is kept, SGLang's line leads."""
        pair = build_pair(draft=PoolSpec(compression_ratios=(4,)))
        _, host = outcome(UNWRAPPED, *pair)
        self._install_with(Garbage(), Extra())
        _, guarded = outcome(utils.setup_state_kv_args, *pair)
        self.assertIsInstance(guarded, DSV4GuardError)
        self.assertEqual(str(guarded).splitlines()[0], str(host))
        codes = [f.code for f in guarded.findings]
        self.assertEqual(codes[0], "DSV4G001")
        self.assertIn("DSV4G090", codes)
        self.assertIn("ACME001", codes)


class TestSettings(GuardTestCase):
    """Every setting records its source; bad values name variable, value, accepted values."""

    def test_modes(self) -> None:
        """Accepted spellings, case-insensitive."""
        for raw, mode in (("", Mode.OFF), ("OFF", Mode.OFF), ("False", Mode.OFF),
                          ("1", Mode.ON), ("True", Mode.ON), ("Strict", Mode.STRICT)):
            settings, problems = settings_from_env({"SGLANG_DSV4_GUARD": raw})
            self.assertEqual((settings.mode.value, problems), (mode, []), raw)
        self.assertEqual(settings.mode.source, "environment variable SGLANG_DSV4_GUARD='Strict'")

    def test_bad_values(self) -> None:
        """Garbage in any variable falls back safely and is reported once, by name."""
        settings, problems = settings_from_env({"SGLANG_DSV4_GUARD": "2",
                                                "SGLANG_DSV4_GUARD_AUTOSHARE": "maybe",
                                                "SGLANG_DSV4_GUARD_LOG_FORMAT": "xml"})
        self.assertEqual([p.variable for p in problems],
                         ["SGLANG_DSV4_GUARD", "SGLANG_DSV4_GUARD_AUTOSHARE",
                          "SGLANG_DSV4_GUARD_LOG_FORMAT"])
        self.assertEqual(settings.mode.value, Mode.OFF)
        self.assertFalse(settings.autoshare.value)
        self.assertIn("(got 'xml')", str(problems[2]))
        self.assertIn("json", problems[2].accepted)


if __name__ == "__main__":
    unittest.main()
