"""``check`` takes a prefill/decode pair: a launch line without its PD role (no
``--disaggregation-mode``, ``null``, or the other role) is input it cannot judge, exit 2
with one line naming the line, the value it has and what is accepted; ``--fix`` never
offers an edit that removes a server's PD role."""

from __future__ import annotations

import json
import unittest

from check_helpers import LLAMA, run_cli, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host.flags import accepts

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

BARE = f"--model-path {LLAMA} --disaggregation-transfer-backend mooncake"


class TestPdRole(GuardTestCase):
    def refused(self, prefill: str, decode: str) -> str:
        status, out, err = run_cli("check", "--prefill", prefill, "--decode", decode)
        self.assertEqual((status, out), (2, ""), err)
        self.assertNotIn("Traceback", err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        return err.strip()

    def test_no_mode_on_either_line(self) -> None:
        """Two lines without --disaggregation-mode are no PD pair: exit 2 naming the
        prefill line, that it has none, and what it needs."""
        err = self.refused(BARE, BARE)
        self.assertIn("--prefill: no --disaggregation-mode", err)
        self.assertIn("--disaggregation-mode prefill", err)

    def test_null_mode(self) -> None:
        """``--disaggregation-mode null`` (SGLang's default, not a PD server) on the
        decode line: named with its value and what the decode line needs."""
        err = self.refused(server("prefill", LLAMA, backend="mooncake"),
                           f"{BARE} --disaggregation-mode null")
        self.assertIn("--decode: --disaggregation-mode is 'null'", err)
        self.assertIn("--disaggregation-mode decode", err)

    def test_both_prefill(self) -> None:
        """Two prefill lines: the decode line is named, with its value 'prefill'."""
        err = self.refused(server("prefill", LLAMA), server("prefill", LLAMA))
        self.assertIn("--decode: --disaggregation-mode is 'prefill'", err)
        self.assertIn("--disaggregation-mode decode", err)

    def test_both_decode(self) -> None:
        """Two decode lines: the prefill line is named, with its value 'decode'."""
        err = self.refused(server("decode", LLAMA), server("decode", LLAMA))
        self.assertIn("--prefill: --disaggregation-mode is 'decode'", err)
        self.assertIn("--disaggregation-mode prefill", err)

    def test_fix_never_removes_the_pd_role(self) -> None:
        """A decode SGLang refuses with "DWDP requires --disaggregation-mode null or
        prefill": no fix edits its --disaggregation-mode, and --fix's corrected lines (if
        any) keep both roles."""
        if not accepts("--dwdp-size"):  # 0.5.16-0.5.x: no DWDP, and no such refusal
            status, _, err = run_cli("check", "--prefill", server("prefill", LLAMA), "--decode",
                                     server("decode", LLAMA, "--dwdp-size 2"))
            self.assertEqual(status, 2)
            self.assertIn("--dwdp-size", err)
            return
        status, out, err = run_cli(
            "check", "--prefill", server("prefill", LLAMA, "--tp-size 2", backend="mooncake"),
            "--decode", server("decode", LLAMA, "--tp-size 2 --dwdp-size 2", backend="mooncake"),
            "--format", "json", "--fix")
        self.assertEqual(status, 1, err)
        doc = json.loads(out)
        self.assertIn("DSV4G026", [f["code"] for f in doc["findings"]])
        edited = [e for f in doc["findings"] for fix in f["fixes"] for e in fix["edits"]
                  if e["name"] == "--disaggregation-mode"]
        self.assertEqual(edited, [])
        if doc["fixed"] is not None:
            self.assertIn("--disaggregation-mode prefill", doc["fixed"]["prefill"])
            self.assertIn("--disaggregation-mode decode", doc["fixed"]["decode"])


if __name__ == "__main__":
    unittest.main()
