"""Auto-share on SGLang's real pool class and setup_state_kv_args: only when provably safe."""

from __future__ import annotations

import logging
from typing import Any

import sglang.srt.disaggregation.utils as utils
from helpers import UNWRAPPED, guard_logs_off, outcome
from hypothesis import given
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from test_parity_property import pairs

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError, Severity
from sglang_dsv4_guard.testing import PoolSpec, build_pair, record

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")


def _mapping_line(exc: BaseException | None) -> bool:
    return exc is not None and str(exc).startswith(
        "DSV4 target and draft pools must share the SWA index mapping")


class TestAutoshareRule(CustomTestCase):
    """Each case of the rule, through the real function."""

    def setUp(self) -> None:
        super().setUp()
        sglang_dsv4_guard.install("on", autoshare=True, load_entry_points=False)
        self.recorder = record()

    def test_g007_view_is_shared(self) -> None:
        """Same storage (a view): shared at INFO, the call succeeds, the draft component is registered."""
        target, draft = build_pair(mapping="view")
        kind, kv = outcome(utils.setup_state_kv_args, target, draft)
        self.assertEqual(kind, "ok")
        self.assertIs(draft.full_to_swa_index_mapping, target.full_to_swa_index_mapping)
        self.assertEqual(len(kv["state_types"]), 2)
        [shared] = self.recorder.reports[0].findings
        self.assertEqual((shared.code, shared.severity), ("DSV4G007", Severity.INFO))

    def test_equal_clone_is_shared_with_warning(self) -> None:
        """Different storage, equal contents and geometry: shared, with a WARNING."""
        target, draft = build_pair(mapping="clone")
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            kind, _ = outcome(utils.setup_state_kv_args, target, draft)
        self.assertEqual(kind, "ok")
        self.assertIs(draft.full_to_swa_index_mapping, target.full_to_swa_index_mapping)
        self.assertIn("no longer reads its own tensor", logs.output[-1] + str(
            self.recorder.reports[0].findings[0].details))

    def test_differing_clone_is_refused(self) -> None:
        """Contents differ: not shared; the report names the first differing index."""
        target, draft = build_pair(mapping="different")
        before = draft.full_to_swa_index_mapping
        _, err = outcome(utils.setup_state_kv_args, target, draft)
        self.assertIsInstance(err, DSV4GuardError)
        self.assertIs(draft.full_to_swa_index_mapping, before)
        self.assertIn("first at index 3 (target=3, draft=-7)", str(err))

    def test_none_on_either_side_is_refused(self) -> None:
        """A missing mapping on either side is never filled in."""
        for pair in (build_pair(mapping="none"), build_pair(target_mapping="none",
                                                             mapping="clone")):
            _, err = outcome(utils.setup_state_kv_args, *pair)
            self.assertTrue(_mapping_line(err))
            self.assertIn("auto-share would not help", str(err))

    def test_unified_not_attempted(self) -> None:
        """Unified-KV pools are never touched."""
        target, draft = build_pair(PoolSpec(unified=True), PoolSpec(unified=True),
                                   mapping="clone")
        before = draft.full_to_swa_index_mapping
        self.assertEqual(outcome(utils.setup_state_kv_args, target, draft)[0], "ok")
        self.assertIs(draft.full_to_swa_index_mapping, before)

    def test_fix_line_offers_autoshare_only_when_it_would_share(self) -> None:
        """With auto-share off, DSV4G004 offers the variable for a view, not for a differing copy."""
        sglang_dsv4_guard.install("on", autoshare=False, load_entry_points=False)
        _, view = outcome(utils.setup_state_kv_args, *build_pair(mapping="view"))
        _, diff = outcome(utils.setup_state_kv_args, *build_pair(mapping="different"))
        self.assertIn("SGLANG_DSV4_GUARD_AUTOSHARE=1", " ".join(view.findings[0].fixes))
        self.assertNotIn("SGLANG_DSV4_GUARD_AUTOSHARE=1", " ".join(diff.findings[0].fixes))


class TestAutoshareHidesNothing(CustomTestCase):
    """Auto-share changes only the mapping check's outcome (installed once per test;
    every example builds its own pair)."""

    def setUp(self) -> None:
        super().setUp()
        sglang_dsv4_guard.install("on", autoshare=True, load_entry_points=False)

    def tearDown(self) -> None:
        sglang_dsv4_guard.uninstall()
        super().tearDown()

    @given(pair=pairs())
    def test_other_rejections_unchanged(self, pair: tuple[Any, Any]) -> None:
        """Every pair SGLang rejects for another reason is still rejected with the same line."""
        _, host = outcome(UNWRAPPED, *pair)
        with guard_logs_off():
            kind, guarded = outcome(utils.setup_state_kv_args, *pair)
        if isinstance(host, Exception) and not _mapping_line(host):
            self.assertEqual(kind, "raised")
            self.assertEqual(str(guarded).splitlines()[0], str(host).splitlines()[0])
        if kind == "raised" and _mapping_line(guarded):
            self.assertTrue(_mapping_line(host))
