"""Promises of ``check`` and ``doctor`` an outside review found broken: a healthy GPU pair
called broken, a real checkpoint's config.json refused, an entry point SGLang runs
called missing. Each test here fails on the code it was written against."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unittest
from pathlib import Path

from check_helpers import DSV3, DSV4, LLAMA, check_json, codes, run_cli, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

# DeepSeek-V4 takes EAGLE with top-k 1.
NEXTN = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")


def _knows(flag: str) -> bool:
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    return flag in parser._option_string_actions


class TestGpuCapabilityIsNotTheFlags(GuardTestCase):
    """A refusal SGLang makes only because the checking machine has no GPU of the kind the
    flags ask for is this machine's, never DSV4G026."""

    def test_trtllm_mha_on_hopper_is_not_g026(self) -> None:
        """``--attention-backend trtllm_mha`` (Hopper/Blackwell only) on a Llama pair is
        accepted by SGLang on an H100: no DSV4G026, exit 0."""
        if not _knows("--attention-backend"):
            self.skipTest("no --attention-backend in this release")
        flags = "--attention-backend trtllm_mha"
        status, doc = check_json(server("prefill", LLAMA, flags, "mooncake"),
                                 server("decode", LLAMA, flags, "mooncake"))
        self.assertNotIn("DSV4G026", codes(doc), doc["findings"])
        self.assertEqual(status, 0)

    def test_dsv4_trtllm_backend_on_blackwell_is_not_g026(self) -> None:
        """``--dsv4-attn-backend trtllm`` (SM100 only) on a DeepSeek-V4 pair is accepted by
        SGLang on a B200: no DSV4G026."""
        if not _knows("--dsv4-attn-backend"):
            self.skipTest("no --dsv4-attn-backend in this release")
        flags = f"{NEXTN} --dsv4-attn-backend trtllm"
        _, doc = check_json(server("prefill", DSV4, flags), server("decode", DSV4, flags))
        self.assertNotIn("DSV4G026", codes(doc), doc["findings"])


class TestRemoteCodeInTheModelDirectory(GuardTestCase):
    """A config.json copied alone from a checkpoint whose ``auto_map`` names code files
    next to it (as DeepSeek's do), with ``--trust-remote-code``: the code is not on this
    machine, which is an ``unknowns`` line, not an input error."""

    def test_local_auto_map_is_not_exit_2(self) -> None:
        """DeepSeek-V3's config.json with its local ``auto_map``, only config.json copied
        (the docs say weights are not needed): exit 0 or 1, never 2."""
        root = Path(tempfile.mkdtemp(prefix="dsv4-review-"))
        self.addCleanup(shutil.rmtree, root, True)
        config = json.loads((Path(DSV3) / "config.json").read_text())
        config["auto_map"] = {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                              "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}
        (root / "config.json").write_text(json.dumps(config))
        status, _, err = run_cli(
            "check", "--prefill", server("prefill", str(root), "--trust-remote-code"),
            "--decode", server("decode", str(root), "--trust-remote-code"), "--format", "json")
        self.assertIn(status, (0, 1), err)


class TestDoctorEntryPointName(GuardTestCase):
    """SGLang runs the guard through any entry point of its group that names the guard's
    function; doctor agrees with SGLang."""

    def test_guard_under_another_entry_point_name_is_ok(self) -> None:
        """Another distribution declares ``acme_guard = sglang_dsv4_guard.entry:activate``
        and ``SGLANG_PLUGINS=acme_guard``: SGLang's loader yields the guard, so doctor
        reports no loader problem."""
        import importlib

        import sglang.srt.plugins as host

        root = Path(tempfile.mkdtemp(prefix="dsv4-review-ep-"))
        self.addCleanup(shutil.rmtree, root, True)
        info = root / "acme_bundle-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-bundle\n"
                                       "Version: 1.0\n")
        (info / "entry_points.txt").write_text(
            "[sglang.srt.plugins]\nacme_guard = sglang_dsv4_guard.entry:activate\n")
        import sys

        sys.path.insert(0, str(root))
        self.addCleanup(sys.path.remove, str(root))
        importlib.invalidate_caches()
        old = os.environ.get("SGLANG_PLUGINS")
        os.environ["SGLANG_PLUGINS"] = "acme_guard"

        def restore() -> None:
            if old is None:
                os.environ.pop("SGLANG_PLUGINS", None)
            else:
                os.environ["SGLANG_PLUGINS"] = old
        self.addCleanup(restore)
        found = host.load_plugins_by_group(host.GENERAL_PLUGINS_GROUP)
        self.assertEqual(found["acme_guard"][0].__module__, "sglang_dsv4_guard.entry")
        _, out, _ = run_cli("doctor")
        self.assertNotIn("will not run", out)


if __name__ == "__main__":
    unittest.main()
