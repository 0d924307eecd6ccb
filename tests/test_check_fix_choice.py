"""Which fixes ``check --fix`` applies and how it reports them: the least invasive proven
edit, GPU counts kept, another model never chosen for the operator, unset variables and
its outcome said in JSON, a time budget that never loses the plain check, and reports
that say what a refused server's values are."""

from __future__ import annotations

import os
import re
import unittest
from unittest import mock

from check_helpers import DSV3, DSV4, GPT_OSS, LLAMA, check_json, codes, run_cli, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.offline.parse import parse_launch
from sglang_dsv4_guard.check.server.edit import typed_flags

register_cpu_ci(est_time=46, suite="stage-a-test-cpu")

NEXTN = "--speculative-algorithm NEXTN"
DP2 = "--tp-size 8 --dp-size 2 --enable-dp-attention"
DP4 = "--tp-size 8 --dp-size 4 --enable-dp-attention"


def _typed(line: str) -> dict[str, str | None]:
    return {field: value for field, (_, value) in typed_flags(line.split()).items()}


class TestLeastInvasiveFix(GuardTestCase):
    """Among proven fixes, ``check --fix`` applies the fewest edits on the fewest servers,
    and keeps each server's GPU count and features where it can."""

    def test_speculation_is_not_switched_on_for_a_server_that_did_not_ask(self) -> None:
        """NEXTN on the DeepSeek-V4 prefill only (refused, and the pair differs): removing
        the prefill's --speculative-algorithm fixes both findings, so the corrected decode
        gets no speculative algorithm."""
        _, doc = check_json(server("prefill", DSV4, NEXTN), server("decode", DSV4), "--fix")
        self.assertEqual(doc["fixed_check"]["exit_status"], 0, doc["fixed_check"])
        self.assertNotIn("speculative_algorithm", _typed(doc["fixed"]["decode"]))

    def test_attention_tp_is_matched_by_dp_size_keeping_gpu_counts(self) -> None:
        """Attention TP 4 against 2 with --tp-size 8 on both: the corrected lines keep
        --tp-size 8 on both servers (the attention-DP size changes instead)."""
        _, doc = check_json(server("prefill", GPT_OSS, DP2), server("decode", GPT_OSS, DP4),
                            "--fix")
        self.assertEqual(doc["fixed_check"]["exit_status"], 0, doc["fixed_check"])
        self.assertEqual([_typed(doc["fixed"][r])["tp_size"] for r in ("prefill", "decode")],
                         ["8", "8"])

    def test_attention_dp_of_one_drops_the_dp_flags(self) -> None:
        """Prefill attention TP 4 (--tp-size 8, DP 2) against decode attention TP 8: the
        prefill's GPU-count-keeping fix removes --dp-size and --enable-dp-attention
        rather than setting --dp-size 1 under DP attention."""
        _, doc = check_json(server("prefill", GPT_OSS, DP2),
                            server("decode", GPT_OSS, "--tp-size 8"), "--fix")
        [g006] = [f for f in doc["findings"] if f["code"] == "DSV4G006"]
        prefill = [f for f in g006["fixes"]
                   if all(e["server"] == "prefill" for e in f["edits"])
                   and "tp_size" not in " ".join(e["name"] for e in f["edits"])]
        self.assertTrue(prefill, g006["fixes"])
        self.assertEqual({(e["name"], e["remove"]) for e in prefill[0]["edits"]},
                         {("--dp-size", True), ("--enable-dp-attention", True)})

    def test_another_architecture_is_never_applied(self) -> None:
        """GPT-OSS against Llama (DSV4G024): ``--fix`` does not serve one model in place of
        the other; the lines keep their model paths and JSON says the warning was kept."""
        _, doc = check_json(server("prefill", GPT_OSS), server("decode", LLAMA), "--fix")
        self.assertIn("DSV4G024", codes(doc))
        self.assertIsNone(doc["fixed"])
        self.assertEqual(doc["fix_status"], "warnings_kept")


class TestFixOutcomeInJson(GuardTestCase):
    """``check --fix --format json`` says what it changed and what it concluded."""

    def test_an_unset_variable_is_listed(self) -> None:
        """The chosen fix unsets SGLANG_HACK_FLASHMLA_BACKEND on the decode: ``fixed``'s
        ``decode_unset`` names it."""
        _, doc = check_json(server("prefill", DSV4), server("decode", DSV4), "--fix",
                            "--decode-env", "SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton")
        self.assertEqual(doc["fixed"]["decode_unset"], ["SGLANG_HACK_FLASHMLA_BACKEND"])

    def test_nothing_to_fix_is_told_apart(self) -> None:
        """A pair with no findings: ``fix_status`` is ``nothing_to_fix``."""
        _, doc = check_json(server("prefill", GPT_OSS), server("decode", GPT_OSS), "--fix")
        self.assertEqual((doc["fixed"], doc["fix_status"]), (None, "nothing_to_fix"))

    def test_a_small_time_limit_keeps_the_plain_check(self) -> None:
        """With a time limit already spent, ``--fix`` re-runs nothing, still reports the
        plain check's findings, and says which budget stopped it."""
        with mock.patch.dict(os.environ, {"SGLANG_DSV4_GUARD_CHECK_TIMEOUT": "0.001"}):
            _, doc = check_json(server("prefill", GPT_OSS, DP2),
                                server("decode", GPT_OSS, DP4), "--fix")
        self.assertIn("DSV4G006", codes(doc))
        self.assertEqual(doc["fix_runs"]["runs"], 0)
        self.assertIn("SGLANG_DSV4_GUARD_CHECK_TIMEOUT", doc["fix_runs"]["budget"])


    def test_a_fix_left_untried_is_not_called_hopeless(self) -> None:
        """Stopped by the time limit before any re-run, no finding is told "no flag change
        fixes this" (its fixes were not tried); it says they are not proven."""
        with mock.patch.dict(os.environ, {"SGLANG_DSV4_GUARD_CHECK_TIMEOUT": "0.001"}):
            _, doc = check_json(server("prefill", GPT_OSS, DP2),
                                server("decode", GPT_OSS, DP4), "--fix")
        texts = [fix["text"] for f in doc["findings"] for fix in f["fixes"]
                 if fix["kind"] == "none"]
        self.assertTrue(texts and all(t.startswith("not proven") for t in texts), texts)


class TestRefusalReports(GuardTestCase):
    """What a DSV4G026 report says about its search and about the values it shows."""

    def test_the_fix_says_how_many_resolutions_found_it(self) -> None:
        """Each DSV4G026 flag fix names the number of resolutions its search ran."""
        _, doc = check_json(server("prefill", DSV4, NEXTN), server("decode", DSV4))
        texts = [fix["text"] for f in doc["findings"] if f["code"] == "DSV4G026"
                 for fix in f["fixes"] if fix["kind"] == "flags"]
        self.assertTrue(texts)
        self.assertTrue(all(re.search(r"found in \d+ resolution", t) for t in texts), texts)

    def test_the_same_refusal_on_both_servers_is_said(self) -> None:
        """Both servers type NEXTN: each DSV4G026 says the other server is refused the same
        way."""
        _, doc = check_json(server("prefill", DSV4, NEXTN), server("decode", DSV4, NEXTN))
        details = {f["subject"]: " ".join(f["details"]) for f in doc["findings"]
                   if f["code"] == "DSV4G026"}
        self.assertEqual(len(details), 2, details)
        self.assertTrue(all("same message" in d for d in details.values()), details)

    def test_a_pool_run_on_refused_flags_says_so(self) -> None:
        """The prefill's flags are refused: the text report's line for its pool run says
        the pools were built from the flags as parsed."""
        _, out, _ = run_cli("check", "--prefill", server("prefill", DSV4, NEXTN),
                            "--decode", server("decode", DSV4))
        line = next(t for t in out.splitlines() if t.startswith("prefill: SGLang's setup"))
        self.assertIn("as parsed", line)


class TestRefusalCounts(GuardTestCase):
    """A count SGLang's refusal names without a value is first tried at the release's own
    choice, not at 1."""

    def test_an_unvalued_count_takes_the_release_choice_first(self) -> None:
        """NEXTN on DeepSeek-V4 (refused; the search reaches EAGLE with top-k 1 and a bare
        assert naming --speculative-num-steps): the first fix's step count is the one
        SGLang's resolution picks itself when no count is typed (read from a DeepSeek-V3
        EAGLE line the release resolves; DeepSeek-V4 refuses EAGLE before picking)."""
        own = parse_launch("prefill", server("prefill", DSV3, "--speculative-algorithm EAGLE"),
                           {})
        self.assertIsNone(own.resolution_error)
        _, doc = check_json(server("prefill", DSV4, NEXTN), server("decode", DSV4))
        first = next(f for f in doc["findings"] if f["code"] == "DSV4G026")["fixes"][0]
        steps = [e["value"] for e in first["edits"] if e["name"] == "--speculative-num-steps"]
        self.assertEqual(steps, [str(own.get("speculative_num_steps"))], first)


class TestOptionalValueFlags(GuardTestCase):
    """A flag whose value is optional (``nargs='?'``) does not take a following flag."""

    def test_an_optional_value_flag_leaves_the_next_flag(self) -> None:
        """``--model-checksum --speculative-algorithm EAGLE``: the algorithm is read."""
        typed = _typed("--model-path /m --model-checksum --speculative-algorithm EAGLE")
        self.assertEqual(typed.get("speculative_algorithm"), "EAGLE")


if __name__ == "__main__":
    unittest.main()
