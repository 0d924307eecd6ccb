"""tools/matrix.py decides whether CI is green: its parsing and judging, and matrix.txt."""

from __future__ import annotations

import argparse
import ast
import contextlib
import sys
import sysconfig
import tempfile
import threading
import unittest
import unittest.mock
from concurrent.futures import CancelledError
from pathlib import Path

import produced_codes
from helpers import GuardTestCase
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host.judgement import load_known
from sglang_dsv4_guard.host.releases import is_supported

register_cpu_ci(est_time=43, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import durations  # noqa: E402
import judging  # noqa: E402
import matrix  # noqa: E402 - tools/ is not a package
import release_env  # noqa: E402
import sglang_ci  # noqa: E402
import suite  # noqa: E402

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
<testcase classname="tests.test_parity_property.TestParity" name="test_guard_agrees_with_sglang"
 time="0.1"/>
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
        """The matrix holds every release the guard knows (digests.json, 0.5.16 to
        0.5.23), only those, and exactly one is the venv's own ('-')."""
        releases = matrix.read_matrix()
        versions = [r.version for r in releases]
        self.assertEqual([Version(v) for v in versions], list(load_known()), versions)
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
        self.assertEqual(release_env.examples_drawn(STATISTICS),
                         {"test_mori::TestMoriParity::test_parity": 2000,
                          "test_autoshare::TestAutoshareHidesNothing::"
                          "test_other_rejections_unchanged": 512})

    def test_same_test_name_in_two_classes_kept_apart(self) -> None:
        """Two classes' same-named property tests are counted separately, not the later
        one overwriting the earlier."""
        twice = STATISTICS + STATISTICS.replace("TestMoriParity", "TestMoriOther").replace(
            "1997 passing", "10 passing")
        counts = release_env.examples_drawn(twice)
        self.assertEqual((counts["test_mori::TestMoriParity::test_parity"],
                          counts["test_mori::TestMoriOther::test_parity"]), (2000, 13))

    def _judge(self, log: str, codes: str, profile: str = "ci") -> release_env.Result:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        junit, codes_file = Path(tmp.name, "r.xml"), Path(tmp.name, "r.codes")
        junit.write_text(JUNIT)
        codes_file.write_text(codes)
        result = release_env.Result(matrix.Release("0.5.23", (), "0.5.23 -"))
        judging.judge(result, junit, log, profile)
        judging.judge_codes(result, judging.produced_codes(codes_file))
        return result

    def test_a_left_out_test_counts_with_what_it_produced_where_it_ran(self) -> None:
        """make test: a release's codes are its own runs' and, for each test it left out,
        that test's on the release that ran it; a left-out test that produced nothing
        there adds nothing."""
        release = matrix.Release("0.5.16", ("x",), "0.5.16 x")
        result = release_env.Result(release, covered={"tests/a.py::T::test_y": "0.5.23",
                                                 "tests/a.py::T::test_z": "0.5.23"})
        codes = {"0.5.16": {"tests/a.py::T::test_x": {"DSV4G001"}},
                 "0.5.23": {"tests/a.py::T::test_y": {"DSV4G006"},
                            "tests/a.py::T::test_w": {"DSV4G002"}}}
        counted = judging.counted_codes(result, codes)
        self.assertEqual(counted, {"tests/a.py::T::test_x": {"DSV4G001"},
                                   "tests/a.py::T::test_y": {"DSV4G006"},
                                   "tests/a.py::T::test_z": set()})
        judging.judge_codes(result, counted)
        self.assertEqual(result.codes_missing,
                         sorted(set(judging.catalogue("0.5.16")) - {"DSV4G001", "DSV4G006"}))

    def test_full_examples_on_oldest_middle_and_base(self) -> None:
        """Whole runs draw the profile's examples on the oldest, the middle and the base
        release of matrix.txt (0.5.16, 0.5.20, 0.5.23 today: issue 5's three), the dev
        profile's on the others."""
        releases = matrix.read_matrix()
        base = next(r.version for r in releases if not r.overlay)  # matrix.txt's "-" line
        # the base is the venv's own release (this test may run with another first on
        # PYTHONPATH, whose metadata would name it)
        with unittest.mock.patch.object(sys.modules["release_env"], "base_version",
                                        lambda: base):
            full = matrix.full_example_releases(releases)
        self.assertEqual(full, {"0.5.16", "0.5.20", base})
        self.assertEqual(matrix.full_example_releases([]), set())

    def test_property_node_ids_are_collected_by_pytest(self) -> None:
        """The base release's pytest run is its property tests, by node id: each one a
        test function of its file and class."""
        for node in suite.property_node_ids():
            path, cls, name = node.split("::")
            tree = ast.parse((ROOT / path).read_text())
            classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
            self.assertIn(cls, classes, node)
            self.assertIn(name, {f.name for f in classes[cls].body
                                 if isinstance(f, ast.FunctionDef)}, node)

    def test_codes_count_only_when_produced(self) -> None:
        """A code counts when a passing test produced it (the codes file), whatever the
        test names say: test_g002_/test_g003_ in the report add nothing."""
        result = self._judge(STATISTICS, "tests/a.py::T::test_x\tDSV4G001\n"
                                         "tests/a.py::T::test_y\tDSV4G006\n")
        with tempfile.TemporaryDirectory() as tmp:  # a codes file that was never written
            self.assertEqual(judging.produced_codes(Path(tmp, "absent.codes")), {})
        expected = sorted(set(judging.catalogue()) - {"DSV4G001", "DSV4G006"})
        self.assertEqual(result.codes_missing, expected)
        self.assertIn("no passing test produced " + ", ".join(expected), result.problems)

    def test_a_code_produced_without_a_when_fails_the_release(self) -> None:
        """Every code the package produces carries a when (phase and effect): a built-in
        finding without one, marked so by the recording (produced_codes.NO_WHEN), is a
        problem of the release; the same code with a when elsewhere does not hide it."""
        codes = "".join(f"tests/a.py::T::test_{i}\t{code}\n" for i, code in
                        enumerate([*judging.catalogue(), produced_codes.NO_WHEN % "DSV4G020"]))
        result = self._judge(STATISTICS, codes)
        self.assertEqual(result.codes_missing, [])
        self.assertIn("produced without a when (phase and effect): DSV4G020 (no when)",
                      result.problems)

    def test_a_property_test_that_ran_must_report_statistics(self) -> None:
        """A property test in the run's report without statistics fails, naming it; too
        few examples fail too; a property test that did not run is not asked for."""
        short = STATISTICS.replace("nothing left to do", "settings.max_examples=512")
        result = self._judge(short, "")
        self.assertIn("test_parity_property::TestParity::test_guard_agrees_with_sglang "
                      "reported no hypothesis statistics", result.problems)
        self.assertIn("test_autoshare::TestAutoshareHidesNothing::"
                      "test_other_rejections_unchanged drew 512 examples, "
                      "profile ci asks 2000", result.problems)
        self.assertFalse([p for p in result.problems if "no hypothesis statistics" in p
                          and "test_parity_property" not in p], result.problems)

    def test_a_fixed_count_is_asked_by_profile(self) -> None:
        """A property test of FIXED_EXAMPLES is short below its count under the ci
        profile, and below a quarter of it under dev, where it draws that quarter."""
        test = "test_pd_contract_property::TestContractAgreesWithSGLang::test_rows_agree_with_sglang"

        def drew(count: int) -> str:
            return STATISTICS + f"""
tests/{test.replace("::", ".py::", 1)}:

  - during generate phase (9.00 seconds):
    - {count} passing, 0 failing, and 0 invalid test cases

  - Stopped because settings.max_examples={count}
"""
        self.assertEqual((suite.examples_asked(test, "ci"), suite.examples_asked(test, "dev")),
                         (20, 5))
        self.assertIn(f"{test} drew 5 examples, it asks 20 (profile ci)",
                      self._judge(drew(5), "").problems)
        self.assertFalse([p for p in self._judge(drew(5), "", "dev").problems if test in p])
        self.assertIn(f"{test} drew 4 examples, it asks 5 (profile dev)",
                      self._judge(drew(4), "", "dev").problems)

    def test_fixed_counts_are_the_tests_own(self) -> None:
        """Each FIXED_EXAMPLES test draws, under each profile, what examples_asked says:
        its @settings passes its count to fixed_examples (whose rule is the same), or,
        NOT_SCALED, the count itself."""
        import helpers

        found = {}
        for path in sorted((ROOT / "tests").glob("test_*.py")):
            for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
                for node in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                    for call in (d for d in node.decorator_list if isinstance(d, ast.Call)
                                 and ast.unparse(d.func) == "settings"):
                        for keyword in (k for k in call.keywords if k.arg == "max_examples"):
                            found[f"{path.stem}::{cls.name}::{node.name}"] = keyword.value
        for test, ci in suite.FIXED_EXAMPLES.items():
            value = found[test]
            for profile in ("ci", "dev"):
                with self.subTest(test=test, profile=profile):
                    if test in suite.NOT_SCALED:
                        drawn = ast.literal_eval(value)
                    else:
                        self.assertEqual(ast.unparse(value), f"fixed_examples({ci})")
                        drawn = helpers.fixed_examples(ci, profile)
                    self.assertEqual(drawn, suite.examples_asked(test, profile))

    def test_a_drawn_out_space_is_not_short(self) -> None:
        """512 examples where hypothesis says it drew every one there is ("nothing left
        to do") is the test's whole space, not a short run; the same count stopped by
        a setting is short."""
        self.assertEqual(release_env.examples_exhausted(STATISTICS),
                         {"test_autoshare::TestAutoshareHidesNothing::"
                          "test_other_rejections_unchanged"})
        self.assertFalse(any("drew 512" in p for p in self._judge(STATISTICS, "").problems))

    def test_property_tests_listed_are_the_given_tests(self) -> None:
        """PROPERTY_TESTS names exactly the tests decorated with hypothesis' @given."""
        found = set()
        for path in sorted((ROOT / "tests").glob("test_*.py")):
            tree = ast.parse(path.read_text())
            for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
                for node in cls.body:
                    if isinstance(node, ast.FunctionDef) and any(
                            "given" in ast.dump(d) for d in node.decorator_list):
                        found.add(f"{path.stem}::{cls.name}::{node.name}")
        self.assertEqual(found, set(suite.PROPERTY_TESTS))



class TestCodesPerRelease(GuardTestCase):
    def test_a_release_without_a_check_does_not_owe_its_code(self) -> None:
        """The codes a release's full run must produce are those whose SGLang check its
        code has: 0.5.16 has no DCP conditions (DSV4G034, DSV4G036) and no DeepSeek-V4 KV
        layout selector (DSV4G047), but its metadata buffers (SGLANG_DISAGGREGATION_
        SAMPLING_MASK_MAX_TOKENS) can differ (DSV4G045); 0.5.23 owes every code."""
        from sglang_dsv4_guard.codes import CODES

        old = set(judging.catalogue("0.5.16"))
        self.assertFalse({"DSV4G034", "DSV4G036", "DSV4G047"} & old, old)
        self.assertTrue({"DSV4G030", "DSV4G045"} <= old, old)
        self.assertEqual(judging.catalogue("0.5.23"), sorted(CODES))
        self.assertEqual(judging.catalogue(), sorted(CODES))

    def test_an_unreadable_label_rules_nothing_out(self) -> None:
        """A release label packaging cannot read owes every code."""
        from sglang_dsv4_guard.codes import CODES

        self.assertEqual(judging.catalogue("not-a-version"), sorted(CODES))


class TestProcessTests(GuardTestCase):
    """PROCESS_TESTS (tools/suite.py) names real test classes; make check-fast leaves them
    out and make test holds the list to what its trace saw."""

    def test_every_process_test_exists(self) -> None:
        """Each key names a test file (and class) of the suite and says why; each declared
        drive is a file (or one of its definitions) of the base release, the one make test
        traces (the venv's own SGLang, whichever release this run imports), so a renamed
        one cannot make every release look alike. An older release may lack it: its
        digest there is "absent", which differs from the base's."""
        package = Path(sysconfig.get_paths()["purelib"]) / "sglang"
        self.assertTrue((package / "__init__.py").is_file(), package)
        for test, entry in suite.PROCESS_TESTS.items():
            path, _, rest = test.partition("::")
            cls, _, method = rest.partition("::")
            source = ROOT / path
            self.assertTrue(source.is_file(), test)
            self.assertTrue(entry.why.strip(), test)
            if method:
                self.assertIn(f"def {method}(", source.read_text(), test)
            for item in entry.drives:
                rel, _, name = item.partition("::")
                self.assertTrue((package / rel).is_file(), item)
                if name:
                    self.assertIn(name, {getattr(n, "name", None) for n in
                                         ast.parse((package / rel).read_bytes()).body}, item)
            if cls:
                classes = {node.name for node in ast.parse(source.read_text()).body
                           if isinstance(node, ast.ClassDef)}
                self.assertIn(cls, classes, test)

    def test_node_ids_find_their_entry(self) -> None:
        """A node id belongs to its class's entry, not to a class whose name it starts
        with; a test outside every entry has none."""
        self.assertEqual(suite.process_test("tests/test_report_once.py::TestAtExit::test_a"),
                         "tests/test_report_once.py::TestAtExit")
        self.assertIsNone(suite.process_test("tests/test_report_once.py::TestAtExitX::test_a"))
        self.assertIsNone(suite.process_test("tests/test_check.py::TestCheck::test_a"))


class TestJobPool(GuardTestCase):
    """make test's workers take the longest ready job first; a job's error reaches the
    caller of its result, and the other jobs still run."""

    def test_longest_ready_first_and_errors_reach_the_caller(self) -> None:
        pool = matrix._Pool(1)
        started, gate, order = threading.Event(), threading.Event(), []
        busy = pool.submit(1.0, lambda: order.append(  # type: ignore[arg-type,func-returns-value]
            ("busy", started.set() or gate.wait(30))))  # type: ignore[func-returns-value]
        self.assertTrue(started.wait(30))  # the only worker is taken: the rest queue
        short = pool.submit(1.0, lambda: order.append("short"))  # type: ignore[arg-type,func-returns-value]
        longest = pool.submit(9.0, lambda: order.append("long"))  # type: ignore[arg-type,func-returns-value]
        middle = pool.submit(5.0, lambda: order.append("middle"))  # type: ignore[arg-type,func-returns-value]
        broken = pool.submit(3.0, lambda: 1 // 0)  # type: ignore[arg-type,return-value]
        gate.set()
        pool.close()
        # Not the order they came in (FIFO), nor its reverse (LIFO): longest first.
        self.assertEqual(order, [("busy", True), "long", "middle", "short"])
        self.assertTrue(busy.done() and short.done() and longest.done() and middle.done())
        with self.assertRaises(ZeroDivisionError):
            broken.result()

    def test_cancel_starts_no_queued_job(self) -> None:
        """close(cancel=True) (an error or Ctrl-C in make test): the running job ends, no
        queued one starts, and their results say they were cancelled."""
        pool = matrix._Pool(1)
        started, gate, ran = threading.Event(), threading.Event(), []
        busy = pool.submit(1.0, lambda: ran.append(started.set() or gate.wait(30)))  # type: ignore[arg-type,func-returns-value]
        self.assertTrue(started.wait(30))
        queued = pool.submit(5.0, lambda: ran.append("queued"))  # type: ignore[arg-type,func-returns-value]
        threading.Timer(0.2, gate.set).start()
        pool.close(cancel=True)
        self.assertEqual(ran, [True])
        self.assertTrue(busy.done())
        with self.assertRaises(CancelledError):
            queued.result()


class TestEstTimes(GuardTestCase):
    """--est-times sets a file's est_time to its tests' seconds in the traced base run."""

    def test_est_time_is_the_files_measured_seconds(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            (root / "tests").mkdir()
            source = 'register_cpu_ci(est_time=90, suite="stage-a-test-cpu")\nX = 1\n'
            (root / "tests" / "test_a.py").write_text(source)
            (root / "tests" / "test_b.py").write_text(source.replace("90", "33"))
            report = root / "0.5.23-1.xml"
            report.write_text(
                '<testsuites><testsuite>'
                '<testcase classname="tests.test_a.TestA" name="test_one" time="10.2"/>'
                '<testcase classname="tests.test_a.TestA" name="test_two" time="2.1"/>'
                '<testcase classname="tests.test_b.TestB" name="test_one" time="2.5"/>'
                '</testsuite></testsuites>')
            changed = durations.write_est_times([report], root)
            # the tests' seconds rounded up, plus the harness's cold start; test_b's 33
            # (3 + 30) is already its value
            self.assertEqual(changed, [f"tests/test_a.py: est_time 90 -> {13 + durations.COLD_START}"])
            self.assertEqual((root / "tests" / "test_a.py").read_text(),
                             source.replace("90", str(13 + durations.COLD_START)))

    def test_float_value_and_missing_registry(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            (root / "tests").mkdir()
            (root / "tests" / "test_a.py").write_text("register_cpu_ci(est_time=12.5)\n")
            (root / "tests" / "test_b.py").write_text("X = 1\n")
            report = root / "0.5.23-1.xml"
            report.write_text(
                '<testsuites><testsuite>'
                '<testcase classname="tests.test_a.TestA" name="test_one" time="1"/>'
                '<testcase classname="tests.test_b.TestB" name="test_one" time="1"/>'
                '</testsuite></testsuites>')
            changed = durations.write_est_times([report], root)
            self.assertEqual((root / "tests" / "test_a.py").read_text(),
                             f"register_cpu_ci(est_time={1 + durations.COLD_START})\n")
            self.assertIn("tests/test_b.py: no register_cpu_ci(est_time=...) call, left alone",
                          changed)


_REGISTER = "from sglang.test.ci.ci_register import register_cpu_ci\n"


def _test_files(root: Path, *names: str) -> list[str]:
    """Test files under ``root/tests`` as SGLang's harness accepts them; their paths."""
    (root / "tests").mkdir(exist_ok=True)
    for name in names:
        (root / "tests" / name).write_text(
            _REGISTER + 'register_cpu_ci(est_time=5, suite="stage-a-test-cpu")\n'
            "import unittest\nif __name__ == '__main__':\n    unittest.main()\n")
    return [f"tests/{name}" for name in names]


class TestRunParts(GuardTestCase):
    """make test's and make check-fast's split of the test files into pytest runs."""

    def test_more_runs_than_files_leave_none_empty(self) -> None:
        """Every file in exactly one run, and no run without a file (pytest given no file
        runs them all): three files in eight runs."""
        with tempfile.TemporaryDirectory() as tmp:
            names = _test_files(Path(tmp), "test_a.py", "test_b.py", "test_c.py")
            with unittest.mock.patch.object(matrix, "ROOT", Path(tmp)), contextlib.chdir(tmp):
                parts = matrix._parts(8)
        self.assertEqual(len(parts), 3)
        self.assertEqual(sorted(f for part in parts for f in part), names)

    def test_a_disabled_test_file_is_an_error(self) -> None:
        """A tests/test_*.py registered disabled would be in no run: named, not dropped."""
        with tempfile.TemporaryDirectory() as tmp:
            _test_files(Path(tmp), "test_a.py")
            (Path(tmp, "tests") / "test_b.py").write_text(
                _REGISTER + 'register_cpu_ci(est_time=5, suite="stage-a-test-cpu", '
                'disabled="flaky")\n')
            with unittest.mock.patch.object(matrix, "ROOT", Path(tmp)), \
                    contextlib.chdir(tmp), self.assertRaises(SystemExit) as caught:
                matrix._parts(2)
        self.assertIn("tests/test_b.py: registered with register_cpu_ci(..., disabled=...)",
                      str(caught.exception))


class TestHarnessParts(GuardTestCase):
    """SGLang's CI harness run, split into make test's jobs by SGLang's own
    auto_partition, still runs every test file, each once."""

    def test_parts_run_every_file_once(self) -> None:
        """The parts of tools/sglang_ci.py (as tools/matrix.py asks for them) hold every
        file SGLang's collect_tests keeps for the suite, none twice, and none is empty."""
        files = sorted(str(p) for p in (ROOT / "tests").glob("*.py")
                       if p.name not in ("conftest.py", "__init__.py"))
        whole, total = sglang_ci.select(files, sglang_ci.SUITE)
        self.assertEqual(total, len(whole))
        self.assertGreater(total, 1)
        n = matrix.HARNESS_PARTS
        parts = [sglang_ci.select(files, sglang_ci.SUITE, (k, n))[0] for k in range(1, n + 1)]
        self.assertEqual(sorted(r.filename for part in parts for r in part),
                         sorted(r.filename for r in whole))
        self.assertTrue(all(parts), [len(part) for part in parts])

    def test_fork_worker_gets_the_preload_and_nothing_else_does(self) -> None:
        """The python3 the runner starts SGLang's fork worker with imports PRELOAD before
        the worker's code runs, with the worker's own arguments; any other python3 call
        is the interpreter itself, with nothing preloaded."""
        import inspect
        import subprocess

        from sglang.test.ci.ci_utils import run_unittest_files

        with tempfile.TemporaryDirectory() as tmp:
            options = sglang_ci.fork_worker_options(Path(tmp))
            if "fork_worker_batch_size" not in inspect.signature(run_unittest_files).parameters:
                # a runner without SGLang's fork worker: a fresh interpreter per file, as
                # before, and no python3 of the runner's
                self.assertEqual((options, list(Path(tmp).iterdir())), ({}, []))
                return
            self.assertEqual(options, {"fork_worker_batch_size": 1_000})
            worker = Path(tmp, "sglang", "test", "ci", "fork_test_worker.py")
            worker.parent.mkdir(parents=True)
            probe = ("import sys; print(sys.argv[1:], "
                     f"[m for m in {sglang_ci.PRELOAD!r} if m in sys.modules])")
            worker.write_text(probe)
            shim = str(Path(tmp, "python3"))
            as_worker = subprocess.run([shim, str(worker), "--result-fd", "7"],
                                       capture_output=True, text=True, check=True)
            self.assertEqual(as_worker.stdout.strip(),
                             f"['--result-fd', '7'] {list(sglang_ci.PRELOAD)}")
            plain = subprocess.run([shim, "-c", probe.replace("sys.argv[1:]", "'plain'")],
                                   capture_output=True, text=True, check=True)
            self.assertEqual(plain.stdout.strip(), "plain []")

    def test_part_spelling(self) -> None:
        """--part is K/N with 1 <= K <= N; anything else is refused, naming it."""
        self.assertEqual(sglang_ci._part("2/4"), (2, 4))
        for bad in ("0/4", "5/4", "2", "a/b", "-1/4"):
            with self.assertRaisesRegex(argparse.ArgumentTypeError, "is not a part K/N"):
                sglang_ci._part(bad)

if __name__ == "__main__":
    import unittest

    unittest.main()
