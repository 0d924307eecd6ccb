"""A report raised into SGLang's scheduler is printed in full once, before it rises.

SGLang's ``run_scheduler_process`` (the real function, in a forked child) constructs the
scheduler inside ``try``; its ``except Exception`` logs "Scheduler hit an exception:"
with the traceback, then signals its parent (the probe, which ignores SIGQUIT). The
scheduler's construction is where SGLang's bootstrap queue calls ``setup_state_kv_args``:
here the scheduler class is one whose construction makes that call from the prefill
queue's module, by that module's own binding. Only the process set-up before ``try``
(placement, logging configuration) is replaced by no-ops: it needs a real server. Then a
whole launch of such ranks, with SGLang's process-group kill on the first exception.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

from helpers import GuardTestCase, fresh_python
from launch_child import GUARD_ON, read
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=92, suite="stage-a-test-cpu")

PROBE = r"""
import json, logging, multiprocessing, signal, sys
signal.signal(signal.SIGQUIT, signal.SIG_IGN)  # SGLang's handler signals its parent: us
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(name)s %(levelname)s %(message)s")
import sglang.srt.managers.scheduler as scheduler
import sglang_dsv4_guard
import scheduler_race_child
sglang_dsv4_guard.install("on", load_entry_points=False)
kwargs = scheduler_race_child.failing_scheduler()
child = multiprocessing.get_context("fork").Process(target=scheduler.run_scheduler_process,
                                                   kwargs=kwargs)
child.start()
child.join(120)
print(json.dumps({"exitcode": child.exitcode}))
"""
TESTS = os.path.dirname(os.path.abspath(__file__))


class TestSchedulerPrintsTheReportOnce(GuardTestCase):
    """Raised into SGLang's scheduler handler, the report is in the log once."""

    def test_log_carries_the_report_and_the_traceback_points_at_it(self) -> None:
        """The guard logs the full report before raising; the DSV4GuardError that SGLang's
        handler logs with its traceback carries SGLang's first line and one line
        pointing at the logged report by its fingerprint."""
        done = fresh_python(PROBE, path_first=TESTS)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIsNotNone(json.loads(done.stdout.strip().splitlines()[-1])["exitcode"])
        log = done.stderr
        self.assertIn("Scheduler hit an exception: Traceback", log)
        self.assertEqual(log.count("[DSV4G001] error:"), 1, log[-4000:])
        handler_at = log.index("Scheduler hit an exception")
        self.assertLess(log.index("[DSV4G001] error:"), handler_at)  # logged before raising
        ours = log[log.index("sglang_dsv4_guard ERROR"):handler_at]
        [fp] = re.findall(r"\(fingerprint ([0-9a-f]{12}); the DSV4GuardError raised to SGLang, "
                          r"whose traceback SGLang's scheduler .* logs, points here\)", ours)
        traceback = log[handler_at:]
        self.assertIn("DSV4 ", traceback)  # SGLang's own first line
        self.assertIn(f"the full report is logged above by this process (logger "
                      f"sglang_dsv4_guard, fingerprint {fp})", traceback)


class TestKilledLaunchStillPrintsTheReport(GuardTestCase):
    """A launch of two ranks both failing in SGLang's scheduler, where the first
    handler's SIGQUIT and process-group SIGKILL end every rank wherever it is (two race as
    many do: whichever logs first kills the other; many ranks reporting once each is
    TestSpawnedSchedulers' and tests/test_launch_identity.py's)."""

    # One trial per run: tools/matrix.py runs this class once per distinct version of
    # SGLang's run_scheduler_process (seven of them in 0.5.16 - 0.5.23), so a full matrix
    # still races the ranks seven times; three trials per run cost ~4 minutes each.
    TRIALS = 1
    RANKS = 2

    def test_every_launch_prints_the_full_report_at_least_once(self) -> None:
        """In every trial, whichever ranks die before their traceback prints, at least
        one rank's output holds the full report."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SGLANG_DSV4_GUARD", "SGLANG_PLUGINS"))}
        env.update(GUARD_ON, SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION="1")
        copies = []
        for _ in range(self.TRIALS):
            with tempfile.TemporaryDirectory() as d:
                subprocess.run([sys.executable, os.path.join(TESTS, "scheduler_race_child.py"),
                                d, str(self.RANKS)], env=env, capture_output=True, text=True,
                               timeout=600,
                               check=False, start_new_session=True)  # killpg: its own group
                logs = [read(f) for f in sorted(glob.glob(os.path.join(d, "rank*.log")))]
            self.assertEqual(len(logs), self.RANKS)
            copies.append(sum(log.count("[DSV4G001] error:") for log in logs))
        self.assertTrue(all(n >= 1 for n in copies), copies)


if __name__ == "__main__":
    unittest.main()
