"""One full report per problem: in one process, and across a server's scheduler processes.

Issue 15. In one process a raised report is logged as one line (the exception carries
it); across processes started as SGLang starts schedulers (``spawn``, from a launcher
that ran SGLang's ``load_plugins()``) the first process to meet a report prints it in
full and the others one line naming its fingerprint; a second launch prints it in full
again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import unittest
from unittest import mock

import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, fresh_install, fresh_python
from launch_child import finish, launch_of, read, start_launcher
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.dedup.identity import process_start
from sglang_dsv4_guard.dedup.markers import Seen, ServerDedup, fingerprint
from sglang_dsv4_guard.findings import Report
from sglang_dsv4_guard.reporter import LogReporter
from sglang_dsv4_guard.testing import build_pair, check_pools, new_kv_args, three_mismatch_pair

register_cpu_ci(est_time=189, suite="stage-a-test-cpu")

FULL_THREE = "[DSV4G001] error:"  # a line only the full report of the "three" pair has
FULL_UNIFIED = "[DSV4G002] error:"
POINTER = re.compile(r"\[DSV4G001, DSV4G004, DSV4G005\]: same report as printed in full by "
                     r"another process of this launch \(fingerprint ([0-9a-f]{12})\)")



class TestOneProcess(GuardTestCase):
    """In one process: the log carries a report only when no exception does."""

    def tearDown(self) -> None:
        sglang_dsv4_guard.uninstall()
        super().tearDown()

    def test_raised_report_is_logged_in_full_by_the_claimant(self) -> None:
        """SGLang's error with three problems: the process claiming the report logs it in
        full before raising (SGLang may kill the process group before its traceback
        prints), and the exception carries it too; a repeat logs and carries one line."""
        fresh_install("on", load_entry_points=False)
        with self.assertLogs("sglang_dsv4_guard", level=logging.INFO) as logs, \
                self.assertRaises(DSV4GuardError) as caught:
            utils.setup_state_kv_args(new_kv_args(), *three_mismatch_pair())
        self.assertIn(FULL_THREE, str(caught.exception))
        [record] = logs.records
        self.assertIn(FULL_THREE, record.getMessage())
        self.assertIn("also carried by the DSV4GuardError raised to SGLang", record.getMessage())
        with self.assertLogs("sglang_dsv4_guard", level=logging.INFO) as logs, \
                self.assertRaises(DSV4GuardError) as caught:
            utils.setup_state_kv_args(new_kv_args(), *three_mismatch_pair())
        self.assertNotIn(FULL_THREE, str(caught.exception))
        [record] = logs.records
        self.assertEqual(len(record.getMessage().splitlines()), 1)
        self.assertIn("printed in full earlier by this process", record.getMessage())

    def test_note_path_logs_the_report_and_names_the_note(self) -> None:
        """SGLang's own AttributeError (the report rides as a PEP 678 note, which Python
        3.10 never prints): the log carries the full report and names the note, not a
        DSV4GuardError."""
        fresh_install("on", load_entry_points=False)
        target, draft = build_pair()
        del draft.page_size
        with self.assertLogs("sglang_dsv4_guard", level=logging.INFO) as logs, \
                self.assertRaises(AttributeError):
            utils.setup_state_kv_args(new_kv_args(), target, draft)
        [record] = logs.records
        self.assertIn("[DSV4G010]", record.getMessage())
        self.assertIn("fix:", record.getMessage())
        self.assertIn("also carried by a note on SGLang's AttributeError", record.getMessage())
        self.assertNotIn("DSV4GuardError", record.getMessage())

    def test_warning_report_is_logged_in_full(self) -> None:
        """SGLang accepts a pair the guard warns about: nothing is raised, so the log
        carries the full report."""
        fresh_install("on", load_entry_points=False)
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            utils.setup_state_kv_args(new_kv_args(),
                                      *build_pair(target_mapping="none", mapping="shared"))
        [record] = logs.records
        self.assertIn("[DSV4G004] warning:", record.getMessage())
        self.assertIn("fix:", record.getMessage())


class TestFingerprintAndMarkers(GuardTestCase):
    """The fingerprint ignores per-process noise; markers never suppress across launches."""

    def test_fingerprint_ignores_object_ids_and_pointers(self) -> None:
        """Two pairs with the same problems but other tensors (other ids and data
        pointers, as in two processes) give one fingerprint; another problem another."""
        first, second = check_pools(*three_mismatch_pair()), check_pools(*three_mismatch_pair())
        self.assertNotEqual(first.to_json(), second.to_json())  # the ids do differ
        self.assertEqual(fingerprint(first), fingerprint(second))
        other = check_pools(*build_pair(mapping="different"))
        self.assertNotEqual(fingerprint(first), fingerprint(other))

    def test_fingerprint_ignores_the_peer_wherever_it_is_named(self) -> None:
        """Two decode peers with the same registration mismatch, SGLang's message naming
        each peer ("... rejected for <agent>"): one fingerprint, so one full report per
        server, not per rank; other values are another report (outside review, finding 4)."""
        from sglang_dsv4_guard.findings import Finding, Phase, Severity, When

        def registered(peer: str, stride: int) -> Report:
            return Report.of([Finding(
                code="DSV4G055", severity=Severity.ERROR, summary="strides differ",
                subject="decode peer's NIXL registration",
                details=(f"decode peer: {peer} at 10.0.0.2:7000 (nixl)",),
                host_message=f"NIXL state layout rejected for {peer}: src[0]={stride}",
                when=When(Phase.PER_REQUEST, "per request"))],
                {"function": "NixlKVManager registration", "peer": f"{peer} at 10.0.0.2:7000"})

        first, second = registered("9f1c-uuid-a", 128), registered("77aa-uuid-b", 128)
        self.assertIn("77aa-uuid-b", second.to_json())  # the text keeps the peer
        self.assertEqual(fingerprint(first), fingerprint(second))
        self.assertNotEqual(fingerprint(first), fingerprint(registered("9f1c-uuid-a", 256)))

    def test_fingerprint_ignores_device_index(self) -> None:
        """On a GPU each TP rank's mapping names its own device (``device=cuda:<rank>``):
        two reports differing only in that index give one fingerprint, while the text
        still names the device; another device type is another report."""
        report = check_pools(*three_mismatch_pair())
        self.assertIn("device=cpu", report.to_json())

        def on(device: str) -> Report:
            return dataclasses.replace(report, findings=tuple(
                dataclasses.replace(f, observations=tuple(
                    dataclasses.replace(o, value=o.value.replace("device=cpu", device))
                    if isinstance(o.value, str) else o for o in f.observations))
                for f in report.findings))

        rank0, rank1 = on("device=cuda:0"), on("device=cuda:1")
        self.assertIn("device=cuda:1", rank1.to_json())
        self.assertEqual(fingerprint(rank0), fingerprint(rank1))
        self.assertNotEqual(fingerprint(rank0), fingerprint(report))

    def test_marker_older_than_this_process_does_not_suppress(self) -> None:
        """A marker another process wrote before this one started (an earlier launch
        from the same launcher) is taken over: the report prints in full."""
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "abc"), "w", encoding="utf-8") as marker:
                json.dump({"pid": 1, "start": 1, "written": 0.0}, marker)
            self.assertIs(ServerDedup(directory).seen("abc"), Seen.FIRST)
            self.assertIs(ServerDedup(directory).seen("abc"), Seen.FIRST)  # ours: ignored

    def test_marker_of_a_contemporary_process_suppresses(self) -> None:
        """A marker another live process wrote after this one started, with that
        process' proof of having printed the report: one line here."""
        with tempfile.TemporaryDirectory() as directory:
            contemporary_marker(os.path.join(directory, "abc"))
            self.assertIs(ServerDedup(directory).seen("abc"), Seen.ELSEWHERE)

    def test_claim_without_proof_of_printing_prints_in_full(self) -> None:
        """Another process claimed the report but never proved it printed it (killed
        between its claim and its log line): after a bounded wait this process prints
        it in full, and its text says why."""
        from sglang_dsv4_guard.dedup import markers as dedup

        with tempfile.TemporaryDirectory() as directory:
            contemporary_marker(os.path.join(directory, "abc"), printed=False)
            began = time.monotonic()
            self.assertIs(ServerDedup(directory).seen("abc"), Seen.UNPROVEN)
            self.assertLess(time.monotonic() - began, dedup.PROOF_SECONDS + 5)
            report = check_pools(*three_mismatch_pair())
            contemporary_marker(os.path.join(directory, fingerprint(report)), printed=False)
            with self.assertLogs("sglang_dsv4_guard", level=logging.INFO) as logs:
                LogReporter(dedup=ServerDedup(directory)).sglang_dsv4_guard_report(report)
        [record] = logs.records
        self.assertIn(FULL_THREE, record.getMessage())
        self.assertIn("showed no proof of printing it", record.getMessage())

    def test_claimant_proves_it_printed_only_after_its_log_line(self) -> None:
        """The process claiming a report writes the proof others wait for once its log
        call returned, never before."""
        report = check_pools(*three_mismatch_pair())
        with tempfile.TemporaryDirectory() as directory:
            proof = os.path.join(directory, fingerprint(report) + ".printed")
            seen_at_log: list[bool] = []

            class Probe(logging.Handler):
                def emit(self, record: logging.LogRecord) -> None:
                    seen_at_log.append(os.path.exists(proof))

            probe = Probe()
            logging.getLogger("sglang_dsv4_guard").addHandler(probe)
            self.addCleanup(logging.getLogger("sglang_dsv4_guard").removeHandler, probe)
            LogReporter(dedup=ServerDedup(directory)).sglang_dsv4_guard_report(report)
            self.assertEqual(seen_at_log, [False])
            self.assertTrue(os.path.isfile(proof))

    def test_sweep_runs_after_the_report_is_printed(self) -> None:
        """The first claim's sweep of gone launches runs after the log line, never
        between the claim and the print."""
        from sglang_dsv4_guard.dedup import markers as dedup

        report = check_pools(*three_mismatch_pair())
        printed: list[bool] = []
        logged: list[str] = []

        class Probe(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                logged.append(record.getMessage())

        probe = Probe()
        logging.getLogger("sglang_dsv4_guard").addHandler(probe)
        self.addCleanup(logging.getLogger("sglang_dsv4_guard").removeHandler, probe)
        mine = launch_of(os.getpid(), process_start(os.getpid()))
        with tempfile.TemporaryDirectory() as base, \
                mock.patch.object(dedup, "_base_dir", return_value=base), \
                mock.patch.object(dedup, "joined_launch", return_value=mine), \
                mock.patch.object(dedup, "sweep", lambda *a: printed.append(bool(logged))):
            os.chmod(base, 0o700)
            LogReporter(dedup=ServerDedup()).sglang_dsv4_guard_report(report)
        self.assertEqual(printed, [True])


def contemporary_marker(path: str, printed: bool = True) -> None:
    """Write at ``path`` a claim that would suppress: by a live process (our parent),
    written now, with (``printed``) its proof of having printed the report."""
    parent = os.getppid()
    for name in (path, path + ".printed") if printed else (path,):
        with open(name, "w", encoding="utf-8") as marker:
            json.dump({"pid": parent, "start": process_start(parent),
                       "written": time.clock_gettime(time.CLOCK_BOOTTIME)}, marker)


class TestHostileMarkerDirectory(GuardTestCase):
    """Another user on the host must not suppress, read or redirect the guard's markers:
    a directory that is not privately ours fails open, and marker names are never
    followed or blocked on."""

    def test_group_writable_directory_fails_open(self) -> None:
        """A marker directory open to group or others is not trusted: a suppressing
        marker in it is ignored and the report prints in full."""
        with tempfile.TemporaryDirectory() as directory:
            os.chmod(directory, 0o770)
            contemporary_marker(os.path.join(directory, "abc"))
            self.assertIs(ServerDedup(directory).seen("abc"), Seen.FIRST)

    def test_directory_of_another_user_fails_open(self) -> None:
        """A marker directory owned by another uid is not trusted either."""
        from sglang_dsv4_guard.dedup import markers as dedup

        with tempfile.TemporaryDirectory() as directory:
            contemporary_marker(os.path.join(directory, "abc"))
            with mock.patch.object(dedup.os, "getuid", return_value=os.getuid() + 1):
                self.assertIs(ServerDedup(directory).seen("abc"), Seen.FIRST)
            self.assertIs(ServerDedup(directory).seen("abc"), Seen.ELSEWHERE)  # ours: trusted

    def test_symlinked_directory_fails_open(self) -> None:
        """A symbolic link planted as the marker directory is not followed."""
        with tempfile.TemporaryDirectory() as real, tempfile.TemporaryDirectory() as base:
            contemporary_marker(os.path.join(real, "abc"))
            link = os.path.join(base, "launch")
            os.symlink(real, link)
            self.assertIs(ServerDedup(link).seen("abc"), Seen.FIRST)

    def test_symlinks_planted_as_marker_and_temp_file_are_not_followed(self) -> None:
        """A link named like the marker (to a suppressing marker) does not suppress, and a
        link named like this process' temporary file does not make it write elsewhere."""
        with tempfile.TemporaryDirectory() as directory, \
                tempfile.TemporaryDirectory() as elsewhere:
            target = os.path.join(elsewhere, "marker")
            contemporary_marker(target)
            os.symlink(target, os.path.join(directory, "abc"))
            precious = os.path.join(elsewhere, "precious")
            with open(precious, "w", encoding="utf-8") as out:
                out.write("precious data\n")
            os.symlink(precious, os.path.join(directory, f".def.{os.getpid()}"))
            dedup = ServerDedup(directory)
            self.assertIs(dedup.seen("abc"), Seen.FIRST)
            self.assertIs(dedup.seen("def"), Seen.FIRST)
            with open(precious, encoding="utf-8") as out:
                self.assertEqual(out.read(), "precious data\n")
            self.assertFalse(os.path.islink(os.path.join(directory, "abc")))

    def test_fifo_planted_as_marker_does_not_block(self) -> None:
        """A FIFO with the fingerprint's name is never opened for a blocking read: the
        claim returns at once and the report prints in full."""
        with tempfile.TemporaryDirectory() as directory:
            os.mkfifo(os.path.join(directory, "abc"))
            result: list[Seen] = []
            worker = threading.Thread(
                target=lambda: result.append(ServerDedup(directory).seen("abc")), daemon=True)
            worker.start()
            worker.join(20)
            if worker.is_alive():  # unblock the stuck reader so the test process can end
                fd = os.open(os.path.join(directory, "abc"), os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            self.assertEqual(result, [Seen.FIRST])


_EXIT_CHILD = """
import logging, os, sys
logging.basicConfig(level=logging.INFO, format="LOG %(message)s")
import sglang_dsv4_guard
from sglang_dsv4_guard.dedup import identity, markers as dedup
identity.open_launch()
sglang_dsv4_guard.install("on", load_entry_points=False)
mine = dedup._private_dir(os.path.join(dedup._private_dir(dedup._base_dir()),
                                       os.environ[identity.ENV_LAUNCH]))
open(os.path.join(mine, "abcdefabcdef"), "w").close()
print("LAUNCH-DIR", mine)
if sys.argv[1] == "fail":
    import sglang.srt.disaggregation.utils as utils
    from sglang_dsv4_guard.testing import new_kv_args, three_mismatch_pair
    try:
        utils.setup_state_kv_args(new_kv_args(), *three_mismatch_pair())
    except RuntimeError:
        pass
"""


class TestAtExit(GuardTestCase):
    """Schedulers never call ``uninstall()``: the counts and the clean-up run at exit."""

    def run_child(self, what: str) -> tuple[str, str]:
        result = fresh_python(_EXIT_CHILD, what)
        self.assertEqual(result.returncode, 0, result.stderr)
        [line] = [ln for ln in result.stdout.splitlines() if ln.startswith("LAUNCH-DIR ")]
        return result.stderr, line.split(" ", 1)[1]

    def test_summary_at_exit_when_something_was_reported(self) -> None:
        """A process that met a report and exits without ``uninstall()`` logs the exact
        counts; one that met nothing logs no summary."""
        stderr, _ = self.run_child("fail")
        self.assertIn("sglang-dsv4-guard summary (this process):", stderr)
        self.assertIn("1 occurrence(s) in this process", stderr)
        stderr, _ = self.run_child("pass")
        self.assertNotIn("sglang-dsv4-guard summary", stderr)

    def test_launcher_removes_its_launch_directory_only(self) -> None:
        """A process exiting removes the marker directory of the launch it minted, and
        leaves another live launcher's directory alone."""
        from sglang_dsv4_guard.dedup import markers as dedup

        other = dedup._private_dir(os.path.join(
            dedup._private_dir(dedup._base_dir()),
            launch_of(os.getpid(), process_start(os.getpid())).name))
        self.addCleanup(shutil.rmtree, other, True)
        _, launch_dir = self.run_child("pass")
        self.assertFalse(os.path.lexists(launch_dir), launch_dir)
        self.assertTrue(os.path.isdir(other))


class TestSpawnedSchedulers(GuardTestCase):
    """Real processes: a launcher runs SGLang's ``load_plugins()`` and starts a launch of
    four schedulers (three meet one failing pair, one another), then, from the same
    launcher, a second launch of one scheduler."""

    first: str
    second: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        with tempfile.TemporaryDirectory() as d:
            first = [{"pair": pair, "out": os.path.join(d, f"first-{i}.log")}
                     for i, pair in enumerate(["three", "three", "unified", "three"])]
            second = [{"pair": "three", "out": os.path.join(d, "second-0.log")}]
            finish(start_launcher([first, second], d, "launcher"))
            cls.first = "\n".join(read(s["out"]) for s in first)
            cls.second = "\n".join(read(s["out"]) for s in second)

    def test_same_report_printed_in_full_by_one_process(self) -> None:
        """Three schedulers meet the same failing pair: the full report only in the
        claimant's output (its log and its traceback), and one-line pointers in the two
        others' logs and exceptions, all naming the same fingerprint and codes."""
        # The claimant's log and its traceback: both in one process, no other.
        self.assertEqual(self.first.count(FULL_THREE), 2, self.first)
        pointers = POINTER.findall(self.first)
        self.assertEqual(len(pointers), 4, self.first)  # two processes: log + exception
        self.assertEqual(len(set(pointers)), 1)
        owner = re.findall(r"\(fingerprint ([0-9a-f]{12}); also carried by the DSV4GuardError",
                           self.first)
        self.assertEqual(len(owner), 2, self.first)  # the claimants of "three" and "unified"
        self.assertIn(pointers[0], owner)

    def test_different_report_printed_in_full(self) -> None:
        """The scheduler meeting another pair prints its own report in full."""
        self.assertEqual(self.first.count(FULL_UNIFIED), 2, self.first)  # log + traceback

    def test_second_launch_prints_in_full_again(self) -> None:
        """A later launch from the same parent is not suppressed by the first's markers."""
        self.assertEqual(self.second.count(FULL_THREE), 2, self.second)  # log + traceback
        self.assertIsNone(POINTER.search(self.second))


if __name__ == "__main__":
    unittest.main()
