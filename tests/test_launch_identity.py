"""Cross-process deduplication suppresses a report only within one launch of one server.

Real processes throughout: launchers that run SGLang's own ``load_plugins()`` before they
start ``spawn`` schedulers (as SGLang's engine does), a worker pool started before any
server, and two PID namespaces sharing ``/dev/shm`` (``unshare``, as root).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import secrets
import subprocess
import sys
import tempfile
import unittest
from typing import Any

import launch_child
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=240, suite="stage-a-test-cpu")

FULL_THREE = "[DSV4G001] error:"  # a line only the full report of the "three" pair has
POINTER = re.compile(r"same report as printed in full by another process of this server")
LAUNCH_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_child.py")
GUARD_ON = {"SGLANG_DSV4_GUARD": "1", "SGLANG_PLUGINS": "dsv4_guard"}


def launcher_env() -> dict[str, str]:
    """This environment without any guard or plug-in variable, with the guard on."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SGLANG_DSV4_GUARD", "SGLANG_PLUGINS"))}
    return {**env, **GUARD_ON}


def start_launcher(specs: list[dict[str, Any]], directory: str, name: str,
                   prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """Start ``launch_child.py`` (optionally under ``prefix``, e.g. ``unshare``)."""
    spec_path = os.path.join(directory, f"{name}.json")
    with open(spec_path, "w", encoding="utf-8") as out:
        json.dump(specs, out)
    return subprocess.Popen([*prefix, sys.executable, LAUNCH_CHILD, spec_path],
                            env=launcher_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str]) -> str:
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"launcher exited with {proc.returncode}:\n{output}"
    return output


def read(path: str) -> str:
    with open(path, encoding="utf-8") as given:
        return given.read()


def spec(directory: str, name: str, **more: Any) -> dict[str, Any]:
    return {"pair": "three", "out": os.path.join(directory, f"{name}.log"),
            "done": os.path.join(directory, f"{name}.done"), **more}


class ServerOutputs:
    """What each process of each server printed, and the checks on it."""

    def __init__(self, case: unittest.TestCase, servers: dict[str, list[str]]) -> None:
        self.case, self.servers = case, servers

    def assert_printed_in_full(self, server: str, times: int | None = None) -> None:
        """``server`` printed its report in full (log + traceback = 2 lines per claimant),
        exactly ``times`` processes if given, else at least one."""
        claimants = sum(out.count(FULL_THREE) // 2 for out in self.servers[server])
        if times is None:
            self.case.assertGreaterEqual(claimants, 1, self.servers[server])
        else:
            self.case.assertEqual(claimants, times, self.servers[server])

    def assert_pointers_true(self, server: str) -> None:
        """A process saying another process of its server printed the report in full
        is right: another process of the same server did."""
        outputs = self.servers[server]
        for i, out in enumerate(outputs):
            if POINTER.search(out):
                others = [o for j, o in enumerate(outputs) if j != i]
                self.case.assertTrue(any(FULL_THREE in o for o in others),
                                     f"process {i} of server {server} points at a full "
                                     f"report nobody of its server printed:\n{outputs}")


class TestPreStartedPool(GuardTestCase):
    """Four workers of a pool started before any server (none ran the guard yet); two
    become server A's schedulers, then two become server B's."""

    def test_each_server_prints_its_report_and_no_pointer_lies(self) -> None:
        """Server B meets the report after A: B still prints it in full, and no process
        points at a full report that no process of its own server printed."""
        saved = {k: os.environ.get(k) for k in (*GUARD_ON, "SGLANG_DSV4_GUARD_LAUNCH")}
        os.environ.update(GUARD_ON)
        os.environ.pop("SGLANG_DSV4_GUARD_LAUNCH", None)  # this process minted no launch
        self.addCleanup(lambda: [os.environ.pop(k, None) if v is None
                                 else os.environ.__setitem__(k, v) for k, v in saved.items()])
        ctx = multiprocessing.get_context("spawn")
        with tempfile.TemporaryDirectory() as d, \
                ctx.Pool(4, launch_child.pool_initializer, (ctx.Barrier(4),)) as pool:
            a = [spec(d, f"a{i}") for i in range(2)]
            b = [spec(d, f"b{i}", wait_for=[s["done"] for s in a]) for i in range(2)]
            results = [pool.apply_async(launch_child.pool_task, (s,)) for s in (*a, *b)]
            pids = [r.get(900) for r in results]
            self.assertEqual(len(set(pids)), 4, pids)  # four workers, one task each
            outputs = ServerOutputs(self, {"A": [read(s["out"]) for s in a],
                                           "B": [read(s["out"]) for s in b]})
        for server in ("A", "B"):
            outputs.assert_printed_in_full(server)
            outputs.assert_pointers_true(server)


UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc")


class TestTwoPidNamespaces(GuardTestCase):
    """Two launchers, each PID 1 of its own PID namespace (containers sharing ``/dev/shm``,
    docker ``--ipc=host``), started at the same moment, two schedulers each. Order:
    A's first scheduler meets the report, then B's first, then both second ones."""

    outputs: ServerOutputs

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        with tempfile.TemporaryDirectory() as d:
            a1 = spec(d, "a1")
            b1 = spec(d, "b1", wait_for=[a1["done"]])
            a2 = spec(d, "a2", wait_for=[b1["done"]])
            b2 = spec(d, "b2", wait_for=[b1["done"]])
            procs = [start_launcher([a1, a2], d, "a", UNSHARE),
                     start_launcher([b1, b2], d, "b", UNSHARE)]
            for proc in procs:
                finish(proc)
            cls.outputs = ServerOutputs(unittest.TestCase(), {
                "A": [read(a1["out"]), read(a2["out"])],
                "B": [read(b1["out"]), read(b2["out"])]})

    def test_each_container_prints_its_report_in_full_once(self) -> None:
        """Each container's launch prints the report in full exactly once: the other
        container's markers neither suppress it (same launcher PID and start tick) nor
        are its own markers swept away while it runs (its PID means nothing here)."""
        self.outputs.case = self
        for server in ("A", "B"):
            self.outputs.assert_printed_in_full(server, times=1)

    def test_pointers_name_a_report_of_the_same_container(self) -> None:
        """Every pointer line in a container points at a full report printed in it."""
        self.outputs.case = self
        for server in ("A", "B"):
            self.outputs.assert_pointers_true(server)


class TestManyStaleLaunches(GuardTestCase):
    """20,000 marker directories of launches that are gone, in this PID namespace."""

    def test_first_claim_does_not_sweep_them_all_under_the_lock(self) -> None:
        """The first claim removes a bounded number of stale directories, none of them
        while holding the deduplicator's lock; the report still prints in full."""
        ns = os.stat("/proc/self/ns/pid").st_ino
        with tempfile.TemporaryDirectory() as d:
            base = os.path.join(d, "base")
            os.mkdir(base, 0o700)
            for _ in range(20_000):  # never-alive PID (above the default pid_max)
                os.mkdir(os.path.join(base, f"{secrets.token_hex(16)}-{ns}-{2**22 + 7}-5"))
            one = spec(d, "one", base=base, counts=os.path.join(d, "counts.json"))
            finish(start_launcher([one], d, "one"))
            counts = json.loads(read(one["counts"]))
            output = read(one["out"])
            remaining = len(os.listdir(base))
        self.assertEqual(counts["removed_under_lock"], 0, counts)
        self.assertLessEqual(counts["removed"], 100, counts)
        self.assertGreaterEqual(counts["removed"], 1, counts)  # stale ones still go
        self.assertGreaterEqual(remaining, 20_000 - 100)
        self.assertEqual(output.count(FULL_THREE), 2, output)  # log + traceback


if __name__ == "__main__":
    unittest.main()
