"""``sglang_dsv4_guard.testing.reset()`` forgets what the process remembers between
installations (warnings already given, memoised judgements), and every ``GuardTestCase``
runs it, so whether a test sees a warning never depends on the tests before it."""

from __future__ import annotations

import json
import logging
import unittest
from unittest import mock

from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import testing
from sglang_dsv4_guard.host import judgement

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

BROKEN = json.JSONDecodeError("Expecting value", "", 0)


def refuse(case: unittest.TestCase) -> list[str]:
    """Install with the digests unreadable (install refuses and stays inert); return the
    guard's log lines at DEBUG and above."""
    with mock.patch.object(judgement, "load_known", side_effect=BROKEN), \
            case.assertLogs("sglang_dsv4_guard", logging.DEBUG) as logs:
        sglang_dsv4_guard.install("on", load_entry_points=False)
    case.assertFalse(sglang_dsv4_guard.is_installed())
    return logs.output


def warned(lines: list[str]) -> bool:
    return any(line.startswith("WARNING:") and "stays inert" in line for line in lines)


class TestReset(GuardTestCase):
    """What ``reset()`` forgets, and what it leaves alone."""

    def test_a_repeated_refusal_warns_once_per_process(self) -> None:
        """Without a reset, the second refusal for the same reason is a DEBUG line only."""
        self.assertTrue(warned(refuse(self)))
        again = refuse(self)
        self.assertFalse(warned(again), again)
        self.assertTrue(any("already warned" in line for line in again), again)

    def test_reset_makes_the_warning_appear_again(self) -> None:
        """After ``reset()`` the same refusal warns again."""
        self.assertTrue(warned(refuse(self)))
        testing.reset()
        self.assertTrue(warned(refuse(self)))

    def test_reset_uninstalls(self) -> None:
        """``reset()`` leaves the guard uninstalled, as a fresh import does."""
        self.install_guard("on", load_entry_points=False)
        testing.reset()
        self.assertFalse(sglang_dsv4_guard.is_installed())


class TestOrderDoesNotMatter(GuardTestCase):
    """A test sees its warning though an earlier test triggered the same one."""

    def test_each_test_sees_the_warning(self) -> None:
        """Two ``GuardTestCase`` tests that make ``install()`` refuse for the same reason,
        run one after the other in this process: both see the WARNING."""

        class Refusing(GuardTestCase):
            def test_first(self) -> None:
                self.assertTrue(warned(refuse(self)))

            def test_second(self) -> None:
                self.assertTrue(warned(refuse(self)))

        result = unittest.TestResult()
        unittest.TestSuite([Refusing("test_first"), Refusing("test_second")]).run(result)
        self.assertEqual(result.testsRun, 2)
        self.assertEqual([str(t) for t, _ in result.failures + result.errors], [])


if __name__ == "__main__":
    unittest.main()
