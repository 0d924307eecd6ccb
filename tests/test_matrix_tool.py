"""tools/matrix.py decides whether CI is green: its parsing and judging, and matrix.txt."""

from __future__ import annotations

import sys
import tempfile
import unittest
from pathlib import Path

from helpers import GuardTestCase
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.releases import is_supported

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import matrix  # noqa: E402 - tools/ is not a package

STATISTICS = """\
============================ Hypothesis Statistics =============================
tests/test_mori.py::TestMoriParity::test_parity:

  - during reuse phase (0.10 seconds):
    - 3 passing, 0 failing, and 0 invalid test cases

  - during generate phase (8.69 seconds):
    - 1997 passing, 0 failing, and 0 invalid test cases

  - Stopped because settings.max_examples=2000


tests/test_autoshare.py::TestAutoshareHidesNothing::test_other_rejections_unchanged:

  - during generate phase (1.00 seconds):
    - 512 passing, 0 failing, and 3 invalid test cases

  - Stopped because nothing left to do
"""

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="a.T" name="test_g001_names_layers" time="0.1"/>
<testcase classname="a.T" name="test_g002_side" time="0.1"><failure message="x"/></testcase>
<testcase classname="a.T" name="test_g003_rings" time="0.1"><skipped message="y"/></testcase>
<testcase classname="a.T" name="test_passing_pair" time="0.1"/>
</testsuite></testsuites>"""


class TestMatrixFile(GuardTestCase):
    """matrix.txt is read strictly and covers what the project promises."""

    def _matrix_file(self, text: str) -> Path:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        path = Path(tmp.name, "matrix.txt")
        path.write_text(text)
        return path

    def test_project_matrix_meets_the_bar(self) -> None:
        """The matrix holds 0.5.16, 0.5.20 and 0.5.23, every release is in the supported
        range, and exactly one is the venv's own ('-')."""
        releases = matrix.read_matrix()
        versions = [r.version for r in releases]
        self.assertTrue({"0.5.16", "0.5.20", "0.5.23"} <= set(versions), versions)
        self.assertTrue(all(is_supported(Version(v)) for v in versions), versions)
        self.assertEqual(len(versions), len(set(versions)))
        self.assertEqual(sum(not r.overlay for r in releases), 1)

    def test_lines_are_parsed(self) -> None:
        """Comments and blank lines are ignored; '-' means no overlay; pins keep their text."""
        path = self._matrix_file("# head\n\n0.5.16  a==1 b>=1,<2  # pinned\n0.5.23  -\n")
        releases = matrix.read_matrix(path)
        self.assertEqual([(r.version, r.overlay) for r in releases],
                         [("0.5.16", ("a==1", "b>=1,<2")), ("0.5.23", ())])

    def test_bad_lines_name_the_line(self) -> None:
        """A bad release number, '-' mixed with pins, or no releases stop the run, saying where."""
        for text, message in (("0.5.x  -\n", "matrix.txt:1: '0.5.x' is not a release number"),
                              ("\n0.5.16  - a==1\n", ":2: '-' (no overlay) cannot be mixed"),
                              ("# nothing\n", "no releases listed")):
            with self.subTest(text=text):
                path = self._matrix_file(text)
                with self.assertRaises(SystemExit) as caught:
                    matrix.read_matrix(path)
                self.assertIn(message, str(caught.exception))


class TestJudging(GuardTestCase):
    """What the matrix reads back from pytest."""

    def test_examples_summed_over_phases(self) -> None:
        """Passing examples are summed per test over reuse and generate phases."""
        self.assertEqual(matrix._examples(STATISTICS),
                         {"test_mori::test_parity": 2000,
                          "test_autoshare::test_other_rejections_unchanged": 512})

    def test_only_passing_gnnn_tests_count(self) -> None:
        """A code counts as reproduced only through a passing test named test_gNNN_."""
        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp, "r.xml")
            junit.write_text(JUNIT)
            self.assertEqual(matrix._passing_codes(junit), {"DSV4G001"})


if __name__ == "__main__":
    unittest.main()
