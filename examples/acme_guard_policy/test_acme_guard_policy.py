"""The example plug-in's own test, written with sglang_dsv4_guard.testing."""

import unittest

import acme_guard_policy

from sglang_dsv4_guard.testing import PoolSpec, build_pair, check_pools


class TestAcmePolicy(unittest.TestCase):
    def test_flags_a_pool_off_the_fleet_page_size(self) -> None:
        """A pair SGLang accepts, at page size 128, gets one ACME001 warning per pool."""
        pair = build_pair(PoolSpec(page_size=128), PoolSpec(page_size=128))
        report = check_pools(*pair, acme_guard_policy)
        self.assertEqual(report.codes, ("ACME001", "ACME001"))
        self.assertEqual(report.findings[1].value("draft pool", "page_size"), 128)
        [fix] = report.findings[1].fixes
        self.assertEqual(fix.edits[0].describe(), "this server: --page-size 256")

    def test_silent_on_the_fleet_page_size(self) -> None:
        """At page size 256 the policy has nothing to say."""
        self.assertEqual(check_pools(*build_pair(), acme_guard_policy).codes, ())


if __name__ == "__main__":
    unittest.main()
