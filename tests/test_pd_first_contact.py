"""``check`` predicts decode's first contact with the prefill and the DCP relayout at
registration, by running the installed release's own ``try_ensure_parallel_info`` and
``requires_dcp_relayout`` on the values two launch lines imply: a pair SGLang rejects
is an error with SGLang's message, its near miss passes, on every release (a row the
release does not have is asserted absent)."""

from __future__ import annotations

import unittest
from typing import Any

from check_helpers import DSV3, DSV4, LLAMA, check_json, server
from helpers import GuardTestCase, sglang_release
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.offline.parse import parse_launch
from sglang_dsv4_guard.check.server.derive import derive_server
from sglang_dsv4_guard.check.server.gpus import page_sizes

register_cpu_ci(est_time=35, suite="stage-a-test-cpu")

DCP_RELEASE = Version("0.5.17")  # the first with DCP conditions and requires_dcp_relayout
# The first whose resolution gives an MHA model trtllm_mha on SM100, with its page sizes
# ("TensorRT-LLM MHA only supports page_size of 16, 32, 64 or 128", arg_groups/overrides.py).
TRTLLM_MHA_RELEASE = Version("0.5.17")


def pair(prefill: str, decode: str, model: str = LLAMA) -> tuple[int, dict[str, Any]]:
    return check_json(server("prefill", model, prefill, backend="mooncake"),
                      server("decode", model, decode, backend="mooncake"))


def errors(doc: dict[str, Any]) -> set[str]:
    return {f["code"] for f in doc["findings"] if f["severity"] == "error"}


def found(doc: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == code]


class TestFirstContactRows(GuardTestCase):
    def sole_error(self, result: tuple[int, dict[str, Any]], code: str, message: str
                   ) -> dict[str, Any]:
        """The one ``code`` finding of a failing check: an error with SGLang's message."""
        status, doc = result
        self.assertEqual(status, 1)
        (finding,) = found(doc, code)
        self.assertEqual(finding["severity"], "error")
        self.assertTrue(finding["host_message"].startswith(message), finding["host_message"])
        return finding

    def test_kv_cache_dtype_strings_compared(self) -> None:
        """An explicit bf16 KV cache dtype on the prefill and the default auto on the
        decode kill decode at first contact: an error with SGLang's message, values by
        role with their sources, and a fix."""
        finding = self.sole_error(pair("--kv-cache-dtype bf16", ""), "DSV4G030",
                                  "KV cache dtype mismatch: prefill server has kv_cache_dtype"
                                  "=bf16, but decode server has kv_cache_dtype=auto.")
        values = {(o["role"], o["value"]) for o in finding["observations"]}
        self.assertEqual(values, {("prefill", "bf16"), ("decode", "auto")})
        self.assertIn("--kv-cache-dtype bf16", finding["observations"][0]["source"])
        self.assertIn("first contact", finding["when"])
        self.assertTrue(any(e["name"] == "--kv-cache-dtype" for f in finding["fixes"]
                            for e in f["edits"]), finding["fixes"])

    def test_model_chosen_kv_cache_dtype_is_the_resolved_one(self) -> None:
        """A DeepSeek-V4 prefill without --kv-cache-dtype gets the dtype SGLang's model
        override chooses (fp8_e4m3), not the flag's default 'auto': against a decode that
        types that dtype, first contact passes, and the DSV4G030 it reports against a
        bfloat16 decode shows the resolved value."""
        _, doc = pair("", "--kv-cache-dtype fp8_e4m3", model=DSV4)
        self.assertNotIn("DSV4G030", errors(doc), found(doc, "DSV4G030"))
        _, doc = pair("", "--kv-cache-dtype bfloat16", model=DSV4)
        (finding,) = found(doc, "DSV4G030")
        values = {(o["role"], o["value"]) for o in finding["observations"]}
        self.assertEqual(values, {("prefill", "fp8_e4m3"), ("decode", "bfloat16")})

    def test_same_kv_cache_dtype_accepted(self) -> None:
        """The same KV cache dtype string on both servers passes first contact."""
        status, doc = pair("--kv-cache-dtype bf16", "--kv-cache-dtype bf16")
        self.assertEqual((status, found(doc, "DSV4G030")), (0, []))

    def test_page_size_reported_once_as_sglang_error(self) -> None:
        """Different page sizes are one error (SGLang's first-contact message), not an
        error and an asymmetry warning."""
        finding = self.sole_error(pair("--page-size 16", "--page-size 32"), "DSV4G022",
                                  "Page size mismatch: prefill server has page_size=16, but "
                                  "decode server has page_size=32.")
        self.assertTrue(finding["fixes"] and finding["fixes"][0]["edits"], finding["fixes"])

    def test_page_size_chosen_by_the_gpu(self) -> None:
        """A typed --page-size 64 on the prefill and none on the decode: the decode's page
        size is its attention backend's, which SGLang chooses by the GPU model (from 0.5.17
        an MHA model's default on SM100 is trtllm_mha, which sets 64). DSV4G022 is an error
        exactly when the page sizes SGLang resolves differ as every GPU model, otherwise a
        warning whose details name each GPU model's page sizes (outside review: check had
        called this pair broken although SGLang accepts it on a B200)."""
        prefill = server("prefill", LLAMA, "--page-size 64", backend="mooncake")
        decode = server("decode", LLAMA, "", backend="mooncake")
        _, doc = check_json(prefill, decode)
        (finding,) = found(doc, "DSV4G022")
        sizes = {gpu.name: (a, page_sizes(derive_server(parse_launch("decode", decode, {})))[gpu])
                 for gpu, a in page_sizes(derive_server(parse_launch("prefill", prefill, {}))
                                          ).items()}
        if sglang_release() >= TRTLLM_MHA_RELEASE:
            self.assertEqual(sizes["SM100 (B200)"], (64, 64), sizes)
            self.assertEqual(sizes["SM90 (H100/H200)"], (64, 1), sizes)
        accepted = [gpu for gpu, (a, b) in sizes.items() if a == b]
        self.assertEqual(finding["severity"], "warning" if accepted else "error", sizes)
        for gpu in accepted:
            self.assertTrue(any(gpu in line and "SGLang accepts the pair" in line
                                for line in finding["details"]), finding["details"])
        self.assertTrue(any(e["name"] == "--page-size" for f in finding["fixes"]
                            for e in f["edits"]), finding["fixes"])

    def test_page_sizes_typed_apart_refused_on_every_gpu(self) -> None:
        """16 and 32, both typed: the same on every GPU model, so still an error."""
        _, doc = pair("--page-size 16", "--page-size 32")
        (finding,) = found(doc, "DSV4G022")
        self.assertEqual(finding["severity"], "error")
        self.assertFalse(any("SGLang accepts the pair" in line for line in finding["details"]))

    def test_fake_backend_decode_makes_no_first_contact(self) -> None:
        """A decode on the fake transfer backend: SGLang's FakeKVManager is no
        CommonKVManager and never calls try_ensure_parallel_info, so no first-contact
        finding claims SGLang's message (outside review); one unknowns line says why, and
        the different backends stay an error."""
        status, doc = check_json(server("prefill", LLAMA, "--page-size 16", backend="mooncake"),
                                 server("decode", LLAMA, "--page-size 32", backend="fake"))
        self.assertEqual(status, 1)
        self.assertEqual([f for f in doc["findings"]
                          if f["subject"] == "decode's first contact with the prefill"], [])
        self.assertIn("DSV4G023", errors(doc))
        self.assertTrue(any("FakeKVManager" in u and "no try_ensure_parallel_info" in u
                            for u in doc["unknowns"]), doc["unknowns"])

    def test_every_mismatch_reported_in_sglang_order(self) -> None:
        """Page size, KV cache dtype and a decode PP that neither equals the prefill's nor
        is 1: SGLang stops at the first; check reports all three, the first carrying the
        message the decode server logs."""
        status, doc = pair("--page-size 16 --kv-cache-dtype bf16 --pp-size 4",
                           "--page-size 32 --pp-size 2")
        self.assertEqual(status, 1)
        contact = [f for f in doc["findings"]
                   if f["subject"] == "decode's first contact with the prefill"]
        self.assertEqual([f["code"] for f in contact], ["DSV4G022", "DSV4G030", "DSV4G035"])
        self.assertIn("SGLang raises this first", contact[0]["details"][0])
        self.assertEqual(contact[2]["host_message"],
                         "('Decode pp size (2) should be equal to prefill pp size (4) or 1',)")

    def test_decode_pp_one_accepted(self) -> None:
        """A decode with PP 1 pulls from every prefill PP rank: accepted."""
        status, doc = pair("--pp-size 2", "")
        self.assertEqual((status, found(doc, "DSV4G035")), (0, []))

    def test_decode_attention_cp_refused(self) -> None:
        """A decode with attention CP 2 fails the rank mapping's bare assertion."""
        status, doc = pair("--tp-size 2", "--tp-size 2 --attn-cp-size 2")
        self.assertEqual(status, 1)
        (finding,) = found(doc, "DSV4G035")
        self.assertEqual(finding["host_message"], "('Decode cp size (2) should be equal to 1',)")

    def test_dcp_needs_mla_pool(self) -> None:
        """A decode with DCP on a non-MLA model: from 0.5.17 decode's first contact
        refuses it and so does the prefill's relayout at registration; 0.5.16 compares
        neither."""
        status, doc = pair("", "--tp-size 2 --dcp-size 2")
        contact, relayout = found(doc, "DSV4G034"), found(doc, "DSV4G036")
        if sglang_release() < DCP_RELEASE:  # no DCP row; its ServerArgs allows DCP on HIP only
            self.assertEqual((contact, relayout), ([], []))
            self.assertLessEqual(errors(doc), {"DSV4G026"})
            return
        self.assertEqual(status, 1)
        self.assertEqual([f["host_message"] for f in contact],
                         ["PD decode DCP requires an MLA or hybrid-MLA KV pool."])
        self.assertEqual([f["host_message"] for f in relayout],
                         ["Unsupported PD DCP topology: 1 -> 2"])
        self.assertIn("bootstrap thread dies", relayout[0]["when"])

    def test_dcp_on_mla_accepted(self) -> None:
        """A decode with DCP on an MLA model, the prefill without: relayout, accepted."""
        _, doc = pair("", "--tp-size 2 --dcp-size 2", model=DSV3)
        self.assertEqual((found(doc, "DSV4G034"), found(doc, "DSV4G036")), ([], []))
        # 0.5.16's ServerArgs allows DCP on ROCm (HIP) only, which these flags cannot tell
        # (--device cuda is ROCm's too): an unknowns line naming the flag, never an error
        self.assertEqual(errors(doc), set())
        if sglang_release() < DCP_RELEASE:
            self.assertTrue(any("--dcp-size 2" in u and "not checked here" in u
                                for u in doc["unknowns"]), doc["unknowns"])

    def test_prefill_dcp_refused_at_registration(self) -> None:
        """A prefill with DCP and a decode without: the relayout refuses the topology
        (0.5.17+); 0.5.16 has no relayout."""
        _, doc = pair("--tp-size 2 --dcp-size 2", "", model=DSV3)
        relayout = found(doc, "DSV4G036")
        if sglang_release() < DCP_RELEASE:  # no relayout; ServerArgs allows DCP on HIP only
            self.assertEqual(relayout, [])
            self.assertLessEqual(errors(doc), {"DSV4G026"})
            return
        self.assertEqual([f["host_message"] for f in relayout],
                         ["Unsupported PD DCP topology: 2 -> 1"])
        self.assertEqual(relayout[0]["subject"], "decode rank registration with the prefill")

    def test_dsv4_layout_needing_sm100_is_judged_per_gpu(self) -> None:
        """SGLANG_DSV4_KV_LAYOUT=v41 on the prefill needs an SM100 GPU to resolve: no
        longer a 'not decidable' line, the pair is judged per GPU model (0.5.21+, its own
        tests: test_check_kv_layout_gpus.py); on 0.5.23 the error is DSV4G031 with the
        first contact's message for SM100; releases before 0.5.21 say nothing of it."""
        _, doc = check_json(server("prefill", DSV4, backend="mooncake"),
                            server("decode", DSV4, backend="mooncake"),
                            "--prefill-env", "SGLANG_DSV4_KV_LAYOUT=v41")
        self.assertEqual([u for u in doc["unknowns"] if "DSV4G031" in u], [])
        layout = found(doc, "DSV4G031")
        if sglang_release() < Version("0.5.23"):
            self.assertEqual([f["severity"] for f in layout],
                             [] if sglang_release() < Version("0.5.21") else ["warning"])
        else:
            self.assertEqual([f["severity"] for f in layout], ["error"])
            self.assertTrue(layout[0]["host_message"].startswith("KV layout mismatch"))

if __name__ == "__main__":
    unittest.main()
