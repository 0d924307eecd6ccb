"""``check``'s contract rows under faulty input: a contributor that raises, metadata buffer
widths SGLang refuses or could not allocate here, environment values SGLang's own parser
refuses, and NIXL's registration of a decode that needs the DCP relayout."""

from __future__ import annotations

import unittest
from typing import Any

from check_helpers import DSV4, GPT_OSS, check_json, server
from helpers import GuardTestCase, sglang_release
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.server import endpoint_values
from sglang_dsv4_guard.host.flags import flag_for_field
from sglang_dsv4_guard.pd.endpoint import Value

register_cpu_ci(est_time=32, suite="stage-a-test-cpu")

RELEASE = sglang_release()
READS_MASK = Version("0.5.20") <= RELEASE  # SGLANG_ENABLE_DISAGG_SAMPLING_MASK
HAS_WIDTH = flag_for_field("sampling_mask_max_tokens") is not None
MASK = "SGLANG_ENABLE_DISAGG_SAMPLING_MASK"
EAGLE = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")


def _gpt_oss(prefill_extra: str, decode_extra: str, *more: str) -> dict[str, Any]:
    _, doc = check_json(server("prefill", GPT_OSS, prefill_extra, backend="mooncake"),
                        server("decode", GPT_OSS, decode_extra, backend="mooncake"), *more)
    return doc


def _codes(doc: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == code]


class TestContributorFault(GuardTestCase):
    """A contributor of endpoint values that raises never ends ``check``."""

    def test_raising_contributor_is_an_unknown_and_other_rows_run(self) -> None:
        """A contributor raising: an unknowns line naming it and its error; the rows still
        run (the sampling-mask pair's DSV4G045 is still reported from 0.5.20)."""
        def broken(side: Any, values: dict[str, Value]) -> dict[str, Value]:
            raise RuntimeError("contributor exploded")

        endpoint_values.CONTRIBUTORS.append(broken)
        try:
            doc = _gpt_oss("", "", "--prefill-env", f"{MASK}=1")
        finally:
            endpoint_values.CONTRIBUTORS.remove(broken)
        lines = [u for u in doc["unknowns"] if "contributor exploded" in u]
        self.assertEqual(len(lines), 2, doc["unknowns"])  # one per server
        self.assertTrue(all("broken" in u and "RuntimeError" in u for u in lines), lines)
        self.assertEqual(bool(_codes(doc, "DSV4G045")), READS_MASK)


class TestSamplingMaskWidth(GuardTestCase):
    """``--sampling-mask-max-tokens`` values the metadata buffers are built with."""

    def test_negative_width_is_said_not_fatal(self) -> None:
        """``--sampling-mask-max-tokens -1`` with the mask on (the reviewers' TP1/TP4 pair):
        check answers, says the server would not start (SGLang refuses the width) and
        judges no DSV4G045 on that server's buffers."""
        if not HAS_WIDTH:
            self.assertLess(RELEASE, Version("0.5.20"))  # the flag is 0.5.20's
            return
        doc = _gpt_oss("--tp-size 1 --sampling-mask-max-tokens -1", "--tp-size 4",
                       "--prefill-env", f"{MASK}=1")
        lines = [u for u in doc["unknowns"] if "--sampling-mask-max-tokens -1" in u]
        self.assertTrue(lines and "would not start" in lines[0], doc["unknowns"])
        self.assertEqual(_codes(doc, "DSV4G045"), [])

    def test_huge_width_is_counted_without_allocating_it(self) -> None:
        """A width no machine could allocate: the buffers are still counted (the count does
        not depend on the width), so the one-sided mask is still DSV4G045."""
        if not HAS_WIDTH:
            self.assertLess(RELEASE, Version("0.5.20"))
            return
        wide = f"--sampling-mask-max-tokens {2 ** 40}"
        doc = _gpt_oss(wide, wide, "--prefill-env", f"{MASK}=1")
        self.assertEqual([f["severity"] for f in _codes(doc, "DSV4G045")], ["error"])


class TestRefusedEnvValues(GuardTestCase):
    """Environment values SGLang's own ``EnvBool`` parse refuses (it warns, reads False)."""

    def _doc(self, *more: str) -> dict[str, Any]:
        return _gpt_oss("", "", "--prefill-env", f"{MASK}=banana", "--decode-env", f"{MASK}=true",
                        *more)

    def test_observation_says_what_sglang_reads(self) -> None:
        """``=banana``: the observation says SGLang reads False and names what it accepts."""
        found = _codes(self._doc(), "DSV4G045")
        if not READS_MASK:
            self.assertEqual(found, [])
            return
        obs = {(o["role"], o["name"]): o for o in found[0]["observations"]}
        banana = obs[("prefill", "sampling_mask_env")]
        self.assertIs(banana["value"], False)
        self.assertIn("banana", banana["source"])
        self.assertIn("reads False", banana["source"])
        self.assertIn("yes", banana["source"])  # an accepted spelling, from SGLang's parse
        self.assertIs(obs[("decode", "sampling_mask_env")]["value"], True)

    def test_fix_never_copies_a_refused_value(self) -> None:
        """``check --fix``: no edit sets ``banana``; the fixed pair has no DSV4G045."""
        doc = self._doc("--fix")
        found = _codes(doc, "DSV4G045")
        if not READS_MASK:
            self.assertEqual(found, [])
            return
        edits = [e for f in found[0]["fixes"] for e in f["edits"]]
        self.assertTrue(edits)
        self.assertFalse([e for e in edits if e.get("value") == "banana"], edits)
        self.assertEqual(_codes(doc["fixed_check"], "DSV4G045"), [])


class TestNixlWithDcpRelayout(GuardTestCase):
    """NIXL's ``_prepare_payload_xfer`` sees the release's own DCP relayout decision."""

    def test_relayout_peer_is_not_refused_for_hisparse(self) -> None:
        """DeepSeek-V4 on NIXL, TP8, decode HiSparse + decode-only EAGLE + ``--dcp-size 2``:
        from 0.5.17 the function takes the relayout branch first and returns before the
        HiSparse checks: no DSV4G042; 0.5.16 has no relayout branch: still DSV4G042."""
        if flag_for_field("dcp_size") is None:
            self.assertLess(RELEASE, Version("0.5.17"))
            return
        _, doc = check_json(server("prefill", DSV4, "--tp-size 8", backend="nixl"),
                            server("decode", DSV4, f"--tp-size 8 --enable-hisparse --dcp-size 2 "
                                   f"{EAGLE}", backend="nixl"))
        self.assertEqual(len(_codes(doc, "DSV4G042")), 0 if Version("0.5.17") <= RELEASE else 1)
        self.assertEqual(_codes(doc, "DSV4G036"), [])  # the relayout itself accepts it

if __name__ == "__main__":
    unittest.main()
