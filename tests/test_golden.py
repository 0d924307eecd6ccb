"""Golden renderings: the text an operator reads for a fixed pair, compared with a committed
file under ``tests/golden/``. Object ids, data pointers, the SGLang release and the calling
module are normalised; everything else must match byte for byte."""

from __future__ import annotations

import re
import unittest
from pathlib import Path
from typing import Any

import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, guard_logs_off, outcome
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.testing import PoolSpec, build_pair

register_cpu_ci(est_time=32, suite="stage-a-test-cpu")

GOLDEN = Path(__file__).parent / "golden"

_NORMALISE = (
    (re.compile(r"id=0x[0-9a-f]+"), "id=0x<id>"),
    (re.compile(r"data_ptr=0x[0-9a-f]+"), "data_ptr=0x<ptr>"),
    (re.compile(r"\(caller [^,]+, sglang [0-9.]+(\.post\d+)?,"), "(caller <caller>, sglang <release>,"),
    # derived fixes name the release and the lines that called or registered
    (re.compile(r"SGLang \d+\.\d+\.\d+(\.post\d+)?"), "SGLang <release>"),
    (re.compile(r"(registered by|at) /\S+\.py:\d+"), r"\1 <file>:<line>"),
)


def normalise(text: str) -> str:
    """The rendering with run-dependent values replaced by placeholders."""
    for pattern, placeholder in _NORMALISE:
        text = pattern.sub(placeholder, text)
    return text.rstrip("\n") + "\n"


# A model-like target: DeepSeek-V4's compressed layers (C4, C128) and an SWA-only one, so
# no case looks like pools passed in swapped order (a one-layer, ratio-0 target does).
_MODEL_RATIOS = (4, 128, 0)

# name -> the pair; each pair's rendering is the same on every release in the matrix.
CASES: dict[str, Any] = {
    "g001_g002_unified_and_compressed_draft": lambda: build_pair(
        PoolSpec(compression_ratios=_MODEL_RATIOS, unified=True),
        PoolSpec(compression_ratios=(0, 4))),
    "g004_mapping_differs": lambda: build_pair(
        PoolSpec(compression_ratios=_MODEL_RATIOS), mapping="different"),
    "g001_twenty_layers_capped": lambda: build_pair(
        PoolSpec(compression_ratios=_MODEL_RATIOS),
        PoolSpec(compression_ratios=tuple([4] * 20))),
}


def render_case(name: str) -> str:
    """The normalised error text SGLang's wrapped function raises for case ``name``."""
    with guard_logs_off():
        _, err = outcome(utils.setup_state_kv_args, *CASES[name]())
    assert isinstance(err, DSV4GuardError), f"{name}: expected DSV4GuardError, got {err!r}"
    return normalise(str(err))


class TestGoldenRenderings(GuardTestCase):
    """The rendered report for fixed pairs matches the committed golden files."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)

    def test_renderings_match_golden_files(self) -> None:
        """Each case's full error text (SGLang's line, then the report) equals its golden
        file; a change to wording, order, alignment or capping shows up here as a diff."""
        for name in CASES:
            with self.subTest(case=name):
                golden = GOLDEN / f"{name}.txt"
                self.assertTrue(golden.is_file(), f"missing {golden}")
                text = render_case(name)
                self.assertEqual(text, golden.read_text())
                # every finding prints its when: line (the README promises one for each)
                self.assertEqual(len(re.findall(r"^    when: ", text, re.M)),
                                 len(re.findall(r"^\[DSV4G\d+\] ", text, re.M)))

    def test_normalisation_keeps_what_matters(self) -> None:
        """The placeholders replace only ids, pointers, caller and release: two renderings
        of different pairs still differ after normalising."""
        self.assertNotEqual(render_case("g004_mapping_differs"),
                            render_case("g001_twenty_layers_capped"))
        self.assertEqual(normalise("(caller x.y, sglang 0.5.16, mode on) id=0xabc"),
                         "(caller <caller>, sglang <release>, mode on) id=0x<id>\n")
        self.assertEqual(normalise("in SGLang 0.5.23 registered by /a/b.py:12 (f)"),
                         "in SGLang <release> registered by <file>:<line> (f)\n")


if __name__ == "__main__":
    unittest.main()
