"""Third-party plug-ins as a server loads them, and the plug-in author's testing API."""

from __future__ import annotations

import sys
import tempfile
import unittest
from pathlib import Path

from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import Finding, SettingError, Severity, hookimpl
from sglang_dsv4_guard.assembly import build_plugins
from sglang_dsv4_guard.testing import PoolSpec, Recorder, build_pair, check_pools, register

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

# Three broken third-party distributions, each with an entry point in our group.
BROKEN = {
    "typo_plugin": ("from sglang_dsv4_guard import hookimpl\n"
                    "@hookimpl\n"
                    "def sglang_dsv4_guard_chek_state(pair, context):\n"
                    "    return []\n", "typo_plugin"),
    "raising_plugin": ("raise ImportError('the plug-in needs a library that is absent')\n",
                       "raising_plugin"),
    "function_plugin": ("def activate():\n    return None\n", "function_plugin:activate"),
}


class Policy:
    """A plug-in object with one check: a warning on every pair."""

    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: object) -> list[Finding]:
        return [Finding("ACME900", Severity.WARNING, "policy", "pair")]


class TestEntryPointLoading(GuardTestCase):
    """A broken entry point becomes DSV4G090 at build time and is left out."""

    def setUp(self) -> None:
        super().setUp()
        self.site = tempfile.TemporaryDirectory()
        for module, (source, target) in BROKEN.items():
            Path(self.site.name, f"{module}.py").write_text(source)
            dist = Path(self.site.name, f"{module}-1.0.dist-info")
            dist.mkdir()
            (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
            (dist / "entry_points.txt").write_text(f"[sglang_dsv4_guard]\n{module} = {target}\n")
        sys.path.insert(0, self.site.name)
        self.addCleanup(self.site.cleanup)
        self.addCleanup(sys.path.remove, self.site.name)
        for module in BROKEN:
            self.addCleanup(sys.modules.pop, module, None)

    def test_g090_each_broken_entry_point_named_with_its_stage(self) -> None:
        """Misspelled hook (validate), failing import (load), a function (validate, no hooks)."""
        with self.assertLogs("sglang_dsv4_guard", "WARNING"):
            plugins = build_plugins(load_entry_points=True)
        stages = {f.origin: f.summary for f in plugins.load_problems}
        self.assertEqual(set(stages), set(BROKEN))
        self.assertIn("(validate)", stages["typo_plugin"])
        self.assertIn("(load)", stages["raising_plugin"])
        self.assertIn("(validate)", stages["function_plugin"])
        details = {f.origin: " ".join(f.details) for f in plugins.load_problems}
        self.assertIn("sglang_dsv4_guard_chek_state", details["typo_plugin"])
        self.assertIn("library that is absent", details["raising_plugin"])
        self.assertIn("implements none of the guard's hooks", details["function_plugin"])
        self.assertTrue(all(f.code == "DSV4G090" for f in plugins.load_problems))
        self.assertFalse(set(BROKEN) & set(plugins.names()))
        self.assertIn("builtin_state", plugins.names())


class TestTestingApi(GuardTestCase):
    """sglang_dsv4_guard.testing registers as a server does and refuses what checks nothing."""

    def test_check_pools_refuses_pools_it_would_not_check(self) -> None:
        """Non-DSV4 objects raise ValueError naming their types instead of an empty report."""
        with self.assertRaises(ValueError) as caught:
            check_pools(object(), object(), Policy())
        self.assertIn("target object, draft object", str(caught.exception))

    def test_check_pools_refuses_a_misspelled_hook(self) -> None:
        """A plug-in a server would drop is refused here too, with its DSV4G090 details."""

        class Typo:
            @hookimpl
            def sglang_dsv4_guard_check_states(self, pair: object) -> list[Finding]:
                return []

        with self.assertRaises(ValueError) as caught:
            check_pools(*build_pair(), Typo())
        self.assertIn("sglang_dsv4_guard_check_states", str(caught.exception))

    def test_check_pools_names_plugins_and_checks_the_mode(self) -> None:
        """Findings name the plug-in by its class; a bad mode is a SettingError naming it."""
        recorder = Recorder()
        report = check_pools(*build_pair(PoolSpec(page_size=128), PoolSpec(page_size=128)),
                             Policy(), recorder)
        self.assertEqual([(f.code, f.origin) for f in report.findings], [("ACME900", "Policy")])
        self.assertEqual(recorder.reports, [report])
        with self.assertRaises(SettingError) as caught:
            check_pools(*build_pair(), mode="loud")
        self.assertEqual(caught.exception.variable, "install(mode=...)")

    def test_register_is_all_or_nothing_and_undoable(self) -> None:
        """A refused plug-in leaves none of the batch registered; the undo removes them."""
        self.install_guard("on", load_entry_points=False)
        policy = Policy()
        with self.assertRaises(ValueError):
            register(policy, policy)
        report = check_pools(*build_pair())
        self.assertEqual(report.codes, ())
        undo = register(policy)
        import sglang.srt.disaggregation.utils as utils

        from sglang_dsv4_guard.testing import new_kv_args, record

        recorder = record()
        utils.setup_state_kv_args(new_kv_args(), *build_pair())
        self.assertEqual(recorder.codes, ["ACME900"])
        undo()
        utils.setup_state_kv_args(new_kv_args(), *build_pair())
        self.assertEqual(recorder.codes, ["ACME900"])


if __name__ == "__main__":
    unittest.main()
