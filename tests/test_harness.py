"""The test base class keeps its promises: leaks fail, retried attempts start afresh, and a
MORI connector import that fails can be retried under the guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

from helpers import GuardTestCase, fresh_python, leftovers
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard.patching import PostImportHooks

register_cpu_ci(est_time=68, suite="stage-a-test-cpu")


def run_case(case: type[unittest.TestCase], name: str) -> unittest.TestResult:
    """Run one test of ``case`` in this process and return its result."""
    result = unittest.TestResult()
    case(name).run(result)
    return result


class TestLeaksFail(GuardTestCase):
    """A test that leaves anything of the guard behind fails, and the next one starts clean."""

    def test_installed_guard_left_behind(self) -> None:
        """A test that installs and never uninstalls fails in its clean-up, naming the leak."""

        class Leaky(GuardTestCase):
            def test_leak(self) -> None:
                sglang_dsv4_guard.install("on", load_entry_points=False)

        result = run_case(Leaky, "test_leak")
        self.assertEqual(len(result.failures), 1, result.failures)
        self.assertIn("the test left the guard in place", result.failures[0][1])
        self.assertIn("the guard is installed", result.failures[0][1])
        self.assertEqual(leftovers(), [])

    def test_import_hook_left_behind(self) -> None:
        """An import hook of ours left in sys.meta_path is a leak even with nothing patched."""

        class LeakyFinder(GuardTestCase):
            def test_leak(self) -> None:
                PostImportHooks().watch("a_module_nobody_imports", lambda module: None)

        result = run_case(LeakyFinder, "test_leak")
        self.assertEqual(len(result.failures), 1, result.failures)
        self.assertIn("1 import hook(s) of the guard in sys.meta_path", result.failures[0][1])
        self.assertFalse(any(isinstance(f, PostImportHooks) for f in sys.meta_path))

    def test_cleaned_up_install_passes(self) -> None:
        """install_guard() registers the uninstall, so a tidy test passes."""

        class Tidy(GuardTestCase):
            def test_tidy(self) -> None:
                self.install_guard("on", load_entry_points=False)
                self.assertTrue(sglang_dsv4_guard.is_installed())

        result = run_case(Tidy, "test_tidy")
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)


class TestRetriedAttempts(GuardTestCase):
    """CustomTestCase's retry (as in SGLang's CI) runs each attempt from a fresh setUp."""

    def test_second_attempt_starts_afresh(self) -> None:
        """The first attempt installs and fails; the retry runs the clean-ups and setUp again,
        starts uninstalled, and passes."""
        seen: list[tuple[int, bool]] = []

        class Flaky(GuardTestCase):
            setups = 0

            def setUp(self) -> None:
                super().setUp()
                type(self).setups += 1

            def test_flaky(self) -> None:
                seen.append((type(self).setups, sglang_dsv4_guard.is_installed()))
                self.install_guard("strict", load_entry_points=False)
                self.assertGreater(len(seen), 1, "first attempt fails on purpose")

        with mock.patch.dict(os.environ, {"SGLANG_TEST_MAX_RETRY": "1"}), \
                mock.patch("sglang.srt.utils.common.traceback.print_exc"):
            result = run_case(Flaky, "test_flaky")
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(seen, [(1, False), (2, False)])
        self.assertEqual(leftovers(), [])


SKIPPING_FILE = textwrap.dedent("""\
    import unittest
    from helpers import GuardTestCase

    class Skips(GuardTestCase):
        def test_skip_test(self):
            self.skipTest("no GPU")

        @unittest.skip("decorated")
        def test_decorated(self):
            pass

    @unittest.skip("whole class")
    class SkippedClass(GuardTestCase):
        def test_never(self):
            pass

    class SkipsInSetUpClass(GuardTestCase):
        @classmethod
        def setUpClass(cls):
            raise unittest.SkipTest("no ROCm")

        def test_never(self):
            pass

    if __name__ == "__main__":
        unittest.main()
    """)


def run_file_as_sglang_ci(text: str, ci: bool) -> subprocess.CompletedProcess[str]:
    """``python3 <file>`` as SGLang's runner does (no conftest), ``CI`` set or not."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    if ci:
        env["CI"] = "true"
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "test_skips.py")
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        return subprocess.run([sys.executable, path], env=env, capture_output=True, text=True,
                              timeout=300, check=False, cwd=folder)


class TestSkipsFailInCi(GuardTestCase):
    """Without conftest (SGLang's runner), a skip of any kind fails when ``CI`` is set."""

    def test_skips_fail_with_ci(self) -> None:
        """CI=true: a skipTest(), a skipped method, a skipped class and a skipping setUpClass
        fail (a failed setUpClass is an error), each saying it was skipped in CI; the file
        exits non-zero."""
        done = run_file_as_sglang_ci(SKIPPING_FILE, ci=True)
        self.assertNotEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("FAILED (failures=3, errors=1)", done.stderr, done.stderr[-3000:])
        self.assertEqual(done.stderr.count("skipped in CI, which counts as a failure"), 4,
                         done.stderr[-3000:])

    def test_skips_stay_skips_outside_ci(self) -> None:
        """Without CI the same file passes with its four skips."""
        done = run_file_as_sglang_ci(SKIPPING_FILE, ci=False)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("OK (skipped=4)", done.stderr, done.stderr[-3000:])


class TestRegistryLeftovers(GuardTestCase):
    """The guard's hook in SGLang's HookRegistry, and its one-shot apply_hooks wrapper, are
    leftovers; the public install() cannot put them there outside SGLang's loader."""

    def test_registry_hook_and_apply_hooks_wrapper_are_leftovers(self) -> None:
        """A StateHook registered in the registry and the guard's apply_hooks wrapper are both
        named by leftovers() and removed by the test's clean-up (which fails the test)."""
        from sglang_dsv4_guard.hook_registry import register_state_hook

        class LeakyRegistry(GuardTestCase):
            def test_leak(self) -> None:
                import sglang.srt.plugins.hook_registry  # noqa: F401

                register_state_hook(lambda fn: fn, lambda *a: None, lambda: False)

        result = run_case(LeakyRegistry, "test_leak")
        self.assertEqual(len(result.failures), 1, result.failures + result.errors)
        self.assertIn("1 hook(s) of the guard in SGLang's HookRegistry", result.failures[0][1])
        self.assertIn("HookRegistry.apply_hooks is the guard's one-shot wrapper",
                      result.failures[0][1])
        self.assertEqual(leftovers(), [])

    def test_public_install_has_no_registry_option(self) -> None:
        """install(via_sglang_registry=True) is refused: outside SGLang's loader the registry
        would never apply the hook while the log said "installed"."""
        with self.assertRaises(TypeError):
            sglang_dsv4_guard.install(via_sglang_registry=True)  # type: ignore[call-arg]
        self.assertFalse(sglang_dsv4_guard.is_installed())


class TestEstTimes(GuardTestCase):
    """Every test file starts at least one interpreter (``python3 <file>`` in SGLang's CI,
    importing SGLang and torch cold), so no ``est_time`` is below one cold start."""

    def test_every_file_allows_a_cold_start(self) -> None:
        """SGLang's own collect_tests reads each file's est_time; none is under 30 s."""
        from sglang.test.ci.ci_register import collect_tests

        here = os.path.dirname(os.path.abspath(__file__))
        files = sorted(os.path.join(here, f) for f in os.listdir(here)
                       if f.startswith("test_") and f.endswith(".py"))
        short = {os.path.basename(r.filename): r.est_time for r in collect_tests(files)
                 if r.est_time < 30}
        self.assertGreater(len(files), 5)
        self.assertEqual(short, {}, "est_time below one interpreter's cold start (30 s)")


MORI_RETRY_PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import sglang_dsv4_guard
from sglang_dsv4_guard.patching import PostImportHooks
sglang_dsv4_guard.install("on", load_entry_points=False)
CONN = "sglang.srt.disaggregation.mori.conn"
try:
    import sglang.srt.disaggregation.mori.conn
    first = "imported"
except ImportError as exc:
    first = f"ImportError: {exc}"
after_failure = {"in_sys_modules": CONN in sys.modules,
                 "still_waiting": any(isinstance(f, PostImportHooks) and CONN in f.pending
                                      for f in sys.meta_path)}
import mori_stub
mori_stub.install_stub()
import sglang.srt.disaggregation.mori.conn as conn
wrapped = [hasattr(vars(conn.MoriKVManager)[m], "__sglang_dsv4_guard_original__")
           for m in ("_send_swa_dsa_state", "_add_remote_peer")]
sglang_dsv4_guard.uninstall()
print(json.dumps({
    "first": first, "after_failure": after_failure, "wrapped": wrapped,
    "restored": [not hasattr(vars(conn.MoriKVManager)[m], "__sglang_dsv4_guard_original__")
                 for m in ("_send_swa_dsa_state", "_add_remote_peer")],
    "finders_left": sum(isinstance(f, PostImportHooks) for f in sys.meta_path)}))
"""


class TestMoriImportRetried(GuardTestCase):
    """An import of the MORI connector that fails (no ``mori``) is SGLang's to report, and a
    later import, once ``mori`` is there, is wrapped; nothing stays after uninstall."""

    def test_failed_import_then_retry(self) -> None:
        """Fresh interpreter: the first import raises SGLang's ImportError and leaves no module
        and the guard still waiting; the retried import is wrapped; uninstall restores both
        methods and leaves no import hook in sys.meta_path."""
        done = fresh_python(MORI_RETRY_PROBE, os.path.dirname(__file__))
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        result = json.loads(done.stdout.strip().splitlines()[-1])
        self.assertEqual(result["first"], "ImportError: No module named 'mori'")
        self.assertEqual(result["after_failure"], {"in_sys_modules": False,
                                                   "still_waiting": True})
        self.assertEqual(result["wrapped"], [True, True])
        self.assertEqual(result["restored"], [True, True])
        self.assertEqual(result["finders_left"], 0)
        self.assertNotIn("could not patch", done.stderr)


if __name__ == "__main__":
    unittest.main()
