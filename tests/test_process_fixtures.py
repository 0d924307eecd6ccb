"""The pool pairs the process tests use behave the same on every release.

The process tests (``PROCESS_TESTS`` in ``tools/suite.py``: spawned schedulers, SGLang's
plug-in loader in a fresh interpreter, JSON logs, exit hooks) run once per distinct
version of the SGLang process code they drive, not on every release. Their children call
SGLang's real ``setup_state_kv_args`` on the pairs below; what a child then sees
(SGLang's outcome, the guard's codes) is asserted here, in-process, on every release,
against one table. A release on which a pair behaves otherwise fails here, and the
process tests must then declare ``setup_state_kv_args`` or use another pair. The MORI
pair of those tests (attention TP 8, decode TP 4, non-MLA) is checked the same way on
every release by ``test_mori.TestMoriReporting``.
"""

from __future__ import annotations

import ast
import sys
import unittest
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, guard_logs_off, outcome
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.testing import PoolSpec, build_pair, record, three_mismatch_pair

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import suite  # noqa: E402 - tools/ is not a package

PAIR_BUILDERS = {"build_pair", "three_mismatch_pair"}

# name -> (the pair, SGLang's outcome and first line, the guard's (code, severity)s);
# the pairs are the ones in tests/scheduler_child.py, test_report_once.py,
# test_json_logs.py, test_host_hooks.py, test_plugin_example.py and
# test_errors_and_inputs.py.
FIXTURES: dict[str, tuple[Callable[[], tuple[Any, Any]], str, str, list[tuple[str, str]]]] = {
    "three_mismatch_pair": (
        three_mismatch_pair, "raised",
        "DSV4 draft state transfer expects SWA-only NextN layers",
        [("DSV4G001", "ERROR"), ("DSV4G004", "ERROR"), ("DSV4G005", "ERROR")]),
    "unified_target": (
        lambda: build_pair(target=PoolSpec(unified=True)), "raised",
        "DSV4 target and draft pools must use the same unified-KV mode",
        [("DSV4G002", "ERROR")]),
    "target_mapping_none": (
        lambda: build_pair(target_mapping="none"), "ok", "", [("DSV4G004", "WARNING")]),
    "target_mapping_none_shared": (
        lambda: build_pair(target_mapping="none", mapping="shared"), "ok", "",
        [("DSV4G004", "WARNING")]),
    "mapping_different": (
        lambda: build_pair(mapping="different"), "raised",
        "DSV4 target and draft pools must share the SWA index mapping",
        [("DSV4G004", "ERROR")]),
    "default": (build_pair, "ok", "", []),
    "page_size_128": (
        lambda: build_pair(PoolSpec(page_size=128), PoolSpec(page_size=128)), "ok", "", []),
    # the example plug-in's probe pair (test_plugin_example.py): SGLang accepts it
    "unified_both": (
        lambda: build_pair(PoolSpec(unified=True), PoolSpec(unified=True)), "ok", "", []),
}


class TestProcessFixtures(GuardTestCase):
    """Each pair: SGLang's own outcome and first line, then the guard's codes, as tabled."""

    def test_sglang_alone(self) -> None:
        """Unguarded, SGLang accepts or rejects each pair with the tabled first line."""
        for name, (make, kind, first, _) in FIXTURES.items():
            with self.subTest(name):
                got, result = outcome(utils.setup_state_kv_args, *make())
                self.assertEqual(got, kind, result)
                if kind == "raised":
                    self.assertEqual(str(result).splitlines()[0], first)

    def test_guarded(self) -> None:
        """Guarded, SGLang's outcome is unchanged and the guard reports the tabled codes."""
        self.install_guard("on", load_entry_points=False)
        recorder = record()
        for name, (make, kind, first, codes) in FIXTURES.items():
            with self.subTest(name):
                recorder.reports.clear()
                with guard_logs_off():
                    got, result = outcome(utils.setup_state_kv_args, *make())
                self.assertEqual(got, kind, result)
                if kind == "raised":
                    self.assertEqual(str(result).splitlines()[0], first)
                found = sorted((f.code, f.severity.name) for r in recorder.reports
                               for f in r.findings)
                self.assertEqual(found, codes)


def _pair_calls(source: str) -> set[str]:
    """Every ``build_pair(...)`` / ``three_mismatch_pair()`` call in ``source`` (and in the
    Python programs its string constants hold: the children's code), as written."""
    calls: set[str] = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in PAIR_BUILDERS:
            calls.add(ast.unparse(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and any(name in node.value for name in PAIR_BUILDERS):
            try:
                calls |= _pair_calls(node.value)
            except SyntaxError:  # prose that names a builder, not a program
                continue
    return calls


class TestEveryPairIsTabled(GuardTestCase):
    """A pair a process test builds, in the test or in its children, is in FIXTURES."""

    def test_process_tests_use_tabled_pairs(self) -> None:
        """A new pair in a process test fails here until it is tabled above (and so
        checked on every release)."""
        tabled = {name: make for name, (make, *_) in FIXTURES.items()}
        source = Path(__file__).read_text()
        mine = _pair_calls(source) | {f"{make.__name__}()" for make in tabled.values()
                                      if make.__name__ != "<lambda>"}
        files = {test.partition("::")[0] for test in suite.PROCESS_TESTS
                 if test.count("::") < 2}  # classes and files whose children build pairs
        files.add("tests/scheduler_child.py")
        used = set()
        for name in sorted(files):
            used |= _pair_calls((ROOT / name).read_text())
        self.assertTrue(used, "no pair found: the scan is broken")
        self.assertEqual(sorted(used - mine), [])


if __name__ == "__main__":
    unittest.main()
