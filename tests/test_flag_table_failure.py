"""The release's flag table is an aid to the fixes, not to the checks: when building it
fails (SGLang's ``add_cli_args`` raising in this process), the built-in findings are still
reported and only the flag edits it would have vetted are missing. SGLang's real
``setup_state_kv_args`` under the installed guard, pools by ``build_pair``; only the
guard's own table builder is made to fail."""

from __future__ import annotations

import argparse
import unittest
from unittest import mock

import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, guard_logs_off, outcome
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.host import flags
from sglang_dsv4_guard.testing import PoolSpec, build_pair

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")


class TestFlagTableFailure(GuardTestCase):
    """A flag table that cannot be built."""

    def test_builtin_findings_kept(self) -> None:
        """add_cli_args raising: DSV4G001 is still in the report SGLang's error carries."""
        self.install_guard("on", load_entry_points=False)
        failure = argparse.ArgumentError(None, "conflicting option string: --x")
        with mock.patch.object(flags, "flag_table", side_effect=failure), guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args,
                             *build_pair(draft=PoolSpec(compression_ratios=(4,))))
        self.assertIsInstance(err, DSV4GuardError)
        self.assertIn("DSV4G001", [f.code for f in err.findings])


if __name__ == "__main__":
    unittest.main()
