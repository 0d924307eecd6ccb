"""Runtime fixes are derived from what differs: per field, on the installed release, with
the callers and registrations the guard saw. Real-constructor pools (``build_pair``) and
SGLang's real ``setup_state_kv_args`` under the installed guard; assertions on fix data."""

from __future__ import annotations

import unittest
from pathlib import Path
from typing import Any

import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, checks_request_rows, guard_logs_off, outcome
from hypothesis import given
from sglang.test.ci.ci_register import register_cpu_ci
from test_parity_property import pairs

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.findings import Phase
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.flags import accepts, flag_for_field
from sglang_dsv4_guard.mori.snapshot import SendSnapshot
from sglang_dsv4_guard.state.pool_fixes import edits
from sglang_dsv4_guard.testing import PoolSpec, build_pair, check_transfer, new_kv_args, record

register_cpu_ci(est_time=50, suite="stage-a-test-cpu")


def _finding(err: Any, code: str) -> Any:
    assert isinstance(err, DSV4GuardError), f"expected DSV4GuardError, got {err!r}"
    return next(f for f in err.findings if f.code == code)


class TestOneFieldOneFix(GuardTestCase):
    """A DSV4G005 report where only one field differs names only that field."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)

    def fixes_for(self, target: PoolSpec, draft: PoolSpec) -> tuple[Fix, ...]:
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args, *build_pair(target, draft))
        return tuple(_finding(err, "DSV4G005").fixes)

    def test_page_size_only(self) -> None:
        """Only the page size differs: one no-flag fix for page_size, never --page-size."""
        fixes = self.fixes_for(PoolSpec(), PoolSpec(page_size=64))
        self.assertEqual({f.field for f in fixes}, {"page_size"})
        self.assertEqual([f.kind for f in fixes], [FixKind.NO_FLAG_FIX])
        self.assertFalse([e for f in fixes for e in f.edits if e.name == "--page-size"])

    def test_sliding_window_only(self) -> None:
        """Only the window differs: fixes for sliding_window, naming the model configs."""
        fixes = self.fixes_for(PoolSpec(), PoolSpec(sliding_window=64))
        self.assertEqual({f.field for f in fixes}, {"sliding_window"})
        self.assertTrue(all("sliding_window" in " ".join(f.inputs) for f in fixes))

    def test_request_rows_only(self) -> None:
        """0.5.23, only the request rows differ (a target of one server's D, 256, a draft
        ring of another's, 512): one code-path fix for the request rows, no flag edit, its
        inputs naming the draft-token count, encoder replay and the rounding."""
        pair = PoolSpec(request_capacity=131), PoolSpec(swa_req_ring_size=512)
        if not checks_request_rows():  # before 0.5.23 SGLang does not compare them
            with guard_logs_off():
                self.assertEqual(outcome(utils.setup_state_kv_args, *build_pair(*pair))[0], "ok")
            return
        fixes = self.fixes_for(*pair)
        self.assertEqual([(f.field, f.kind) for f in fixes], [("request rows", FixKind.CODE)])
        self.assertEqual([e for f in fixes for e in f.edits], [])
        inputs = " ".join(fixes[0].inputs)
        for word in ("draft-token count", "encoder replay", "RequestWindow",
                     "get_draft_swa_ring_size"):
            self.assertIn(word, inputs)


class TestRequestRowsSource(GuardTestCase):
    """0.5.23: the draft's request-rows from: line names the rounding to the SWA page."""

    def test_draft_source_names_the_rounding(self) -> None:
        """The draft's swa_req_ring_size source cites get_draft_swa_ring_size, the
        target's request_window.capacity source SGLang's RequestWindow rounding."""
        self.install_guard("on", load_entry_points=False)
        pair = build_pair(PoolSpec(request_capacity=131), PoolSpec(swa_req_ring_size=512))
        if not checks_request_rows():  # before 0.5.23 SGLang does not compare them
            with guard_logs_off():
                self.assertEqual(outcome(utils.setup_state_kv_args, *pair)[0], "ok")
            return
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args, *pair)
        finding = _finding(err, "DSV4G005")
        sources = {(o.role, o.name): o.source for o in finding.observations}
        self.assertIn("get_draft_swa_ring_size", sources[("draft pool", "swa_req_ring_size")])
        self.assertIn("RequestWindow", sources[("target pool", "request_window.capacity")])


class TestUnifiedFixes(GuardTestCase):
    """Unified mode: DSV4G002 says where the mode comes from; DSV4G003 one field each."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)

    def fixes_for(self, code: str, target: PoolSpec, draft: PoolSpec) -> tuple[Fix, ...]:
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args, *build_pair(target, draft))
        return tuple(_finding(err, code).fixes)

    def test_mode_differs(self) -> None:
        """DSV4G002: a code-path fix on _unified_kv naming the variable, no flag edit."""
        fixes = self.fixes_for("DSV4G002", PoolSpec(unified=True), PoolSpec())
        self.assertEqual([(f.kind, f.field) for f in fixes], [(FixKind.CODE, "_unified_kv")])
        self.assertIn("SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton", fixes[0].inputs)

    def test_each_ring_field_alone(self) -> None:
        """DSV4G003: window, ring size or pages differing alone gives that field only."""
        for ring, field in (((64, 130, 2), "window"), ((128, 131, 2), "ring size"),
                            ((128, 130, 3), "pages")):
            with self.subTest(field=field):
                fixes = self.fixes_for("DSV4G003", PoolSpec(unified=True),
                                       PoolSpec(unified=True, ring=ring))
                self.assertEqual({f.field for f in fixes}, {field})


class TestMoriFixes(GuardTestCase):
    """DSV4G006: edits per server from that server's TP layout (pd/attention_tp.py, the
    family's one home, as in check), the fix keeping its GPU count first."""

    def fixes(self, snap: SendSnapshot, place: str = "send") -> tuple[Fix, ...]:
        return tuple(check_transfer(snap, place=place).findings[0].fixes)

    def test_dp_attention_prefill_changes_dp_size(self) -> None:
        """Prefill --tp-size 8 --dp-size 8 --enable-dp-attention (attention TP 1), decode
        attention TP 4: the prefill's first fix gives it attention DP 2 (its 8 GPUs kept):
        --dp-size 2, or on a release with --attn-dp-size, --attn-dp-size 2 in place of the
        deprecated pair; --tp-size 32 comes after it, said to change its GPU count."""
        snap = SendSnapshot(state_type="swa", is_mla_backend=False, attn_tp_size=1,
                            decode_tp_size=4, tp_size=8, dp_size=8, enable_dp_attention=True)
        edited = [f for f in self.fixes(snap) if f.edits]
        self.assertEqual([sorted((e.server, e.name, str(e.value)) for e in f.edits)
                          for f in edited],
                         [sorted([("prefill", "--attn-dp-size", "2"),
                                  ("prefill", "--enable-dp-attention", "None"),
                                  ("prefill", "--dp-size", "None")])
                          if flag_for_field("attn_dp_size") else [("prefill", "--dp-size", "2")],
                          [("prefill", "--tp-size", "32")]])
        self.assertIn("(this changes its GPU count)", edited[1].text)
        self.assertNotIn("changes its GPU count", edited[0].text)

    def test_plain_prefill_changes_tp_size(self) -> None:
        """Prefill --tp-size 8 without DP attention, decode attention TP 4: attention DP 2
        (its 8 GPUs kept), or --tp-size 4 (said to change its GPU count), as check gives."""
        snap = SendSnapshot(state_type="swa", is_mla_backend=False, attn_tp_size=8,
                            decode_tp_size=4, tp_size=8, dp_size=1, enable_dp_attention=False)
        edits = [[(e.server, e.name, e.value) for e in f.edits] for f in self.fixes(snap)
                 if f.edits]
        dp = ([("prefill", "--attn-dp-size", "2")] if flag_for_field("attn_dp_size")
              else [("prefill", "--dp-size", "2"), ("prefill", "--enable-dp-attention", None)])
        self.assertEqual(edits, [dp, [("prefill", "--tp-size", "4")]])

    def test_attention_cp_counts(self) -> None:
        """Prefill --tp-size 8 with attention CP 2 (attention TP 4), decode attention TP 2:
        attention DP is --tp-size / (attention TP x attention CP) = 2, and --tp-size keeps
        the CP: 2 x 1 x 2 = 4 (the run-time copy once left attention CP out)."""
        snap = SendSnapshot(state_type="swa", is_mla_backend=False, attn_tp_size=4,
                            decode_tp_size=2, tp_size=8, dp_size=1, enable_dp_attention=False,
                            attn_cp_size=2)
        edits = [[(e.server, e.name, e.value) for e in f.edits] for f in self.fixes(snap)
                 if f.edits]
        dp = ([("prefill", "--attn-dp-size", "2")] if flag_for_field("attn_dp_size")
              else [("prefill", "--dp-size", "2"), ("prefill", "--enable-dp-attention", None)])
        self.assertEqual(edits, [dp, [("prefill", "--tp-size", "4")]])

    def test_decode_layout_unknown_no_decode_edit(self) -> None:
        """At run time the decode's DP layout is unknown: its fix names both forms (plain
        --tp-size, or the release's attention-DP flag) and carries no edit."""
        snap = SendSnapshot(state_type="swa", is_mla_backend=False, attn_tp_size=4,
                            decode_tp_size=2, tp_size=8, dp_size=2, enable_dp_attention=True)
        [decode] = [f for f in self.fixes(snap) if f.text.startswith("give the decode")]
        self.assertEqual((decode.kind, decode.field, decode.edits),
                         (FixKind.ADVICE, "attn_tp_size", ()))
        self.assertIn("--tp-size 4 (times its attention CP size) without DP attention", decode.text)
        self.assertIn("--attn-dp-size" if flag_for_field("attn_dp_size") else "--dp-size",
                      decode.text)

    def test_decode_layout_known_changes_dp_size(self) -> None:
        """Before launch the decode's layout is known: decode --tp-size 8 --dp-size 4
        --enable-dp-attention (attention TP 2) against the prefill's 4: decode attention DP 2
        (--dp-size 2, or --attn-dp-size 2 in place of the deprecated pair)."""
        snap = SendSnapshot(state_type="swa", is_mla_backend=False, attn_tp_size=4,
                            decode_tp_size=2, tp_size=4, dp_size=1, enable_dp_attention=False,
                            decode_tp=8, decode_dp_size=4, decode_enable_dp_attention=True)
        decode = self.fixes(snap, "check")[0]
        self.assertEqual(sorted((e.server, e.name, str(e.value)) for e in decode.edits),
                         sorted([("decode", "--attn-dp-size", "2"),
                                 ("decode", "--enable-dp-attention", "None"),
                                 ("decode", "--dp-size", "None")])
                         if flag_for_field("attn_dp_size") else [("decode", "--dp-size", "2")])

    def test_attn_dp_size_prefill_edits_attn_dp_size(self) -> None:
        """Prefill attention TP 4 on --tp-size 8 (attention DP 2) against decode attention
        TP 8: the prefill's fix removes its attention DP in the release's spelling
        (``--attn-dp-size`` where it has it, else ``--dp-size`` and
        ``--enable-dp-attention``), and no edit repeats its current --tp-size 8."""
        if flag_for_field("attn_dp_size"):
            snap = SendSnapshot(state_type="swa", is_mla_backend=False, attn_tp_size=4,
                                decode_tp_size=8, tp_size=8, dp_size=1,
                                enable_dp_attention=False)
            wanted = {("prefill", "--attn-dp-size", None, True)}
        else:
            snap = SendSnapshot(state_type="swa", is_mla_backend=False, attn_tp_size=4,
                                decode_tp_size=8, tp_size=8, dp_size=2,
                                enable_dp_attention=True)
            wanted = {("prefill", "--dp-size", None, True),
                      ("prefill", "--enable-dp-attention", None, True)}
        [prefill] = [f for f in self.fixes(snap) if f.field == "attn_tp_size" and f.edits
                     and all(e.server == "prefill" for e in f.edits)
                     and not any(e.name == "--tp-size" for e in f.edits)]
        self.assertEqual({(e.server, e.name, e.value, e.remove) for e in prefill.edits}, wanted)

    def test_attn_dp_size_release_names_it_as_source(self) -> None:
        """The attention TP's ``from:`` line names the release's own attention-DP flag:
        --attn-dp-size where the release has it (not "divided by --dp-size with
        --enable-dp-attention"), --dp-size with --enable-dp-attention before."""
        snap = SendSnapshot(state_type="swa", is_mla_backend=False, attn_tp_size=4,
                            decode_tp_size=8, tp_size=8, dp_size=1, enable_dp_attention=False)
        [obs] = [o for o in check_transfer(snap).findings[0].observations
                 if o.name == "attn_tp_size"]
        if flag_for_field("attn_dp_size"):
            self.assertIn("--attn-dp-size", obs.source)
            self.assertNotIn("divided by --dp-size with --enable-dp-attention", obs.source)
        else:
            self.assertIn("--dp-size", obs.source)
            self.assertNotIn("--attn-dp-size", obs.source)

    def test_check_place_wording(self) -> None:
        """Place "check": the details say the guard reports this when the decode peer
        registers and SGLang raises it per request (its ``when``), and name no peer."""
        snap = SendSnapshot(state_type="swa", is_mla_backend=False, attn_tp_size=4,
                            decode_tp_size=2, engine_key="planned decode server")
        found = check_transfer(snap, place="check").findings[0]
        details = found.details
        self.assertIs(found.when.phase, Phase.PER_REQUEST)
        self.assertIn("the guard reports it when the decode peer registers (at run time); "
                      "SGLang raises it on every request carrying 'swa' state", details)
        self.assertFalse([d for d in details if "registered:" in d or "engine=" in d], details)


def _published_server_args() -> None:
    """Publish SGLang's own resolved ServerArgs for a speculative DeepSeek-V4 launch, as a
    scheduler does (SGLang's parser, ``from_cli_args`` and its scheduler publish shim)."""
    import argparse

    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    data = Path(__file__).parent / "data" / "deepseek_v4"
    args = parser.parse_args(["--model-path", str(data), "--device", "cpu",
                              "--speculative-algorithm", "EAGLE", "--speculative-num-steps",
                              "2", "--speculative-num-draft-tokens", "3",
                              "--speculative-eagle-topk", "1"])
    set_global_server_args_for_scheduler(ServerArgs.from_cli_args(args))


def _as_decode(*args: Any) -> Any:
    """Call the installed setup_state_kv_args from a frame of SGLang's decode module (the
    bootstrap queue's module, whose role CALLERS gives), as its DecodePreallocQueue does."""
    namespace: dict[str, Any] = {"__name__": "sglang.srt.disaggregation.decode",
                                 "fn": utils.setup_state_kv_args}
    exec("def call(*args):\n    return fn(*args)\n", namespace)
    return namespace["call"](new_kv_args(), *args)


class TestServerArgsQuoted(GuardTestCase):
    """A fix whose input is a flag quotes this server's published value, by its role."""

    def setUp(self) -> None:
        super().setUp()
        from sglang.srt.runtime_context import reset_context

        self.addCleanup(reset_context)
        with guard_logs_off():
            _published_server_args()
        self.install_guard("on", load_entry_points=False)

    def errors(self, *pair: Any) -> DSV4GuardError:
        with guard_logs_off():
            try:
                _as_decode(*pair)
            except DSV4GuardError as exc:
                return exc
        raise AssertionError("SGLang accepted the pair")

    def test_speculative_algorithm_quoted(self) -> None:
        """DSV4G001's workaround says what this decode server runs."""
        err = self.errors(*build_pair(draft=PoolSpec(compression_ratios=(4,))))
        texts = [f.text for f in _finding(err, "DSV4G001").fixes if f.kind is FixKind.FLAGS]
        self.assertTrue(any("this decode server runs --speculative-algorithm EAGLE" in t
                            for t in texts), texts)

    def test_request_rows_for_the_running_algorithm(self) -> None:
        """0.5.23, EAGLE published, a target window left unrounded (131, as a plug-in's
        might be) against the draft ring of the same D (256): the request-rows fix carries
        no edit and names no speculative algorithm (encoder replay runs DSpark only)."""
        pair = build_pair(PoolSpec(request_capacity=256), PoolSpec(swa_req_ring_size=256))
        pair[0].request_window.capacity = 131  # not SGLang's rounding
        if not checks_request_rows():  # before 0.5.23 SGLang does not compare them
            with guard_logs_off():
                self.assertEqual(outcome(utils.setup_state_kv_args, *pair)[0], "ok")
            return
        fixes = [f for f in _finding(self.errors(*pair), "DSV4G005").fixes
                 if f.field == "request rows"]
        self.assertTrue(fixes)
        self.assertEqual([e for f in fixes for e in f.edits], [])
        self.assertFalse([f.text for f in fixes if "EAGLE" in f.text], fixes)


class TestCodePaths(GuardTestCase):
    """Code paths named: swapped pools with their caller; registrations observed."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)

    def test_swapped_pools_named_with_caller(self) -> None:
        """setup_state_kv_args(kv, draft, target): a 'pool order' fix quoting this line."""
        target, draft = build_pair(PoolSpec(compression_ratios=(4, 128, 0)), PoolSpec())
        with guard_logs_off():
            try:
                utils.setup_state_kv_args(new_kv_args(), draft, target)
            except DSV4GuardError as exc:
                err = exc
        fixes = _finding(err, "DSV4G001").fixes
        self.assertEqual(fixes[0].field, "pool order")
        self.assertEqual(fixes[0].kind, FixKind.CODE)
        self.assertIn("test_fixes_runtime.py:", fixes[0].text)

    def test_swapped_pools_get_only_the_swap(self) -> None:
        """Once the swap is named it is the fix: no other code-path fix (which would offer
        the swap again as an "or") and no serve-without-speculative workaround."""
        target, draft = build_pair(PoolSpec(compression_ratios=(4, 128, 0)), PoolSpec())
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args, draft, target)
        fixes = _finding(err, "DSV4G001").fixes
        self.assertEqual([f.field for f in fixes], ["pool order"])
        self.assertFalse([f for f in fixes if "swapped order" in f.text and
                          f.field != "pool order"])

    def test_unswapped_pools_get_no_order_fix(self) -> None:
        """A compressed draft with a compressed target is not called swapped."""
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args, *build_pair(
                PoolSpec(compression_ratios=(4, 128, 0)), PoolSpec(compression_ratios=(4,))))
        self.assertNotIn("pool order", [f.field for f in _finding(err, "DSV4G001").fixes])

    def test_registration_observed(self) -> None:
        """Pools built after install: each mapping's source is the registering line."""
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args, *build_pair(mapping="different"))
        sources = [o.source for o in _finding(err, "DSV4G004").observations]
        self.assertTrue(all(s.startswith("registered by ") and "samples.py:" in s
                            for s in sources), sources)

    def test_registration_not_seen(self) -> None:
        """Pools built before install: 'not seen registered', and what usually does."""
        sglang_dsv4_guard.uninstall()
        pair = build_pair(mapping="different")
        self.install_guard("on", load_entry_points=False)
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args, *pair)
        sources = [o.source for o in _finding(err, "DSV4G004").observations]
        self.assertTrue(all(s.startswith("not seen registered") and "usually" in s
                            for s in sources), sources)

    def test_no_autoshare_without_a_tensor(self) -> None:
        """Neither pool has a mapping: the warning offers no auto-share variable."""
        recorder = record()
        with guard_logs_off():
            utils.setup_state_kv_args(new_kv_args(), *build_pair(mapping="none",
                                                                 target_mapping="none"))
        found = [f for r in recorder.reports for f in r.findings if f.code == "DSV4G004"]
        self.assertTrue(found)
        self.assertFalse([e for f in found for fix in f.fixes for e in fix.edits if e.env])
        self.assertFalse([fix for f in found for fix in f.fixes if "AUTOSHARE" in fix.text])


class TestEditFilter(GuardTestCase):
    """An edit naming a flag the release's parser lacks is dropped, with a debug line."""

    def test_unknown_flag_dropped(self) -> None:
        """--no-such-flag is dropped, --tp-size and a variable are kept."""
        keep = (Edit("decode", "--tp-size", "4"), Edit("decode", "SOME_VAR", "1", env=True))
        with self.assertLogs("sglang_dsv4_guard", "DEBUG") as logs:
            kept = edits(Edit("decode", "--no-such-flag", "1"), *keep)
        self.assertEqual(kept, keep)
        self.assertTrue(any("--no-such-flag" in line for line in logs.output))


class TestFlagsAccepted(GuardTestCase):
    """Every flag any runtime fix names is one the release's parser accepts; no NEXTN."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)
        self.recorder = record()

    @given(pair=pairs())
    def test_every_flag_accepted(self, pair: tuple[Any, Any]) -> None:
        """On every drawn pair, each edit's flag is accepted and no fix mentions NEXTN."""
        self.recorder.reports.clear()
        with guard_logs_off():
            outcome(utils.setup_state_kv_args, *pair)
        for report in self.recorder.reports:
            for finding in report.findings:
                for fix in finding.fixes:
                    self.assertNotIn("NEXTN", fix.text.replace("COMPRESS_RATIO_NEXTN", ""))
                    for edit in fix.edits:
                        self.assertTrue(edit.env or accepts(edit.name), edit)


if __name__ == "__main__":
    unittest.main()
