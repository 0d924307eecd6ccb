"""The guard's counts on SGLang's own ``/metrics`` (issue 34).

- :class:`TestScrape`: a launcher (``metrics_launch.py``) runs SGLang's
  ``set_prometheus_multiproc_dir`` and ``load_plugins``, spawns scheduler processes that
  publish their server arguments and meet a start-up failure, a registration mismatch and a
  first-contact mismatch through SGLang's real functions, then serves SGLang's
  ``add_prometheus_middleware`` with uvicorn on 127.0.0.1 and scrapes it. The scrape is
  read with ``prometheus_client``'s own parser.
- :class:`TestServerArgsDecide`: on every release, the server's own ``enable_metrics`` and
  ``--disaggregation-mode`` as SGLang publishes them decide the export and the role.
- :class:`TestFaults`: the exporter with the real ``prometheus_client`` in a fresh
  interpreter: missing, imported too early, a directory that is not one, and labels bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path
from typing import Any
from unittest import mock

from helpers import GuardTestCase, fresh_python, guard_logs_off
from launch_child import GUARD_ON
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import cli
from sglang_dsv4_guard.dedup.markers import Seen
from sglang_dsv4_guard.errors import SettingError
from sglang_dsv4_guard.findings import Report
from sglang_dsv4_guard.lifecycle import installation
from sglang_dsv4_guard.metrics import (
    DIRECTORY_VARIABLE,
    FOREIGN_CODES,
    Exporter,
    decide,
    phase_label,
    role_label,
)
from sglang_dsv4_guard.reporter import Delivery
from sglang_dsv4_guard.settings import ENV_METRICS, settings_from_env

register_cpu_ci(est_time=90, suite="stage-a-test-cpu")

HERE = Path(__file__).parent
_DSV4 = HERE / "data" / "deepseek_v4"
Sample = tuple[str, frozenset[tuple[str, str]]]


def samples(text: str) -> dict[Sample, float]:
    """Every sample of a scrape, by name and labels, read by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def key(name: str, **labels: str) -> Sample:
    return name, frozenset(labels.items())


def counted(code: str, phase: str, role: str) -> dict[str, str]:
    return {"code": code, "severity": "error", "phase": phase, "role": role}


def _log_lines(path: Path) -> list[str]:
    """A scheduler's log as it would compare between two launches: the bootstrap server's
    port, fingerprints, memory addresses and the import line are what differ by run."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"0x[0-9a-f]+", "0xADDRESS", text)
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
    text = re.sub(r"\b[0-9a-f]{12}\b", "FINGERPRINT", text)
    return [line for line in text.splitlines() if not line.startswith("prometheus_client")]


class TestScrape(GuardTestCase):
    """Three servers from one launcher: a prefill of two ranks and a decode, both with
    ``--enable-metrics``, and the same decode without it."""

    out: Path
    prefill: dict[Sample, float]
    decode: dict[Sample, float]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.out = Path(cls.enterClassContext(tempfile.TemporaryDirectory()))
        env = {k: v for k, v in os.environ.items() if not k.startswith(
            ("SGLANG_DSV4_GUARD", "SGLANG_PLUGINS", DIRECTORY_VARIABLE))}
        proc = subprocess.run([sys.executable, str(HERE / "metrics_launch.py"), str(cls.out)],
                              env={**env, **GUARD_ON}, capture_output=True, text=True,
                              timeout=1800, check=False)
        assert proc.returncode == 0, f"launcher exited {proc.returncode}:\n{proc.stdout}" \
                                     f"\n{proc.stderr[-4000:]}"
        cls.prefill = samples((cls.out / "prefill.metrics").read_text(encoding="utf-8"))
        cls.decode = samples((cls.out / "decode.metrics").read_text(encoding="utf-8"))

    def guard(self, scrape: dict[Sample, float]) -> dict[Sample, float]:
        return {k: v for k, v in scrape.items() if k[0].startswith("sglang:dsv4_guard_")}

    def test_prefill_counts_by_phase_and_role(self) -> None:
        """Two ranks met the start-up failure (one printed it in full, the other a
        pointer): two occurrences, one problem per code. One decode peer registered with
        another TP: DSV4G040 at registration. The sums are over the two processes' files."""
        expected = {}
        for code in ("DSV4G001", "DSV4G004", "DSV4G005"):
            labels = counted(code, "start_up", "prefill")
            expected[key("sglang:dsv4_guard_occurrences_total", **labels)] = 2.0
            expected[key("sglang:dsv4_guard_problems_total", **labels)] = 1.0
        labels = counted("DSV4G040", "registration", "prefill")
        expected[key("sglang:dsv4_guard_occurrences_total", **labels)] = 1.0
        expected[key("sglang:dsv4_guard_problems_total", **labels)] = 1.0
        expected[key("sglang:dsv4_guard_info", version=self.version(), mode="on",
                     sglang=self.release(), judgement="supported")] = 1.0
        self.assertEqual(self.guard(self.prefill), expected)

    def test_decode_counts_first_contact_and_the_plugin_failure(self) -> None:
        """The decode met its first contact twice: two occurrences (the second a pointer),
        one problem. The plug-in that raised is DSV4G090 on the failures counter, once per
        occurrence, and never a problem."""
        expected = {}
        for code, phase, times in (("DSV4G001", "start_up", 1), ("DSV4G004", "start_up", 1),
                                   ("DSV4G005", "start_up", 1), ("DSV4G022", "first_contact", 2)):
            labels = counted(code, phase, "decode")
            expected[key("sglang:dsv4_guard_occurrences_total", **labels)] = float(times)
            expected[key("sglang:dsv4_guard_problems_total", **labels)] = 1.0
        expected[key("sglang:dsv4_guard_failures_total", code="DSV4G090")] = 2.0
        expected[key("sglang:dsv4_guard_info", version=self.version(), mode="on",
                     sglang=self.release(), judgement="supported")] = 1.0
        self.assertEqual(self.guard(self.decode), expected)

    def test_metrics_off_imports_nothing_writes_nothing_prints_the_same(self) -> None:
        """Without --enable-metrics: no prometheus_client in the scheduler, no file in the
        directory SGLang set, nothing on /metrics, and the log line for line as with it."""
        self.assertEqual((self.out / "decode-off.files").read_text(encoding="utf-8"), "")
        self.assertEqual(self.guard(samples(
            (self.out / "decode-off.metrics").read_text(encoding="utf-8"))), {})
        off, on = self.out / "decode-off-0.log", self.out / "decode-0.log"
        self.assertIn("prometheus_client imported: False", off.read_text(encoding="utf-8"))
        self.assertIn("prometheus_client imported: True", on.read_text(encoding="utf-8"))
        self.assertEqual(_log_lines(off), _log_lines(on))
        self.assertTrue(any("[DSV4G022]" in line for line in _log_lines(on)))

    def test_every_metric_file_belongs_to_a_scheduler(self) -> None:
        """The files are the schedulers' (one counter and one info file per process), so
        the launcher, which loaded the guard too, created no metric."""
        names = (self.out / "prefill.files").read_text(encoding="utf-8").split()
        self.assertEqual(len([n for n in names if n.startswith("counter_")]), 2, names)
        self.assertEqual(len([n for n in names if n.startswith("gauge_max_")]), 2, names)

    def version(self) -> str:
        from sglang_dsv4_guard.metrics import guard_version

        return guard_version()

    def release(self) -> str:
        """The release the schedulers' guard runs the checks of, as its install line says
        (read from their log, not judged here: that would make this test's key differ on
        every release, where its children's declared code does not)."""
        log = (self.out / "prefill-0.log").read_text(encoding="utf-8")
        found = re.search(r"sglang-dsv4-guard installed: .* SGLang (\S+);", log)
        assert found is not None, log[-2000:]
        return found.group(1)


def _publish(*extra: str) -> None:
    """Publish SGLang's ServerArgs for a DeepSeek-V4 decode with ``extra`` flags."""
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", str(_DSV4), "--device", "cpu",
                              "--disaggregation-mode", "decode", *extra])
    set_global_server_args_for_scheduler(ServerArgs.from_cli_args(args))


class TestServerArgsDecide(GuardTestCase):
    """``auto`` follows the server's own ``enable_metrics`` as the scheduler's published
    arguments say (the directory alone is not enough), on every release."""

    def setUp(self) -> None:
        super().setUp()
        from sglang.srt.runtime_context import reset_context

        self.addCleanup(reset_context)
        self.directory = self.enterContext(tempfile.TemporaryDirectory())

    def test_unpublished_is_asked_again(self) -> None:
        decision = decide("auto", {DIRECTORY_VARIABLE: self.directory})
        self.assertEqual((decision.export, decision.final), (False, False))

    def test_enable_metrics_exports(self) -> None:
        _publish("--enable-metrics")
        decision = decide("auto", {DIRECTORY_VARIABLE: self.directory})
        self.assertEqual((decision.export, decision.final, decision.warn), (True, True, False))
        from sglang_dsv4_guard.metrics import _server_role

        self.assertEqual(_server_role(), "decode")

    def test_directory_alone_is_not_enough(self) -> None:
        _publish()
        decision = decide("auto", {DIRECTORY_VARIABLE: self.directory})
        self.assertEqual((decision.export, decision.final, decision.warn), (False, True, False))
        self.assertIn("without --enable-metrics", decision.reason)

    def test_on_and_off_overrule(self) -> None:
        _publish()
        self.assertTrue(decide("on", {DIRECTORY_VARIABLE: self.directory}).export)
        _publish("--enable-metrics")
        self.assertFalse(decide("off", {DIRECTORY_VARIABLE: self.directory}).export)

    def test_no_directory_is_a_warning(self) -> None:
        _publish("--enable-metrics")
        for setting in ("auto", "on"):
            decision = decide(setting, {})
            self.assertEqual((decision.export, decision.warn), (False, True))
            self.assertIn(DIRECTORY_VARIABLE, decision.reason)
        missing = os.path.join(self.directory, "missing")
        decision = decide("on", {DIRECTORY_VARIABLE: missing})
        self.assertEqual((decision.export, decision.warn), (False, True))
        self.assertIn(repr(missing), decision.reason)


class TestLabelsAndSetting(GuardTestCase):
    def test_labels_are_bounded_words(self) -> None:
        from sglang_dsv4_guard.findings import Phase

        self.assertEqual([phase_label(p) for p in (Phase.START_UP, Phase.FIRST_CONTACT,
                                                   Phase.REGISTRATION, Phase.PER_REQUEST)],
                         ["start_up", "first_contact", "registration", "per_request"])
        self.assertEqual(phase_label(Phase.SILENT), "unknown")
        self.assertEqual([role_label(r) for r in ("prefill", "decode", "null", None, "10.0.0.1")],
                         ["prefill", "decode", "unknown", "unknown", "unknown"])

    def test_setting_words_and_a_bad_value(self) -> None:
        for raw, value in (("on", "on"), ("1", "on"), ("OFF", "off"), ("", "auto"),
                           ("auto", "auto")):
            settings, problems = settings_from_env({ENV_METRICS: raw})
            self.assertEqual((settings.metrics.value, problems), (value, []))
        settings, problems = settings_from_env({ENV_METRICS: "prometheus"})
        self.assertEqual(settings.metrics.value, "auto")
        self.assertEqual(len(problems), 1)
        self.assertIsInstance(problems[0], SettingError)
        self.assertEqual(str(problems[0]),
                         "SGLANG_DSV4_GUARD_METRICS must be one of unset, auto, 1, on, true, 0, "
                         "off, false (got 'prometheus'); the guard's metrics follow SGLang's "
                         "--enable-metrics")

    def test_doctor_says_whether_and_where(self) -> None:
        def doctor(**env: str) -> list[str]:
            clean = {k: v for k, v in os.environ.items()
                     if not k.startswith(("SGLANG_DSV4_GUARD", DIRECTORY_VARIABLE))}
            out = io.StringIO()
            with mock.patch.dict(os.environ, {**clean, **env}, clear=True), \
                    contextlib.redirect_stdout(out):
                cli.main(["doctor"])
            return [line for line in out.getvalue().splitlines() if "metrics" in line]

        with tempfile.TemporaryDirectory() as directory:
            off = doctor(SGLANG_DSV4_GUARD="1", SGLANG_DSV4_GUARD_METRICS="off")
            auto = doctor(SGLANG_DSV4_GUARD="1")
            on = doctor(SGLANG_DSV4_GUARD="1", SGLANG_DSV4_GUARD_METRICS="on",
                        PROMETHEUS_MULTIPROC_DIR=directory)
            bad = doctor(SGLANG_DSV4_GUARD="1", SGLANG_DSV4_GUARD_METRICS="on",
                         PROMETHEUS_MULTIPROC_DIR=os.path.join(directory, "missing"))
            guard_off = doctor()
            auto_bad = doctor(SGLANG_DSV4_GUARD="1",
                              PROMETHEUS_MULTIPROC_DIR=os.path.join(directory, "missing"))
        self.assertIn("metrics: not exported (SGLANG_DSV4_GUARD_METRICS=off)", off)
        self.assertIn("metrics: not exported (the guard is off)", guard_off)
        self.assertTrue(any(line.startswith("metrics: exported by the schedulers of a prefill or "
                                            "decode server launched with --enable-metrics")
                            for line in auto), auto)
        self.assertTrue(any(f"under PROMETHEUS_MULTIPROC_DIR={directory} " in line
                            for line in on), on)
        self.assertTrue(any(line.startswith("problem: metrics:") and "is not a directory" in line
                            for line in bad), bad)
        self.assertTrue(any(line.startswith("problem: metrics:") and "is not a directory" in line
                            for line in auto_bad), auto_bad)


class _Counted(Exporter):
    """The installation's exporter, recording what each report path asks it to count
    (phase and role as the metrics label them) instead of writing files."""

    def __init__(self) -> None:
        super().__init__(setting="on")
        self.calls: list[tuple[str, str, str, bool]] = []

    def ready(self, at_report: bool = True) -> bool:
        return True

    def count(self, report: Report, delivery: Delivery | None) -> None:
        d = delivery or Delivery()
        full = not d.quiet and d.seen in (None, Seen.FIRST, Seen.UNPROVEN)
        for code in dict.fromkeys(report.codes):
            self.calls.append((code, phase_label(d.phase), role_label(d.role), full))

    def occurrence(self, code: str, severity: Any, phase: Any, role: str) -> None:
        self.calls.append((code, phase_label(phase), role_label(role), False))


class TestEveryReportPathCounts(GuardTestCase):
    """What the MORI, NIXL and thread-death paths hand the exporter, on SGLang's real
    connectors (engines stubbed): every occurrence, each with its phase and role."""

    def counted(self, mode: str) -> _Counted:
        self.install_guard(mode, load_entry_points=False)
        current = installation()
        assert current is not None
        counted = _Counted()
        current.runtime.metrics = counted
        return counted

    def test_mori_failures_and_strict_refusals(self) -> None:
        """On: three failing ``swa`` transfers to one peer are three occurrences, the
        first a problem. Strict: the registration, then each refused transfer."""
        import mori_stub

        mori_stub.install_stub()
        import sglang.srt.disaggregation.mori.conn as conn

        mgr = mori_stub.manager(conn, attn_tp=8)
        counted = self.counted("on")
        peer = mori_stub.peer(conn, "decode-a", decode_tp=4)
        with guard_logs_off():
            for _ in range(3):
                with contextlib.suppress(Exception):
                    conn.MoriKVManager._send_swa_dsa_state(
                        mgr, *mori_stub.send_args(conn, peer, "swa"))
        self.assertEqual(counted.calls, [("DSV4G006", "per_request", "prefill", True),
                                         ("DSV4G006", "per_request", "prefill", False),
                                         ("DSV4G006", "per_request", "prefill", False)])
        counted = self.counted("strict")
        peer = mori_stub.peer(conn, "decode-b", decode_tp=4)
        with guard_logs_off():
            mgr._add_remote_peer(peer)
            for _ in range(2):
                with contextlib.suppress(Exception):
                    conn.MoriKVManager._send_swa_dsa_state(
                        mgr, *mori_stub.send_args(conn, peer, "swa"))
        self.assertEqual(counted.calls, [("DSV4G006", "registration", "prefill", True),
                                         ("DSV4G006", "per_request", "prefill", False),
                                         ("DSV4G006", "per_request", "prefill", False)])

    def test_thread_death_is_an_occurrence(self) -> None:
        """SGLang's NIXL bootstrap thread dies of a HiSparse decode with another TP: the
        registration's report, then the death, each counted at registration."""
        import peers_real
        import sglang.srt.disaggregation.nixl.conn as nixl

        counted = self.counted("on")
        frames, _ = peers_real.registration(nixl, "nixl", tp=2, kinds=("DRAM", "DRAM"))
        mgr = peers_real.prefill(nixl, "nixl", tp=1)
        mgr.server_socket = peers_real.Socket([frames])
        hook = threading.excepthook
        threading.excepthook = lambda args: None
        try:
            with guard_logs_off():
                mgr._start_bootstrap_thread()
                for t in threading.enumerate():
                    if t is not threading.current_thread() and not t.daemon:
                        t.join(10)
        finally:
            threading.excepthook = hook
        self.assertEqual(counted.calls, [("DSV4G043", "registration", "prefill", True),
                                         ("DSV4G043", "registration", "prefill", False)])


_FAULT = r"""
import json, logging, os, sys, tempfile
mode = sys.argv[1]
os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append([record.levelname, record.getMessage()])
log = logging.getLogger("sglang_dsv4_guard")
log.addHandler(Keep()); log.setLevel(logging.INFO)
directory = tempfile.mkdtemp()
if mode == "missing":
    sys.modules["prometheus_client"] = None
if mode == "early":
    import prometheus_client
from sglang_dsv4_guard.findings import Finding, Phase, Report, Severity
from sglang_dsv4_guard.metrics import Exporter
from sglang_dsv4_guard.reporter import Delivery
from sglang_dsv4_guard.boundary import plugin_failure
exporter = Exporter(setting="on", mode="on", sglang="0.5.23", judgement="supported",
                    pending=[plugin_failure("acme", "load", "ImportError: no module acme")])
early = exporter.ready(at_report=False)  # as at a connector's import, before the launcher set up
os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory if mode != "not-a-directory" else \
    os.path.join(directory, "gone")
odd = ["ACME\udcff", "10.0.0.7:8998", 'A"B\nC{x="y"}', "x" * 4096]
findings = [Finding(code=code, severity=Severity.ERROR, summary="s", subject="x")
            for code in [f"ACME{i:03d}" for i in range(40)] + odd]
for _ in range(3):
    exporter.count(Report.of(findings, {}), Delivery(phase=Phase.REGISTRATION, role="prefill"))
exporter.failure()
result = {"records": records, "files": sorted(os.listdir(directory)), "early": early,
          "imported": "prometheus_client" in sys.modules and sys.modules["prometheus_client"] is not None}
if mode == "ok":
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    result["samples"] = [[s.name, s.labels, s.value] for m in registry.collect() for s in m.samples]
    from prometheus_client import generate_latest
    result["scrape"] = len(generate_latest(registry))  # what /metrics encodes
print(json.dumps(result))
"""


class TestFaults(GuardTestCase):
    """The exporter on the real prometheus_client, one fresh interpreter per case."""

    def run_case(self, mode: str) -> dict[str, Any]:
        proc = fresh_python(_FAULT, mode)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return dict(json.loads(proc.stdout.splitlines()[-1]))

    def warnings(self, result: dict[str, Any]) -> list[str]:
        return [message for level, message in result["records"] if level == "WARNING"]

    def test_labels_bounded_and_every_occurrence_counted(self) -> None:
        """40 codes of a plug-in that are words: the first 16 as labels, the rest as
        ``other``, with the codes that are not words (an address, quotes and a newline, a
        lone surrogate, 4,096 characters), which a scrape could not encode or that would
        be free text; none lost, and the scrape encodes. A plug-in that failed to load
        before the export was decided is counted once it is. Asked before the directory
        was set (a launcher), the exporter waited, said nothing, and exported after."""
        result = self.run_case("ok")
        self.assertFalse(result["early"])
        occurrences = {s[1]["code"]: s[2] for s in result["samples"]
                       if s[0] == "sglang:dsv4_guard_occurrences_total"}
        self.assertEqual(len(occurrences), FOREIGN_CODES + 1)
        self.assertEqual(occurrences["other"], 3.0 * (40 - FOREIGN_CODES + 4))
        self.assertEqual(sum(occurrences.values()), 3.0 * 44)
        self.assertGreater(result["scrape"], 0)
        self.assertEqual({s[1]["phase"] for s in result["samples"]
                          if s[0] == "sglang:dsv4_guard_occurrences_total"}, {"registration"})
        failures = {s[1]["code"]: s[2] for s in result["samples"]
                    if s[0] == "sglang:dsv4_guard_failures_total"}
        # the plug-in that failed to load before the decision, then our own bug
        self.assertEqual(failures, {"DSV4G090": 1.0, "internal": 1.0})
        self.assertEqual(self.warnings(result), [])

    def test_missing_client_is_one_warning(self) -> None:
        result = self.run_case("missing")
        self.assertEqual(len(self.warnings(result)), 1, result)
        self.assertIn("prometheus_client could not be used", self.warnings(result)[0])
        self.assertEqual((result["files"], result["imported"]), ([], False))

    def test_client_imported_before_the_directory_is_one_warning(self) -> None:
        result = self.run_case("early")
        self.assertEqual(len(self.warnings(result)), 1, result)
        self.assertIn("imported in this process before PROMETHEUS_MULTIPROC_DIR was set",
                      self.warnings(result)[0])
        self.assertEqual(result["files"], [])

    def test_directory_that_is_not_one_is_one_warning(self) -> None:
        result = self.run_case("not-a-directory")
        self.assertEqual(len(self.warnings(result)), 1, result)
        self.assertIn("is not a directory", self.warnings(result)[0])
        self.assertFalse(result["imported"])


if __name__ == "__main__":
    unittest.main()
