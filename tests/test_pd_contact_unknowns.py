"""``check``'s first-contact rows judge only values it knows: the KV cache dtype a
checkpoint's quantization config chooses is read with the release's own quant-config
class, and a server whose flags SGLang's resolution did not resolve has its
resolution-decided values unknown (one ``unknowns`` line), never its parser defaults."""

from __future__ import annotations

import os
import unittest
from typing import Any

from check_helpers import DATA, DSV4, LLAMA, check_json, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.offline.parse import offline_env
from sglang_dsv4_guard.check.server.pools import published_server_args

register_cpu_ci(est_time=39, suite="stage-a-test-cpu")

LLAMA_FP8_KV = os.path.join(DATA, "llama_fp8_kv")  # ModelOpt FP8 weights and FP8 KV cache
# An FP8 config whose activation scheme the release's Fp8Config refuses.
LLAMA_FP8_REFUSED = os.path.join(DATA, "llama_fp8_refused")
CONTACT_CODES = ("DSV4G022", "DSV4G030", "DSV4G031")
LAYOUT = "SGLANG_DSV4_KV_LAYOUT"


def found(doc: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == code]


def _dsv4_check(*env: str) -> tuple[int, dict[str, Any]]:
    line = {r: server(r, DSV4, "--tp-size 8", backend="mooncake") for r in ("prefill", "decode")}
    return check_json(line["prefill"], line["decode"], *env)


def _dsv4_unknowns(*env: str) -> list[str]:
    return [u for u in _dsv4_check(*env)[1]["unknowns"] if LAYOUT in u]


def _sglang_says(env: dict[str, str]) -> str | None:
    """What SGLang's real select_dsv4_kv_layout raises in ``env`` on this machine (a
    dummy runtime context published, as a server's would be), ``""`` when it returns;
    ``None`` on a release without the selector."""
    from sglang.srt.mem_cache import deepseek_v4_memory_pool as pool

    select = getattr(pool, "select_dsv4_kv_layout", None)
    if select is None:
        return None
    with offline_env(env), published_server_args(None):
        try:
            select()
        except (AssertionError, ValueError) as exc:
            return str(exc)
    return ""


class TestDeepSeekV4KvLayoutEnv(GuardTestCase):
    def test_unset_layout_is_the_release_default_not_auto(self) -> None:
        """SGLANG_DSV4_KV_LAYOUT unset reads as the release's default (v4 where the
        variable exists), which gives the V4 layout on every GPU: no 'auto ... depends on
        the GPU' line."""
        self.assertEqual([u for u in _dsv4_unknowns() if "=auto" in u], [])

    def test_a_value_sglang_refuses_everywhere_is_an_error(self) -> None:
        """A layout value SGLang's select_dsv4_kv_layout asserts against on every machine
        (0.5.21+) is DSV4G047, an error at start-up with SGLang's own message (the real
        function, run here in that environment, raises the same), never GPU-dependent;
        the first-contact row's line says DSV4G031 is not judged. 0.5.16 - 0.5.20 have no
        selector: no DSV4G047."""
        expected = _sglang_says({LAYOUT: "nonsense"})
        status, doc = _dsv4_check("--prefill-env", f"{LAYOUT}=nonsense")
        lines = [u for u in doc["unknowns"] if LAYOUT in u]
        self.assertFalse(any("depends on the GPU" in u for u in lines), lines)
        if expected is None:  # no selector in this release: the variable is not read
            self.assertEqual(found(doc, "DSV4G047"), [])
            return
        (finding,) = found(doc, "DSV4G047")
        self.assertEqual((status, finding["severity"]), (1, "error"))
        self.assertEqual(finding["host_message"], expected)
        self.assertIn("nonsense", finding["observations"][0]["value"])
        self.assertIn("at start-up", finding["when"])
        self.assertIn("v4", finding["details"][0])
        self.assertIn("prefill", finding["subject"])

    def test_values_sglang_accepts_are_no_error(self) -> None:
        """Near misses: V4 (SGLang lowercases it), auto, and v41 (which needs an SM100
        GPU: GPU-dependent, an unknowns line on 0.5.23, never DSV4G047); SGLang's real
        selector refuses none of them on every machine."""
        for value in ("V4", "auto", "v41"):
            said = _sglang_says({LAYOUT: value})
            self.assertFalse(said and said.startswith("unknown"), said)
            _, doc = _dsv4_check("--decode-env", f"{LAYOUT}={value}")
            self.assertEqual(found(doc, "DSV4G047"), [], value)

    def test_the_fix_is_proven(self) -> None:
        """``check --fix``: the decode's refused value becomes the prefill's (accepted by
        SGLang's selector), or is unset; each fix proven, the corrected pair exits 0."""
        if _sglang_says({LAYOUT: "nonsense"}) is None:
            return  # no selector: nothing to fix (asserted above)
        _, doc = _dsv4_check("--prefill-env", f"{LAYOUT}=v4", "--decode-env",
                             f"{LAYOUT}=nonsense", "--fix")
        fixes = found(doc, "DSV4G047")[0]["fixes"]
        self.assertEqual([(e["server"], e["name"], e["value"], e["remove"])
                          for f in fixes for e in f["edits"]],
                         [("decode", LAYOUT, "v4", False), ("decode", LAYOUT, None, True)])
        self.assertTrue(all(f["proven"] for f in fixes))
        self.assertEqual((doc["fix_status"], doc["fixed_check"]["exit_status"]),
                         ("corrected", 0))
        self.assertIn(doc["fixed"]["decode_env"], ({LAYOUT: "v4"}, {}))


class TestCheckpointKvCacheDtype(GuardTestCase):
    def test_checkpoint_fp8_kv_matches_an_explicit_fp8_decode(self) -> None:
        """A checkpoint whose config.json quantizes the KV cache to FP8 publishes
        fp8_e4m3 under the default --kv-cache-dtype auto (the release's quant-config class
        read from config.json): a decode typing fp8_e4m3 passes first contact."""
        status, doc = check_json(server("prefill", LLAMA_FP8_KV, backend="mooncake"),
                                 server("decode", LLAMA_FP8_KV, "--kv-cache-dtype fp8_e4m3",
                                        backend="mooncake"))
        self.assertEqual((status, found(doc, "DSV4G030")), (0, []))

    def test_checkpoint_fp8_kv_against_bf16_decode_shows_fp8(self) -> None:
        """The same prefill against a decode typing bf16 is DSV4G030 with the prefill's
        value fp8_e4m3, named as coming from the checkpoint's quantization config."""
        _, doc = check_json(server("prefill", LLAMA_FP8_KV, backend="mooncake"),
                            server("decode", LLAMA_FP8_KV, "--kv-cache-dtype bf16",
                                   backend="mooncake"))
        (finding,) = found(doc, "DSV4G030")
        prefill = next(o for o in finding["observations"] if o["role"] == "prefill")
        self.assertEqual(prefill["value"], "fp8_e4m3")
        self.assertIn("quantization_config", prefill["source"])

    def test_unreadable_quant_config_is_unknown(self) -> None:
        """A quantization config the release's own class refuses to build leaves the KV
        cache dtype string unknown: no DSV4G030 against a bf16 decode, and an unknowns
        line naming the prefill and the row."""
        _, doc = check_json(server("prefill", LLAMA_FP8_REFUSED, backend="mooncake"),
                            server("decode", LLAMA_FP8_REFUSED, "--kv-cache-dtype bf16",
                                   backend="mooncake"))
        self.assertEqual(found(doc, "DSV4G030"), [])
        lines = [u for u in doc["unknowns"] if "DSV4G030 was not judged" in u]
        self.assertEqual(len(lines), 1, doc["unknowns"])
        self.assertTrue(lines[0].startswith("prefill: "), lines[0])


class TestUnresolvedServer(GuardTestCase):
    def test_refused_server_defaults_not_judged(self) -> None:
        """A DeepSeek-V4 prefill SGLang's resolution refuses (NEXTN) against a plain
        DeepSeek-V4 decode (resolved: fp8_e4m3, page 256): only DSV4G026, no first-contact
        finding on the prefill's parser defaults."""
        _, doc = check_json(server("prefill", DSV4, "--speculative-algorithm NEXTN",
                                   backend="mooncake"),
                            server("decode", DSV4, backend="mooncake"))
        self.assertEqual(found(doc, "DSV4G026")[0]["subject"], "prefill server flags")
        self.assertEqual([f["code"] for f in doc["findings"] if f["code"] in CONTACT_CODES],
                         [])

    def test_refused_server_gets_no_page_size_warning(self) -> None:
        """A DeepSeek-V4 prefill SGLang's resolution refuses (NEXTN) against a Llama
        decode (page size 1): DSV4G026, and no DSV4G022 warning built on the refused
        server's unresolved page size, which check does not know (its unknowns line says
        DSV4G022 was not judged)."""
        _, doc = check_json(server("prefill", DSV4, "--speculative-algorithm NEXTN",
                                   backend="mooncake"),
                            server("decode", LLAMA, backend="mooncake"))
        self.assertIn("DSV4G026", [f["code"] for f in doc["findings"]])
        self.assertEqual(found(doc, "DSV4G022"), [])

    def test_refused_server_one_unknowns_line(self) -> None:
        """The same pair says, in one unknowns line for the prefill, that its values only
        SGLang's resolution decides are unknown and which rows were not judged on them."""
        _, doc = check_json(server("prefill", DSV4, "--speculative-algorithm NEXTN",
                                   backend="mooncake"),
                            server("decode", DSV4, backend="mooncake"))
        lines = [u for u in doc["unknowns"] if u.startswith("prefill: SGLang's resolution")]
        self.assertEqual(len(lines), 1, doc["unknowns"])
        self.assertIn("DSV4G030", lines[0])
        self.assertEqual([u for u in doc["unknowns"] if "not derived; those conditions" in u],
                         [])

    def test_machine_refusal_defaults_not_judged(self) -> None:
        """A Llama prefill whose resolution fails only on this machine (trtllm_mha needs a
        Hopper or Blackwell GPU) against a decode typing fp8_e4m3: the prefill's KV cache
        dtype is unknown, so no DSV4G030 on its parser default 'auto', and one unknowns
        line for the prefill says so. (Where this release resolves the prefill here, its
        'auto' is known and DSV4G030 is SGLang's verdict.)"""
        _, doc = check_json(server("prefill", LLAMA, "--attention-backend trtllm_mha",
                                   backend="mooncake"),
                            server("decode", LLAMA, "--kv-cache-dtype fp8_e4m3",
                                   backend="mooncake"))
        refused_here = any(u.startswith("prefill: SGLang's resolution of these flags failed "
                                        "on this machine") for u in doc["unknowns"])
        if not refused_here:
            self.assertEqual(len(found(doc, "DSV4G030")), 1, doc["unknowns"])
            return
        self.assertEqual(found(doc, "DSV4G030"), [])
        lines = [u for u in doc["unknowns"]
                 if u.startswith("prefill: SGLang's resolution did not complete")]
        self.assertEqual(len(lines), 1, doc["unknowns"])
        self.assertIn("DSV4G030", lines[0])


if __name__ == "__main__":
    unittest.main()
