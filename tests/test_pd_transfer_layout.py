"""``check`` predicts the head-sliced SWA transfer refusing a prefill whose SWA KV cache is
not in the NHD layout (DSV4G040): SGLang's unified memory pool (``--enable-unified-memory``)
lays it out ``page_major``; a ROCm AITER layout depends on the hardware and is not
predicted. ``SGLANG_USE_HND_KVCACHE`` on a PD server is SGLang's own refusal at start-up
(``get_contiguous_buf_infos`` asserts NHD when the KV manager is set up): DSV4G049, an
error with the derived fix, never "could not be built on CPU"."""

from __future__ import annotations

import unittest
from typing import Any

from check_helpers import DSV3, GPT_OSS, check_json, server
from helpers import GuardTestCase, sglang_release
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host.flags import flag_for_field

register_cpu_ci(est_time=35, suite="stage-a-test-cpu")

SLICES_SWA = sglang_release() >= Version("0.5.22")  # head-sliced SWA transfer
UNIFIED = flag_for_field("enable_unified_memory") is not None
LAYOUT = "Head-sliced PD transfer needs the NHD KV cache layout, got page_major"
AITER = "SGLANG_AITER_KV_CACHE_LAYOUT"
HND = "SGLANG_USE_HND_KVCACHE"


def g040(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == "DSV4G040"]


def g047(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == "DSV4G049"]


def hnd_refusal() -> str:
    """What the release's own ``get_contiguous_buf_infos`` raises on an MHA pool its
    constructor builds with the variable set: the message of its assertion."""
    import os

    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    saved = os.environ.get(HND)
    os.environ[HND] = "1"
    try:
        pool = MHATokenToKVPool(64, page_size=1, dtype=torch.bfloat16, head_num=1,
                                head_dim=8, layer_num=1, device="cpu",
                                enable_memory_saver=False)
        try:
            pool.get_contiguous_buf_infos()
        except AssertionError as exc:
            return str(exc)
        raise AssertionError("the release accepts an HND pool for PD")
    finally:
        if saved is None:
            os.environ.pop(HND, None)
        else:
            os.environ[HND] = saved


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



class TestHndKvCache(GuardTestCase):
    """gpt-oss P TP2 / D TP4 over Mooncake with SGLANG_USE_HND_KVCACHE on the prefill."""

    def test_hnd_stops_the_server_at_start_up(self) -> None:
        """The prefill's pool is refused by SGLang's own assertion when its KV manager is
        set up: one DSV4G049 error on the prefill, at start-up, with SGLang's message and
        the fix unsetting the variable; not a "could not be built on CPU" line."""
        doc = _pair("--tp-size 2", "--tp-size 4", "--prefill-env", f"{HND}=1")
        [found] = g047(doc)
        self.assertEqual(found["severity"], "error")
        self.assertEqual(found["host_message"], hnd_refusal())
        self.assertIn("start-up", found["when"])
        self.assertTrue(found["subject"].startswith("prefill server"))
        edits = [e for f in found["fixes"] for e in f["edits"]]
        self.assertIn({"server": "prefill", "name": HND, "value": None, "remove": True,
                       "env": True}, edits)
        self.assertFalse([u for u in doc["unknowns"] if "could not be built" in u])

    def test_the_fixed_lines_pass_check(self) -> None:
        """``check --fix``: the unset variable is proven and the corrected pair has no
        DSV4G049 (from 0.5.22, which slices SWA by heads, no finding at all)."""
        doc = _pair("--tp-size 2", "--tp-size 4", "--prefill-env", f"{HND}=1", "--fix")
        fixes = [f for x in g047(doc) for f in x["fixes"]]
        self.assertTrue(fixes and all(f["proven"] for f in fixes), fixes)
        self.assertIn(HND, doc["fixed"]["prefill_unset"])
        status, again = check_json(doc["fixed"]["prefill"], doc["fixed"]["decode"])
        self.assertEqual(g047(again), [])
        if SLICES_SWA:
            self.assertEqual((status, again["findings"]), (0, []))

    def test_variable_off_or_mla_pool_is_accepted(self) -> None:
        """Near misses: the variable read as off (SGLang's EnvBool: 0, false) on both
        servers; set on both servers of an MLA model (DeepSeek-V3), whose pool's
        ``get_contiguous_buf_infos`` has no such assertion: no DSV4G049."""
        doc = _pair("--tp-size 2", "--tp-size 4", "--prefill-env", f"{HND}=0",
                    "--decode-env", f"{HND}=false")
        self.assertEqual(g047(doc), [])
        _, doc = check_json(server("prefill", DSV3, "--tp-size 2", backend="mooncake"),
                            server("decode", DSV3, "--tp-size 4", backend="mooncake"),
                            "--prefill-env", f"{HND}=1", "--decode-env", f"{HND}=1")
        self.assertEqual(g047(doc), [])


if __name__ == "__main__":
    unittest.main()
