"""The guard's metrics on every release: the server's own ``enable_metrics`` and
``--disaggregation-mode`` as SGLang publishes them decide the export and the role
(:class:`TestServerArgsDecide`), and each report path on SGLang's real connectors hands
the exporter every occurrence with its phase and role (:class:`TestEveryReportPathCounts`).
The scrape itself is ``test_metrics.py``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
import unittest
from pathlib import Path
from typing import Any

from helpers import GuardTestCase, guard_logs_off
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.findings import Report
from sglang_dsv4_guard.lifecycle import installation
from sglang_dsv4_guard.metrics import (
    DIRECTORY_VARIABLE,
    Exporter,
    counts_as_problem,
    decide,
    phase_label,
    role_label,
)
from sglang_dsv4_guard.reporter import Delivery

register_cpu_ci(est_time=40, suite="stage-a-test-cpu")

_DSV4 = Path(__file__).parent / "data" / "deepseek_v4"


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
        full = counts_as_problem(d)
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

        def send(peer: Any, times: int) -> None:
            for _ in range(times):
                with contextlib.suppress(Exception):  # SGLang's refusal, carrying the report
                    conn.MoriKVManager._send_swa_dsa_state(
                        mgr, *mori_stub.send_args(conn, peer, "swa"))

        counted = self.counted("on")
        with guard_logs_off():
            send(mori_stub.peer(conn, "decode-a", decode_tp=4), 3)
        self.assertEqual(counted.calls, [("DSV4G006", "per_request", "prefill", True),
                                         ("DSV4G006", "per_request", "prefill", False),
                                         ("DSV4G006", "per_request", "prefill", False)])
        counted = self.counted("strict")
        peer = mori_stub.peer(conn, "decode-b", decode_tp=4)
        with guard_logs_off():
            mgr._add_remote_peer(peer)
            send(peer, 2)
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


if __name__ == "__main__":
    unittest.main()
