"""``check`` predicts the decode allocation policy comparison that the release's own
``CommonKVReceiver.init`` makes for every request (0.5.22+): different
``--disaggregation-decode-allocation-policy`` values fail each request at the decode,
with SGLang's message, and a derived fix; equal ones pass; releases without the flag
have no such row."""

from __future__ import annotations

import argparse
import unittest
from typing import Any

from check_helpers import LLAMA, check_json, codes, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=32, suite="stage-a-test-cpu")

POLICY = "--disaggregation-decode-allocation-policy"


def release_has_policy() -> bool:
    """Whether the installed release's flag table has the allocation policy flag."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    return any(POLICY in action.option_strings for action in parser._actions)


def pair(prefill: str, decode: str, *more: str) -> tuple[int, dict[str, Any]]:
    return check_json(server("prefill", LLAMA, prefill, backend="mooncake"),
                      server("decode", LLAMA, decode, backend="mooncake"), *more)


def found(doc: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == code]


class TestAllocationPolicy(GuardTestCase):
    def test_prefill_only_policy_fails_each_request(self) -> None:
        """prefill_complete on the prefill only: DSV4G037, SGLang's receiver message with
        both values, the prefill's from its flag, failing per request at the decode; a
        release without the flag has no DSV4G037 for a plain pair."""
        if not release_has_policy():
            self.assertEqual(found(pair("", "")[1], "DSV4G037"), [])
            return
        status, doc = pair(f"{POLICY} prefill_complete", "")
        self.assertEqual(status, 1)
        (finding,) = found(doc, "DSV4G037")
        self.assertTrue(finding["host_message"].startswith(
            "Disaggregation decode allocation policy mismatch: prefill=prefill_complete, "
            "decode=early."), finding["host_message"])
        values = {(o["role"], o["value"]) for o in finding["observations"]}
        self.assertEqual(values, {("prefill", "prefill_complete"), ("decode", "early")})
        prefill = next(o for o in finding["observations"] if o["role"] == "prefill")
        self.assertIn(POLICY, prefill["source"])
        self.assertIn("per request", finding["when"])

    def test_decode_only_policy_fails_each_request(self) -> None:
        """prefill_complete on the decode only fails the same way, the other way round."""
        if not release_has_policy():
            self.assertNotIn("DSV4G037", codes(pair("", "")[1]))
            return
        _, doc = pair("", f"{POLICY} prefill_complete")
        (finding,) = found(doc, "DSV4G037")
        self.assertIn("prefill=early, decode=prefill_complete", finding["host_message"])

    def test_equal_policies_accepted(self) -> None:
        """prefill_complete on both servers passes the receiver's comparison."""
        if not release_has_policy():
            self.assertNotIn("DSV4G037", codes(pair("", "")[1]))
            return
        status, doc = pair(f"{POLICY} prefill_complete", f"{POLICY} prefill_complete")
        self.assertEqual((status, found(doc, "DSV4G037")), (0, []))

    def test_policy_fix_proven(self) -> None:
        """check --fix derives the policy flag on one server (the decode taking the
        prefill's, or the prefill without it), proven, and the corrected lines pass."""
        if not release_has_policy():
            self.assertNotIn("DSV4G037", codes(pair("", "", "--fix")[1]))
            return
        _, doc = pair(f"{POLICY} prefill_complete", "", "--fix")
        (finding,) = found(doc, "DSV4G037")
        proven = {tuple((e["server"], e["name"], e["value"]) for e in f["edits"])
                  for f in finding["fixes"] if f["proven"]}
        self.assertEqual(proven, {(("decode", POLICY, "prefill_complete"),),
                                  (("prefill", POLICY, None),)})
        status, again = check_json(doc["fixed"]["prefill"], doc["fixed"]["decode"])
        self.assertEqual((status, codes(again)), (0, []))


if __name__ == "__main__":
    unittest.main()
