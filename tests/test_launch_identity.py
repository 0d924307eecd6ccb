"""Cross-process deduplication suppresses a report only within one launch of one server.

The rule for joining a launch and for sweeping marker directories, then real processes:
launchers that run SGLang's own ``load_plugins()`` before they
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
import time
import unittest
from typing import Any
from unittest import mock

import launch_child
from helpers import GuardTestCase, fresh_python
from launch_child import GUARD_ON, finish, launch_of, read, start_launcher
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.dedup import identity as launch_identity
from sglang_dsv4_guard.dedup.identity import ENV_LAUNCH, Launch, joined_launch, process_start
from sglang_dsv4_guard.dedup.markers import sweep

register_cpu_ci(est_time=242, suite="stage-a-test-cpu")

FULL_THREE = "[DSV4G001] error:"  # a line only the full report of the "three" pair has
POINTER = re.compile(r"same report as printed in full by another process of this launch")
def spec(directory: str, name: str, **more: Any) -> dict[str, Any]:
    return {"pair": "three", "out": os.path.join(directory, f"{name}.log"),
            "done": os.path.join(directory, f"{name}.done"), **more}


_TELLING = ("[DSV4G001] error:", "same report as printed in full", "(fingerprint ")


def gist(outputs: list[str]) -> str:
    """The lines of each process' output that say where the report was printed."""
    return "\n".join(f"process {i}: " + " | ".join(
        ln.strip()[:160] for ln in out.splitlines() if any(t in ln for t in _TELLING))
        for i, out in enumerate(outputs))


class ServerOutputs:
    """What each process of each server printed, and the checks on it."""

    def __init__(self, case: unittest.TestCase, servers: dict[str, list[str]]) -> None:
        self.case, self.servers = case, servers

    def assert_printed_in_full(self, server: str, times: int | None = None) -> None:
        """``server`` printed its report in full (log + traceback = 2 lines per claimant),
        exactly ``times`` processes if given, else at least one."""
        claimants = sum(out.count(FULL_THREE) // 2 for out in self.servers[server])
        if times is None:
            self.case.assertGreaterEqual(claimants, 1, gist(self.servers[server]))
        else:
            self.case.assertEqual(claimants, times, gist(self.servers[server]))

    def assert_pointers_true(self, server: str) -> None:
        """A process saying another process of its server printed the report in full
        is right: another process of the same server did."""
        outputs = self.servers[server]
        for i, out in enumerate(outputs):
            if POINTER.search(out):
                others = [o for j, o in enumerate(outputs) if j != i]
                self.case.assertTrue(any(FULL_THREE in o for o in others),
                                     f"process {i} of server {server} points at a full "
                                     f"report nobody of its server printed:\n{gist(outputs)}")


_GRANDCHILD = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import launch_child
sys.exit(launch_child.launch_through_a_bystander())
"""


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


class TestLaunchIdentityRule(GuardTestCase):
    """Which launch a process joins: only one minted by an ancestor, in its PID namespace,
    and only when ``multiprocessing`` started it (as SGLang starts its schedulers)."""

    def joined(self, launch: Launch | str, *, by_multiprocessing: bool = True) -> Launch | None:
        value = launch if isinstance(launch, str) else launch.name
        parent = mock.Mock(pid=os.getppid()) if by_multiprocessing else None
        with mock.patch.object(launch_identity.multiprocessing, "parent_process",
                               return_value=parent), \
                mock.patch.dict(os.environ, {ENV_LAUNCH: value}), \
                mock.patch.object(launch_identity, "_opened", None):
            return joined_launch()

    def test_multiprocessing_child_joins_its_parents_launch(self) -> None:
        """The launch minted by our parent (PID and start time match) is joined."""
        parent = launch_of(os.getppid(), process_start(os.getppid()))
        self.assertEqual(self.joined(parent), parent)

    def test_launch_of_a_grandparent_is_joined(self) -> None:
        """Real processes: a launcher opens a launch and starts a child that runs no guard
        (SGLang 0.5.16's data-parallel controller never loads plug-ins), which starts a
        grandchild: the grandchild joins the launcher's launch."""
        result = fresh_python(_GRANDCHILD)
        self.assertEqual(result.returncode, 0, result.stderr)
        [minted] = [ln.split()[1] for ln in result.stdout.splitlines() if ln.startswith("MINTED")]
        [joined] = [ln.split()[1] for ln in result.stdout.splitlines() if ln.startswith("JOINED")]
        self.assertEqual(joined, minted)

    def test_process_not_started_by_multiprocessing_joins_nothing(self) -> None:
        """A shell, a supervisor or a test runner's worker inherits the variable but was
        not started as SGLang starts schedulers: it deduplicates with nobody."""
        parent = launch_of(os.getppid(), process_start(os.getppid()))
        self.assertIsNone(self.joined(parent, by_multiprocessing=False))

    def test_reused_pid_joins_nothing(self) -> None:
        """The minter's PID names an ancestor with another start time: another process."""
        reused = launch_of(os.getppid(), (process_start(os.getppid()) or 0) + 1)
        self.assertIsNone(self.joined(reused))

    def test_minter_that_is_not_an_ancestor_joins_nothing(self) -> None:
        """A live process that is not an ancestor (here: this process itself)."""
        self.assertIsNone(self.joined(launch_of(os.getpid(), process_start(os.getpid()))))

    def test_launch_of_another_pid_namespace_joins_nothing(self) -> None:
        """Same PID and start as our parent, but minted in another PID namespace (another
        container): not joined."""
        other = launch_of(os.getppid(), process_start(os.getppid()),
                          namespace=os.stat("/proc/self/ns/pid").st_ino + 1)
        self.assertIsNone(self.joined(other))

    def test_malformed_identity_joins_nothing(self) -> None:
        """A value that is not an identity (hand-set, truncated) is ignored."""
        for value in ("", "1-2", f"{os.getppid()}-{process_start(os.getppid())}",
                      "g" * 32 + "-1-1-1"):
            self.assertIsNone(self.joined(value), value)

    def test_malformed_identity_still_mints_and_warns_once(self) -> None:
        """A value past Python's digit limit or with non-ASCII digits is no identity: the
        process joins nothing, still mints its own for its children, and warns once
        naming the variable, the value and the form expected."""
        for value in ("a" * 32 + "-1-" + "9" * 5000 + "-1", "a" * 32 + "-\u0661-1-1"):
            env = {ENV_LAUNCH: value}
            with mock.patch.object(launch_identity, "_opened", None), \
                    mock.patch.object(launch_identity, "_warned_malformed", False), \
                    mock.patch.object(launch_identity.multiprocessing, "parent_process",
                                      return_value=mock.Mock(pid=os.getppid())), \
                    self.assertLogs("sglang_dsv4_guard", level="WARNING") as logs:
                self.assertIsNone(launch_identity.open_launch(env))
            minted = Launch.parse(env[ENV_LAUNCH])
            self.assertIsNotNone(minted, env[ENV_LAUNCH][:80])
            [record] = logs.records
            self.assertIn(ENV_LAUNCH, record.getMessage())
            self.assertIn(value[:40], record.getMessage())
            self.assertIn("<32 hex digits>-", record.getMessage())
            self.assertLess(len(record.getMessage()), 600)

    def test_open_launch_mints_a_fresh_identity_for_the_children(self) -> None:
        """Each process that opens a launch puts its own new identity into the environment
        its children inherit: this process, unguessable, different every time."""
        minted = []
        for _ in range(2):
            env: dict[str, str] = {}
            with mock.patch.object(launch_identity, "_opened", None):
                self.assertIsNone(launch_identity.open_launch(env))
            launch = Launch.parse(env[ENV_LAUNCH])
            assert launch is not None
            self.assertEqual((launch.pid, launch.start),
                             (os.getpid(), process_start(os.getpid())))
            minted.append(launch.token)
        self.assertNotEqual(minted[0], minted[1])


class TestSweep(GuardTestCase):
    """Marker directories of launches provably gone are removed; a directory this process
    cannot prove dead (another PID namespace, a live minter) stays, however old."""

    def test_sweep_removes_only_provably_gone_launches(self) -> None:
        """Removed: a dead minter and a reused PID in this PID namespace. Kept: a live
        minter, a dead PID of another namespace (also when nothing was written to it
        for over a week), a directory of unknown name, and this process' own launch."""

        parent, start = os.getppid(), process_start(os.getppid())
        ns = os.stat("/proc/self/ns/pid").st_ino
        never = 2**22 + 7  # above the kernel's default pid_max: never alive
        names = {"live": launch_of(parent, start).name,
                 "reused": launch_of(parent, (start or 0) + 1).name,
                 "dead": launch_of(never, 5).name,
                 "other-ns": launch_of(never, 5, namespace=ns + 1).name,
                 "old-other-ns": launch_of(never, 5, namespace=ns + 1).name,
                 "unknown": "1-2", "mine": launch_of(os.getpid(), 1).name}
        with tempfile.TemporaryDirectory() as base:
            for name in names.values():
                os.mkdir(os.path.join(base, name), 0o700)
                os.close(os.open(os.path.join(base, name, "fp"), os.O_CREAT, 0o600))
            weeks = time.time() - 30 * 24 * 3600
            os.utime(os.path.join(base, names["old-other-ns"]), (weeks, weeks))
            self.assertEqual(sweep(base, keep=names["mine"]), 2)
            self.assertEqual(sorted(os.listdir(base)), sorted(
                names[k] for k in ("live", "other-ns", "old-other-ns", "unknown", "mine")))

    def test_sweep_leaves_a_directory_with_many_entries(self) -> None:
        """A gone launch's directory holding far more entries than markers would is left
        as it is (removing it could outlast the sweep's deadline); a small one goes."""
        from sglang_dsv4_guard.dedup import markers as dedup

        with tempfile.TemporaryDirectory() as base:
            big, small = (launch_of(2**22 + 7, 5).name for _ in range(2))
            for name, entries in ((big, 5_000), (small, 3)):
                os.mkdir(os.path.join(base, name), 0o700)
                for i in range(entries):
                    os.close(os.open(os.path.join(base, name, f"{i:012x}"), os.O_CREAT, 0o600))
            began = time.monotonic()
            self.assertEqual(sweep(base, keep="none"), 1)
            self.assertLess(time.monotonic() - began, 1.0)
            self.assertEqual(os.listdir(base), [big])
            self.assertEqual(len(os.listdir(os.path.join(base, big))), 5_000)
            self.assertGreater(5_000, dedup._ENTRIES_MAX)

    def test_sweep_looks_at_a_bounded_number_of_directories(self) -> None:
        """However many gone launches there are, one sweep removes at least one and no
        more than its bound (the rest are left to later sweeps)."""
        from sglang_dsv4_guard.dedup import markers as dedup

        with tempfile.TemporaryDirectory() as base:
            for _ in range(dedup._SWEEP_MAX * 3):
                os.mkdir(os.path.join(base, launch_of(2**22 + 7, 5).name), 0o700)
            removed = sweep(base, keep="none")
            self.assertGreaterEqual(removed, 1)
            self.assertLessEqual(removed, dedup._SWEEP_MAX)
            self.assertEqual(len(os.listdir(base)), dedup._SWEEP_MAX * 3 - removed)


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
            procs = [start_launcher([[a1, a2]], d, "a", UNSHARE),
                     start_launcher([[b1, b2]], d, "b", UNSHARE)]
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


class TestTwoServersRunningFromOneLauncher(GuardTestCase):
    """Two servers run at the same time from one launcher process, which ran SGLang's
    ``load_plugins()`` once (as a script starting two ``sglang.Engine``): they share one
    launch, so the second may point at the first's report, and its pointer must be true."""

    def test_second_servers_pointer_names_a_full_copy_of_its_launch(self) -> None:
        """Server B meets the report server A printed while both run: B prints it in
        full, or one line saying another process of this launch printed it, with the
        fingerprint of A's full copy."""
        with tempfile.TemporaryDirectory() as d:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("SGLANG_DSV4_GUARD", "SGLANG_PLUGINS"))}
            tests = os.path.dirname(os.path.abspath(__file__))
            done = subprocess.run([sys.executable, "-c", TWO_SERVERS, d, tests],
                                  env={**env, **GUARD_ON}, capture_output=True, text=True,
                                  timeout=900, check=False)
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            a, b = read(os.path.join(d, "a.log")), read(os.path.join(d, "b.log"))
        self.assertIn(FULL_THREE, a)
        [printed] = set(re.findall(r"\(fingerprint ([0-9a-f]{12}); also carried by", a))
        if FULL_THREE not in b:
            pointers = re.findall(r"printed in full by another process of this launch "
                                  r"\(fingerprint ([0-9a-f]{12})\)", b)
            self.assertTrue(pointers, b)
            self.assertEqual(set(pointers), {printed}, b)


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
                os.mkdir(os.path.join(base, f"{secrets.token_hex(16)}-{ns}-{2**22 + 7}-5"), 0o700)
            one = spec(d, "one", base=base, counts=os.path.join(d, "counts.json"))
            finish(start_launcher([[one]], d, "one"))
            counts = json.loads(read(one["counts"]))
            output = read(one["out"])
            remaining = len(os.listdir(base))
        self.assertEqual(counts["removed_under_lock"], 0, counts)
        self.assertLessEqual(counts["removed"], 100, counts)
        self.assertGreaterEqual(counts["removed"], 1, counts)  # stale ones still go
        self.assertGreaterEqual(remaining, 20_000 - 100)
        self.assertEqual(output.count(FULL_THREE), 2, gist([output]))  # log + traceback


if __name__ == "__main__":
    unittest.main()
