"""``check`` predicts Mooncake's and NIXL's per-request state transfer refusing a different
attention TP (DSV4G040), exactly as narrow as each release's ``maybe_send_extra``."""

from __future__ import annotations

import itertools
import tempfile
import unittest
from pathlib import Path
from typing import Any

from check_helpers import DSV3, GPT_OSS, check_json, codes, server
from helpers import GuardTestCase, sglang_release
from host_trees import disguised_tree, real_package
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version
from pd_real import send_extra_refusal
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.offline.parse import parse_launch
from sglang_dsv4_guard.check.server.derive import derive_server
from sglang_dsv4_guard.check.server.endpoint_values import endpoint_of
from sglang_dsv4_guard.findings import Report
from sglang_dsv4_guard.host.judgement import imported_package_dir
from sglang_dsv4_guard.pd.endpoint import Endpoint, Value
from sglang_dsv4_guard.pd.send_extra import send_extra_findings, send_extra_refusals

register_cpu_ci(est_time=37, suite="stage-a-test-cpu")

SLICES_SWA = sglang_release() >= Version("0.5.22")  # head-sliced SWA, PP 1 only
PLAIN = ("PD Disaggregation does NOT support PD different TP sizes for non-MLA SWA hybrid "
         "models yet.")
WITH_PP = ("PD Disaggregation does NOT support PD different TP sizes for non-MLA SWA hybrid "
           "models with pipeline parallelism yet.")


def g040(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == "DSV4G040"]


class TestSendExtraHeterogeneousTP(GuardTestCase):
    """gpt-oss (hybrid SWA, MHA) across attention TP sizes on Mooncake and NIXL."""

    def _pair(self, backend: str, prefill: str, decode: str) -> dict[str, Any]:
        _, doc = check_json(server("prefill", GPT_OSS, prefill, backend=backend),
                            server("decode", GPT_OSS, decode, backend=backend))
        return doc

    def test_mooncake_tp1_tp4_by_release(self) -> None:
        """The SGLang PD guide's P TP1 / D TP4 on gpt-oss over Mooncake: an error naming the
        dead transfer worker before 0.5.22, accepted (head-sliced) from 0.5.22."""
        found = g040(self._pair("mooncake", "--tp-size 1", "--tp-size 4"))
        if SLICES_SWA:
            self.assertEqual(found, [])
            return
        self.assertEqual([(f["severity"], f["host_message"]) for f in found],
                         [("error", PLAIN)])
        self.assertIn("Transfer thread failed", found[0]["when"])
        values = {(o["role"], o["name"]): o["value"] for o in found[0]["observations"]}
        self.assertEqual((values[("prefill", "attn_tp_size")],
                          values[("decode", "attn_tp_size")],
                          values[("prefill", "state_types")]), (1, 4, ["swa"]))

    def test_mooncake_pipeline_parallel_prefill_is_refused_on_every_release(self) -> None:
        """The same pair with --pp-size 2 on the prefill: refused on every release, from
        0.5.22 by the head-slice path's own pipeline-parallelism message."""
        found = g040(self._pair("mooncake", "--tp-size 1 --pp-size 2", "--tp-size 4"))
        self.assertEqual([f["host_message"] for f in found], [WITH_PP if SLICES_SWA else PLAIN])

    def test_nixl_tp1_tp4_by_release(self) -> None:
        """NIXL: the same verdicts, with a per-request failure (not a dead worker)."""
        found = g040(self._pair("nixl", "--tp-size 1", "--tp-size 4"))
        self.assertEqual([f["host_message"] for f in found], [] if SLICES_SWA else [PLAIN])
        for f in found:
            self.assertIn("each request fails", f["when"])

    def test_equal_attention_tp_is_accepted(self) -> None:
        """Near miss: TP 4 on both servers (and PP 2 on the prefill) is no DSV4G040, and
        the row says nothing unknown."""
        doc = self._pair("mooncake", "--tp-size 4 --pp-size 2", "--tp-size 4")
        self.assertEqual(g040(doc), [])
        self.assertFalse([u for u in doc["unknowns"] if u.startswith("DSV4G040")])

    def test_mla_model_heterogeneous_tp_is_accepted(self) -> None:
        """Heterogeneous TP is a supported feature for MLA models: DeepSeek-V3 P TP1 /
        D TP4 over Mooncake is never DSV4G040."""
        _, doc = check_json(server("prefill", DSV3, "--tp-size 1", backend="mooncake"),
                            server("decode", DSV3, "--tp-size 4", backend="mooncake"))
        self.assertNotIn("DSV4G040", codes(doc))

    def test_the_fixed_lines_pass_check(self) -> None:
        """``check --fix`` on the refused pair gives lines that ``check`` accepts."""
        prefill = server("prefill", GPT_OSS, "--tp-size 1 --pp-size 2", backend="mooncake")
        _, doc = check_json(prefill, server("decode", GPT_OSS, "--tp-size 4",
                                            backend="mooncake"), "--fix")
        self.assertIn("DSV4G040", codes(doc))
        self.assertTrue(all(f["proven"] for x in g040(doc) for f in x["fixes"]))
        status, again = check_json(doc["fixed"]["prefill"], doc["fixed"]["decode"])
        self.assertEqual((status, g040(again)), (0, []))

    def test_pipeline_parallel_fix_holds_for_both_servers(self) -> None:
        """P TP1 PP2 / D TP2 PP2 on Mooncake: every pipeline-parallelism fix check offers
        is proven (the decode's PP must equal the prefill's or be 1, so PP 1 goes on both
        servers), and check --fix's corrected pair passes check."""
        prefill = server("prefill", GPT_OSS, "--tp-size 1 --pp-size 2", backend="mooncake")
        decode = server("decode", GPT_OSS, "--tp-size 2 --pp-size 2", backend="mooncake")
        _, doc = check_json(prefill, decode, "--fix")
        found = g040(doc)
        self.assertEqual(len(found), 1)
        self.assertTrue(found[0]["fixes"])
        self.assertEqual([f for f in found[0]["fixes"] if not f["proven"]], [])
        pp = [f for f in found[0]["fixes"] if f.get("field") == "pp_size"]
        if SLICES_SWA:  # the head-slice path's PP refusal: PP 1 on both servers
            self.assertEqual(len(pp), 1)
            self.assertEqual(sorted(e["server"] for e in pp[0]["edits"]), ["decode", "prefill"])
        status, again = check_json(doc["fixed"]["prefill"], doc["fixed"]["decode"])
        self.assertEqual((status, g040(again)), (0, []))


def _ours(prefill_tp: int, decode_tp: int, pp: int, mla: bool, state: str,
          layout: str = "nhd", state_tp: int | None = None) -> str | None:
    def ep(role: str, tp: int, pp_size: int) -> Endpoint:
        return Endpoint(role, {"attn_tp_size": Value(tp, "drawn"), "pp_size": Value(pp_size, "drawn"),
                               "is_mla_backend": Value(mla, "drawn"),
                               "swa_kv_cache_layout": Value(layout, "drawn")})

    package = imported_package_dir()
    assert package is not None
    prefill = ep("prefill", prefill_tp, pp)
    if state_tp is not None:  # the live manager's, as the registration snapshot reads it
        prefill = prefill.with_values(state_tp_size=Value(state_tp, "drawn"))
    verdicts, unknowns = send_extra_refusals(prefill, ep("decode", decode_tp, 1), "nixl",
                                             package, [state])
    if unknowns:  # SGLang refuses the state first for a reason of its own: that message
        assert "refuses this state before comparing TP sizes" in unknowns[0], unknowns
        return unknowns[0].split(": ", 3)[-1].split("'")[1]
    return verdicts[0].message if verdicts else None


class TestMiniMaxRow(GuardTestCase):
    """DSV4G041: the row's finding for a prefill whose pool registers MiniMax state."""

    def test_minimax_state_with_heterogeneous_tp(self) -> None:
        """A prefill sending MiniMax sparse index state to a decode with another attention
        TP over Mooncake: DSV4G041 with SGLang's message and a dead-worker ``when`` before
        0.5.23; from 0.5.23 decode's first contact refuses it first, so this row is silent
        (the first-contact row reports it). The state type is given to the endpoint as
        SGLang's MiniMax pool registers it (that pool is not built by check)."""
        sides = [derive_server(parse_launch(role, server(role, GPT_OSS, f"--tp-size {tp}",
                                                       backend="mooncake"), {}))
                 for role, tp in (("prefill", 1), ("decode", 2))]
        prefill = endpoint_of(sides[0]).with_values(
            state_types=Value(("minimax_index_k",), "SGLang's MiniMaxSparseKVPool"))
        findings, unknowns = send_extra_findings(prefill, endpoint_of(sides[1]),
                                                 imported_package_dir())
        report = Report.of(findings, {"function": "test"})
        self.assertEqual(unknowns, [])
        if sglang_release() >= Version("0.5.23"):
            self.assertEqual(report.codes, ())
            return
        self.assertEqual(report.codes, ("DSV4G041",))
        message = findings[0].host_message or ""
        self.assertTrue(message.startswith("PD disagg: heterogeneous TP not supported for "
                                           "MiniMax"), message)
        self.assertIn("Transfer thread failed", findings[0].to_dict()["when"])
        self.assertTrue(findings[0].fixes)


class TestSendExtraParity(GuardTestCase):
    """The row's verdict equals SGLang's real NIXL ``maybe_send_extra`` on the same values."""

    def test_tp1_tp4_agrees_with_the_real_function(self) -> None:
        """P TP1 / D TP4, SWA state, PP 1 and 2: the same message (or none) as SGLang's."""
        for pp in (1, 2):
            self.assertEqual(_ours(1, 4, pp, False, "swa"),
                             send_extra_refusal("nixl", 1, 4, pp, False, ("swa",)))
        self.assertEqual(send_extra_refusal("nixl", 1, 4, 2, False, ("swa",)),
                         WITH_PP if SLICES_SWA else PLAIN)

    def test_state_tp_where_the_prefill_has_one(self) -> None:
        """A prefill whose state TP differs from its attention TP (a live manager's, as the
        registration reads it): the verdict is SGLang's for every TP triple, QSA state
        (paired by the state TP on 0.5.23) and SWA alike (outside review, finding 2)."""
        from sglang.srt.disaggregation.base.conn import StateType

        states = [s for s in ("qsa_pending", "swa") if s in {t.value for t in StateType}]
        for state in states:
            for prefill_tp, state_tp, decode_tp in itertools.product((1, 2, 4), repeat=3):
                with self.subTest(state=state, tp=(prefill_tp, state_tp, decode_tp)):
                    self.assertEqual(
                        _ours(prefill_tp, decode_tp, 1, False, state, state_tp=state_tp),
                        send_extra_refusal("nixl", prefill_tp, decode_tp, 1, False, (state,),
                                           state_tp=state_tp))

    @settings(deadline=None)
    @given(prefill_tp=st.sampled_from([1, 2, 4, 8]), decode_tp=st.sampled_from([1, 2, 4, 8]),
           pp=st.sampled_from([1, 2]), mla=st.booleans(),
           state=st.sampled_from(["swa", "swa_ring", "minimax_index_k", "mamba"]),
           layout=st.sampled_from(["nhd", "page_major", "hnd"]))
    def test_parity(self, prefill_tp: int, decode_tp: int, pp: int, mla: bool,
                    state: str, layout: str) -> None:
        """Drawn TP sizes, PP, MLA or not, state type and the prefill's SWA KV cache
        layout: check's verdict is SGLang's."""
        try:
            from sglang.srt.disaggregation.base.conn import StateType
            StateType(state)
        except ValueError:
            state = "swa"  # a state type this release does not have
        self.assertEqual(_ours(prefill_tp, decode_tp, pp, mla, state, layout),
                         send_extra_refusal("nixl", prefill_tp, decode_tp, pp, mla, (state,),
                                            layout))


class TestSendExtraDigest(GuardTestCase):
    """A release whose ``maybe_send_extra`` condition differs is not judged."""

    def test_an_edited_condition_is_not_judged(self) -> None:
        """Mooncake's heterogeneous-TP test edited in a disguised copy of the imported
        package: the row says it is not judged, and gives no verdict."""
        text = (real_package() / "srt/disaggregation/mooncake/conn.py").read_text()
        old = "!= target_rank_registration_info.dst_attn_tp_size"
        self.assertIn(old, text)
        with tempfile.TemporaryDirectory() as tmp:
            root = disguised_tree(Path(tmp), edits={
                "srt/disaggregation/mooncake/conn.py": (old, "> target_rank_registration_info"
                                                             ".dst_attn_tp_size")})
            p = Endpoint("prefill", {"attn_tp_size": Value(1, "t"), "pp_size": Value(2, "t"),
                                     "is_mla_backend": Value(False, "t")})
            d = Endpoint("decode", {"attn_tp_size": Value(4, "t")})
            verdicts, unknowns = send_extra_refusals(p, d, "mooncake", root / "sglang", ["swa"])
        self.assertEqual(verdicts, [])
        self.assertEqual(len(unknowns), 1)
        self.assertIn("differs from every release this guard knows", unknowns[0])
        self.assertIn("MooncakeKVManager.maybe_send_extra", unknowns[0])


if __name__ == "__main__":
    unittest.main()
