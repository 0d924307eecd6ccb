"""When SGLang finds a broken prefill/decode contract, as ``check`` says it: the
bootstrap timeout is the server's value read with SGLang's own parser."""

from __future__ import annotations

import importlib
import unittest

from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host.targets import ENVIRON_MODULE
from sglang_dsv4_guard.pd.when import Phase, bootstrap_timeout, when_text

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

VARIABLE = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"


def release_default() -> int:
    return int(getattr(importlib.import_module(ENVIRON_MODULE).envs, VARIABLE).default)


class TestBootstrapTimeout(GuardTestCase):
    def test_unset_is_the_release_default(self) -> None:
        """No value in the server's environment: the release's own default, said so."""
        seconds, source = bootstrap_timeout({})
        self.assertEqual(seconds, release_default())
        self.assertIn("default", source)

    def test_value_sglang_rejects_is_its_default(self) -> None:
        """A value SGLang's EnvInt refuses ('abc') is what SGLang makes of it: its
        default, with the value named."""
        seconds, source = bootstrap_timeout({VARIABLE: "abc"})
        self.assertEqual(seconds, release_default())
        self.assertIn("'abc'", source)
        self.assertIn("not a number SGLang accepts", source)

    def test_non_positive_times_out_at_once(self) -> None:
        """A timeout of -1 s never lets a poll wait (elapsed is never below it): the
        registration text says requests time out at their first poll."""
        text = when_text(Phase.REGISTRATION, "mooncake", {VARIABLE: "-1"})
        self.assertIn("at their first poll", text)
        self.assertNotIn("after -1 s", text)

    def test_value_given_is_used(self) -> None:
        """A number in the server's environment is the one the text names."""
        self.assertIn("after 60 s", when_text(Phase.REGISTRATION, "nixl", {VARIABLE: "60"}))


if __name__ == "__main__":
    unittest.main()
