"""``check``'s fixes derived from the two launch lines, and ``check --fix`` proving them
on the installed release (its own parser, resolution and checks)."""

from __future__ import annotations

import unittest
from dataclasses import replace
from typing import Any

from check_helpers import (
    DSV4,
    DSV4_WINDOW64,
    GPT_OSS,
    LLAMA,
    check_json,
    codes,
    run_cli,
    server,
)
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.fixing import refusal
from sglang_dsv4_guard.check.offline.parse import parse_launch
from sglang_dsv4_guard.check.predict import run_check
from sglang_dsv4_guard.check.prove import _prove, fix_check
from sglang_dsv4_guard.check.rerun import Lines, Runner, errors_of
from sglang_dsv4_guard.check.server.edit import apply_edits, apply_env
from sglang_dsv4_guard.check.server.state_types import registered_state
from sglang_dsv4_guard.check.server.swa_layout import registered_layout
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.flags import accepts, flag_for_field

register_cpu_ci(est_time=53, suite="stage-a-test-cpu")

EAGLE1 = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
          "--speculative-num-draft-tokens 4")


def finding(doc: dict[str, Any], code: str) -> dict[str, Any]:
    """The first finding of ``code`` in a ``check`` document."""
    return next(f for f in doc["findings"] if f["code"] == code)


def edits(fix: dict[str, Any]) -> list[tuple[str, str, str | None, bool, bool]]:
    """A fix's edits as ``(server, name, value, remove, env)``."""
    return [(e["server"], e["name"], e["value"], e["remove"], e["env"]) for e in fix["edits"]]


class TestEditLines(GuardTestCase):
    """Edits are applied with the release's arity, keeping the launcher prefix."""

    def test_set_replaces_every_spelling_and_keeps_the_launcher(self) -> None:
        """``--page-size=16`` and a later ``--page-size 32`` become one ``--page-size 64``
        at the first place; ``python -m sglang.launch_server`` stays in front."""
        line = ("python -m sglang.launch_server --model-path /m --page-size=16 --tp-size 2 "
                "--page-size 32")
        self.assertEqual(apply_edits(line, [Edit("decode", "--page-size", "64")], "decode"),
                         "python -m sglang.launch_server --model-path /m --page-size 64 "
                         "--tp-size 2")

    def test_remove_takes_the_value_and_leaves_other_servers_alone(self) -> None:
        """Removing a flag that takes a value removes its value too; a switch is removed
        alone; an edit for the other server changes nothing."""
        line = "--model-path /m --speculative-algorithm EAGLE --enable-dp-attention --tp-size 2"
        done = apply_edits(line, [Edit("prefill", "--speculative-algorithm", remove=True),
                                  Edit("prefill", "--enable-dp-attention", remove=True),
                                  Edit("decode", "--tp-size", "8")], "prefill")
        self.assertEqual(done, "--model-path /m --tp-size 2")

    def test_env_edits_set_and_unset(self) -> None:
        """An env edit sets or unsets one variable of its server only."""
        env = {"A": "1", "B": "2"}
        self.assertEqual(apply_env(env, [Edit("decode", "A", remove=True, env=True),
                                         Edit("decode", "C", "x y", env=True),
                                         Edit("prefill", "B", remove=True, env=True)],
                                   "decode"), {"B": "2", "C": "x y"})


class TestDerivedFixes(GuardTestCase):
    """Each asymmetry's fixes are flag edits taken from the other server's values."""

    def test_g022_page_size_from_the_other_server(self) -> None:
        """Page sizes 16 and 32: the decode gets ``--page-size 16``, the prefill 32."""
        _, doc = check_json(server("prefill", GPT_OSS, "--page-size 16"),
                            server("decode", GPT_OSS, "--page-size 32"))
        fixes = finding(doc, "DSV4G022")["fixes"]
        self.assertEqual([(f["kind"], f["field"]) for f in fixes], [("flags", "page_size")] * 2)
        self.assertEqual([edits(f) for f in fixes],
                         [[("decode", "--page-size", "16", False, False)],
                          [("prefill", "--page-size", "32", False, False)]])

    def test_g022_never_sets_a_page_size_the_release_replaces(self) -> None:
        """A server whose resolution replaced its typed ``--page-size`` (DeepSeek-V4 from
        0.5.22: 64 resolves to 256) gets no ``--page-size`` edit; the other server does."""
        _, doc = check_json(server("prefill", DSV4, "--page-size 64"),
                            server("decode", GPT_OSS, "--page-size 16"))
        replaced = doc["derived"]["prefill"]["page_size"] != 64
        fixes = finding(doc, "DSV4G022")["fixes"]
        servers = {e[0] for f in fixes for e in edits(f)}
        self.assertEqual("prefill" in servers, not replaced)
        self.assertIn("decode", servers)

    def test_g023_backend_both_ways(self) -> None:
        """MORI against NIXL: the decode takes mori, or the prefill takes nixl."""
        _, doc = check_json(server("prefill", GPT_OSS), server("decode", GPT_OSS, backend="nixl"))
        self.assertEqual([edits(f) for f in finding(doc, "DSV4G023")["fixes"]],
                         [[("decode", "--disaggregation-transfer-backend", "mori", False, False)],
                          [("prefill", "--disaggregation-transfer-backend", "nixl", False,
                            False)]])

    def test_g024_model_path_both_ways(self) -> None:
        """Two checkpoints of one architecture: each server may take the other's
        ``--model-path``, said as advice without an edit (DSV4G024 is a warning, and a
        warning never gets a checkpoint change ``--fix`` applies)."""
        _, doc = check_json(server("prefill", DSV4), server("decode", DSV4_WINDOW64))
        fixes = finding(doc, "DSV4G024")["fixes"]
        self.assertEqual([(f["kind"], edits(f), f["cost"]) for f in fixes],
                         [("advice", [], None), ("advice", [], None)])
        self.assertIn(f"decode: --model-path {DSV4}", fixes[0]["text"])
        self.assertIn(f"prefill: --model-path {DSV4_WINDOW64}", fixes[1]["text"])

    def test_g024_draft_path_only_where_the_finding_compares_it(self) -> None:
        """Two checkpoints of one architecture, EAGLE on the decode only: the finding
        compares the model paths (not the draft's: one server has no draft), and so do the
        fixes: no edit of --speculative-draft-model-path on either server."""
        _, doc = check_json(server("prefill", DSV4), server("decode", DSV4_WINDOW64, EAGLE1))
        texts = [f["text"] for f in finding(doc, "DSV4G024")["fixes"]]
        self.assertEqual(len(texts), 2)
        self.assertIn(f"decode: --model-path {DSV4};", texts[0])
        self.assertIn(f"prefill: --model-path {DSV4_WINDOW64};", texts[1])
        self.assertNotIn("--speculative-draft-model-path", " ".join(texts))

    def test_g024_another_architecture_is_only_advice(self) -> None:
        """Checkpoints of different architectures: the fix is advice with no edit (which
        model to serve is the operator's choice, never a flag edit ``--fix`` applies)."""
        _, doc = check_json(server("prefill", GPT_OSS), server("decode", LLAMA))
        self.assertEqual([(f["kind"], edits(f)) for f in finding(doc, "DSV4G024")["fixes"]],
                         [("advice", [])])

    def test_g025_environment_variable(self) -> None:
        """The unified-KV variable on the prefill only: set it on the decode, or unset it
        on the prefill."""
        _, doc = check_json(server("prefill", DSV4), server("decode", DSV4),
                            "--prefill-env", "SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton")
        self.assertEqual([edits(f) for f in finding(doc, "DSV4G025")["fixes"]],
                         [[("decode", "SGLANG_HACK_FLASHMLA_BACKEND", "unified_kv_triton",
                            False, True)],
                          [("prefill", "SGLANG_HACK_FLASHMLA_BACKEND", None, True, True)]])

    def test_g020_copy_or_remove_the_speculative_flags(self) -> None:
        """Speculative decoding on the prefill only: every typed --speculative-* flag
        copied to the decode, or all of them removed from the prefill."""
        _, doc = check_json(server("prefill", DSV4, EAGLE1), server("decode", DSV4))
        copy, drop = finding(doc, "DSV4G020")["fixes"]
        self.assertEqual(sorted(e[1:3] for e in edits(copy)),
                         [("--speculative-algorithm", "EAGLE"),
                          ("--speculative-eagle-topk", "1"),
                          ("--speculative-num-draft-tokens", "4"),
                          ("--speculative-num-steps", "3")])
        self.assertEqual({e[0] for e in edits(copy)}, {"decode"})
        self.assertTrue(all(e[0] == "prefill" and e[3] for e in edits(drop)))
        self.assertEqual(len(edits(drop)), 4)

    def test_g021_the_other_servers_speculative_flags(self) -> None:
        """Draft tokens 4 against 2: the decode takes the prefill's flags (its own that
        the prefill lacks removed), or the prefill the decode's; the field is the count."""
        decode = server("decode", DSV4, "--speculative-algorithm EAGLE --speculative-eagle-topk 1 "
                                        "--speculative-num-steps 1")
        _, doc = check_json(server("prefill", DSV4, EAGLE1), decode)
        first, second = finding(doc, "DSV4G021")["fixes"]
        self.assertEqual(first["field"], "speculative_num_draft_tokens")
        self.assertIn(("decode", "--speculative-num-draft-tokens", "4", False, False),
                      edits(first))
        self.assertIn(("prefill", "--speculative-num-draft-tokens", None, True, False),
                      edits(second))

    def test_g006_tp_size_for_equal_attention_tp(self) -> None:
        """Prefill TP 8 with attention DP 2 (attention TP 4) and decode TP 8: first the
        attention-DP edits that keep each --tp-size (decode ``--attn-dp-size 2`` where the
        release has that flag, else ``--dp-size 2`` with ``--enable-dp-attention``; the
        prefill's DP flags removed), then the --tp-size ones (decode 4, prefill 16 = 8 x
        its DP 2)."""
        _, doc = check_json(server("prefill", GPT_OSS, "--tp-size 8 --dp-size 2 "
                                                       "--enable-dp-attention"),
                            server("decode", GPT_OSS, "--tp-size 8"))
        decode = ([("decode", "--attn-dp-size", "2", False, False)]
                  if flag_for_field("attn_dp_size") is not None
                  else [("decode", "--dp-size", "2", False, False),
                        ("decode", "--enable-dp-attention", None, False, False)])
        self.assertEqual([edits(f) for f in finding(doc, "DSV4G006")["fixes"]],
                         [decode,
                          [("prefill", "--dp-size", None, True, False),
                           ("prefill", "--enable-dp-attention", None, True, False)],
                          [("decode", "--tp-size", "4", False, False)],
                          [("prefill", "--tp-size", "16", False, False)]])


class TestRefusalFixes(GuardTestCase):
    """DSV4G026's fixes are the lines SGLang's resolution accepts, found from its message."""

    def test_refusal_fixes_are_lines_the_release_accepts(self) -> None:
        """NEXTN on DeepSeek-V4, which 0.5.23 refuses: every offered fix is a flag edit on
        the prefill whose edited line the release's resolution accepts."""
        prefill = server("prefill", DSV4, "--speculative-algorithm NEXTN")
        _, doc = check_json(prefill, server("decode", DSV4))
        if "DSV4G026" not in codes(doc):
            self.skipTest("this release accepts NEXTN for DeepSeek-V4")
        fixes = finding(doc, "DSV4G026")["fixes"]
        self.assertTrue(fixes and all(f["kind"] == "flags" for f in fixes), fixes)
        for fix in fixes:
            line = apply_edits(prefill, [Edit(**e) for e in fix["edits"]], "prefill")
            self.assertIsNone(parse_launch("prefill", line, {}).resolution_error, line)

    def test_eagle_with_top_k_one_is_found_for_deepseek_v4(self) -> None:
        """The search reaches EAGLE with top-k 1 (what 0.5.23 takes for DeepSeek-V4)
        from "Only EAGLE and DSPARK ...", through its follow-up refusals."""
        _, doc = check_json(server("prefill", DSV4, "--speculative-algorithm NEXTN"),
                            server("decode", DSV4))
        if "DSV4G026" not in codes(doc):
            self.skipTest("this release accepts NEXTN for DeepSeek-V4")
        found = [dict((e[1], e[2]) for e in edits(f)) for f in finding(doc, "DSV4G026")["fixes"]]
        message = finding(doc, "DSV4G026")["observations"][0]["value"]
        if "EAGLE" not in message:
            self.skipTest(f"this release's refusal names no EAGLE: {message}")
        self.assertTrue(any(f.get("--speculative-algorithm") == "EAGLE" for f in found), found)

    def test_budget_ran_out_is_said(self) -> None:
        """With a budget of one resolution, a refusal that needs more gets a no-flag-fix
        fix that says the budget ran out."""
        saved = refusal.MAX_RESOLUTIONS
        refusal.MAX_RESOLUTIONS = 1
        try:
            result = run_check(server("prefill", DSV4, "--speculative-algorithm EAGLE "
                                                       "--speculative-num-draft-tokens 3"),
                               server("decode", DSV4))
        finally:
            refusal.MAX_RESOLUTIONS = saved
        refused = [f for f in result.report.findings if f.code == "DSV4G026"]
        if not refused:
            self.skipTest("this release accepts these flags")
        kinds = [(fix.kind.value, "ran out" in fix.text) for fix in refused[0].fixes]
        self.assertIn(kinds, ([("none", True)], [("flags", False)]))


class TestCheckFix(GuardTestCase):
    """``check --fix``: fixes proven on the release, corrected lines that check accepts."""

    def test_fixed_lines_pass_check(self) -> None:
        """Page sizes and backends differ: every flag fix is proven, and the corrected
        lines in ``fixed`` pass ``check`` (exit 0, no findings)."""
        _, doc = check_json(server("prefill", GPT_OSS, "--page-size 16"),
                            server("decode", GPT_OSS, "--page-size 32", backend="nixl"), "--fix")
        self.assertEqual(codes(doc), ["DSV4G022", "DSV4G023"])
        self.assertTrue(all(f["proven"] for x in doc["findings"] for f in x["fixes"]))
        fixed = doc["fixed"]
        status, again = check_json(fixed["prefill"], fixed["decode"])
        self.assertEqual((status, codes(again)), (0, []))

    def test_a_fix_that_brings_a_new_error_is_not_proven(self) -> None:
        """Different transfer backends (DSV4G023): a fix that gives the decode MORI and
        also a speculative algorithm the release refuses for DeepSeek-V4 removes the
        finding but brings the decode's own refusal (DSV4G026), so it is not proven."""
        lines = Lines(server("prefill", DSV4), server("decode", DSV4, backend="nixl"))
        base = run_check(lines.prefill, lines.decode, derive=False)
        g023 = next(f for f in base.report.findings if f.code == "DSV4G023")
        bad = Fix(FixKind.FLAGS, "mori and BOGUS", edits=(
            Edit("decode", "--disaggregation-transfer-backend", "mori"),
            Edit("decode", "--speculative-algorithm", "BOGUS")))
        proved = _prove(replace(g023, fixes=(bad,)), Runner(lines, tuple),
                        errors_of(base.report))
        self.assertIs(proved.fixes[0].proven, False)

    def test_g005_own_draft_is_proven(self) -> None:
        """A draft checkpoint with another window (DSV4G005, SGLang's own check on the
        pools): dropping --speculative-draft-model-path on that server is proven, and the
        corrected lines have no findings."""
        draft = f"{EAGLE1} --speculative-draft-model-path {DSV4_WINDOW64}"
        _, doc = check_json(server("prefill", DSV4, draft), server("decode", DSV4, draft),
                            "--fix")
        self.assertEqual(codes(doc), ["DSV4G005", "DSV4G005"])
        for g005, role in zip(doc["findings"], ("prefill", "decode"), strict=True):
            self.assertEqual((edits(g005["fixes"][0]), g005["fixes"][0]["proven"]),
                             ([(role, "--speculative-draft-model-path", None, True, False)],
                              True))
        self.assertEqual(doc["fixed_check"], {"exit_status": 0, "findings": []})

    def test_no_flag_fix_is_said(self) -> None:
        """A refusal whose search has no budget left has no flag fix of its own; the other
        finding's fix clears it too, so it is credited with the corrected lines' changes
        (proven) and says nowhere that no flag change fixes it."""
        saved = refusal.MAX_RESOLUTIONS
        refusal.MAX_RESOLUTIONS = 0
        try:
            fixed = fix_check(Lines(server("prefill", DSV4, "--speculative-algorithm NEXTN"),
                                    server("decode", DSV4)))
        finally:
            refusal.MAX_RESOLUTIONS = saved
        refused = [f for f in fixed.result.report.findings if f.code == "DSV4G026"]
        if not refused:
            self.skipTest("this release accepts NEXTN for DeepSeek-V4")
        # the other finding's fix clears it too: credited, never "no flag change fixes this"
        self.assertEqual([(f.kind, f.proven) for f in refused[0].fixes], [(FixKind.FLAGS, True)])
        self.assertEqual(refused[0].fixes[0].edits, fixed.lines.applied if fixed.lines else ())
        self.assertIsNotNone(fixed.lines_result)
        assert fixed.lines_result is not None
        self.assertEqual(fixed.lines_result.exit_status, 0)

    def test_launcher_prefix_kept_and_text_matches_json(self) -> None:
        """A line given with ``python -m sglang.launch_server`` keeps it in the corrected
        line, and the text output prints the same shell-quoted lines as ``fixed``."""
        prefill = "python -m sglang.launch_server " + server("prefill", GPT_OSS, "--tp-size 8")
        decode = server("decode", GPT_OSS, "--tp-size 4")
        _, doc = check_json(prefill, decode, "--fix")
        self.assertTrue(doc["fixed"]["prefill"].startswith("python -m sglang.launch_server "))
        self.assertEqual(doc["fixed_check"], {"exit_status": 0, "findings": []})
        status, out, _ = run_cli("check", "--prefill", prefill, "--decode", decode, "--fix")
        self.assertEqual(status, 1)
        shown = {line.split(": ", 1)[0].strip(): line.split(": ", 1)[1]
                 for line in out.splitlines()[-2:]}
        self.assertEqual(shown, {"prefill": doc["fixed"]["prefill"],
                                 "decode": doc["fixed"]["decode"]})

    def test_nothing_to_fix_is_null(self) -> None:
        """An accepted pair: ``fixed`` is null."""
        status, doc = check_json(server("prefill", GPT_OSS), server("decode", GPT_OSS), "--fix")
        self.assertEqual((status, doc["fixed"]), (0, None))

    def test_every_fix_names_flags_the_release_parses(self) -> None:
        """Every flag named in any fix of a failing pair is in the release's parser."""
        _, doc = check_json(server("prefill", DSV4, "--speculative-algorithm NEXTN --page-size 64"),
                            server("decode", GPT_OSS, "--tp-size 4", backend="nixl"))
        named = [e["name"] for f in doc["findings"] for x in f["fixes"] for e in x["edits"]
                 if not e["env"]]
        self.assertTrue(named)
        self.assertEqual([n for n in named if not accepts(n)], [])


class TestIndependentRuns(GuardTestCase):
    """Re-running the check in one process does not carry state from an earlier run."""

    def test_run_a_then_b_equals_b_alone(self) -> None:
        """A DeepSeek-V4 pair with a refused draft, then a gpt-oss pair: the second
        document equals the same pair checked first (SGLang's resolution sets env vars
        and globals; check restores them). The process's probe caches start empty, as
        in a process whose first check this is, whatever ran before."""
        registered_state.cache_clear()
        registered_layout.cache_clear()
        b = (server("prefill", GPT_OSS, "--page-size 16"), server("decode", GPT_OSS))
        alone = run_check(*b).to_dict()
        run_check(server("prefill", DSV4, "--speculative-algorithm NEXTN"),
                  server("decode", DSV4, EAGLE1),
                  {"SGLANG_HACK_FLASHMLA_BACKEND": "unified_kv_triton"})
        self.assertEqual(run_check(*b).to_dict(), alone)
        again = run_check(server("prefill", DSV4, EAGLE1), server("decode", DSV4)).to_dict()
        run_check(*b)
        self.assertEqual(run_check(server("prefill", DSV4, EAGLE1),
                                   server("decode", DSV4)).to_dict(), again)


if __name__ == "__main__":
    unittest.main()
