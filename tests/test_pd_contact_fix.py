"""``check --fix`` on pairs decode's first contact or the DCP relayout rejects: every
row's fixes are proven by the installed release, and the corrected lines pass ``check``
(or the finding says no flag fixes it)."""

from __future__ import annotations

import unittest
from typing import Any

from check_helpers import DSV3, LLAMA, check_json, codes, server
from helpers import GuardTestCase, sglang_release
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=34, suite="stage-a-test-cpu")


def fixed_pair(model: str, prefill: str, decode: str) -> tuple[dict[str, Any], int, list[str]]:
    """``check --fix`` on the pair, then ``check`` on its corrected lines."""
    _, doc = check_json(server("prefill", model, prefill, backend="mooncake"),
                        server("decode", model, decode, backend="mooncake"), "--fix")
    fixed = doc["fixed"]
    if fixed is None:  # nothing to fix: 0.5.16 refuses DCP off ROCm, which check cannot tell
        return doc, -1, []  # (an unknowns line); the tests on 0.5.16 read only the findings
    status, again = check_json(fixed["prefill"], fixed["decode"])
    return doc, status, codes(again)


class TestFirstContactFixesProven(GuardTestCase):
    def test_dtype_and_pp_fixed(self) -> None:
        """A KV cache dtype mismatch and a decode PP the prefill cannot serve: a proven
        fix for each, and the corrected lines pass."""
        doc, status, left = fixed_pair(LLAMA, "--kv-cache-dtype bf16 --pp-size 4",
                                       "--pp-size 2")
        self.assertEqual(codes(doc), ["DSV4G030", "DSV4G035"])
        for finding in doc["findings"]:
            self.assertTrue(any(f["proven"] for f in finding["fixes"]), finding["fixes"])
        self.assertEqual((status, left), (0, []))

    def test_decode_cp_fixed(self) -> None:
        """A decode with attention CP 2: launching it without --attn-cp-size is proven."""
        doc, status, left = fixed_pair(LLAMA, "--tp-size 2", "--tp-size 2 --attn-cp-size 2")
        self.assertEqual(codes(doc), ["DSV4G035"])
        self.assertEqual((status, left), (0, []))

    def test_dcp_rows_fixed(self) -> None:
        """A DCP decode on a non-MLA model (first contact and relayout, 0.5.17+): the decode
        without --dcp-size is proven for both; before 0.5.17 neither row exists."""
        doc, status, left = fixed_pair(LLAMA, "", "--tp-size 2 --dcp-size 2")
        if sglang_release() < Version("0.5.17"):
            self.assertNotIn("DSV4G034", codes(doc))
            self.assertNotIn("DSV4G036", codes(doc))
            return
        self.assertEqual(codes(doc), ["DSV4G034", "DSV4G036"])
        self.assertEqual((status, left), (0, []))

    def test_prefill_dcp_relayout_fixed(self) -> None:
        """A prefill with DCP and a plain decode (relayout refused, 0.5.17+): a proven fix
        and corrected lines that pass."""
        doc, status, left = fixed_pair(DSV3, "--tp-size 2 --dcp-size 2", "")
        if sglang_release() < Version("0.5.17"):
            self.assertNotIn("DSV4G036", codes(doc))
            return
        self.assertEqual(codes(doc), ["DSV4G036"])
        self.assertEqual((status, left), (0, []))

    def test_decode_takes_the_prefills_dcp_size(self) -> None:
        """A prefill with DCP 2 and a decode without (0.5.17+): besides the prefill without
        --dcp-size, the decode taking the prefill's DCP size (equal DCP layouts, which the
        relayout accepts) is a fix proven by check."""
        _, doc = check_json(server("prefill", DSV3, "--tp-size 2 --dcp-size 2", "mooncake"),
                            server("decode", DSV3, "--tp-size 2", "mooncake"), "--fix")
        if sglang_release() < Version("0.5.17"):
            self.assertNotIn("DSV4G036", codes(doc))
            return
        (finding,) = [f for f in doc["findings"] if f["code"] == "DSV4G036"]
        proven = {tuple((e["server"], e["name"], e["value"]) for e in f["edits"])
                  for f in finding["fixes"] if f["proven"]}
        self.assertEqual(proven, {(("prefill", "--dcp-size", None),),
                                  (("decode", "--dcp-size", "2"),)})


if __name__ == "__main__":
    unittest.main()
