"""The SGLang patch series (patches/), applied with ``patch -p2`` to a copy of the release.

Runs only on that patched copy: ``tools/patched_tree.py`` builds it, puts it first on
``PYTHONPATH`` and names it in ``DSV4_GUARD_PATCHED_TREE``; the released tree is in
``DSV4_GUARD_RELEASED_TREE``, from which the released ``setup_state_kv_args`` is loaded
under another module name to compare against, over the same SGLang pool classes.

- patched and released ``setup_state_kv_args`` agree on every drawn pair: the same
  outcome, the same first line, the same ``kv_args``; the patched message names every
  failing check the guard reports, one line each; with the guard installed over the
  patched tree there is no ``DSV4G099`` and no line of SGLang's message is said twice;
- with any two attributes missing, patched and released raise the same first line (the
  patch reads the pools in the released order until the first failure);
- MORI logs one registration warning per mismatched peer, and ``_send_swa_dsa_state``
  is the released code, unchanged.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import logging
import os
import sys
import unittest
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import mori_stub
import sglang.srt.disaggregation.utils as utils
import test_parity_property as parity
from helpers import geometry_prefix, guard_logs_off, outcome
from hypothesis import given
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError, Finding, Severity
from sglang_dsv4_guard.testing import PoolSpec, Recorder, build_pair, record

register_cpu_ci(est_time=180, suite="stage-a-test-cpu")

UTILS = "sglang/srt/disaggregation/utils.py"
MORI = "sglang/srt/disaggregation/mori/conn.py"
PATCHED_TREE = Path(os.environ["DSV4_GUARD_PATCHED_TREE"])
RELEASED_TREE = Path(os.environ["DSV4_GUARD_RELEASED_TREE"])


def _load_released(relative: str, name: str) -> ModuleType:
    """The released file as its own module; its imports resolve to the shared SGLang."""
    spec = importlib.util.spec_from_file_location(name, RELEASED_TREE / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


RELEASED = _load_released(UTILS, "dsv4_guard_released_sglang_utils")
# The patched function itself, kept in a dict: the guard rebinds module globals holding it.
PATCHED = {"setup_state_kv_args": utils.setup_state_kv_args}

# Words of each check's SGLang message, by the guard's code for that check.
CHECK_WORDS = {
    "DSV4G001": "expects SWA-only NextN layers",
    "DSV4G002": "must use the same unified-KV mode",
    "DSV4G003": "must share SWA ring geometry",
    "DSV4G004": "must share the SWA index mapping",
}


def names_check(finding: Finding, line: str) -> bool:
    """Whether ``line`` of the patched message names the check ``finding`` reports."""
    if finding.code == "DSV4G005":
        return geometry_prefix().rstrip(": ") in line
    if finding.code == "DSV4G010":
        obs = finding.observations[0]
        return obs.role in line and f"no attribute '{obs.name.split('.')[0]}" in line
    return CHECK_WORDS[finding.code] in line


def failing_lines(message: str) -> list[str]:
    """The first line and every ``also:`` line: one per failing check."""
    lines = message.splitlines()
    return lines[:1] + [line for line in lines[1:] if line.startswith("also: ")]


# Every attribute a missing read can name, in no particular order.
MISSABLE = (*parity.DROPPABLE, "request_window", "unified_swa_window",
            "full_to_swa_index_mapping")


class TestPatchedTree(CustomTestCase):
    """The process imports the patched copy, and the released function from the release."""

    def test_imports_the_patched_copy(self) -> None:
        """SGLang's utils come from the patched copy, carry the series, and differ from the
        released file loaded for comparison."""
        self.assertTrue(Path(utils.__file__).resolve().is_relative_to(PATCHED_TREE.resolve()))
        self.assertTrue(hasattr(utils, "_dsv4_draft_mismatches"))
        self.assertFalse(hasattr(RELEASED, "_dsv4_draft_mismatches"))
        self.assertEqual(Path(RELEASED.__file__).resolve(), (RELEASED_TREE / UTILS).resolve())


class TestPatchedStateParity(CustomTestCase):
    """Patched and released ``setup_state_kv_args`` agree; the patch reports every check."""

    recorder: Recorder | None = None

    def tearDown(self) -> None:
        sglang_dsv4_guard.uninstall()
        super().tearDown()

    def _guard(self) -> Recorder:
        """The guard, installed once for all of a property's examples (installing is slow)."""
        if self.recorder is None or not sglang_dsv4_guard.is_installed():
            sglang_dsv4_guard.install("on", load_entry_points=False)
            self.recorder = record()
        return self.recorder

    @given(pair=parity.pairs())
    def test_patched_agrees_with_released(self, pair: tuple[Any, Any]) -> None:
        """Same outcome, first line and kv_args; one line per failing check the guard finds;
        the guard over the patched tree predicts SGLang and repeats none of its lines."""
        expected = outcome(RELEASED.setup_state_kv_args, *pair)
        actual = outcome(PATCHED["setup_state_kv_args"], *pair)
        self.assertEqual(actual[0], expected[0])
        if expected[0] == "ok":
            self.assertEqual(actual[1], expected[1])
        else:
            self.assertIs(type(actual[1]), type(expected[1]))
            self.assertEqual(str(actual[1]).splitlines()[0], str(expected[1]).splitlines()[0])
        recorder = self._guard()
        seen = len(recorder.reports)
        with guard_logs_off():
            with_guard = outcome(utils.setup_state_kv_args, *pair)
        self.assertNotIn("DSV4G099", [c for r in recorder.reports[seen:] for c in r.codes])
        self.assertEqual(with_guard[0], actual[0])
        message = str(actual[1]) if actual[0] == "raised" else ""
        if not (isinstance(actual[1], RuntimeError) and message.startswith("DSV4 ")):
            return
        error = with_guard[1]
        self.assertIsInstance(error, DSV4GuardError)
        errors = [f for f in error.findings if f.severity is Severity.ERROR]
        lines = failing_lines(message)
        self.assertEqual(len(lines), len(errors), f"{message}\nguard: {error.report.codes}")
        for finding in errors:
            self.assertTrue(any(names_check(finding, line) for line in lines),
                            f"{finding.code} not named in:\n{message}")
        said = Counter(line for line in str(error).splitlines() if line.strip())
        self.assertEqual([line for line in message.splitlines() if said[line] != 1], [])

    def test_missing_attributes_are_read_in_the_released_order(self) -> None:
        """Accepted pairs of both KV modes with every two attributes removed, from one pool
        or one each: the patched function raises what the released one raises, first line
        included, so until the first failure it reads in the released order. (Exhaustive:
        a random draw of two drops rarely hits the pairs whose order matters.)"""
        for unified in (False, True):
            for first, second in itertools.combinations(MISSABLE, 2):
                for victims in itertools.product((0, 1), repeat=2):
                    pair = build_pair(PoolSpec(unified=unified), PoolSpec(unified=unified))
                    for drop, victim in zip((first, second), victims, strict=True):
                        if drop in vars(pair[victim]):
                            delattr(pair[victim], drop)
                    expected = outcome(RELEASED.setup_state_kv_args, *pair)
                    actual = outcome(PATCHED["setup_state_kv_args"], *pair)
                    case = f"unified={unified}, {first} from {victims[0]}, {second} from {victims[1]}"
                    self.assertEqual(actual[0], expected[0], case)
                    if expected[0] == "raised":
                        self.assertIs(type(actual[1]), type(expected[1]), case)
                        self.assertEqual(str(actual[1]).splitlines()[0],
                                         str(expected[1]).splitlines()[0], case)

    def test_three_mismatches_in_one_error(self) -> None:
        """The demo's pair: SGLang's first line, then the mapping and geometry as also-lines."""
        target, draft = PoolSpec(), PoolSpec(compression_ratios=(0, 4), page_size=128)
        pair = build_pair(target, draft, mapping="clone")
        kind, error = outcome(PATCHED["setup_state_kv_args"], *pair)
        self.assertEqual(kind, "raised")
        lines = str(error).splitlines()
        self.assertEqual(lines[0], "DSV4 draft state transfer expects SWA-only NextN layers")
        self.assertEqual(lines[1], "  draft compression_ratios=[0, 4] (NextN layers have ratio 0)")
        also = [line for line in lines if line.startswith("also: ")]
        self.assertEqual(len(also), 2)
        self.assertIn("must share the SWA index mapping: target=Tensor(shape=(16,), "
                      "dtype=torch.int64, device=cpu), draft=Tensor(shape=(16,), "
                      "dtype=torch.int64, device=cpu); the draft's is a separate tensor",
                      also[0])
        self.assertIn("the draft worker is handed that allocator", also[0])
        self.assertTrue(also[1].startswith("also: " + geometry_prefix() + "target=(256, 128"))

    def test_mapping_lines_are_the_same_every_run(self) -> None:
        """The mapping line names no memory address: two builds of the same pair give the
        same message; a view of the target's mapping is named as one."""
        messages = [str(outcome(PATCHED["setup_state_kv_args"],
                                *build_pair(PoolSpec(), PoolSpec(), mapping=kind))[1])
                    for kind in ("clone", "clone", "view")]
        self.assertEqual(messages[0], messages[1])
        self.assertNotRegex(messages[0], r"0x[0-9a-f]+")
        self.assertIn("the draft's is a view of the target's storage", messages[2])

    def test_one_mismatch_keeps_the_released_message_as_its_first_line(self) -> None:
        """A pair failing one check: the released message, then only that check's values."""
        pair = build_pair(PoolSpec(), PoolSpec(unified=True))
        released, patched = (str(outcome(fn, *pair)[1]).splitlines()
                             for fn in (RELEASED.setup_state_kv_args, PATCHED["setup_state_kv_args"]))
        self.assertEqual(released, ["DSV4 target and draft pools must use the same unified-KV mode"])
        self.assertEqual(patched, [*released, "  target _unified_kv=False, draft _unified_kv=True"])


mori_stub.install_stub()
import sglang.srt.disaggregation.mori.conn as conn  # noqa: E402 - needs the stub first


def _method(source: str, name: str) -> str:
    """``MoriKVManager.<name>`` of ``source``, as an AST dump (comments and layout aside)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "MoriKVManager":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return ast.dump(item)
    raise AssertionError(f"MoriKVManager.{name} not found")


class TestPatchedMori(CustomTestCase):
    """The registration warning, once per peer; the per-request check untouched."""

    LOGGER = "sglang.srt.disaggregation.mori.conn"

    def test_warns_once_per_mismatched_peer(self) -> None:
        """Two registrations of one peer and one of another: two warnings, each naming its
        peer, both TP sizes and the fix."""
        mgr = mori_stub.manager(conn, attn_tp=8)
        a, b = mori_stub.peer(conn, "decode-a", decode_tp=4), mori_stub.peer(conn, "decode-b", 2)
        with self.assertLogs(self.LOGGER, level=logging.WARNING) as logs:
            for p in (a, a, b):
                mgr._add_remote_peer(p)
        self.assertEqual(len(logs.records), 2)
        first = logs.records[0].getMessage()
        self.assertIn("decode-a registered with decode_tp_size=4", first)
        self.assertIn("attention TP size is 8", first)
        self.assertIn("Fix: launch the decode server with attention TP size 8", first)
        self.assertIn("decode-b", logs.records[1].getMessage())
        self.assertEqual(set(mgr.decode_kv_args_table), {"decode-a", "decode-b"})

    def test_silent_where_transfers_work(self) -> None:
        """Equal TP, an MLA pool, no swa state, or a decode-side manager (which sends no
        state): registration logs no warning."""
        decode = mori_stub.manager(conn, attn_tp=8)
        decode.disaggregation_mode = conn.DisaggregationMode.DECODE
        with self.assertNoLogs(self.LOGGER, level=logging.WARNING):
            decode._add_remote_peer(mori_stub.peer(conn, "d0", 4))
            mori_stub.manager(conn, attn_tp=8)._add_remote_peer(mori_stub.peer(conn, "d1", 8))
            mori_stub.manager(conn, attn_tp=8, mla=True)._add_remote_peer(
                mori_stub.peer(conn, "d2", 4))
            mori_stub.manager(conn, attn_tp=8, state_types=("dsa",))._add_remote_peer(
                mori_stub.peer(conn, "d3", 4))

    def test_send_check_is_the_released_code(self) -> None:
        """``_send_swa_dsa_state`` is the released method, and still raises per request."""
        released = (RELEASED_TREE / MORI).read_text()
        patched = (PATCHED_TREE / MORI).read_text()
        self.assertEqual(_method(patched, "_send_swa_dsa_state"),
                         _method(released, "_send_swa_dsa_state"))
        self.assertNotEqual(_method(patched, "_add_remote_peer"),
                            _method(released, "_add_remote_peer"))
        mgr, p = mori_stub.manager(conn, attn_tp=8), mori_stub.peer(conn, "d4", decode_tp=4)
        with self.assertRaisesRegex(RuntimeError, r"^PD state transfer does not support "
                                    r"TP-mismatched non-MLA SWA models \(prefill_tp_size=8, "
                                    r"decode_tp_size=4\)$"):
            mgr._send_swa_dsa_state(*mori_stub.send_args(conn, p, "swa"))

    def test_guard_over_the_patch_says_nothing_twice(self) -> None:
        """With the guard on, a mismatched peer gets SGLang's warning and the guard's report,
        and no line of the warning is repeated."""
        sglang_dsv4_guard.install("on", load_entry_points=False)
        try:
            with self.assertLogs(level=logging.WARNING) as logs:
                mori_stub.manager(conn, attn_tp=8)._add_remote_peer(
                    mori_stub.peer(conn, "d5", decode_tp=4))
        finally:
            sglang_dsv4_guard.uninstall()
        by_logger = Counter(r.name for r in logs.records)
        self.assertEqual(by_logger[self.LOGGER], 1)
        self.assertEqual(by_logger["sglang_dsv4_guard"], 1)
        said = Counter(line for r in logs.records for line in r.getMessage().splitlines())
        warning = next(r for r in logs.records if r.name == self.LOGGER).getMessage()
        self.assertEqual(said[warning], 1)


if __name__ == "__main__":
    unittest.main()
