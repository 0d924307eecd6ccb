"""No built-in fix is canned text: every fix the guard prints, at run time and in ``check``,
is derived from the finding's values, and none is one of ``explain``'s texts."""

from __future__ import annotations

import re
import unittest
from typing import Any

import sglang.srt.disaggregation.utils as utils
from check_helpers import DSV4, GPT_OSS, LLAMA, check_json, server
from helpers import GuardTestCase, guard_logs_off, outcome
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.codes import CODES
from sglang_dsv4_guard.findings import Finding, Severity
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.host.flags import accepts
from sglang_dsv4_guard.render import render_finding
from sglang_dsv4_guard.testing import PoolSpec, build_pair

register_cpu_ci(est_time=34, suite="stage-a-test-cpu")

MODEL_TARGET = PoolSpec(compression_ratios=(4, 128, 0))
# Runtime pairs SGLang rejects, one per kind of difference.
RUNTIME_CASES: dict[str, Any] = {
    "compressed draft": lambda: build_pair(MODEL_TARGET, PoolSpec(compression_ratios=(0, 4))),
    "mapping differs": lambda: build_pair(MODEL_TARGET, mapping="different"),
    "page size and window": lambda: build_pair(
        MODEL_TARGET, PoolSpec(page_size=64, sliding_window=64)),
    "unified on one side": lambda: build_pair(PoolSpec(unified=True), PoolSpec()),
}
# Launch pairs check finds problems in.
CHECK_CASES = {
    "page size and backend": (server("prefill", LLAMA, "--page-size 32", backend="nixl"),
                              server("decode", LLAMA, "--page-size 16", backend="mooncake")),
    "MORI attention TP": (server("prefill", GPT_OSS, "--tp-size 4"),
                          server("decode", GPT_OSS, "--tp-size 8")),
    "NEXTN on DeepSeek-V4": (server("prefill", DSV4, "--speculative-algorithm NEXTN"),
                             server("decode", DSV4)),
}
EXPLAIN_TEXTS = {text for info in CODES.values() for text in info.fix_derivation}


def _problems(code: str, fix: dict[str, Any]) -> list[str]:
    problems = []
    if fix["text"] in EXPLAIN_TEXTS:
        problems.append(f"{code}: explain's text used as a fix: {fix['text'][:80]}")
    problems += [f"{code}: flag {e['name']} not in the release's parser"
                 for e in fix["edits"] if not e["env"] and not accepts(e["name"])]
    if fix["text"].startswith("or "):  # alternatives are the renderer's, from Fix.need
        problems.append(f"{code}: a fix text says 'or' itself: {fix['text'][:80]}")
    # the algorithm, not SGLang's constant COMPRESS_RATIO_NEXTN_LAYER
    if re.search(r"\bNEXTN\b", fix["text"]) or any(e["value"] == "NEXTN" for e in fix["edits"]):
        problems.append(f"{code}: suggests NEXTN")
    return problems


class TestNoCannedFix(GuardTestCase):
    """Every built-in finding's fixes are derived, name only flags the release has, and
    never suggest NEXTN."""

    def test_runtime_fixes_are_derived(self) -> None:
        """Real setup_state_kv_args on real-constructor pools, guard on: each finding has
        fixes, none is explain's text, every flag is the release's."""
        self.install_guard("on", load_entry_points=False)
        for name, make in RUNTIME_CASES.items():
            with self.subTest(case=name), guard_logs_off():
                _, err = outcome(utils.setup_state_kv_args, *make())
                findings = getattr(err, "findings", ())
                self.assertTrue(findings, f"{name}: no report ({err!r})")
                for f in findings:
                    self.assertTrue(f.fixes, f"{f.code} has no fix")
                    problems = [p for fix in f.fixes for p in _problems(f.code, fix.to_dict())]
                    self.assertEqual(problems, [])

    def test_check_fixes_are_derived(self) -> None:
        """``check`` on launch pairs with problems: each finding has fixes, none is
        explain's text, every flag is the release's."""
        for name, (prefill, decode) in CHECK_CASES.items():
            with self.subTest(case=name):
                status, doc = check_json(prefill, decode)
                self.assertEqual(status, 1, name)
                for f in doc["findings"]:
                    self.assertTrue(f["fixes"], f"{f['code']} has no fix")
                    problems = [p for fix in f["fixes"] for p in _problems(f["code"], fix)]
                    self.assertEqual(problems, [])


class TestFixLabels(GuardTestCase):
    """Rendering says which fixes are alternatives, never "or" before nothing."""

    def test_a_lone_or_fix_reads_without_or(self) -> None:
        """The first fix left (its first alternative dropped: a value the release refuses)
        renders as ``fix: drop ...``, never "or" before nothing; the "or" is the renderer's
        (no fix text begins with it); a second fix of one need renders ``or fix:``."""
        finding = Finding("DSV4G020", Severity.WARNING, "s", "x", fixes=(
            Fix(FixKind.FLAGS, "drop speculative decoding", field="speculative"),
            Fix(FixKind.FLAGS, "copy the flags", field="speculative")))
        lines = render_finding(finding).splitlines()
        self.assertIn("    fix: drop speculative decoding", lines)
        self.assertIn("    or fix: copy the flags", lines)


if __name__ == "__main__":
    unittest.main()
