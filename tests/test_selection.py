"""make test's selection (tools/selection.py, tools/trace_drives.py): a test runs again on a
release exactly where the SGLang code it drove differs, on real traces of SGLang's code."""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import tempfile
import unittest
import unittest.mock
from pathlib import Path

import sglang
from helpers import UNWRAPPED, GuardTestCase, outcome
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.testing import PoolSpec, build_pair

register_cpu_ci(est_time=54, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import release_code  # noqa: E402 - tools/ is not a package
import selection  # noqa: E402
import suite  # noqa: E402
import trace_drives  # noqa: E402

SGLANG = Path(sglang.__file__).resolve().parent
UTILS = "srt/disaggregation/utils.py"
TEST = "tests/test_state_guard.py::TestEveryCode::test_g001_names_offending_draft_layers"


def _write(where: Path, name: str, records: list[dict[str, object]]) -> None:
    with (where / name).open("a", encoding="utf-8") as out:
        out.writelines(json.dumps(r) + "\n" for r in records)


class _Trees(GuardTestCase):
    """Fake releases in a temporary directory: copies of the installed ``sglang`` whose
    files are links to the installed ones, but for the files a test edits."""

    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = Path(tmp.name)

    def release(self, name: str, edits: dict[str, tuple[str, str]] | None = None) -> Path:
        """A fake release: the installed package, with ``edits`` (file -> (old, new))."""
        package = self.tmp / name / "sglang"
        shutil.copytree(SGLANG, package, copy_function=os.symlink,
                        ignore=shutil.ignore_patterns("__pycache__"))
        for rel, (old, new) in (edits or {}).items():
            text = (SGLANG / rel).read_text(encoding="utf-8")
            self.assertIn(old, text, f"{rel}: the edit's anchor is gone")
            (package / rel).unlink()
            (package / rel).write_text(text.replace(old, new, 1), encoding="utf-8")
        return package

    def trace_of_a_real_call(self) -> selection.Trace:
        """What tracing SGLang's real setup_state_kv_args on a mismatched pair records."""
        recorder = trace_drives.Recorder()
        pair = build_pair(draft=PoolSpec(compression_ratios=(0, 4, 0, 128)))
        recorder.start()
        try:
            kind, _ = outcome(UNWRAPPED, *pair)
        finally:
            ran = recorder.stop()
        self.assertEqual(kind, "raised")
        where = self.tmp / "drives"
        where.mkdir()
        _write(where, trace_drives.TESTS_FILE, [{"test": TEST, "file": TEST.split("::")[0], **ran}])
        return selection.read_traces(where)[TEST]


class TestSeededChange(_Trees):
    """A fake 0.5.24: the tests that drive an edited function run on it, the others not."""

    def plan(self, edits: dict[str, tuple[str, str]] | None = None) -> selection.Plan:
        trace = self.trace_of_a_real_call()
        self.assertIn((UTILS, "setup_state_kv_args"), trace.sglang)
        packages = {"0.5.23": SGLANG, "0.5.24": self.release("0.5.24", edits)}
        return selection.plan({TEST: trace}, "0.5.23", ["0.5.24"], packages)

    def test_same_code_is_left_out(self) -> None:
        """A release whose code is the base's runs none of its tests again, and names the
        base release as where each ran."""
        chosen = self.plan()
        self.assertEqual(chosen.runs["0.5.24"], [])
        self.assertEqual(chosen.covered["0.5.24"], {TEST: "0.5.23"})

    def test_edited_function_runs_the_test(self) -> None:
        """An edit in setup_state_kv_args (which the test drove) runs it on that release."""
        chosen = self.plan({UTILS: (
            "    req_to_token_pool=None,\n) -> None:\n",
            "    req_to_token_pool=None,\n) -> None:\n    kv_args.seeded = True\n")})
        self.assertEqual(chosen.runs["0.5.24"], [TEST])
        self.assertEqual(chosen.covered["0.5.24"], {})

    def test_formatting_and_other_functions_do_not_count(self) -> None:
        """Comments, blank lines and a function the test did not drive, in the same file,
        leave the test out: digests are of code, per function."""
        chosen = self.plan({UTILS: (
            "def setup_state_kv_args(",
            "# a comment\n\n\ndef _never_called_by_the_test():\n    return 1\n\n\n"
            "def setup_state_kv_args(")})
        self.assertEqual(chosen.runs["0.5.24"], [])


class TestWhatTheGuardReads(_Trees):
    """A test that ran the guard's reading of SGLang's checks depends on whether the guard
    knows each check, not on which known release stored it."""

    def test_an_unknown_check_runs_the_test(self) -> None:
        """A release whose NIXL registration check is gone (renamed) is one the guard does
        not know: the test runs there; an identical release leaves it out."""
        where = self.tmp / "drives"
        where.mkdir()
        test = "tests/t.py::T::test_reads_checks"
        _write(where, trace_drives.TESTS_FILE, [{
            "test": test, "file": "tests/t.py", "sglang": [], "starts": {},
            "guard": [["host/pd_digests.py", "locate"]]}])
        trace = selection.read_traces(where)[test]
        self.assertEqual(trace.reads, frozenset({"sites"}))
        renamed = self.release("0.5.25", {"srt/disaggregation/nixl/conn.py": (
            "def _add_remote_peer(", "def _add_remote_peer_renamed(")})
        chosen = selection.plan({test: trace}, "0.5.23", ["0.5.24", "0.5.25"],
                                {"0.5.23": SGLANG, "0.5.24": self.release("0.5.24"),
                                 "0.5.25": renamed})
        self.assertEqual((chosen.runs["0.5.24"], chosen.runs["0.5.25"]), ([], [test]))


class TestWhatAKeyHolds(_Trees):
    """What a function that ran depends on: its definition, its classes' skeletons, and
    the module-level bindings of the names it reads."""

    def _source(self, text: str) -> release_code.ReleaseCode:
        package = self.tmp / f"p{len(list(self.tmp.iterdir()))}"
        package.mkdir()
        (package / "m.py").write_text(text)
        return release_code.ReleaseCode(package)

    def test_module_bindings_read_count_others_do_not(self) -> None:
        """A constant the function reads counts; one it does not read does not."""
        base = self._source("A = 1\nB = 1\ndef f():\n    return A\n")
        read = self._source("A = 2\nB = 1\ndef f():\n    return A\n")
        unread = self._source("A = 1\nB = 2\ndef f():\n    return A\n")
        self.assertNotEqual(base.function("m.py", "f"), read.function("m.py", "f"))
        self.assertEqual(base.function("m.py", "f"), unread.function("m.py", "f"))

    def test_class_fields_count_for_methods(self) -> None:
        """A dataclass field's default counts for every method of the class."""
        one = self._source("class C:\n    x: int = 1\n    def m(self):\n        return 0\n")
        two = self._source("class C:\n    x: int = 2\n    def m(self):\n        return 0\n")
        self.assertNotEqual(one.function("m.py", "C.m"), two.function("m.py", "C.m"))

    def test_imported_names_count_by_their_own_binding(self) -> None:
        """A constant imported from another module of the package counts by its value
        there: an edit in the other module changes the key; the release's label
        (``__version__``) does not count."""
        def package(default: str, label: str = "1") -> release_code.ReleaseCode:
            root = Path(tempfile.mkdtemp(dir=self.tmp))
            (root / "sub").mkdir()
            (root / "sub/env.py").write_text(f"FLAG = {default}\n__version__ = '{label}'\n")
            (root / "m.py").write_text("from .sub.env import FLAG, __version__\n"
                                       "def f():\n    return FLAG, __version__\n")
            return release_code.ReleaseCode(root)
        self.assertNotEqual(package("False").function("m.py", "f"),
                            package("True").function("m.py", "f"))
        self.assertEqual(package("False").function("m.py", "f"),
                         package("False", "2").function("m.py", "f"))

    def test_every_definition_of_a_conditional_function_counts(self) -> None:
        """``if X: def f() ... else: def f() ...``: an edit in either branch counts."""
        one = self._source("if A:\n    def f():\n        return 1\nelse:\n    def f():\n"
                           "        return 2\n")
        two = self._source("if A:\n    def f():\n        return 3\nelse:\n    def f():\n"
                           "        return 2\n")
        self.assertNotEqual(one.function("m.py", "f"), two.function("m.py", "f"))

    def test_nested_code_belongs_to_its_function(self) -> None:
        """A lambda's or comprehension's code counts as the function around it; a missing
        function is absent, not an error."""
        package = self._source("def f():\n    return [x for x in (1,)]\n")
        self.assertEqual(release_code.def_path("f.<locals>.<listcomp>"), ("f",))
        self.assertIn("absent", package.function("m.py", "g"))
        self.assertEqual(package.def_at("m.py", 2), ("f",))


class TestImportsReached(GuardTestCase):
    """A test's key holds the SGLang names its class reaches by name (tools/selection.py
    imports_reached), and what the modules it loads run at import; not every name its
    file imports."""

    def test_names_reached_through_definitions_and_helper_modules(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        tests = Path(tmp.name, "tests")
        tests.mkdir()
        files = {
            "conftest.py": "from sglang.srt.h import Hooked\n",
            "aid.py": "from sglang.srt.a import Built, Unused\n"
                      "from sglang.srt.e import Effect\n"
                      "from starred import *\n"
                      "Effect.register()\n"
                      "def build():\n    return Built(), star_made()\n",
            "starred.py": "from sglang.srt.s import Star, Unread\n"
                          "def star_made():\n    return Star()\n",
            "test_x.py": "from aid import build\n"
                         "from sglang.srt.b import Field, Other\n"
                         "from sglang.test.ci import runner_name\n"
                         "DEFAULTS = {'f': Field}\n"
                         "def helper():\n    return DEFAULTS\n"
                         "class TestUses:\n"
                         "    def test_a(self):\n        build(); helper()\n"
                         "        from sglang.srt.c import Late\n"
                         "class TestNeither:\n"
                         "    def test_b(self):\n        runner_name()\n"}
        for name, text in files.items():
            (tests / name).write_text(text)
        loaded = [("srt.e", "Effect"), ("srt.h", "Hooked")]  # whatever the test reaches
        reached = {test: selection.imports_reached(f"tests/test_x.py::{test}", Path(tmp.name))
                   for test in ("TestUses::test_a", "TestNeither::test_b[1]",
                                "test_not_at_module_level")}
        self.assertEqual(reached["TestUses::test_a"], tuple(sorted([
            *loaded, ("srt.a", "Built"), ("srt.b", "Field"), ("srt.c", "Late"),
            ("srt.s", "Star")])))
        self.assertEqual(reached["TestNeither::test_b[1]"], tuple(loaded))
        self.assertEqual(reached["test_not_at_module_level"], tuple(sorted([
            *loaded, ("srt.a", "Built"), ("srt.b", "Field"), ("srt.b", "Other"),
            ("srt.c", "Late"), ("srt.s", "Star")])))


class TestPlacing(GuardTestCase):
    """A test the trace cannot account for runs on every release."""

    def _trace(self, test: str = "tests/t.py::T::test_x", **record: object) -> selection.Trace:
        with tempfile.TemporaryDirectory() as tmp:
            _write(Path(tmp), trace_drives.TESTS_FILE,
                   [{"test": test, "file": test.split("::")[0], "sglang": [], "guard": [],
                     "starts": {}, **record}])
            return selection.read_traces(Path(tmp))[test]

    def test_unplaced_reasons(self) -> None:
        """A fork or a Python interpreter started by a test that is not a declared process
        test, and an untraced record, make the test unplaceable, saying why; another
        program does not; a declared process test is placed by its declaration."""
        self.assertIn("forked", self._trace(starts={"fork": 1}).unplaced)
        self.assertIn("not in PROCESS_TESTS", self._trace(starts={"python": 1}).unplaced)
        self.assertIn("profiler", self._trace(untraced="another profiler took it").unplaced)
        self.assertEqual(self._trace(starts={"program": 2}).unplaced, "")
        declared = self._trace("tests/test_mori.py::TestLazyPatch::test_fresh_interpreter",
                               starts={"python": 2, "fork": 1})
        self.assertEqual((declared.unplaced, declared.children), ("", 2))

    def test_declared_code_is_in_the_key(self) -> None:
        """A declared process test's key holds what its children drive (MORI's connector):
        an edit there runs it on that release."""
        trace = self._trace("tests/test_mori.py::TestLazyPatch::test_fresh_interpreter",
                            starts={"python": 1})
        with tempfile.TemporaryDirectory() as tmp:
            edited = Path(tmp, "sglang")
            shutil.copytree(SGLANG, edited, copy_function=os.symlink,
                            ignore=shutil.ignore_patterns("__pycache__"))
            conn = edited / "srt/disaggregation/mori/conn.py"
            text = conn.read_text(encoding="utf-8")
            conn.unlink()
            conn.write_text(text + "\nSEEDED = 1\n", encoding="utf-8")
            chosen = selection.plan({trace.test: trace}, "0.5.23", ["0.5.24", "0.5.25"],
                                    {"0.5.23": SGLANG, "0.5.24": SGLANG, "0.5.25": edited})
        self.assertEqual((chosen.runs["0.5.24"], chosen.runs["0.5.25"]), ([], [trace.test]))

    def test_bad_records_and_missing_traces(self) -> None:
        """A line that is not a record is left out, saying where; a test of the base
        release's run without a record runs everywhere; no trace file is one clear
        error, not a traceback."""
        with tempfile.TemporaryDirectory() as tmp:
            where = Path(tmp)
            _write(where, trace_drives.TESTS_FILE, [{"test": "tests/t.py::T::test_x",
                                                     "file": "tests/t.py"}])
            with (where / trace_drives.TESTS_FILE).open("a") as out:
                out.write('{"test": "tests/t.py::T::test_y", "fi\n')  # a run cut short
            traces = selection.read_traces(where, ["tests/t.py::T::test_x",
                                                   "tests/t.py::T::test_y"])
            self.assertEqual(traces["tests/t.py::T::test_x"].unplaced, "")
            self.assertEqual(traces["tests/t.py::T::test_y"].unplaced,
                             "no trace was recorded for it")
            with self.assertRaises(SystemExit) as caught:
                selection.read_traces(where / "absent")
        self.assertIn("absent/tests.jsonl is missing", str(caught.exception))

    def test_interpreters_through_multiprocessing_and_shells_are_counted(self) -> None:
        """A spawn child (no audit event) and a Python started through ``sh -c`` count as
        interpreters; another program does not."""
        import multiprocessing
        import subprocess

        recorder = trace_drives.Recorder()
        recorder.start()
        try:
            child = multiprocessing.get_context("spawn").Process(target=os.getpid)
            child.start()
            child.join()
            subprocess.run(["sh", "-c", f"{sys.executable} -c pass"], check=True)
            subprocess.run(["sh", "-c", "true"], check=True)
        finally:
            starts = recorder.stop()["starts"]
        self.assertGreaterEqual(starts.get("python", 0), 2, starts)
        self.assertEqual(starts.get("program"), 1, starts)
        self.assertNotIn("fork", starts)

    def test_unplaced_and_every_release_tests_run_everywhere(self) -> None:
        """Unplaced tests and EVERY_RELEASE files run on every release; a placed test whose
        code is the same is left out."""
        trees = {"0.5.23": SGLANG, "0.5.16": SGLANG, "0.5.20": SGLANG}
        traces = {
            "tests/t.py::T::test_same": selection.Trace("tests/t.py::T::test_same", "tests/t.py"),
            "tests/t.py::T::test_fork": selection.Trace("tests/t.py::T::test_fork", "tests/t.py",
                                                        unplaced="forked"),
            **{f"{f}::T::test_r": selection.Trace(f"{f}::T::test_r", f)
               for f in selection.EVERY_RELEASE}}
        chosen = selection.plan(traces, "0.5.23", ["0.5.16", "0.5.20"], trees)
        everywhere = sorted(t for t in traces if t != "tests/t.py::T::test_same")
        for release in ("0.5.16", "0.5.20"):
            self.assertEqual(chosen.runs[release], everywhere)
            self.assertEqual(chosen.covered[release], {"tests/t.py::T::test_same": "0.5.23"})
        self.assertEqual(chosen.unplaced, ["tests/t.py::T::test_fork"])

    def test_a_process_entry_that_is_not_one_fails_the_run(self) -> None:
        """A PROCESS_TESTS entry whose traced tests started no interpreter, or that names no
        traced test (renamed), is a problem of the run, named; an entry whose test
        started one is not."""
        entries = ("tests/test_mori.py::TestLazyPatch", "tests/test_renamed.py::TestGone")
        with unittest.mock.patch.dict(selection.PROCESS_TESTS, clear=True,
                                      **{e: suite.ProcessTest("t") for e in entries}):
            mori = "tests/test_mori.py::TestLazyPatch::test_fresh_interpreter"
            idle = selection.idle_process_entries({mori: selection.Trace(mori, "tests/test_mori.py")})
            self.assertEqual(idle, [f"PROCESS_TESTS lists {entries[0]}, whose tests started no "
                                    "Python interpreter", f"PROCESS_TESTS lists {entries[1]}, "
                                    "which names no test"])
            started = selection.Trace(mori, "tests/test_mori.py", children=1)
            self.assertEqual(len(selection.idle_process_entries({mori: started})), 1)


class TestNamedPlaces(GuardTestCase):
    """The files and functions the selection names by hand still exist, so a rename cannot
    silently turn off an every-release run or a part of every key."""

    def test_named_files_and_functions_exist(self) -> None:
        for test_file in (*selection.EVERY_RELEASE, selection.RUNNER_TESTS):
            self.assertTrue((ROOT / test_file).is_file(), test_file)
        package = ROOT / "sglang_dsv4_guard"
        for module, function in (selection.JUDGEMENT, *selection.SITES):
            text = (package / module).read_text(encoding="utf-8")
            self.assertIn(f"\ndef {function}(", text, f"{module}::{function}")
        self.assertTrue((package / selection.SERIES).is_file(), selection.SERIES)
        self.assertTrue((SGLANG / selection.RUNNER).is_dir(), selection.RUNNER)

    def test_single_test_entries_name_one_test(self) -> None:
        """pytest's --deselect (make check-fast) matches a node id by prefix: a PROCESS_TESTS
        entry naming one test must not be the start of another test's name in its class."""
        for entry in selection.PROCESS_TESTS:
            if entry.count("::") != 2:
                continue
            path, cls, name = entry.split("::")
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            methods = [f.name for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls
                       for f in c.body if isinstance(f, ast.FunctionDef)]
            self.assertIn(name, methods, entry)
            self.assertEqual([m for m in methods if m != name and m.startswith(name)], [], entry)


if __name__ == "__main__":
    unittest.main()
