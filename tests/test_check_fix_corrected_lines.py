"""``check`` and ``check --fix`` as an operator uses them: corrected lines that say every
change, fixes that name only values the release accepts, and edits that find a flag however
the release's parser lets the operator spell it."""

from __future__ import annotations

import unittest

from check_helpers import DSV4, check_json, codes, run_cli, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.offline.parse import parse_launch
from sglang_dsv4_guard.check.server.edit import apply_edits, typed_flags
from sglang_dsv4_guard.fixes import Edit

register_cpu_ci(est_time=34, suite="stage-a-test-cpu")

UNIFIED = "SGLANG_HACK_FLASHMLA_BACKEND"


class TestCorrectedLinesSayEveryChange(GuardTestCase):
    """The corrected lines printed by ``check --fix`` are enough to relaunch from."""

    def test_an_unset_variable_is_printed_with_the_corrected_lines(self) -> None:
        """The decode runs with SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton and the
        prefill without it (DSV4G025); the chosen fix unsets it on the decode, so the
        corrected lines printed by ``check --fix`` name that variable for the decode (an
        operator who pastes only the printed lines would keep it set and relaunch the
        same failing pair)."""
        status, out, err = run_cli(
            "check", "--prefill", server("prefill", DSV4), "--decode", server("decode", DSV4),
            "--decode-env", f"{UNIFIED}=unified_kv_triton", "--fix")
        self.assertIn(status, (0, 1), err)
        corrected = out.split("check --fix: corrected lines", 1)
        self.assertEqual(len(corrected), 2, out)
        self.assertIn(UNIFIED, corrected[1])


class TestPlainCheckOffersOnlyAcceptedFlags(GuardTestCase):
    """Without ``--fix``, a fix still names only values the release's resolution accepts
    for this model."""

    def test_a_refused_value_is_not_copied_to_the_other_server(self) -> None:
        """The DeepSeek-V4 prefill types speculative flags the release's resolution refuses
        (DSV4G026; the first of a few candidates this release refuses) and the decode
        none: every fix that edits the decode leaves a decode line the same release
        accepts (the decode is never told to take the refused value)."""
        refused = None
        for extra in ("--speculative-algorithm NEXTN", "--speculative-algorithm BOGUS",
                      "--speculative-algorithm EAGLE --speculative-eagle-topk 4"):
            prefill = server("prefill", DSV4, extra)
            if parse_launch("prefill", prefill, {}).resolution_error is not None:
                refused = prefill
                break
        self.assertIsNotNone(refused, "no candidate is refused by this release")
        _, doc = check_json(str(refused), server("decode", DSV4))
        self.assertIn("DSV4G026", codes(doc))
        decode_edits = [tuple(Edit(**e) for e in fix["edits"] if e["server"] == "decode")
                        for f in doc["findings"] for fix in f["fixes"]]
        line = server("decode", DSV4)
        refusals = [(edits, parse_launch("decode", apply_edits(line, edits, "decode"), {})
                     .resolution_error) for edits in decode_edits if edits]
        self.assertEqual([r for r in refusals if r[1] is not None], [])


class TestEditsFindAbbreviatedFlags(GuardTestCase):
    """SGLang's parser accepts a unique prefix of a flag (argparse ``allow_abbrev``), so
    ``check`` reads ``--speculative-algo EAGLE``; its edits must find it too."""

    def test_typed_flags_reads_an_abbreviated_flag(self) -> None:
        """``--speculative-algo EAGLE`` is the typed ``speculative_algorithm`` (the value
        fix copies to the other server)."""
        typed = typed_flags(["--model-path", "/m", "--speculative-algo", "EAGLE"])
        self.assertEqual(typed.get("speculative_algorithm", (None, None))[1], "EAGLE")

    def test_removing_a_flag_removes_its_abbreviated_spelling(self) -> None:
        """Removing ``--speculative-algorithm`` from a line that spells it
        ``--speculative-algo EAGLE`` leaves no speculative algorithm on the line."""
        line = "--model-path /m --speculative-algo EAGLE"
        done = apply_edits(line, [Edit("prefill", "--speculative-algorithm", remove=True)],
                           "prefill")
        self.assertEqual(done, "--model-path /m")


if __name__ == "__main__":
    unittest.main()
