"""MORI at deployment scale: one report per distinct mismatch, exact counts, peers told apart.

A prefill manager of SGLang's real ``mori/conn.py`` (over stub ``mori`` modules) meets
many decode peers, as a TP-8 prefill rank does.
"""

from __future__ import annotations

import json
import logging
import threading
import unittest
from typing import Any

import mori_stub
from helpers import GuardTestCase, fresh_install, guard_logs_off
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.hookspecs import hookimpl
from sglang_dsv4_guard.lifecycle import installation
from sglang_dsv4_guard.reporter import EXTRA_KEY
from sglang_dsv4_guard.testing import register

register_cpu_ci(est_time=35, suite="stage-a-test-cpu")

mori_stub.install_stub()
import sglang.srt.disaggregation.mori.conn as conn  # noqa: E402 - needs the stub first

_RAW = {"send": vars(conn.MoriKVManager)["_send_swa_dsa_state"]}
FULL = "prefill attn_tp_size"  # a line only the full DSV4G006 report has



def send(mgr: Any, p: Any, state_type: str, fn: Any = None) -> tuple[str, Any]:
    fn = fn or conn.MoriKVManager._send_swa_dsa_state
    try:
        return "ok", fn(mgr, *mori_stub.send_args(conn, p, state_type))
    except Exception as exc:
        return "raised", exc


def keyless_peer(endpoint: str | None, port: int | None, decode_tp: int) -> Any:
    """A decode peer whose engine descriptor has no key."""
    p = mori_stub.peer(conn, "unused", decode_tp=decode_tp)
    p.engine_desc = object()
    p.endpoint, p.dst_port = endpoint, port
    return p


class TestManyPeers(GuardTestCase):
    """A prefill rank meeting 64 + 3 decode peers with two distinct mismatches."""

    def tearDown(self) -> None:
        sglang_dsv4_guard.uninstall()
        super().tearDown()

    def register_all(self) -> list[logging.LogRecord]:
        mgr = mori_stub.manager(conn, attn_tp=8)
        peers = [mori_stub.peer(conn, f"decode-4-{i}", decode_tp=4) for i in range(64)]
        peers += [mori_stub.peer(conn, f"decode-2-{i}", decode_tp=2) for i in range(3)]
        with self.assertLogs("sglang_dsv4_guard", level=logging.DEBUG) as logs:
            for p in peers:
                mgr._add_remote_peer(p)
        return logs.records

    def test_g006_one_full_report_per_distinct_mismatch(self) -> None:
        """64 peers at decode TP 4 and 3 at decode TP 2 give two full reports, the first
        naming the peers it covers; the count is logged at 10 peers (powers of ten), and
        no other line reaches WARNING."""
        fresh_install("on", load_entry_points=False)
        records = self.register_all()
        loud = [r for r in records if r.levelno >= logging.WARNING]
        full = [r for r in loud if FULL in r.getMessage()]
        self.assertEqual(len(full), 2)
        self.assertIn("covers 1 decode peer(s) so far", full[0].getMessage())
        self.assertRegex(full[0].getMessage(), r"decode decode_tp_size\s+= 4\n")
        self.assertRegex(full[1].getMessage(), r"decode decode_tp_size\s+= 2\n")
        counts = [r.getMessage() for r in loud if r not in full]
        self.assertEqual(len(counts), 1, counts)
        self.assertIn("decode TP 4", counts[0])
        self.assertIn("10 decode peer(s)", counts[0])

    def test_g006_exact_peer_counts_in_summary_and_at_uninstall(self) -> None:
        """The summary names 64 and 3 peers exactly; uninstall logs the same summary."""
        fresh_install("on", load_entry_points=False)
        self.register_all()
        text = sglang_dsv4_guard.summary()
        self.assertIn("decode TP 4, state layout swa; fingerprint", text)
        self.assertIn("): 64 decode peer(s), 0 failed", text)
        self.assertIn("): 3 decode peer(s), 0 failed", text)
        with self.assertLogs("sglang_dsv4_guard", level=logging.INFO) as logs:
            sglang_dsv4_guard.uninstall()
        self.assertTrue(any("64 decode peer(s)" in r.getMessage() for r in logs.records))

    def test_g006_json_keeps_every_peer_as_structured_data(self) -> None:
        """In JSON mode each of the 67 registrations is a record carrying its report and
        running peer count as data, and the count line at 10 peers carries its counts,
        while the text stays deduplicated."""
        fresh_install("on", load_entry_points=False, log_format="json")
        structured = [r for r in self.register_all() if hasattr(r, EXTRA_KEY)]
        records = [r for r in structured if "report" in getattr(r, EXTRA_KEY)]
        self.assertEqual(len(records), 67)
        [count] = [getattr(r, EXTRA_KEY) for r in structured if r not in records]
        self.assertEqual((count["count"], count["peers"]), ("peers", 10))
        data = [getattr(r, EXTRA_KEY) for r in records]
        self.assertEqual([d["peers"] for d in data[:64]], list(range(1, 65)))
        self.assertEqual({d["report"]["findings"][0]["code"] for d in data}, {"DSV4G006"})
        self.assertEqual(len({d["fingerprint"] for d in data}), 2)
        self.assertEqual(sum(FULL in r.getMessage() for r in records), 2)
        json.dumps(data)  # plain data all the way down


class TestPeerIdentity(GuardTestCase):
    """Issue 10 item 17: peers without an engine key never share one cached report."""

    def tearDown(self) -> None:
        sglang_dsv4_guard.uninstall()
        super().tearDown()

    def test_keyless_peers_get_their_own_report(self) -> None:
        """Two key-less peers (told apart by endpoint and port) and two with neither (told
        apart by object): each failure's report shows that peer's own decode TP."""
        fresh_install("on", load_entry_points=False)
        mgr = mori_stub.manager(conn, attn_tp=8)
        peers = [keyless_peer("10.0.0.2", 17000, 4), keyless_peer("10.0.0.2", 17001, 2),
                 keyless_peer(None, None, 1), keyless_peer(None, None, 16)]
        with guard_logs_off():
            errors = [send(mgr, p, "swa")[1] for p in peers]
        self.assertTrue(all(isinstance(e, DSV4GuardError) for e in errors))
        self.assertEqual([e.findings[0].value("decode", "decode_tp_size") for e in errors],
                         [4, 2, 1, 16])
        current = installation()
        assert current is not None
        self.assertEqual(len(current.mori.failures), 4)
        self.assertIn(("endpoint 10.0.0.2:17001", "swa"), current.mori.failures)


class TestSparseFailures(GuardTestCase):
    """Issue 10 item 18: failures after the first are counted, not logged one by one."""

    def tearDown(self) -> None:
        sglang_dsv4_guard.uninstall()
        super().tearDown()

    def test_g006_repeated_failures_log_sparsely_and_count_exactly(self) -> None:
        """2,000 failed transfers to one peer: at most one WARNING-or-worse line per power
        of ten, every call still raises, and the exact count is in state and summary."""
        fresh_install("on", load_entry_points=False)
        mgr = mori_stub.manager(conn, attn_tp=8)
        p = mori_stub.peer(conn, "decode-x", decode_tp=4)
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            kinds = {send(mgr, p, "swa")[0] for _ in range(2000)}
        self.assertEqual(kinds, {"raised"})
        messages = [r.getMessage() for r in logs.records]
        self.assertEqual(len(messages), 4, messages)  # the first failure, then 10, 100, 1000
        self.assertIn("1000 failed state transfer(s) so far", messages[-1])
        current = installation()
        assert current is not None
        self.assertEqual(current.mori.failures, {("decode-x", "swa"): 2000})
        self.assertIn("failed transfers to decode-x (swa): 2000", sglang_dsv4_guard.summary())


class _SecondFailureDuringFirst:
    """A reporter that, while the first failure's report is being published, lets a
    second failure to another peer of the same mismatch run (for up to one second)."""

    def __init__(self, second: Any) -> None:
        self.second = second
        self.calls = 0
        self.worker: threading.Thread | None = None

    @hookimpl
    def sglang_dsv4_guard_report(self, report: Any) -> None:
        self.calls += 1
        if self.calls == 1:
            self.worker = threading.Thread(target=self.second, daemon=True)
            self.worker.start()
            self.worker.join(1.0)


class TestConcurrentFirstFailures(GuardTestCase):
    """Two transfer threads fail at once on the same mismatch: the one that is not
    printing the report names the right fingerprint in its pointer."""

    def tearDown(self) -> None:
        sglang_dsv4_guard.uninstall()
        super().tearDown()

    def test_g006_concurrent_pointer_names_the_fingerprint(self) -> None:
        """The second failure happens while the first is still being published: its
        exception's pointer names the first one's fingerprint, never ``?``."""
        fresh_install("on", load_entry_points=False)
        mgr = mori_stub.manager(conn, attn_tp=8)
        first, second = (mori_stub.peer(conn, f"decode-{i}", decode_tp=4) for i in (1, 2))
        results: list[tuple[str, Any]] = []
        during = _SecondFailureDuringFirst(lambda: results.append(send(mgr, second, "swa")))
        register(during)
        with guard_logs_off():
            kind, error = send(mgr, first, "swa")
            assert during.worker is not None
            during.worker.join(30)
        self.assertEqual(kind, "raised")
        self.assertIn(FULL, str(error))
        [(kind2, error2)] = results
        self.assertEqual(kind2, "raised")
        current = installation()
        assert current is not None
        [m] = current.mori.mismatches.values()
        self.assertRegex(m.fingerprint, r"^[0-9a-f]{12}$")
        self.assertNotIn("fingerprint ?", str(error2))
        self.assertIn(f"(fingerprint {m.fingerprint})", str(error2))


class TestStrictBlocksOnlySwa(GuardTestCase):
    """Issue 10 item 19: strict mode blocks only the state type SGLang rejects."""

    def tearDown(self) -> None:
        sglang_dsv4_guard.uninstall()
        super().tearDown()

    def test_strict_block_spares_dsa_and_c128_state(self) -> None:
        """After a mismatched peer registers in strict mode, its dsa and c128_state
        transfers reach SGLang and end as SGLang's own do; swa is refused."""
        mgr = mori_stub.manager(conn, attn_tp=8, state_types=("swa", "dsa", "c128_state"))
        p = mori_stub.peer(conn, "decode-s", decode_tp=4)
        expected = {st: send(mgr, p, st, _RAW["send"]) for st in ("dsa", "c128_state")}
        fresh_install("strict", load_entry_points=False)
        with guard_logs_off():
            mgr._add_remote_peer(p)
            actual = {st: send(mgr, p, st) for st in ("dsa", "c128_state", "swa")}
        for st, (kind, value) in expected.items():
            self.assertEqual(actual[st][0], kind, st)
            self.assertNotIn("transfer not attempted", str(actual[st][1]), st)
            if kind == "ok":
                self.assertEqual(actual[st][1], value)
        self.assertEqual(actual["swa"][0], "raised")
        self.assertIn("transfer not attempted", str(actual["swa"][1]).splitlines()[0])


class TestManyPeersOtherMismatch(GuardTestCase):
    """One MORI prefill rank, 64 decode peers with the same non-TP mismatch (three
    metadata buffers more on each decode, at equal TP): the registration checks' shared
    deduplication, as for NIXL and Mooncake."""

    def tearDown(self) -> None:
        sglang_dsv4_guard.uninstall()
        super().tearDown()

    def test_64_peers_one_report_and_counts(self) -> None:
        """One full DSV4G045 report, one count line at 10 peers, nothing else at WARNING,
        and the exact count (64) in the summary."""
        fresh_install("on", load_entry_points=False)
        mgr = mori_stub.manager(conn, attn_tp=4)
        mgr.kv_args.aux_data_ptrs = [1, 2, 3]
        peers = [mori_stub.peer(conn, f"decode-{i}", decode_tp=4) for i in range(64)]
        for p in peers:
            p.dst_aux_mem_descs = [object()] * 6
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            for p in peers:
                mgr._add_remote_peer(p)
        self.assertEqual(len(mgr.decode_kv_args_table), 64)
        full = [r.getMessage() for r in logs.records if "decode peer: decode-" in r.getMessage()]
        counts = [r.getMessage() for r in logs.records if "decode peer(s) so far" in
                  r.getMessage() and "registration mismatch" in r.getMessage()]
        self.assertEqual(len(full), 1, full)
        self.assertIn("[DSV4G045]", full[0])
        self.assertEqual(len(counts), 1, counts)
        self.assertIn("10 decode peer(s)", counts[0])
        self.assertEqual(len(logs.records), 2, [r.getMessage()[:120] for r in logs.records])
        self.assertIn("64 decode peer(s)", sglang_dsv4_guard.summary())


if __name__ == "__main__":
    unittest.main()
