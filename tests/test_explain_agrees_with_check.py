"""What ``explain`` says, what ``check`` reports and what ``check --fix`` applies agree,
because they read one fact each: a code's severity from the catalogue, a value's source
from whether the line typed it, and whether fixes are alternatives or steps from
``Fix.need``."""

from __future__ import annotations

import unittest
from typing import Any

from check_helpers import DSV4, GPT_OSS, LLAMA, check_json, run_cli, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.codes import CODES
from sglang_dsv4_guard.findings import Finding, Severity
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.render import render_finding

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

EAGLE1 = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
          "--speculative-num-draft-tokens 4")
_RANK = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
PAIRS = {
    "speculative on the decode only (DSV4G020)": (
        server("prefill", DSV4), server("decode", DSV4, EAGLE1)),
    "two transfer backends (DSV4G023)": (
        server("prefill", LLAMA, backend="mooncake"), server("decode", LLAMA)),
    "typed page sizes 16 and 32 (DSV4G022)": (
        server("prefill", LLAMA, "--page-size 16", "mooncake"),
        server("decode", LLAMA, "--page-size 32", "mooncake")),
    "page size 64 against the GPU's (DSV4G022, some GPU models only)": (
        server("prefill", LLAMA, "--page-size 64", "mooncake"),
        server("decode", LLAMA, backend="mooncake")),
    "MORI attention TP 2 against 1 (DSV4G006)": (
        server("prefill", GPT_OSS, "--tp-size 2"), server("decode", GPT_OSS)),
}


def _findings(doc: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == code]


class TestSeverityIsTheCatalogues(GuardTestCase):
    """A finding's severity is its catalogue entry's, which ``explain`` prints; lower only
    where the entry says when (``CodeInfo.milder``)."""

    def test_check_reports_the_catalogue_severity(self) -> None:
        """On each pair, every finding's severity is the catalogue's, or lower where the
        catalogue says when; the codes the pairs are for are all seen."""
        seen = set()
        for name, (prefill, decode) in PAIRS.items():
            with self.subTest(pair=name):
                _, doc = check_json(prefill, decode)
                for f in doc["findings"]:
                    seen.add(f["code"])
                    info = CODES[f["code"]]
                    severity = Severity(f["severity"])
                    self.assertTrue(severity is info.severity or (
                        info.milder and _RANK[severity] > _RANK[info.severity]),
                        (f["code"], severity, info.severity))
        self.assertLessEqual({"DSV4G006", "DSV4G020", "DSV4G022", "DSV4G023"}, seen)

    def test_explain_prints_the_catalogue_severity(self) -> None:
        """``explain CODE`` prints the catalogue's severity for every code."""
        for code, info in CODES.items():
            with self.subTest(code=code):
                status, out, _ = run_cli("explain", code)
                self.assertEqual(status, 0)
                self.assertIn(f"\nseverity: {info.severity.value}", out)


class TestSourcesSayDefaults(GuardTestCase):
    """A value the launch line did not type is the release's default, not a server flag."""

    def test_mori_layout_values_name_what_was_typed(self) -> None:
        """DSV4G006 on a prefill typed with --tp-size 2 only: its tp_size comes from the
        flag, its dp_size, enable_dp_attention and pp_size from the release's defaults."""
        _, doc = check_json(server("prefill", GPT_OSS, "--tp-size 2"), server("decode", GPT_OSS))
        [g006] = _findings(doc, "DSV4G006")
        sources = {o["name"]: o["source"] for o in g006["observations"]
                   if o["role"] == "prefill"}
        self.assertEqual(sources["tp_size"], "server flag --tp-size")
        for name in ("dp_size", "enable_dp_attention", "pp_size"):
            self.assertTrue(sources[name].startswith("the release's default"), sources)


class TestFixAppliesWhatExplainSays(GuardTestCase):
    """``explain DSV4G020``: check --fix lists copying and dropping speculative decoding,
    proven and priced, and applies neither to the warning."""

    def test_decode_only_eagle_is_listed_not_applied(self) -> None:
        """Speculative decoding typed on the decode only: the copy to the prefill is the
        first fix, proven, turning EAGLE on there; the drop turns it off on the decode;
        the lines are kept (``warnings_kept``)."""
        _, doc = check_json(server("prefill", DSV4), server("decode", DSV4, EAGLE1), "--fix")
        [g020] = _findings(doc, "DSV4G020")
        copy, drop = g020["fixes"][:2]
        self.assertEqual(({e["server"] for e in copy["edits"]}, copy["proven"],
                          copy["cost"]["on"], copy["cost"]["tier"]),
                         ({"prefill"}, True, ["prefill: speculative decoding"], 3))
        self.assertEqual((drop["cost"]["off"], drop["cost"]["tier"]),
                         (["decode: speculative decoding"], 3))
        self.assertEqual((doc["fix_status"], doc["fixed"]), ("warnings_kept", None))


class TestAlternativesAndSteps(GuardTestCase):
    """``Fix.need`` says whether a finding's fixes are alternatives or steps, in the JSON
    and in the text."""

    def test_one_servers_page_size_or_the_others_are_alternatives(self) -> None:
        """DSV4G022's two fixes (either server takes the other's page size) share one
        need: alternatives."""
        _, doc = check_json(server("prefill", LLAMA, "--page-size 16", "mooncake"),
                            server("decode", LLAMA, "--page-size 32", "mooncake"))
        [g022] = _findings(doc, "DSV4G022")
        self.assertEqual([f["need"] for f in g022["fixes"]], ["", ""])

    def test_fields_of_two_needs_render_as_steps(self) -> None:
        """Fixes naming two needs are steps (each needed), the second fix of one need its
        alternative; fixes with one need are alternatives across fields."""
        steps = Finding("X001", Severity.ERROR, "s", "s", fixes=(
            Fix(FixKind.CODE, "a", field="page_size", need="page_size"),
            Fix(FixKind.CODE, "b", field="page_size", need="page_size"),
            Fix(FixKind.CODE, "c", field="window", need="window")))
        self.assertEqual([line.split(":")[0].strip() for line in
                          render_finding(steps).splitlines()[1:]],
                         ["fix (step 1 of 2) [page_size]", "or fix (step 1 of 2) [page_size]",
                          "fix (step 2 of 2) [window]"])
        either = Finding("X001", Severity.ERROR, "s", "s", fixes=(
            Fix(FixKind.CODE, "a", field="pp_size"), Fix(FixKind.CODE, "b", field="tp_size")))
        self.assertEqual([line.split(":")[0].strip() for line in
                          render_finding(either).splitlines()[1:]],
                         ["fix [pp_size]", "or fix [tp_size]"])


if __name__ == "__main__":
    unittest.main()
