"""``sglang-dsv4-guard check`` on flags whose verdict depends on the servers' GPU model:
SGLang's device probes read during resolution answer as each GPU a server may have, so
a refusal only this machine's lack of that GPU causes is an ``unknowns`` line, never
DSV4G026, and a refusal on every GPU stays DSV4G026."""

from __future__ import annotations

import argparse
import unittest

from check_helpers import DSV4, LLAMA, check_json, codes, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=33, suite="stage-a-test-cpu")

# DeepSeek-V4 takes EAGLE with top-k 1.
NEXTN = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")


def _knows(flag: str) -> bool:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    return flag in parser._option_string_actions


def _machine_lines(doc: dict[str, object]) -> list[str]:
    return [u for u in doc["unknowns"] if "depends on the GPU model/device" in u]  # type: ignore[attr-defined]


class TestGpuModelIsNotTheFlags(GuardTestCase):
    """A refusal SGLang makes only because this machine has no GPU of the kind the flags
    ask for is this machine's."""

    def test_trtllm_mha_is_accepted_as_a_hopper(self) -> None:
        """``--attention-backend trtllm_mha`` (Hopper/Blackwell only) on a Llama pair is
        accepted by SGLang as a B200 (and an H100 from 0.5.22): no DSV4G026, exit 0, and
        each server's refusal here is an ``unknowns`` line naming the GPUs that accept it."""
        if not _knows("--attention-backend"):
            self.skipTest("no --attention-backend in this release")
        flags = "--attention-backend trtllm_mha"
        status, doc = check_json(server("prefill", LLAMA, flags, "mooncake"),
                                 server("decode", LLAMA, flags, "mooncake"))
        self.assertEqual((status, codes(doc)), (0, []), doc["findings"])
        lines = _machine_lines(doc)
        self.assertEqual(len(lines), 2, doc["unknowns"])
        self.assertIn("SM100 (B200)", lines[0])

    def test_mps_device_is_not_this_machine(self) -> None:
        """``--device mps`` on a machine without an Apple GPU: SGLang's MPS probe is this
        machine's answer, so no DSV4G026."""
        flags = "--device mps"
        status, doc = check_json(server("prefill", LLAMA, flags, "mooncake"),
                                 server("decode", LLAMA, flags, "mooncake"))
        self.assertNotIn("DSV4G026", codes(doc), doc["findings"])
        self.assertEqual(status, 0)

    def test_refused_on_every_gpu_is_g026(self) -> None:
        """``--dsv4-attn-backend trtllm`` needs a Blackwell GPU, and SGLang refuses it on
        a Blackwell for a PD server too: DSV4G026, quoting what the Blackwell gets. (A
        release without that flag: its NEXTN refusal for DeepSeek-V4, on every GPU.)"""
        trtllm = _knows("--dsv4-attn-backend")
        flags = (f"{NEXTN} --dsv4-attn-backend trtllm" if trtllm
                 else "--speculative-algorithm NEXTN")
        status, doc = check_json(server("prefill", DSV4, flags), server("decode", DSV4, flags))
        self.assertEqual((status, codes(doc)), (1, ["DSV4G026", "DSV4G026"]))
        if trtllm:
            refusal = doc["findings"][0]["observations"][0]["value"]
            self.assertIn("SM100 (B200)", refusal)
            self.assertIn("disaggregation", refusal)
        self.assertEqual(_machine_lines(doc), [])

if __name__ == "__main__":
    unittest.main()
