"""Review-c findings, each a behaviour the docs promise and that does not hold (yet).

Real processes: a launcher runs SGLang's own ``load_plugins()`` and starts schedulers with
``spawn`` as SGLang's engine does; each scheduler runs SGLang's real ``setup_state_kv_args``
(:mod:`scheduler_child`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import unittest

from helpers import GuardTestCase
from launch_child import GUARD_ON, read
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=120, suite="stage-a-test-cpu")

# Run by ``python -c``: server A's scheduler starts, then server B's (both from one
# launcher that ran load_plugins() once, as a script starting two sglang.Engine does);
# A meets the report, then B meets the same report while A is still alive.
TWO_SERVERS = r"""
import multiprocessing, os, sys, time
sys.path.insert(0, sys.argv[2])
import launch_child
from sglang.srt.plugins import load_plugins
load_plugins()
d = sys.argv[1]
ctx = multiprocessing.get_context("spawn")
a = ctx.Process(target=launch_child.scheduler, args=({
    "pair": "three", "out": f"{d}/a.log", "wait_for": [f"{d}/b-started"], "done": f"{d}/a-done"},))
a.start()
time.sleep(1.0)  # the second server starts later, as a second Engine(...) does
b = ctx.Process(target=launch_child.scheduler, args=({
    "pair": "three", "out": f"{d}/b.log", "wait_for": [f"{d}/a-done"]},))
b.start()
time.sleep(1.0)
open(f"{d}/b-started", "w").close()
a.join(600); b.join(600)
sys.exit(abs(a.exitcode or 0) + abs(b.exitcode or 0))
"""


class TestServersStartedOneAfterTheOther(GuardTestCase):
    """docs/operating.md, Limitations: "Servers started one after the other from one
    process are kept apart (markers older than a process never count)"."""

    def test_second_server_prints_its_report_in_full(self) -> None:
        """Server B, started after server A from the same launcher, meets the report
        A printed while both run: B's own output must carry the full report."""
        with tempfile.TemporaryDirectory() as d:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("SGLANG_DSV4_GUARD", "SGLANG_PLUGINS"))}
            tests = os.path.dirname(os.path.abspath(__file__))
            done = subprocess.run([sys.executable, "-c", TWO_SERVERS, d, tests],
                                  env={**env, **GUARD_ON}, capture_output=True, text=True,
                                  timeout=900, check=False)
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            a, b = read(os.path.join(d, "a.log")), read(os.path.join(d, "b.log"))
        self.assertIn("[DSV4G001] error:", a)
        self.assertIn("[DSV4G001] error:", b, b)


if __name__ == "__main__":
    unittest.main()
