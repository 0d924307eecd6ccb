"""The failing pairs issue 32 reported, each with what ``check --fix`` now does (0.5.23
figures in the issue; every release of the matrix here).

Each test runs ``check --fix --format json`` on the installed release and asserts on the
data: the fixes' edits, their cost, the corrected lines and their own check. Every
document also passes :func:`_consistent`: a fix says which servers it changes, a warning
never gets a checkpoint edit, and no finding the corrected lines clear says "no flag
change fixes this".
"""

from __future__ import annotations

import shlex
import unittest
from typing import Any

from check_helpers import DSV4, GPT_OSS, LLAMA, run_cli, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host.flags import accepts

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

EAGLE = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")


def fix_json(prefill: str, decode: str) -> tuple[int, dict[str, Any] | str]:
    """``check --fix --format json``: the exit status and the document (exit 2: the
    error line)."""
    import json

    status, out, err = run_cli("check", "--prefill", prefill, "--decode", decode, "--fix",
                               "--format", "json")
    return status, (json.loads(out) if status in (0, 1) else err)


def findings(doc: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == code]


def edits(fix: dict[str, Any]) -> list[tuple[str, str, str | None, bool]]:
    return [(e["server"], e["name"], e["value"], e["remove"]) for e in fix["edits"]]


def flags(line: str) -> list[str]:
    return [t.split("=")[0] for t in shlex.split(line) if t.startswith("--")]


class _Examples(GuardTestCase):
    def run_fix(self, prefill: str, decode: str) -> dict[str, Any]:
        status, doc = fix_json(prefill, decode)
        self.assertIn(status, (0, 1), doc)
        assert isinstance(doc, dict)
        self._consistent(doc)
        return doc

    def _consistent(self, doc: dict[str, Any]) -> None:
        left = set((doc.get("fixed_check") or {}).get("findings") or [])
        for finding in doc["findings"]:
            for fix in finding["fixes"]:
                if fix["kind"] == "flags" and fix["edits"]:
                    self.assertEqual(sorted(fix["cost"]["servers"]),
                                     sorted({e["server"] for e in fix["edits"]}), fix)
                    if finding["severity"] != "error":
                        self.assertLess(fix["cost"]["tier"], 5, fix)
            said_none = any(f["kind"] == "none" for f in finding["fixes"])
            if said_none and doc.get("fixed") is not None:
                self.assertIn(finding["code"], left, finding)


class TestSwitchesSGLangNames(_Examples):
    """A typed switch SGLang's refusal names is removed (never turned on)."""

    def test_the_decode_offload_switch_is_removed(self) -> None:
        doc = self.run_fix(server("prefill", DSV4), server(
            "decode", DSV4, "--disaggregation-decode-enable-offload-kvcache"))
        [refused] = findings(doc, "DSV4G026")
        first = refused["fixes"][0]
        self.assertEqual((edits(first), first["proven"], first["cost"]["off"]),
                         ([("decode", "--disaggregation-decode-enable-offload-kvcache", None,
                            True)], True,
                          ["decode: --disaggregation-decode-enable-offload-kvcache"]))
        self.assertEqual(doc["fix_status"], "corrected")
        self.assertNotIn("--disaggregation-decode-enable-offload-kvcache",
                         flags(doc["fixed"]["decode"]))

    def test_kv_cache_sharding_is_removed_where_the_release_has_it(self) -> None:
        status, doc = fix_json(server("prefill", DSV4, "--enable-kv-cache-sharding"),
                               server("decode", DSV4))
        if not accepts("--enable-kv-cache-sharding"):  # 0.5.16-0.5.21: no such flag
            self.assertEqual(status, 2)
            self.assertIn("--enable-kv-cache-sharding", str(doc))
            return
        assert isinstance(doc, dict)
        self._consistent(doc)
        self.assertEqual(doc["fix_status"], "corrected")
        self.assertNotIn("--enable-kv-cache-sharding", flags(doc["fixed"]["prefill"]))
        self.assertEqual(doc["fix_cost"]["off"], ["prefill: --enable-kv-cache-sharding"])


class TestOneRefusalOnBothServers(_Examples):
    """The same refusal on both servers is fixed on both, jointly."""

    def test_mxfp8_is_removed_from_both(self) -> None:
        doc = self.run_fix(server("prefill", DSV4, "--kv-cache-dtype mxfp8"),
                           server("decode", DSV4, "--kv-cache-dtype mxfp8"))
        refused = findings(doc, "DSV4G026")
        if not refused:  # a release that accepts mxfp8 for DeepSeek-V4 as --device cuda
            self.assertNotIn("DSV4G026", (doc["fixed_check"] or {}).get("findings", []))
            return
        self.assertEqual(len(refused), 2, refused)
        self.assertEqual(doc["fix_status"], "corrected")
        for role in ("prefill", "decode"):
            self.assertNotIn("--kv-cache-dtype", flags(doc["fixed"][role]))
        self.assertEqual(sorted(doc["fix_cost"]["values"]),
                         ["decode: --kv-cache-dtype", "prefill: --kv-cache-dtype"])
        for finding in refused:
            self.assertTrue(any(f["proven"] for f in finding["fixes"]), finding)


class TestNothingNobodyAskedFor(_Examples):
    """The cheapest change that clears the errors, and nothing more."""

    def test_hisparse_over_nixl_moves_both_servers_to_mooncake_only(self) -> None:
        doc = self.run_fix(server("prefill", DSV4, backend="nixl"),
                           server("decode", DSV4, f"{EAGLE} --enable-hisparse", "nixl"))
        if doc["fix_status"] != "corrected":  # a release without the HiSparse rows
            self.assertEqual([f for f in doc["findings"] if f["severity"] == "error"], [])
            return
        self.assertEqual((doc["fix_cost"]["tier"], doc["fix_cost"]["on"],
                          doc["fix_cost"]["off"]), (2, [], []))
        prefill, decode = (shlex.split(doc["fixed"][r]) for r in ("prefill", "decode"))
        for argv in (prefill, decode):
            self.assertEqual(argv[argv.index("--disaggregation-transfer-backend") + 1],
                             "mooncake")
        self.assertIn("--enable-hisparse", decode)
        self.assertIn("--speculative-algorithm", decode)
        self.assertNotIn("--speculative-algorithm", prefill)

    def test_speculative_flags_go_with_the_algorithm(self) -> None:
        """Every fix that removes --speculative-algorithm removes the server's other
        --speculative-* flags too, and no corrected line keeps one without it."""
        typed = ("--speculative-algorithm NEXTN --speculative-eagle-topk 2 "
                 "--speculative-num-steps 3")
        doc = self.run_fix(server("prefill", DSV4), server("decode", DSV4, typed))
        removals = 0
        for finding in doc["findings"]:
            for fix in finding["fixes"]:
                for role in ("prefill", "decode"):
                    mine = [(e["name"], e["remove"]) for e in fix["edits"]
                            if e["server"] == role]
                    if ("--speculative-algorithm", True) in mine:
                        removals += 1
                        self.assertIn(("--speculative-eagle-topk", True), mine, fix)
                        self.assertIn(("--speculative-num-steps", True), mine, fix)
        self.assertGreater(removals, 0, doc["findings"])
        for line in (doc["fixed"] or {}).values():
            if isinstance(line, str) and "--speculative-algorithm" not in line:
                self.assertNotIn("--speculative-", line)


class TestSeveralErrors(_Examples):
    """Errors that a first change leaves or brings get fixes derived anew, round by round."""

    def test_five_errors_are_corrected(self) -> None:
        """Llama over NIXL with differing page sizes, KV dtypes and PP, a refused offload
        switch and (0.5.22+) KV cache sharding: corrected (the review's pair, which two
        rounds left refused)."""
        sharding = " --enable-kv-cache-sharding" if accepts("--enable-kv-cache-sharding") else ""
        doc = self.run_fix(
            server("prefill", LLAMA, "--page-size 16 --kv-cache-dtype fp8_e4m3 --tp-size 2 "
                   f"--pp-size 2{sharding}", "nixl"),
            server("decode", LLAMA, "--page-size 32 --kv-cache-dtype fp8_e5m2 --tp-size 2 "
                   "--pp-size 3 --disaggregation-decode-enable-offload-kvcache "
                   "--kv-cache-dtype mxfp8", "nixl"))
        self.assertGreaterEqual(len([f for f in doc["findings"] if f["severity"] == "error"]), 3)
        self.assertEqual((doc["fix_status"], doc["fixed_check"]["exit_status"]),
                         ("corrected", 0))
        self.assertNotIn("--disaggregation-decode-enable-offload-kvcache",
                         flags(doc["fixed"]["decode"]))


class TestGpuCounts(_Examples):
    """A fix that changes a GPU count says so, before and after."""

    def test_decode_pp_takes_the_prefills_or_one(self) -> None:
        """Decode PP 3 against the prefill's 2 (12 GPUs): the prefill's PP (12 -> 8) or
        none (12 -> 4), each saying so; no TP keeps 12 GPUs at PP 2 or 1 as a power of two
        (6, 12), so none is offered."""
        doc = self.run_fix(server("prefill", DSV4, "--tp-size 4 --pp-size 2"),
                           server("decode", DSV4, "--tp-size 4 --pp-size 3"))
        [g035] = findings(doc, "DSV4G035")
        priced = {tuple(edits(f)): f["cost"]["gpus"] for f in g035["fixes"] if f["edits"]}
        self.assertEqual(priced, {(("decode", "--pp-size", "2", False),): ["decode: 12 -> 8"],
                                  (("decode", "--pp-size", None, True),): ["decode: 12 -> 4"]})
        self.assertEqual(doc["fix_cost"]["tier"], 4)

    def test_decode_pp_and_tp_traded_to_keep_the_gpu_count(self) -> None:
        """Decode TP 4 x PP 4 against the prefill's PP 2 (16 GPUs): TP 8 x PP 2 keeps them
        (values only) and is applied, not PP 2 alone (16 -> 8), though that is fewer edits."""
        doc = self.run_fix(server("prefill", DSV4, "--tp-size 8 --pp-size 2", "mooncake"),
                           server("decode", DSV4, "--tp-size 4 --pp-size 4", "mooncake"))
        self.assertEqual(doc["fix_status"], "corrected")
        self.assertEqual((doc["fix_cost"]["gpus"], doc["fix_cost"]["tier"]), ([], 2))
        argv = shlex.split(doc["fixed"]["decode"])
        self.assertEqual((argv[argv.index("--tp-size") + 1], argv[argv.index("--pp-size") + 1]),
                         ("8", "2"))

    def test_mori_tp_3_and_2_keep_their_gpus_by_attention_dp(self) -> None:
        doc = self.run_fix(server("prefill", GPT_OSS, "--tp-size 3"),
                           server("decode", GPT_OSS, "--tp-size 2"))
        self.assertEqual(doc["fix_status"], "corrected")
        self.assertEqual((doc["fix_cost"]["gpus"], doc["fix_cost"]["tier"]), ([], 3))
        for role, tp in (("prefill", "3"), ("decode", "2")):
            argv = shlex.split(doc["fixed"][role])
            self.assertEqual(argv[argv.index("--tp-size") + 1], tp)
        [g006] = findings(doc, "DSV4G006")
        self.assertEqual(sorted(g006["fixes"][0]["cost"]["servers"]), ["decode", "prefill"])


if __name__ == "__main__":
    unittest.main()
