"""Property: on drawn failing launch pairs, ``check --fix``'s corrected lines pass ``check``
(exit 0), or each error left says no flag change fixes it; and every flag any fix names
is one the installed release's ``ServerArgs.add_cli_args`` parser accepts.

Run in-process on the installed release (few examples: each costs several resolutions);
the counts (fixed / no flag fix) are printed when the class ends.
"""

from __future__ import annotations

import sys
import unittest
from typing import Any, ClassVar

from check_helpers import DSV4, GPT_OSS, LLAMA, server
from helpers import GuardTestCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.prove import Lines, fix_check
from sglang_dsv4_guard.fixes import FixKind
from sglang_dsv4_guard.host.flags import accepts

register_cpu_ci(est_time=45, suite="stage-a-test-cpu")

SPECULATIVE = (None, "--speculative-algorithm NEXTN", "--speculative-algorithm EAGLE",
               "--speculative-algorithm EAGLE --speculative-eagle-topk 1 "
               "--speculative-num-steps 3 --speculative-num-draft-tokens 4",
               "--speculative-algorithm EAGLE --speculative-eagle-topk 1 "
               "--speculative-num-steps 1")
UNIFIED = {"SGLANG_HACK_FLASHMLA_BACKEND": "unified_kv_triton"}


@st.composite
def pairs(draw: Any) -> Lines:
    """A prefill/decode pair that differs in at least one flag these checks read."""
    model = draw(st.sampled_from([DSV4, GPT_OSS]))
    decode_model = draw(st.sampled_from([model, model, LLAMA if model == GPT_OSS else model]))
    extra = {role: [] for role in ("prefill", "decode")}
    for role in extra:
        page = draw(st.sampled_from([None, 16, 64]))
        if page:
            extra[role].append(f"--page-size {page}")
        tp = draw(st.sampled_from([1, 1, 2]))
        if tp > 1:
            extra[role].append(f"--tp-size {tp}")
    spec = draw(st.sampled_from(SPECULATIVE))
    side = draw(st.sampled_from(["prefill", "decode", "both"]))
    if spec:
        for role in (("prefill", "decode") if side == "both" else (side,)):
            extra[role].append(spec)
    backend = draw(st.sampled_from(["mori", "mori", "nixl"]))
    unified = model == DSV4 and draw(st.booleans())
    lines = Lines(server("prefill", model, " ".join(extra["prefill"])),
                  server("decode", decode_model, " ".join(extra["decode"]), backend=backend),
                  dict(UNIFIED) if unified else {}, {})
    return lines


class TestCheckFixProperty(GuardTestCase):
    """``check --fix`` fixes what a flag can fix, on the installed release."""

    counts: ClassVar[dict[str, int]] = {"drawn": 0, "failing": 0, "fixed": 0,
                                        "no_flag_fix": 0}

    @classmethod
    def tearDownClass(cls) -> None:
        from helpers import sglang_release

        print(f"check --fix property on SGLang {sglang_release()}: {cls.counts['drawn']} "
              f"drawn, {cls.counts['failing']} with findings, {cls.counts['fixed']} fixed "
              f"(check exit 0 on the corrected lines), {cls.counts['no_flag_fix']} with an "
              "error no flag change fixes", file=sys.__stderr__)
        super().tearDownClass()
        if cls.counts["drawn"] and not cls.counts["failing"]:
            raise AssertionError("no drawn pair had a finding: the property tested nothing")

    @settings(max_examples=12, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(pairs())
    def test_fixed_lines_pass_or_say_no_flag_fix(self, lines: Lines) -> None:
        """The corrected lines pass ``check``, or every error left is one the report says
        no flag change fixes; every flag of every fix is in the release's parser."""
        counts = type(self).counts
        counts["drawn"] += 1
        fixed = fix_check(lines)
        findings = fixed.result.report.findings
        named = [e.name for f in findings for fix in f.fixes for e in fix.edits if not e.env]
        self.assertEqual([n for n in named if not accepts(n)], [])
        if not findings:
            return
        counts["failing"] += 1
        if fixed.lines_result is not None and fixed.lines_result.exit_status == 0:
            counts["fixed"] += 1
            return
        left = fixed.lines_result.report if fixed.lines_result is not None else \
            fixed.result.report
        unfixed = {(f.code, f.subject) for f in findings
                   if any(x.kind is FixKind.NO_FLAG_FIX for x in f.fixes)}
        if fixed.lines_result is None and fixed.result.exit_status == 0:
            # warnings only and none fixed by a flag: each says no flag change fixes it
            self.assertLessEqual({(f.code, f.subject) for f in findings}, unfixed, lines)
            counts["no_flag_fix"] += 1
            return
        errors = [(f.code, f.subject) for f in left.findings if f.severity.value == "error"]
        self.assertTrue(errors and set(errors) <= unfixed, (lines, errors, unfixed))
        counts["no_flag_fix"] += 1


if __name__ == "__main__":
    unittest.main()
