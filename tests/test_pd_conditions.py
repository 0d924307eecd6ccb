"""The first-contact runner (``pd.first_contact``) on endpoints built directly: the
conditions whose values launch lines cannot give on this CPU (MXFP8 and MiniMax state
types, the DeepSeek-V4 KV layout, DSpark layouts, KV cache sharding) run through the
installed release's own ``try_ensure_parallel_info``; every raise is found, a release
without a condition accepts, and the runner agrees with one real call of SGLang's
function on the same values (property)."""

from __future__ import annotations

import importlib
import unittest
from typing import Any

from helpers import GuardTestCase, sglang_release
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version
from pd_real import first_contact_raise
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.findings import Report
from sglang_dsv4_guard.host import targets
from sglang_dsv4_guard.pd import first_contact as fc
from sglang_dsv4_guard.pd.endpoint import Endpoint, Value

register_cpu_ci(est_time=39, suite="stage-a-test-cpu")

BASE = {"attn_tp_size": 1, "attn_cp_size": 1, "attn_dp_size": 1, "pp_size": 1,
        "page_size": 64, "kv_cache_dtype_str": "auto", "dcp_size": 1,
        "is_mla_backend": False, "is_hybrid_mla_backend": False, "kv_layout": None,
        "dsv41_spec_layout": None, "enable_kv_cache_sharding": False,
        "enable_dsa_cache_layer_split": False, "state_types": (),
        "transfer_backend": "mooncake"}
RELEASE = sglang_release()


def endpoint(role: str, **values: Any) -> Endpoint:
    return Endpoint(role, {k: Value(v, "test") for k, v in {**BASE, **values}.items()})


def messages(prefill: dict[str, Any], decode: dict[str, Any]) -> list[str]:
    contact = fc.first_contact(endpoint("prefill", **prefill), endpoint("decode", **decode),
                               str(RELEASE))
    return [r.message for r in contact.raised]


def report_codes(prefill: dict[str, Any], decode: dict[str, Any]) -> list[str]:
    """The codes of the report the first contact's findings make (as ``check`` builds it)."""
    findings, _ = fc.contact_findings(endpoint("prefill", **prefill),
                                      endpoint("decode", **decode), str(RELEASE))
    return list(Report.of(findings, {"function": "test"}).codes)


class TestConditionFindings(GuardTestCase):
    """Each condition launch lines cannot reach on this CPU, as the finding ``check``
    reports when the endpoint holds the value: its own code, on the releases with it."""

    def test_mxfp8_is_dsv4g033(self) -> None:
        """Block scales with different attention TP: DSV4G033 from 0.5.22, none before."""
        got = report_codes({"attn_tp_size": 2},
                           {"attn_tp_size": 4, "state_types": ("block_scale",)})
        self.assertEqual(got, ["DSV4G033"] if Version("0.5.22") <= RELEASE else [])

    def test_minimax_is_dsv4g041(self) -> None:
        """MiniMax index state with different attention TP at first contact: DSV4G041 in
        0.5.23, none before (earlier releases find it per request)."""
        got = report_codes({"attn_tp_size": 2},
                           {"attn_tp_size": 4, "state_types": ("minimax_index_k",)})
        self.assertEqual(got, ["DSV4G041"] if Version("0.5.23") <= RELEASE else [])

    def test_kv_layout_is_dsv4g031(self) -> None:
        """Different DeepSeek-V4 KV layouts: DSV4G031 in 0.5.23, none before."""
        got = report_codes({"kv_layout": "v4,c4:v4"}, {"kv_layout": "v41,c4:v41"})
        self.assertEqual(got, ["DSV4G031"] if Version("0.5.23") <= RELEASE else [])

    def test_dspark_is_dsv4g032(self) -> None:
        """Different DSpark layouts and TP: two DSV4G032 from 0.5.21, none before."""
        got = report_codes(
            {"dsv41_spec_layout": {"num_draft_tokens": 4}, "attn_tp_size": 2},
            {"dsv41_spec_layout": {"num_draft_tokens": 8}, "attn_tp_size": 4})
        self.assertEqual(got, ["DSV4G032"] * 2 if Version("0.5.21") <= RELEASE else [])


class TestConditionsByRelease(GuardTestCase):
    def test_mxfp8_block_scales_need_equal_attention_tp(self) -> None:
        """A non-MLA decode whose state types hold block scales, with another attention
        TP than the prefill: refused from 0.5.22, accepted before."""
        got = messages({"attn_tp_size": 2},
                       {"attn_tp_size": 4, "state_types": ("block_scale",)})
        if Version("0.5.22") > RELEASE:
            self.assertEqual(got, [])
        else:
            self.assertEqual(len(got), 1)
            self.assertIn("different attention TP sizes with MXFP8 KV cache", got[0])

    def test_minimax_needs_equal_attention_tp(self) -> None:
        """A MiniMax sparse index state with another attention TP: refused at first
        contact in 0.5.23 only (earlier releases find it per request)."""
        got = messages({"attn_tp_size": 2},
                       {"attn_tp_size": 4, "state_types": ("minimax_index_k",)})
        if Version("0.5.23") > RELEASE:
            self.assertEqual(got, [])
        else:
            self.assertEqual(got, ["MiniMax sparse PD requires matching attention TP "
                                   "sizes: prefill=2, decode=4."])

    def test_dsv4_kv_layouts_compared(self) -> None:
        """Different DeepSeek-V4 KV layouts: refused in 0.5.23, not compared before."""
        got = messages({"kv_layout": "v4,c4:v4"}, {"kv_layout": "v41,c4:v41"})
        if Version("0.5.23") > RELEASE:
            self.assertEqual(got, [])
        else:
            self.assertEqual(len(got), 1)
            self.assertTrue(got[0].startswith("KV layout mismatch: prefill server has "
                                              "kv_layout=v4,c4:v4"), got)

    def test_dspark_layout_and_tp(self) -> None:
        """Different DSpark layouts, then (once equal) different TP: both refused from
        0.5.21, in SGLang's order; nothing before."""
        got = messages({"dsv41_spec_layout": {"num_draft_tokens": 4}, "attn_tp_size": 2},
                       {"dsv41_spec_layout": {"num_draft_tokens": 8}, "attn_tp_size": 4})
        if Version("0.5.21") > RELEASE:
            self.assertEqual(got, [])
            return
        self.assertEqual(len(got), 2, got)
        self.assertIn("DSpark PD layout mismatch (num_draft_tokens)", got[0])
        self.assertIn("DSpark PD requires the same TP size", got[1])

    def test_dspark_mla_decode_tp_spanning_prefill_cp_accepted(self) -> None:
        """An MLA decode whose TP equals the prefill's TP x CP: accepted from 0.5.22
        (0.5.21 requires equal TP)."""
        layout = {"num_draft_tokens": 4}
        got = messages({"dsv41_spec_layout": layout, "attn_tp_size": 2, "attn_cp_size": 2,
                        "is_mla_backend": True},
                       {"dsv41_spec_layout": layout, "attn_tp_size": 4,
                        "is_mla_backend": True})
        if Version("0.5.21") > RELEASE:
            self.assertEqual(got, [])
        elif Version("0.5.22") > RELEASE:
            self.assertEqual(len(got), 1)
        else:
            self.assertEqual(got, [])

    def test_kv_cache_sharding_conditions(self) -> None:
        """A prefill with KV cache sharding: a DCP decode is refused, and an MLA decode
        with another attention TP fails the rank mapping's assertion (0.5.23); earlier
        releases read no sharding flag."""
        got = messages({"enable_kv_cache_sharding": True, "attn_tp_size": 2,
                        "is_mla_backend": True},
                       {"dcp_size": 2, "attn_tp_size": 4, "is_mla_backend": True})
        if Version("0.5.17") > RELEASE or Version("0.5.23") > RELEASE:
            self.assertEqual(got, [])
        else:
            self.assertEqual(got[0], "PD decode DCP does not support a prefill with "
                                     "--enable-kv-cache-sharding.")
            self.assertIn("MLA KV cache sharding requires equal", got[1])


class TestRunnerSafety(GuardTestCase):
    def test_requests_restored_after_a_raise(self) -> None:
        """The conn module's ``requests`` is SGLang's again after a raising first
        contact: the local answerer never outlives the call."""
        module = importlib.import_module(targets.PD_COMMON_MODULE)
        before = module.requests
        self.assertTrue(messages({"page_size": 16}, {"page_size": 32}))
        self.assertIs(module.requests, before)

    def test_unmapped_message_kept_and_loop_stops(self) -> None:
        """A message the runner cannot map to a value is reported as SGLang wrote it
        (DSV4G035) and the runner stops there, saying so."""
        saved = fc._RULES
        fc._RULES = ()
        try:
            contact = fc.first_contact(endpoint("prefill", page_size=16, pp_size=4),
                                       endpoint("decode", page_size=32, pp_size=2), "x")
        finally:
            fc._RULES = saved
        self.assertEqual([(r.code, r.message[:18]) for r in contact.raised],
                         [("DSV4G035", "Page size mismatch")])
        self.assertEqual(contact.calls, 1)
        self.assertTrue(any("does not map" in u for u in contact.unknowns), contact.unknowns)

    def test_unset_attribute_is_an_unknown_not_an_error(self) -> None:
        """A release that reads a manager attribute the runner does not set gives an
        unknowns line naming it, no finding."""
        saved = fc._manager

        def without_tp(*args: Any) -> Any:
            manager = saved(*args)
            del manager.attn_tp_size
            return manager

        fc._manager = without_tp
        try:
            contact = fc.first_contact(endpoint("prefill"), endpoint("decode"), "x")
        finally:
            fc._manager = saved
        self.assertEqual(contact.raised, ())
        self.assertTrue(any("attn_tp_size" in u and "AttributeError" in u
                            for u in contact.unknowns), contact.unknowns)


_SIDE = st.fixed_dictionaries({
    "page_size": st.sampled_from([16, 64]),
    "kv_cache_dtype_str": st.sampled_from(["auto", "bf16", "fp8_e4m3"]),
    "attn_tp_size": st.sampled_from([1, 2, 4]), "attn_cp_size": st.sampled_from([1, 2]),
    "pp_size": st.sampled_from([1, 2, 4]), "dcp_size": st.sampled_from([1, 2]),
    "is_mla_backend": st.booleans(), "enable_kv_cache_sharding": st.booleans()})


class TestParityWithSGLang(GuardTestCase):
    @given(prefill=_SIDE, decode=_SIDE)
    def test_runner_agrees_with_one_real_call(self, prefill: dict[str, Any],
                                              decode: dict[str, Any]) -> None:
        """For drawn values of both servers, the runner's verdict (an error or not) and
        its first message equal SGLang's try_ensure_parallel_info called once."""
        decode = {**decode, "is_mla_backend": prefill["is_mla_backend"]}  # one model
        contact = fc.first_contact(endpoint("prefill", **prefill),
                                   endpoint("decode", **decode), str(RELEASE))
        first = contact.first.message if contact.first else None
        self.assertEqual(first, first_contact_raise(prefill, decode))
        self.assertFalse(contact.unknowns)


if __name__ == "__main__":
    unittest.main()
