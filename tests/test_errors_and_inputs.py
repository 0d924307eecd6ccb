"""The guard's exceptions and odd host inputs: errors that travel, and inputs that are not
what SGLang expects but must not break the guard."""

from __future__ import annotations

import concurrent.futures
import copy
import multiprocessing
import os
import pickle
import sys
import threading
import unittest
import warnings
from typing import Any
from unittest import mock

import error_worker
import mori_stub
import sglang.srt.disaggregation.utils as utils
import torch
from helpers import UNWRAPPED, GuardTestCase, guard_logs_off, outcome
from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import DSV4GuardError, Finding, Observation, Severity, hookimpl
from sglang_dsv4_guard.testing import build_pair, record, register

register_cpu_ci(est_time=54, suite="stage-a-test-cpu")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import bench_memory  # noqa: E402  (the benchmark's own probe: one measurement, two users)


def _fields(exc: BaseException) -> tuple[object, ...]:
    """What must survive a round trip: type, message and the exception's fields."""
    return (type(exc), str(exc), getattr(exc, "report", None), getattr(exc, "variable", None),
            getattr(exc, "value", None), getattr(exc, "accepted", None),
            getattr(exc, "reason", None), getattr(exc, "target", None),
            str(getattr(exc, "error", "")), str(getattr(exc, "host_error", "")))


class TestErrorsTravel(GuardTestCase):
    """Every guard exception survives pickle, copy, deepcopy and a process pool."""

    def test_errors_round_trip_pickle_copy_deepcopy(self) -> None:
        """Same type, message, report and fields after pickle, copy and deepcopy."""
        for name, exc in error_worker.sample_errors().items():
            for how, clone in (("pickle", lambda e: pickle.loads(pickle.dumps(e))),
                               ("copy", copy.copy), ("deepcopy", copy.deepcopy)):
                with self.subTest(error=name, how=how):
                    back = clone(exc)
                    self.assertEqual(_fields(back), _fields(exc))

    def test_errors_cross_a_spawned_process_pool(self) -> None:
        """Raised in a spawn-context ProcessPoolExecutor worker, each error reaches the parent
        as itself, not as BrokenProcessPool."""
        expected = error_worker.sample_errors()
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            futures = {name: pool.submit(error_worker.raise_sample, name) for name in expected}
            for name, future in futures.items():
                with self.subTest(error=name):
                    back = future.exception(timeout=120)
                    self.assertIsNotNone(back)
                    assert back is not None
                    self.assertEqual(_fields(back), _fields(expected[name]))
        self.assertEqual(expected["DSV4GuardError"].findings[0].value("draft pool"), 64)


class _LockObserver:
    """A plug-in whose finding observes an unpicklable value (a threading.Lock)."""

    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: Any, context: Any) -> list[Finding]:
        return [Finding("ACME200", Severity.WARNING, "lock", "draft pool", observations=(
            Observation("draft pool", "lock", threading.Lock(), "a plug-in"),))]


class TestUnpicklablePluginValueTravels(GuardTestCase):
    """Item 12: a real wrapper error carrying a plug-in's unpicklable value still travels."""

    def test_error_with_a_lock_observation_crosses_a_spawn_pool(self) -> None:
        """The real wrapper's DSV4GuardError, with a plug-in observation holding a Lock:
        pickle, deepcopy and a spawn pool give back the same type and message, the lock
        reduced to its repr, instead of a TypeError."""
        self.install_guard("on", load_entry_points=False)
        register(_LockObserver())
        target, draft = build_pair(mapping="different")
        with guard_logs_off():
            _, guarded = outcome(utils.setup_state_kv_args, target, draft)
        self.assertIsInstance(guarded, DSV4GuardError)
        for back in (pickle.loads(pickle.dumps(guarded)), copy.deepcopy(guarded)):
            self.assertIs(type(back), DSV4GuardError)
            self.assertEqual(str(back), str(guarded))
            self.assertEqual(back.report.codes, guarded.report.codes)
            self.assertIn("lock", str(back.findings[-1].value("draft pool")))
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            back = pool.submit(error_worker.raise_given, guarded).exception(timeout=120)
        self.assertIs(type(back), DSV4GuardError)
        self.assertEqual(str(back), str(guarded))


_NOT_IMPLEMENTED = "DSV4 draft pools are not implemented on this backend"


class _NotImplementedPool(DeepSeekV4TokenToKVPool):  # type: ignore[misc]
    """A DSV4 pool subclass (a backend port) that raises NotImplementedError("DSV4 ...")."""

    @property
    def compression_ratios(self) -> list[int]:
        raise NotImplementedError(_NOT_IMPLEMENTED)


def _send_to_mismatched_peer(conn: Any, manager_class: type, attribute: str) -> None:
    """An swa transfer from a TP-8 prefill manager of ``manager_class`` (whose property
    ``attribute`` replaces the stub's plain value) to a TP-2 decode peer."""
    mgr = mori_stub.manager(conn, attn_tp=8)
    del mgr.__dict__[attribute]
    mgr.__class__ = manager_class
    args = mori_stub.send_args(conn, mori_stub.peer(conn, "decode-x", decode_tp=2), "swa")
    conn.MoriKVManager._send_swa_dsa_state(mgr, *args)


class TestOnlySGLangsOwnRuntimeErrorIsUpgraded(GuardTestCase):
    """Only SGLang's exact RuntimeError becomes DSV4GuardError; subclasses rise as they are."""

    def test_not_implemented_error_stays_itself_in_setup_state(self) -> None:
        """A NotImplementedError("DSV4 ...") from setup_state_kv_args rises unchanged, so
        `except NotImplementedError` still matches; the report is a note, and no DSV4G099."""
        target, draft = build_pair()
        draft.__class__ = _NotImplementedPool
        _, host = outcome(UNWRAPPED, target, draft)
        self.assertIs(type(host), NotImplementedError)
        self.install_guard("on", load_entry_points=False)
        with guard_logs_off():
            _, guarded = outcome(utils.setup_state_kv_args, target, draft)
        self.assertIs(type(guarded), NotImplementedError)
        self.assertEqual(str(guarded), _NOT_IMPLEMENTED)
        self.assertNotIn("DSV4G099", guarded.dsv4_guard_report.codes)

    def test_not_implemented_error_stays_itself_in_mori_send(self) -> None:
        """The MORI send path too: a NotImplementedError("DSV4 ...") raised while SGLang reads
        the manager, for a TP-mismatched peer, is not turned into DSV4GuardError."""
        mori_stub.install_stub()
        import sglang.srt.disaggregation.mori.conn as conn

        class FirstReadFails(conn.MoriKVManager):  # type: ignore[misc,name-defined]
            @property
            def is_mla_backend(self) -> bool:
                self.reads = getattr(self, "reads", 0) + 1
                if self.reads == 1:
                    raise NotImplementedError(_NOT_IMPLEMENTED)
                return False

        self.install_guard("on", load_entry_points=False)
        with guard_logs_off(), self.assertRaises(NotImplementedError) as caught:
            _send_to_mismatched_peer(conn, FirstReadFails, "is_mla_backend")
        self.assertIs(type(caught.exception), NotImplementedError)
        self.assertNotIsInstance(caught.exception, DSV4GuardError)

    def test_strict_internal_failure_on_the_mori_path_is_a_note_under_sglangs_error(self) -> None:
        """Strict mode, SGLang's own TP error in a transfer, and the guard fails while reading
        the manager: SGLang's exact RuntimeError rises with its own message first; the
        guard's failure is a note on it, never a replacement."""
        mori_stub.install_stub()
        import sglang.srt.disaggregation.mori.conn as conn

        class BrokenServerArgs(conn.MoriKVManager):  # type: ignore[misc,name-defined]
            @property
            def server_args(self) -> Any:  # read by the guard's snapshot, never by SGLang here
                raise ValueError("server args unreadable")

        self.install_guard("strict", load_entry_points=False)
        with guard_logs_off(), self.assertRaises(RuntimeError) as caught:
            _send_to_mismatched_peer(conn, BrokenServerArgs, "server_args")
        self.assertIs(type(caught.exception), RuntimeError)
        self.assertTrue(str(caught.exception).startswith(
            "PD state transfer does not support TP-mismatched non-MLA SWA models"))
        self.assertIn("failed internally", "\n".join(getattr(caught.exception, "__notes__", [])))


class TestOddCompressionRatios(GuardTestCase):
    """compression_ratios that are not a list: the real problem named, no false DSV4G099."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)
        self.recorder = record()

    def test_none_or_zero_ratios_name_the_value_not_a_missing_attribute(self) -> None:
        """None and 0: SGLang's `not ratios` raises its SWA-only error; the guard says
        "compression_ratios is None, not a list" under that line, with no DSV4G010/099."""
        for value, text in ((None, "None (NoneType)"), (0, "0 (int)")):
            with self.subTest(value=value):
                target, draft = build_pair()
                draft.compression_ratios = value
                _, host = outcome(UNWRAPPED, target, draft)
                with guard_logs_off():
                    _, guarded = outcome(utils.setup_state_kv_args, target, draft)
                self.assertIsInstance(guarded, DSV4GuardError)
                self.assertEqual(str(guarded).splitlines()[0], str(host))
                self.assertEqual(guarded.report.codes, ("DSV4G001",))
                self.assertIn(f"compression_ratios is {text}, not a list",
                              guarded.findings[0].summary)

    def test_one_element_arrays_and_early_nonzero_match_sglangs_verdict(self) -> None:
        """np.array([0]) and torch.tensor([0]): SGLang's `not ratios` is True, so it raises
        its SWA-only error; [4, torch.tensor([0, 0])]: SGLang's all() stops at 4 and raises
        the same error before the ambiguous tensor. The guard predicts each (DSV4G001 under
        SGLang's line) and reports no false DSV4G099."""
        import numpy as np

        for label, make in (("np.array([0])", lambda: np.array([0])),
                            ("torch.tensor([0])", lambda: torch.tensor([0])),
                            ("[4, tensor([0, 0])]", lambda: [4, torch.tensor([0, 0])])):
            with self.subTest(ratios=label):
                target, draft = build_pair()
                draft.compression_ratios = make()
                _, host = outcome(UNWRAPPED, target, draft)
                self.assertEqual(str(host), "DSV4 draft state transfer expects SWA-only NextN layers")
                self.recorder.reports.clear()
                with guard_logs_off():
                    _, guarded = outcome(utils.setup_state_kv_args, target, draft)
                self.assertIsInstance(guarded, DSV4GuardError)
                self.assertEqual(str(guarded).splitlines()[0], str(host))
                self.assertEqual(guarded.report.codes, ("DSV4G001",))

    def test_generator_ratios_are_not_consumed_and_give_no_g099(self) -> None:
        """A generator: the guard does not consume it before SGLang (whose check iterates it),
        so SGLang's verdict stands either way, and no false DSV4G099 appears."""
        for ratios, verdict in (((0, 4), "raised"), ((0, 0), "ok")):
            with self.subTest(ratios=ratios):
                target, draft = build_pair()
                draft.compression_ratios = (r for r in ratios)
                host_kind, _ = outcome(UNWRAPPED, target, draft)
                self.assertEqual(host_kind, verdict)
                draft.compression_ratios = (r for r in ratios)
                with guard_logs_off():
                    kind, guarded = outcome(utils.setup_state_kv_args, target, draft)
                self.assertEqual(kind, verdict)
                codes = [c for report in self.recorder.reports for c in report.codes]
                self.assertNotIn("DSV4G099", codes)
                self.assertIn("DSV4G001", codes)  # the warning that it is a generator
                if verdict == "raised":
                    self.assertEqual(str(guarded).splitlines()[0],
                                     "DSV4 draft state transfer expects SWA-only NextN layers")

    def test_million_layers_render_capped(self) -> None:
        """A million compressed draft layers: every rendered list shows 16 items and a count;
        the message and the JSON report stay a few kilobytes."""
        target, draft = build_pair()
        draft.compression_ratios = [4] * 1_000_000
        with guard_logs_off():
            _, guarded = outcome(utils.setup_state_kv_args, target, draft)
        self.assertIsInstance(guarded, DSV4GuardError)
        self.assertLess(len(str(guarded)), 8_000)
        self.assertLess(len(guarded.report.to_json()), 8_000)
        self.assertIn("... +999984 more (1000000 in all)", str(guarded))
        self.assertIn("(+999984 more)", guarded.findings[0].details[0])
        self.assertEqual(len(guarded.findings[0].value("draft pool")), 1_000_000)  # data kept


class TestMappingComparisonMemory(GuardTestCase):
    """Comparing two big mappings costs little memory, whatever their differences."""

    def test_20m_entries_differing_everywhere_stay_under_an_eighth(self) -> None:
        """20M int64 entries that all differ: the guard's comparison grows peak RSS by less
        than 1/8 of one mapping (no tensor of differing indices); the probe itself does see
        the one-shot nonzero() it replaced, so it can tell the two apart."""
        guard = bench_memory.measure("guard")
        self.assertLess(guard["extra_bytes"], guard["mapping_bytes"] / 8, guard)
        naive = bench_memory.measure("naive")
        self.assertGreater(naive["extra_bytes"], naive["mapping_bytes"] / 2, naive)


def _exotic(kind: str) -> Any:
    with warnings.catch_warnings():  # torch: sparse CSR and nested tensors are beta
        warnings.simplefilter("ignore", UserWarning)
        return _build_exotic(kind)


def _build_exotic(kind: str) -> Any:
    base = torch.arange(16, dtype=torch.int64)
    if kind == "meta":
        return torch.empty(16, dtype=torch.int64, device="meta")
    if kind == "sparse":
        return base.to_sparse()
    if kind == "sparse_csr":
        return base.reshape(4, 4).to_sparse_csr()
    return torch.nested.nested_tensor([base[:8].clone(), base[8:].clone()])


_MAPPING_LINE = "DSV4 target and draft pools must share the SWA index mapping"


class TestExoticMappingTensors(GuardTestCase):
    """Meta, sparse and nested mapping tensors never make the guard fail internally, and in
    strict mode SGLang's message always comes first."""

    def test_exotic_mappings_are_described_not_failed_on(self) -> None:
        """On either side or both, in modes on and strict: SGLang's own first line, a DSV4G004
        that says why the contents were not compared, and no internal-error log line."""
        for mode in ("on", "strict"):
            self.install_guard(mode, load_entry_points=False)
            for kind in ("meta", "sparse", "sparse_csr", "nested"):
                for side in ("draft", "target", "both"):
                    with self.subTest(mode=mode, kind=kind, side=side):
                        target, draft = build_pair()
                        if side != "target":
                            draft.register_mapping(_exotic(kind))
                        if side != "draft":
                            target.register_mapping(_exotic(kind))
                        with self.assertLogs("sglang_dsv4_guard", level="WARNING") as logs:
                            _, guarded = outcome(utils.setup_state_kv_args, target, draft)
                        self.assertFalse([r for r in logs.output if "internal error" in r])
                        self.assertEqual(str(guarded).splitlines()[0], _MAPPING_LINE)
                        self.assertEqual(guarded.report.codes, ("DSV4G004",))
                        self.assertIn("contents not comparable (", str(guarded))
                        self.assertIn("same memory layout: no", str(guarded))

    def test_strict_passes_one_sparse_mapping_object_shared_by_both_pools(self) -> None:
        """SGLang accepts a pair whose pools hold the very same sparse mapping object; strict
        mode must pass it too (the re-snapshot fingerprint cannot read a sparse data pointer),
        and nothing is logged as an internal error."""
        for kind in ("sparse", "sparse_csr"):
            with self.subTest(kind=kind):
                self.install_guard("strict", load_entry_points=False)
                target, draft = build_pair()
                shared = _exotic(kind)
                target.register_mapping(shared)
                draft.register_mapping(shared)
                host_kind, _ = outcome(UNWRAPPED, target, draft)
                self.assertEqual(host_kind, "ok")
                with self.assertNoLogs("sglang_dsv4_guard", level="ERROR"):
                    kind_seen, guarded = outcome(utils.setup_state_kv_args, target, draft)
                self.assertEqual(kind_seen, "ok", guarded)

    def test_strict_internal_failure_is_a_note_under_sglangs_error(self) -> None:
        """A failure of ours in strict mode (injected into the snapshot) no longer replaces
        SGLang's error: SGLang's exception rises with ours as a note."""
        self.install_guard("strict", load_entry_points=False)
        target, draft = build_pair(mapping="different")
        _, host = outcome(UNWRAPPED, target, draft)
        with guard_logs_off(), mock.patch("sglang_dsv4_guard.state.wrapper.snapshot_pair",
                                          side_effect=RuntimeError("injected guard bug")):
            _, guarded = outcome(utils.setup_state_kv_args, target, draft)
        self.assertIs(type(guarded), RuntimeError)
        self.assertEqual(str(guarded), str(host))
        self.assertIn("sglang-dsv4-guard (strict mode) failed internally while checking the "
                      "pools before setup_state_kv_args: RuntimeError: injected guard bug",
                      "\n".join(guarded.__notes__))

    def test_strict_internal_failure_still_blocks_a_pair_sglang_accepts(self) -> None:
        """Strict mode on SGLang's pass path: our failure is raised after SGLang's call."""
        self.install_guard("strict", load_entry_points=False)
        with guard_logs_off(), mock.patch("sglang_dsv4_guard.state.wrapper.snapshot_pair",
                                          side_effect=RuntimeError("injected guard bug")):
            kind, guarded = outcome(utils.setup_state_kv_args, *build_pair())
        self.assertEqual(kind, "raised")
        self.assertIn("failed internally", str(guarded))


if __name__ == "__main__":
    unittest.main()
