"""SGLang integration: the guard around the real ``setup_state_kv_args``, on CPU."""

from __future__ import annotations

import json
import logging
import unittest

import sglang.srt.disaggregation.decode as decode
import sglang.srt.disaggregation.prefill as prefill
import sglang.srt.disaggregation.utils as utils
from helpers import (
    UNWRAPPED,
    GuardTestCase,
    geometry_prefix,
    mapping_set_in_init,
    outcome,
    raw_setup_state_kv_args,
    sglang_release,
)
from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError, Severity
from sglang_dsv4_guard.testing import PoolSpec, build_pair, new_kv_args, record, three_mismatch_pair

register_cpu_ci(est_time=35, suite="stage-a-test-cpu")

class TestEveryCode(GuardTestCase):
    """Each code, produced from real pool objects through the real SGLang function."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on")
        self.recorder = record()

    def assert_guarded(self, *pair: object, code: str) -> DSV4GuardError:
        kind, host = outcome(UNWRAPPED, *pair)
        self.assertEqual(kind, "raised")
        with self.assertRaises(DSV4GuardError) as caught:
            utils.setup_state_kv_args(new_kv_args(), *pair)
        err = caught.exception
        self.assertEqual(str(err).splitlines()[0], str(host))
        self.assertIs(type(err.host_error), type(host))
        self.assertIn(code, [f.code for f in err.findings])
        self.assertNotIn("DSV4G099", [f.code for f in err.findings])
        return err

    def test_g001_names_offending_draft_layers(self) -> None:
        """DSV4G001 lists each draft layer whose compression ratio is not 0."""
        err = self.assert_guarded(*build_pair(draft=PoolSpec(compression_ratios=(0, 4, 0, 128))),
                                  code="DSV4G001")
        finding = err.findings[0]
        self.assertEqual(finding.value("draft pool", "compression_ratios"), (0, 4, 0, 128))
        self.assertIn("layer 1: ratio 4, layer 3: ratio 128", finding.details[0])

    def test_g001_empty_draft(self) -> None:
        """An empty draft ratio list is DSV4G001 too, and says the draft has no layers."""
        err = self.assert_guarded(*build_pair(draft=PoolSpec(compression_ratios=())),
                                  code="DSV4G001")
        self.assertIn("no layers", err.findings[0].details[0])

    def test_g002_names_the_unified_side(self) -> None:
        """DSV4G002 says which pool is unified and names the environment variable."""
        err = self.assert_guarded(*build_pair(target=PoolSpec(unified=True)), code="DSV4G002")
        finding = err.findings[0]
        self.assertIs(finding.value("target pool", "_unified_kv"), True)
        self.assertIs(finding.value("draft pool", "_unified_kv"), False)
        self.assertIn("SGLANG_HACK_FLASHMLA_BACKEND", finding.observations[0].source)

    def test_g003_field_by_field(self) -> None:
        """DSV4G003 compares window, ring size and pages one by one."""
        pair = build_pair(PoolSpec(unified=True), PoolSpec(unified=True, ring=(128, 131, 3)),
                          target_mapping="none", mapping="none")
        err = self.assert_guarded(*pair, code="DSV4G003")
        finding = err.findings[0]
        self.assertEqual(finding.value("draft pool", "unified_swa_ring_size"), 131)
        self.assertIn("ring size: target unified_swa_ring_size=130, draft unified_swa_ring_size"
                      "=131 (differs)", finding.details)

    def test_g004_describes_both_tensors(self) -> None:
        """DSV4G004 gives both mappings' layout, storage sharing and the first difference."""
        err = self.assert_guarded(*build_pair(mapping="different"), code="DSV4G004")
        finding = err.findings[0]
        self.assertIn("shape=(16,)", str(finding.value("draft pool")))
        self.assertIn("same storage: no", " ".join(finding.details))
        self.assertIn("first at index 3 (target=3, draft=-7)", " ".join(finding.details))

    def test_g004_none_side(self) -> None:
        """A draft with no mapping registered is DSV4G004 and says None."""
        err = self.assert_guarded(*build_pair(mapping="none"), code="DSV4G004")
        self.assertIn("None", str(err.findings[0].value("draft pool")))

    def test_g005_page_size_and_window(self) -> None:
        """DSV4G005 shows the installed release's geometry tuple and its exact first line."""
        err = self.assert_guarded(*build_pair(draft=PoolSpec(page_size=64, sliding_window=64)),
                                  code="DSV4G005")
        self.assertTrue(str(err).startswith(geometry_prefix()), str(err))
        finding = err.findings[0]
        self.assertEqual(finding.value("draft pool", "page_size"), 64)
        self.assertEqual(finding.value("target pool", "sliding_window"), 128)
        # DeepSeek-V4's page size is resolved by SGLang, never the operator's --page-size
        self.assertIn("resolves for DeepSeek-V4", finding.observations[0].source)
        self.assertNotIn("--page-size", finding.observations[0].source)

    def test_all_problems_at_once(self) -> None:
        """Three independent problems are all reported, in SGLang's order, in one error."""
        err = self.assert_guarded(*three_mismatch_pair(), code="DSV4G001")
        self.assertEqual([f.code for f in err.findings], ["DSV4G001", "DSV4G004", "DSV4G005"])
        self.assertTrue(all(f.fixes for f in err.findings))
        self.assertEqual(json.loads(err.report.to_json())["findings"][2]["code"], "DSV4G005")
        self.assertEqual(self.recorder.codes, ["DSV4G001", "DSV4G004", "DSV4G005"])

    def test_g010_half_built_pool_names_the_attribute(self) -> None:
        """A draft pool without ``page_size``: SGLang's AttributeError rises unchanged, and
        the notes name the pool and the attribute (DSV4G010)."""
        target, draft = build_pair()
        del draft.page_size
        _, host = outcome(UNWRAPPED, target, draft)
        self.assertIsInstance(host, AttributeError)
        _, guarded = outcome(utils.setup_state_kv_args, target, draft)
        self.assertIs(type(guarded), AttributeError)
        self.assertEqual(str(guarded), str(host))
        [finding] = guarded.dsv4_guard_report.findings
        self.assertEqual(finding.code, "DSV4G010")
        self.assertTrue(finding.subject.startswith("draft pool ("), finding.subject)
        self.assertIn("the draft pool has no readable attribute 'page_size'",
                      "\n".join(guarded.__notes__))

    def test_g004_never_registered_mapping_keeps_attribute_error(self) -> None:
        """No mapping attribute: SGLang's AttributeError rises unchanged, with notes that say
        what a missing attribute means on this release."""
        pair = build_pair(mapping="missing")
        _, host = outcome(UNWRAPPED, *pair)
        self.assertIsInstance(host, AttributeError)
        _, guarded = outcome(utils.setup_state_kv_args, *pair)
        self.assertIs(type(guarded), AttributeError)
        self.assertEqual(str(guarded), str(host))
        notes = "\n".join(guarded.__notes__)
        if mapping_set_in_init():
            self.assertIn("sets it to None in __init__, so this pool was not built", notes)
        else:
            self.assertIn("never registered on: draft pool", notes)
            self.assertIn("only in register_mapping()", notes)
        self.assertIn(f"SGLang {sglang_release()}", notes)
        self.assertIn("DSV4G004", guarded.dsv4_guard_report.codes)


class TestVerdictAndModes(GuardTestCase):
    """The guard never changes SGLang's verdict in mode on; strict adds failures."""

    def test_passing_pair_identical_kv_args(self) -> None:
        """A healthy pair passes guarded, with kv_args identical to SGLang's own result."""
        pair = build_pair()
        expected = outcome(UNWRAPPED, *pair)
        self.install_guard("on")
        self.assertEqual(outcome(utils.setup_state_kv_args, *pair), expected)
        self.assertEqual(expected[0], "ok")

    def test_both_none_warns_but_passes_in_on(self) -> None:
        """Neither pool has a mapping: SGLang accepts, the guard warns (DSV4G004 warning)."""
        pair = build_pair(target_mapping="none", mapping="shared")
        self.install_guard("on")
        recorder = record()
        self.assertEqual(outcome(utils.setup_state_kv_args, *pair)[0], "ok")
        [finding] = recorder.reports[0].findings
        self.assertEqual((finding.code, finding.severity), ("DSV4G004", Severity.WARNING))

    def test_strict_turns_warnings_into_errors(self) -> None:
        """In strict mode the same warning fails the call."""
        pair = build_pair(target_mapping="none", mapping="shared")
        self.install_guard("strict")
        with self.assertRaises(DSV4GuardError) as caught:
            utils.setup_state_kv_args(new_kv_args(), *pair)
        self.assertIn("[DSV4G004]", str(caught.exception).splitlines()[0])

    def test_strict_keeps_sglang_first_line(self) -> None:
        """In strict mode an SGLang failure still leads with SGLang's message."""
        pair = three_mismatch_pair()
        _, host = outcome(UNWRAPPED, *pair)
        self.install_guard("strict")
        _, guarded = outcome(utils.setup_state_kv_args, *pair)
        self.assertIsInstance(guarded, DSV4GuardError)
        self.assertEqual(str(guarded).splitlines()[0], str(host))

    def test_json_log_format(self) -> None:
        """SGLANG_DSV4_GUARD_LOG_FORMAT=json puts the report on the record as data (a
        JSON-ready dict under ``sglang_dsv4_guard``); the message stays readable text."""
        self.install_guard("on", log_format="json")
        with self.assertLogs("sglang_dsv4_guard", level=logging.ERROR) as logs:
            outcome(utils.setup_state_kv_args, *three_mismatch_pair())
        record = logs.records[-1]
        payload = json.loads(json.dumps(record.sglang_dsv4_guard["report"]))
        self.assertEqual([f["code"] for f in payload["findings"]],
                         ["DSV4G001", "DSV4G004", "DSV4G005"])
        self.assertTrue(record.getMessage().startswith("sglang-dsv4-guard: 3 errors"))

    def test_no_draft_is_untouched(self) -> None:
        """Without a draft pool the guard does nothing and SGLang's result is unchanged."""
        target, _ = build_pair()
        expected = outcome(UNWRAPPED, target)
        self.install_guard("on")
        recorder = record()
        self.assertEqual(outcome(utils.setup_state_kv_args, target), expected)
        self.assertEqual(recorder.reports, [])

    def test_g099_pool_changed_under_the_guard(self) -> None:
        """A pool whose ratios change after the guard read them: SGLang raises on what it
        reads, the guard says it predicted otherwise (DSV4G099) and SGLang's line leads."""
        target, draft = build_pair()
        draft.__class__ = _Drifting
        self.install_guard("on")
        _, guarded = outcome(utils.setup_state_kv_args, target, draft)
        self.assertIsInstance(guarded, DSV4GuardError)
        self.assertEqual(str(guarded).splitlines()[0],
                         "DSV4 draft state transfer expects SWA-only NextN layers")
        [finding] = guarded.findings
        self.assertEqual((finding.code, finding.severity), ("DSV4G099", Severity.WARNING))
        self.assertEqual(finding.details[1], "guard predicted: acceptance")
        self.assertEqual([(e.name, e.value) for f in finding.fixes for e in f.edits],
                         [("SGLANG_DSV4_GUARD_LOG_FORMAT", "json"), ("SGLANG_DSV4_GUARD", "0")])


class _Drifting(DeepSeekV4TokenToKVPool):  # type: ignore[misc]
    """A draft pool whose compression ratios change after the first read (a racing pool)."""

    @property
    def compression_ratios(self) -> list[int]:
        self.reads = getattr(self, "reads", 0) + 1
        return [0] if self.reads == 1 else [0, 4]


class TestInstallUninstall(GuardTestCase):
    """install/uninstall are idempotent and restore the very original objects."""

    def test_rebinds_prefill_and_decode(self) -> None:
        """Install rebinds utils, prefill and decode to one wrapper. After the undo (whose
        restoring the originals GuardTestCase checks), a wrapper somebody still holds
        passes straight through: SGLang's bare RuntimeError, no report."""
        undo = self.install_guard("on")
        wrapper = utils.setup_state_kv_args
        self.assertIsNot(wrapper, raw_setup_state_kv_args())
        self.assertIs(prefill.setup_state_kv_args, wrapper)
        self.assertIs(decode.setup_state_kv_args, wrapper)
        recorder = record()
        self.assertTrue(undo())
        kind, err = outcome(wrapper, *three_mismatch_pair())
        self.assertEqual(kind, "raised")
        self.assertIs(type(err), RuntimeError)
        self.assertEqual(str(err), "DSV4 draft state transfer expects SWA-only NextN layers")
        self.assertEqual(recorder.reports, [])

    def test_idempotent_both_ways(self) -> None:
        """A second install and a second uninstall are harmless and say so."""
        self.install_guard("on")
        wrapper = utils.setup_state_kv_args
        self.install_guard("on")
        self.assertIs(utils.setup_state_kv_args, wrapper)
        self.assertTrue(sglang_dsv4_guard.uninstall())
        self.assertFalse(sglang_dsv4_guard.uninstall())
        self.assertFalse(sglang_dsv4_guard.is_installed())

    def test_leaves_a_later_patch_alone(self) -> None:
        """If someone patched over us, uninstall keeps theirs and warns."""
        self.install_guard("on")

        def theirs(*args: object, **kwargs: object) -> None:
            return None

        utils.setup_state_kv_args = theirs
        try:
            with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
                sglang_dsv4_guard.uninstall()
            self.assertIs(utils.setup_state_kv_args, theirs)
            self.assertIn("left in place", logs.output[0])
        finally:
            utils.setup_state_kv_args = raw_setup_state_kv_args()
        self.assertIs(prefill.setup_state_kv_args, raw_setup_state_kv_args())

    def test_bad_install_argument(self) -> None:
        """A bad mode names the keyword, the value and the accepted values."""
        with self.assertRaises(sglang_dsv4_guard.SettingError) as caught:
            sglang_dsv4_guard.install("loud")
        self.assertEqual(caught.exception.variable, "install(mode=...)")
        self.assertIn("strict", str(caught.exception))
        self.assertFalse(sglang_dsv4_guard.is_installed())


if __name__ == "__main__":
    unittest.main()
