"""The guard's counts on SGLang's own ``/metrics`` (issue 34).

- :class:`TestScrape`: a launcher (``metrics_launch.py``) runs SGLang's
  ``set_prometheus_multiproc_dir`` and ``load_plugins``, spawns scheduler processes that
  publish their server arguments and meet a start-up failure, a registration mismatch and a
  first-contact mismatch through SGLang's real functions, then serves SGLang's
  ``add_prometheus_middleware`` with uvicorn on 127.0.0.1 and scrapes it. The scrape is
  read with ``prometheus_client``'s own parser.
- ``test_metrics_paths.py``: what decides the export on every release, and what each
  report path counts (kept apart: their SGLang imports differ by release, this file's
  process tests' do not, so these run on the base release alone).
- :class:`TestFaults`: the exporter with the real ``prometheus_client`` in a fresh
  interpreter: missing, imported too early, a directory that is not one, and labels bounded.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any
from unittest import mock

from helpers import GuardTestCase, fresh_python
from launch_child import GUARD_ON
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import cli
from sglang_dsv4_guard.errors import SettingError
from sglang_dsv4_guard.metrics import (
    DIRECTORY_VARIABLE,
    FOREIGN_CODES,
    phase_label,
    role_label,
)
from sglang_dsv4_guard.settings import ENV_METRICS, settings_from_env

register_cpu_ci(est_time=90, suite="stage-a-test-cpu")

HERE = Path(__file__).parent
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
        """One whole ``doctor`` run prints the metrics line; its other cases are asked of
        the part of doctor that prints it (a whole run per case costs an SGLang plug-in
        load and the loader's scan each)."""
        def environ(**env: str) -> dict[str, str]:
            clean = {k: v for k, v in os.environ.items()
                     if not k.startswith(("SGLANG_DSV4_GUARD", DIRECTORY_VARIABLE))}
            return {**clean, **env}

        def lines(run: Any, **env: str) -> list[str]:
            out = io.StringIO()
            with mock.patch.dict(os.environ, environ(**env), clear=True), \
                    contextlib.redirect_stdout(out):
                run()
            return [line for line in out.getvalue().splitlines() if "metrics" in line]

        auto = lines(lambda: cli.main(["doctor"]), SGLANG_DSV4_GUARD="1")
        self.assertTrue(any(line.startswith("metrics: exported by the schedulers of a prefill or "
                                            "decode server launched with --enable-metrics")
                            for line in auto), auto)
        with tempfile.TemporaryDirectory() as directory:
            missing = os.path.join(directory, "missing")
            said = {case: lines(lambda args=args: cli._metrics(*args), **env)
                    for case, args, env in (
                        ("off", ("off", True, True), {}),
                        ("guard off", ("auto", False, True), {}),
                        ("inert", ("auto", True, False), {}),
                        ("on", ("on", True, True), {DIRECTORY_VARIABLE: directory}),
                        ("on, unset", ("on", True, True), {}),
                        ("on, missing", ("on", True, True), {DIRECTORY_VARIABLE: missing}),
                        ("auto, missing", ("auto", True, True), {DIRECTORY_VARIABLE: missing}))}
        self.assertEqual(said["off"], ["metrics: not exported (SGLANG_DSV4_GUARD_METRICS=off)"])
        self.assertEqual(said["guard off"], ["metrics: not exported (the guard is off)"])
        self.assertEqual(said["inert"],
                         ["metrics: not exported (the guard stays inert on this SGLang)"])
        self.assertIn(f"under PROMETHEUS_MULTIPROC_DIR={directory} ", said["on"][0])
        self.assertIn("it is unset here, where nothing would be exported", said["on, unset"][0])
        for case in ("on, missing", "auto, missing"):
            self.assertTrue(said[case][0].startswith("problem: metrics:"), said[case])
            self.assertIn("is not a directory", said[case][0])


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
