"""DSV4G004's code-path fix says what the pools hold: when the draft holds a mapping tensor
and the target holds none, it never says that no pool holds one. SGLang's real
``setup_state_kv_args`` under the installed guard, pools by ``build_pair``."""

from __future__ import annotations

import unittest
from typing import Any

import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, guard_logs_off, outcome
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.testing import build_pair

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")


class TestMappingFixText(GuardTestCase):
    """The DSV4G004 fix for a target without a mapping tensor."""

    def test_draft_tensor_not_denied(self) -> None:
        """Target mapping None, draft a tensor: no fix says "no pool holds a mapping tensor"."""
        self.install_guard("on", load_entry_points=False)
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args,
                             *build_pair(target_mapping="none", mapping="clone"))
        self.assertIsInstance(err, DSV4GuardError)
        finding: Any = next(f for f in err.findings if f.code == "DSV4G004")
        self.assertEqual(finding.value("draft pool", "full_to_swa_index_mapping")[:3], "id=")
        self.assertFalse([f.text for f in finding.fixes if "no pool holds" in f.text])


if __name__ == "__main__":
    unittest.main()
