"""The example plug-in's own test, written with sglang_dsv4_guard.testing."""

import unittest

import acme_guard_policy

from sglang_dsv4_guard.testing import PoolSpec, build_pair, check_pools


class TestAcmePolicy(unittest.TestCase):
    def test_flags_a_unified_kv_pool(self) -> None:
        """A pair SGLang accepts, both in the unified-KV ring, gets one ACME001 per pool."""
        pair = build_pair(PoolSpec(unified=True), PoolSpec(unified=True))
        report = check_pools(*pair, acme_guard_policy)
        self.assertEqual(report.codes, ("ACME001", "ACME001"))
        self.assertIs(report.findings[1].value("draft pool", "_unified_kv"), True)
        [fix] = report.findings[1].fixes
        self.assertEqual(fix.edits[0].describe(),
                         "this server env: unset SGLANG_HACK_FLASHMLA_BACKEND")

    def test_silent_on_paged_pools(self) -> None:
        """Paged pools (SGLang's default) give the policy nothing to say."""
        self.assertEqual(check_pools(*build_pair(), acme_guard_policy).codes, ())


if __name__ == "__main__":
    unittest.main()
