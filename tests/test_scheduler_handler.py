"""A report raised into SGLang's scheduler is printed once, by SGLang's own handler.

SGLang's ``run_scheduler_process`` (the real function, in a forked child) constructs the
scheduler inside ``try``; its ``except Exception`` logs "Scheduler hit an exception:"
with the traceback, then signals its parent (the probe, which ignores SIGQUIT). The
scheduler's construction is where SGLang's bootstrap queue calls ``setup_state_kv_args``:
here the scheduler class is one whose construction makes that call from the prefill
queue's module, by that module's own binding. Only the process set-up before ``try``
(placement, logging configuration) is replaced by no-ops: it needs a real server.
"""

from __future__ import annotations

import json
import unittest

from helpers import GuardTestCase, fresh_python
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

PROBE = r"""
import inspect, json, logging, multiprocessing, signal, sys, types
signal.signal(signal.SIGQUIT, signal.SIG_IGN)  # SGLang's handler signals its parent: us
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(name)s %(levelname)s %(message)s")
import sglang.srt.disaggregation.prefill as prefill
import sglang.srt.managers.scheduler as scheduler
import sglang_dsv4_guard
sglang_dsv4_guard.install("on", load_entry_points=False)


class QueueStartingScheduler:
    # Constructing SGLang's Scheduler starts its bootstrap queue, which calls
    # setup_state_kv_args; this one makes that call from the prefill queue's module.
    def __init__(self, *args, **kwargs):
        from sglang_dsv4_guard.testing import new_kv_args, three_mismatch_pair
        call = compile("setup_state_kv_args(kv, *pools)", prefill.__file__, "exec")
        exec(call, vars(prefill), {"kv": new_kv_args(), "pools": three_mismatch_pair()})


scheduler.Scheduler = QueueStartingScheduler
for name in ("load_plugins", "configure_scheduler_process", "publish",
             "resolve_spawn_dp_rank", "spawn_world_rank", "SpawnRanks"):
    if hasattr(scheduler, name):  # process set-up before the try: needs a real server
        setattr(scheduler, name, lambda *a, **k: None)
if hasattr(scheduler, "get_observability"):
    scheduler.get_observability = lambda: types.SimpleNamespace(enable_trace=False)
params = inspect.signature(scheduler.run_scheduler_process).parameters
kwargs = {n: None for n, p in params.items() if p.default is inspect.Parameter.empty}
kwargs["server_args"] = types.SimpleNamespace(enable_trace=False)
child = multiprocessing.get_context("fork").Process(target=scheduler.run_scheduler_process,
                                                   kwargs=kwargs)
child.start()
child.join(120)
print(json.dumps({"exitcode": child.exitcode}))
"""


class TestSchedulerPrintsTheReportOnce(GuardTestCase):
    """Raised into SGLang's scheduler handler, the report is in the log once."""

    def test_handler_traceback_carries_the_report_and_the_log_points_at_it(self) -> None:
        """SGLang's handler logs the DSV4GuardError's traceback with the full report; the
        guard's own ERROR line is one line naming the fingerprint and that traceback."""
        done = fresh_python(PROBE)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIsNotNone(json.loads(done.stdout.strip().splitlines()[-1])["exitcode"])
        log = done.stderr
        self.assertIn("Scheduler hit an exception: Traceback", log)
        self.assertEqual(log.count("[DSV4G001] error:"), 1, log[-4000:])
        handler_at = log.index("Scheduler hit an exception")
        self.assertGreater(log.index("[DSV4G001] error:"), handler_at)  # in the traceback
        ours = [line for line in log.splitlines() if line.startswith("sglang_dsv4_guard ERROR")]
        self.assertEqual(len(ours), 1, ours)
        self.assertIn("whose traceback SGLang's scheduler", ours[0])
        self.assertIn("(fingerprint ", ours[0])


if __name__ == "__main__":
    unittest.main()
