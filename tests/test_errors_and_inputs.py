"""The guard's exceptions and odd host inputs: errors that travel, and inputs that are not
what SGLang expects but must not break the guard."""

from __future__ import annotations

import concurrent.futures
import copy
import multiprocessing
import pickle
import unittest

import error_worker
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

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


if __name__ == "__main__":
    unittest.main()
