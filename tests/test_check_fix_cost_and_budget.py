"""``check --fix``'s edits and their cost: attention DP spelled as the release spells
it, a copied value the destination's resolution replaces never offered, a partial
correction called partial, removals ranked like switches, and every resolution of a
refusal's search counted against its budget."""

from __future__ import annotations

import unittest
from dataclasses import replace
from unittest import mock

from check_helpers import DSV4, GPT_OSS, LLAMA, check_json, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.child import fix_status
from sglang_dsv4_guard.check.fixing import refusal
from sglang_dsv4_guard.check.offline.parse import parse_launch
from sglang_dsv4_guard.check.prove import Fixed, fix_check
from sglang_dsv4_guard.check.rerun import Lines, cost
from sglang_dsv4_guard.check.server import pools
from sglang_dsv4_guard.findings import Finding, Severity
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.flags import flag_for_field

register_cpu_ci(est_time=34, suite="stage-a-test-cpu")

NEXTN = "--speculative-algorithm NEXTN"


def _g006_fixes(doc: dict) -> list[dict]:
    [g006] = [f for f in doc["findings"] if f["code"] == "DSV4G006"]
    return [fix for fix in g006["fixes"] if fix["kind"] == "flags"]


def _only(fixes: list[dict], role: str) -> list[dict]:
    return [f for f in fixes if f["edits"] and all(e["server"] == role for e in f["edits"])]


class TestAttentionDpSpelling(GuardTestCase):
    """Attention DP is set with the release's own flag for it."""

    def test_attention_dp_is_set_by_attn_dp_size_where_the_release_has_it(self) -> None:
        """Prefill attention TP 4 and decode attention TP 2 on --tp-size 8: one decode fix
        is exactly the release's attention-DP flag set to 2 (``--attn-dp-size 2`` where the
        release has it, else ``--dp-size 2`` beside the typed --enable-dp-attention)."""
        if flag_for_field("attn_dp_size") is not None:
            prefill, decode = "--tp-size 8 --attn-dp-size 2", "--tp-size 8 --attn-dp-size 4"
            wanted = [("--attn-dp-size", "2", False)]
        else:
            prefill = "--tp-size 8 --dp-size 2 --enable-dp-attention"
            decode = "--tp-size 8 --dp-size 4 --enable-dp-attention"
            wanted = [("--dp-size", "2", False)]
        _, doc = check_json(server("prefill", GPT_OSS, prefill), server("decode", GPT_OSS, decode))
        edits = [[(e["name"], e["value"], e["remove"]) for e in f["edits"]]
                 for f in _only(_g006_fixes(doc), "decode")]
        self.assertIn(wanted, edits)

    def test_dropping_dp_replicas_is_not_said_to_keep_the_gpu_count(self) -> None:
        """A decode with --dp-size 2 replicas and no attention DP (a release where that
        spelling means replicas): its attention-DP fix drops the replicas, and its text
        does not say it keeps the server's GPU count."""
        flag = flag_for_field("attn_dp_size")
        prefill = ("--tp-size 8 --attn-dp-size 2" if flag is not None
                   else "--tp-size 8 --dp-size 2 --enable-dp-attention")
        _, doc = check_json(server("prefill", GPT_OSS, prefill),
                            server("decode", GPT_OSS, "--tp-size 8 --dp-size 2"))
        dp_flag = "--attn-dp-size" if flag is not None else "--dp-size"
        fixes = [f for f in _only(_g006_fixes(doc), "decode")
                 if any(e["name"] == dp_flag for e in f["edits"])]
        if flag is None:  # before --attn-dp-size, --dp-size 2 is the attention DP wanted
            self.assertTrue(all(e["name"] != "--attn-dp-size" for f in _g006_fixes(doc)
                                for e in f["edits"]), _g006_fixes(doc))
            return
        self.assertTrue(fixes, _g006_fixes(doc))
        for fix in fixes:
            self.assertNotIn("(its GPU count)", fix["text"])


class TestCopiedValueReplaced(GuardTestCase):
    """A copied value the destination's resolution replaces is not offered."""

    def test_page_size_is_not_offered_to_a_server_that_resolves_its_own(self) -> None:
        """Llama prefill --page-size 64, DeepSeek-V4 decode (its page size resolved by the
        release): no fix sets the decode's --page-size when the decode line with it
        resolves another page size."""
        line = server("decode", DSV4, "--page-size 64")
        resolved = parse_launch("decode", line, {}).get("page_size")
        _, doc = check_json(server("prefill", LLAMA, "--page-size 64"), server("decode", DSV4))
        edits = [e for f in doc["findings"] for fix in f["fixes"] for e in fix["edits"]
                 if e["server"] == "decode" and e["name"] == "--page-size"]
        # offered exactly when the decode's line with it resolves to the value it sets
        self.assertEqual(bool(edits), resolved == 64, (resolved, edits))


class TestPartialCorrection(GuardTestCase):
    """Corrected lines whose own check still fails are called partial."""

    def test_lines_that_still_fail_are_partial(self) -> None:
        """``check --fix`` lines whose check exits 1 give ``fix_status`` ``partial``."""
        given = Lines(server("prefill", GPT_OSS, "--tp-size 8 --dp-size 2 --enable-dp-attention"),
                      server("decode", GPT_OSS, "--tp-size 8"))
        fixed = fix_check(given)
        self.assertEqual(fixed.result.exit_status, 1)
        still = replace(fixed, lines=given, lines_result=fixed.result)
        self.assertIsInstance(still, Fixed)
        self.assertEqual(fix_status(still), "partial")


class TestRemovalCost(GuardTestCase):
    """Removing a feature the operator typed is priced like switching one on: a feature."""

    def test_removing_a_typed_switch_counts_as_a_feature_change(self) -> None:
        """A fix removing the prefill's typed --enable-dp-attention turns attention DP off
        (and its --dp-size 2 then counts replicas: 8 GPUs become 16); adding --dp-size 2
        --enable-dp-attention to the decode turns it on."""
        lines = Lines(server("prefill", GPT_OSS, "--tp-size 8 --dp-size 2 --enable-dp-attention"),
                      server("decode", GPT_OSS, "--tp-size 8"))
        removal = cost((Edit("prefill", "--enable-dp-attention", remove=True),), lines)
        adding = cost((Edit("decode", "--dp-size", "2"), Edit("decode", "--enable-dp-attention")),
                      lines)
        self.assertEqual((removal.off, removal.on, removal.gpus),
                         (("prefill: attention DP",), (), ("prefill: 8 -> 16",)))
        self.assertEqual((adding.off, adding.on, adding.gpus, adding.tier),
                         ((), ("decode: attention DP",), (), 3))
        self.assertEqual(removal.tier, 4)
        if flag_for_field("attn_dp_size") is None:  # 0.5.16-0.5.21: no newer spelling
            return
        # the deprecated spelling respelled as --attn-dp-size: nothing the server runs changes
        respelled = cost((Edit("prefill", "--enable-dp-attention", remove=True),
                          Edit("prefill", "--dp-size", remove=True),
                          Edit("prefill", "--attn-dp-size", "2")), lines)
        self.assertEqual((respelled.off, respelled.on, respelled.gpus, respelled.tier),
                         ((), (), (), 1))


class TestRefusalBudget(GuardTestCase):
    """Every resolution a refusal's search runs is counted and bounded."""

    def test_every_resolution_is_counted(self) -> None:
        """NEXTN on DeepSeek-V4: the search's resolution count equals the number of
        times it ran SGLang's resolution (the release's own choice of a count included)."""
        line = server("prefill", DSV4, NEXTN)
        side = parse_launch("prefill", line, {})
        self.assertIsNotNone(side.resolution_error)
        with mock.patch.object(refusal, "parse_launch", wraps=parse_launch) as spy:
            found = refusal.search("prefill", line, {}, str(side.resolution_error), {})
        self.assertEqual(found.resolutions, spy.call_count)

    def test_a_search_out_of_budget_is_not_called_hopeless(self) -> None:
        """A refusal whose search ran out of resolutions says "not found" and the budget,
        never "no flag change fixes this" (a change may exist past it)."""
        line = server("prefill", DSV4, NEXTN)
        side = parse_launch("prefill", line, {})
        with mock.patch.object(refusal, "MAX_RESOLUTIONS", 1):
            fixes = refusal.refusal_fixes("prefill", side.argv, {}, str(side.resolution_error),
                                          ())
        self.assertEqual([f.kind for f in fixes], [FixKind.NO_FLAG_FIX])
        self.assertTrue(fixes[0].text.startswith("not found:"), fixes[0].text)
        self.assertIn("budget of 1 resolutions ran out", fixes[0].text)


class TestPoolRunEdits(GuardTestCase):
    """An edit a state check made for "this server" is for the pool run's server."""

    def test_this_server_becomes_the_pool_runs_role(self) -> None:
        """A finding of the decode's pool run whose fix edits "this server" (as a plug-in's
        state-check fix may) edits the decode once ``check`` takes it."""
        finding = Finding("DSV4G005", Severity.ERROR, "differ", "pools", fixes=(
            Fix(FixKind.FLAGS, "set", edits=(Edit("this server", "--page-size", "64"),)),))
        [edit] = pools._for_side("decode", finding).fixes[0].edits
        self.assertEqual(edit.server, "decode")


if __name__ == "__main__":
    unittest.main()
