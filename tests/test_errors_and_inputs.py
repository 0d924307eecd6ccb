"""The guard's exceptions and odd host inputs: errors that travel, and inputs that are not
what SGLang expects but must not break the guard."""

from __future__ import annotations

import concurrent.futures
import copy
import multiprocessing
import pickle
import unittest

import error_worker
import mori_stub
import sglang.srt.disaggregation.utils as utils
from helpers import UNWRAPPED, guard_logs_off, outcome
from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.testing import build_pair, record

register_cpu_ci(est_time=40, suite="stage-a-test-cpu")


def _fields(exc: BaseException) -> tuple[object, ...]:
    """What must survive a round trip: type, message and the exception's fields."""
    return (type(exc), str(exc), getattr(exc, "report", None), getattr(exc, "variable", None),
            getattr(exc, "value", None), getattr(exc, "accepted", None),
            getattr(exc, "reason", None), getattr(exc, "target", None),
            str(getattr(exc, "error", "")), str(getattr(exc, "host_error", "")))


class TestErrorsTravel(CustomTestCase):
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


_NOT_IMPLEMENTED = "DSV4 draft pools are not implemented on this backend"


class _NotImplementedPool(DeepSeekV4TokenToKVPool):  # type: ignore[misc]
    """A DSV4 pool subclass (a backend port) that raises NotImplementedError("DSV4 ...")."""

    @property
    def compression_ratios(self) -> list[int]:
        raise NotImplementedError(_NOT_IMPLEMENTED)


class TestOnlySGLangsOwnRuntimeErrorIsUpgraded(CustomTestCase):
    """Only SGLang's exact RuntimeError becomes DSV4GuardError; subclasses rise as they are."""

    def test_not_implemented_error_stays_itself_in_setup_state(self) -> None:
        """A NotImplementedError("DSV4 ...") from setup_state_kv_args rises unchanged, so
        `except NotImplementedError` still matches; the report is a note, and no DSV4G099."""
        target, draft = build_pair()
        draft.__class__ = _NotImplementedPool
        _, host = outcome(UNWRAPPED, target, draft)
        self.assertIs(type(host), NotImplementedError)
        sglang_dsv4_guard.install("on", load_entry_points=False)
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

        mgr = mori_stub.manager(conn, attn_tp=8)
        del mgr.__dict__["is_mla_backend"]
        mgr.__class__ = FirstReadFails
        sglang_dsv4_guard.install("on", load_entry_points=False)
        args = mori_stub.send_args(conn, mori_stub.peer(conn, "decode-ni", decode_tp=2), "swa")
        with guard_logs_off(), self.assertRaises(NotImplementedError) as caught:
            conn.MoriKVManager._send_swa_dsa_state(mgr, *args)
        self.assertIs(type(caught.exception), NotImplementedError)
        self.assertNotIsInstance(caught.exception, DSV4GuardError)


if __name__ == "__main__":
    unittest.main()
