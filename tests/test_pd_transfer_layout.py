"""``check`` predicts the head-sliced SWA transfer refusing a prefill whose SWA KV cache is
not in the NHD layout (DSV4G040): SGLang's unified memory pool (``--enable-unified-memory``)
lays it out ``page_major``; a ROCm AITER layout depends on the hardware and is not
predicted."""

from __future__ import annotations

import unittest
from typing import Any

from check_helpers import GPT_OSS, check_json, server
from helpers import GuardTestCase, sglang_release
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host.flags import flag_for_field

register_cpu_ci(est_time=90, suite="stage-a-test-cpu")

SLICES_SWA = sglang_release() >= Version("0.5.22")  # head-sliced SWA transfer
UNIFIED = flag_for_field("enable_unified_memory") is not None
LAYOUT = "Head-sliced PD transfer needs the NHD KV cache layout, got page_major"
AITER = "SGLANG_AITER_KV_CACHE_LAYOUT"


def g040(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == "DSV4G040"]


def _pair(prefill: str, decode: str, *more: str, backend: str = "mooncake") -> dict[str, Any]:
    _, doc = check_json(server("prefill", GPT_OSS, prefill, backend=backend),
                        server("decode", GPT_OSS, decode, backend=backend), *more)
    return doc


class TestSwaLayout(GuardTestCase):
    """gpt-oss P TP1 / D TP4 over Mooncake and NIXL, with the prefill's SWA layout."""

    def test_unified_memory_is_refused_per_request(self) -> None:
        """With --enable-unified-memory on both servers: from 0.5.22 SGLang's own unified
        pool registers a ``page_major`` SWA layout, which the head-sliced transfer refuses
        (an error with SGLang's message, per request: the Mooncake worker dies); before
        0.5.22 the plain refusal of a different TP."""
        if not UNIFIED:
            self.assertLess(sglang_release(), Version("0.5.22"))
            return
        doc = _pair("--tp-size 1 --enable-unified-memory", "--tp-size 4 --enable-unified-memory")
        found = g040(doc)
        if not SLICES_SWA and any("refuses the unified SWA pool" in u for u in doc["unknowns"]):
            # Before 0.5.22 SGLang's setup_state_kv_args refuses the unified pool itself: the
            # server stops before any request, so no per-request finding is made on it.
            self.assertEqual(found, [])
            return
        self.assertEqual(len(found), 1)
        self.assertEqual(found[0]["severity"], "error")
        if SLICES_SWA:
            self.assertEqual(found[0]["host_message"], LAYOUT)
            values = {(o["role"], o["name"]): o["value"] for o in found[0]["observations"]}
            self.assertEqual(values[("prefill", "swa_kv_cache_layout")], "page_major")
        self.assertIn("Transfer thread failed", found[0]["when"])

    def test_unified_memory_on_nixl_fails_each_request(self) -> None:
        """The same pair on NIXL: the same refusal, each request failing."""
        if not UNIFIED:
            self.assertLess(sglang_release(), Version("0.5.22"))
            return
        found = g040(_pair("--tp-size 1 --enable-unified-memory",
                           "--tp-size 4 --enable-unified-memory", backend="nixl"))
        self.assertEqual(len(found), 1)
        if SLICES_SWA:
            self.assertEqual(found[0]["host_message"], LAYOUT)
        self.assertIn("each request fails", found[0]["when"])

    def test_the_fixed_lines_pass_check(self) -> None:
        """``check --fix`` on the unified-memory pair: every fix offered is proven and the
        corrected pair has no DSV4G040 (and, from 0.5.22, whose resolution accepts unified
        memory with PD, no finding at all)."""
        if not UNIFIED:
            self.assertLess(sglang_release(), Version("0.5.22"))
            return
        doc = _pair("--tp-size 1 --enable-unified-memory", "--tp-size 4 --enable-unified-memory",
                    "--fix")
        if not SLICES_SWA and any("refuses the unified SWA pool" in u for u in doc["unknowns"]):
            self.assertEqual(g040(doc), [])  # SGLang refuses the pool itself, before requests
            return
        fixes = [f for x in g040(doc) for f in x["fixes"]]
        self.assertTrue(fixes and all(f["proven"] for f in fixes))
        status, again = check_json(doc["fixed"]["prefill"], doc["fixed"]["decode"])
        self.assertEqual(g040(again), [])
        if SLICES_SWA:
            self.assertEqual(status, 0)

    def test_unified_memory_with_equal_tp_is_accepted(self) -> None:
        """Near miss: unified memory with the same attention TP is no DSV4G040."""
        doc = _pair("--tp-size 4 --enable-unified-memory", "--tp-size 4 --enable-unified-memory")
        self.assertEqual(g040(doc), [])

    def test_plain_pool_is_nhd_and_accepted(self) -> None:
        """Near miss: without unified memory the prefill's SWA layout is NHD and the
        head-sliced transfer runs (0.5.22+): no DSV4G040, nothing unknown for it."""
        doc = _pair("--tp-size 1", "--tp-size 4")
        if SLICES_SWA:
            self.assertEqual(g040(doc), [])
            self.assertFalse([u for u in doc["unknowns"] if u.startswith("DSV4G040")])
        else:
            self.assertEqual(len(g040(doc)), 1)

    def test_rocm_aiter_layout_is_not_predicted(self) -> None:
        """SGLANG_AITER_KV_CACHE_LAYOUT=vectorized_5d on the prefill: the layout is the
        ROCm AITER hardware's choice, so from 0.5.22 the row reports nothing and says
        so in ``unknowns``."""
        doc = _pair("--tp-size 1", "--tp-size 4", "--prefill-env", f"{AITER}=vectorized_5d")
        if not SLICES_SWA:
            self.assertEqual(len(g040(doc)), 1)
            return
        self.assertEqual(g040(doc), [])
        self.assertTrue([u for u in doc["unknowns"] if u.startswith("DSV4G040") and AITER in u])


if __name__ == "__main__":
    unittest.main()
