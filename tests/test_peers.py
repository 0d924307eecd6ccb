"""Decode peers registering with SGLang's real NIXL and Mooncake prefill connectors (engines
stubbed): what SGLang will refuse is reported once at registration; a thread that dies of
it is named once; SGLang's own outcome never changes."""

from __future__ import annotations

import inspect
import logging
import threading
import unittest
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any
from unittest import mock

import peers_real
import sglang.srt.disaggregation.mooncake.conn as mooncake
import sglang.srt.disaggregation.nixl.conn as nixl
from helpers import GuardTestCase, fixed_examples, guard_logs_off
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version
from pd_real import send_extra_refusal
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard.hookspecs import hookimpl
from sglang_dsv4_guard.lifecycle import installation
from sglang_dsv4_guard.pd.nixl_payload import _PHRASES

register_cpu_ci(est_time=51, suite="stage-a-test-cpu")

_RAW = {"nixl": vars(nixl.NixlKVManager)["_add_remote_peer"],
        "worker": vars(mooncake.MooncakeKVManager)["transfer_worker"],
        "send_extra": vars(nixl.NixlKVManager)["maybe_send_extra"]}
_SWA = mooncake.StateType("swa")


def register(fn: Callable[..., Any], mgr: Any, info: Any) -> tuple[str, str]:
    """SGLang's registration outcome: ``ok`` or the exception's type and message."""
    try:
        fn(mgr, info)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


@contextmanager
def thread_errors() -> Iterator[list[BaseException]]:
    """Collect the exceptions that end threads (SGLang's bootstrap thread, its workers)."""
    seen: list[BaseException] = []
    old = threading.excepthook
    def hook(args: Any) -> None:
        if args.exc_type is not SystemExit:  # the socket stub's end of the inbox
            seen.append(args.exc_value)

    threading.excepthook = hook
    try:
        yield seen
    finally:
        threading.excepthook = old


def guard_records(logs: Any) -> list[logging.LogRecord]:
    return [r for r in logs.records if r.name == "sglang_dsv4_guard"]


class TestNixlRegistration(GuardTestCase):
    """NIXL: ``_add_remote_peer`` in the prefill's real bootstrap thread."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)

    def test_wrapped_and_restored(self) -> None:
        """Installed: the registration method is the guard's; uninstalled: SGLang's."""
        self.assertIsNot(vars(nixl.NixlKVManager)["_add_remote_peer"], _RAW["nixl"])
        sglang_dsv4_guard.uninstall()
        self.assertIs(vars(nixl.NixlKVManager)["_add_remote_peer"], _RAW["nixl"])

    def test_changed_release_is_not_wrapped_and_says_so(self) -> None:
        """A release whose registration code no known release has (its digest differs) is
        left unwrapped, with one line saying it differs from every release the guard knows."""
        sglang_dsv4_guard.uninstall()
        with mock.patch("sglang_dsv4_guard.host.pd_digests.row_releases", lambda *a: []), \
                self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            self.install_guard("on", load_entry_points=False)
        self.assertIs(vars(nixl.NixlKVManager)["_add_remote_peer"], _RAW["nixl"])
        self.assertIs(vars(mooncake.MooncakeKVManager)["transfer_worker"], _RAW["worker"])
        text = "\n".join(r.getMessage() for r in logs.records)
        self.assertEqual(text.count("differs from every release this guard knows"), 2, text)

    def test_thread_death_reported_at_registration_and_named_once(self) -> None:
        """A HiSparse decode (host-memory KV) with another attention TP: SGLang's real
        bootstrap thread dies of its own NotImplementedError, unchanged; the guard logs
        one DSV4G043 report naming both TP sizes and the peer, and one line naming the
        cause, the peer and what now hangs."""
        frames, _ = peers_real.registration(nixl, "nixl", tp=2, kinds=("DRAM", "DRAM"))
        mgr = peers_real.prefill(nixl, "nixl", tp=1)
        mgr.server_socket = peers_real.Socket([frames])
        with thread_errors() as died, self.assertLogs(level=logging.INFO) as logs:
            mgr._start_bootstrap_thread()
            for t in threading.enumerate():
                if t is not threading.current_thread() and not t.daemon:
                    t.join(10)
        self.assertEqual([type(e) for e in died], [NotImplementedError])
        self.assertIn("direct-to-host", str(died[0]))
        ours = guard_records(logs)
        self.assertEqual(len(ours), 2, [r.getMessage()[:200] for r in ours])
        report, death = (r.getMessage() for r in ours)
        self.assertIn("[DSV4G043]", report)
        self.assertRegex(report, r"prefill attn_tp_size +\= 1\n")
        self.assertRegex(report, r"decode attn_tp_size +\= 2\n")
        self.assertIn("decode-0 at 10.0.0.2:7001", report)
        self.assertIn("[DSV4G043]", death)
        self.assertIn("bootstrap thread died", death)
        self.assertIn("decode peer decode-0", death)
        self.assertIn("times out after", death)

    def test_per_request_refusal_reported_at_registration(self) -> None:
        """A non-MLA pool with SWA state and different attention TP on VRAM: SGLang's
        registration goes on (its outcome is the same with the guard), and one DSV4G040
        report says every request carrying swa will fail."""
        _, raw_info = peers_real.registration(nixl, "nixl", tp=2)
        _, info = peers_real.registration(nixl, "nixl", tp=2)
        mk = lambda: peers_real.prefill(nixl, "nixl", tp=1, state_types=(_SWA,))  # noqa: E731
        expected = register(_RAW["nixl"], mk(), raw_info)
        with self.assertLogs("sglang_dsv4_guard", level=logging.ERROR) as logs:
            actual = register(nixl.NixlKVManager._add_remote_peer, mk(), info)
        self.assertEqual(actual, expected)
        text = "\n".join(r.getMessage() for r in logs.records)
        self.assertIn("[DSV4G040]", text)
        self.assertIn("per request", text)
        self.assertEqual(installation().peers.mismatches.__len__(), 1)

    def test_accepted_pair_says_nothing(self) -> None:
        """Equal TP, GPU memory, same buffers: SGLang accepts, the guard logs nothing."""
        _, info = peers_real.registration(nixl, "nixl", tp=2)
        with self.assertNoLogs("sglang_dsv4_guard", level=logging.INFO):
            outcome = register(nixl.NixlKVManager._add_remote_peer,
                               peers_real.prefill(nixl, "nixl", tp=2, state_types=(_SWA,)), info)
        self.assertEqual(outcome, ("ok", ""))

    def test_64_peers_one_report_and_counts(self) -> None:
        """One prefill rank, 64 decode peers with the same mismatch: one full report, a
        count line at 10 peers, and the exact count in the summary."""
        mgr = peers_real.prefill(nixl, "nixl", tp=1, state_types=(_SWA,))
        infos = [peers_real.registration(nixl, "nixl", tp=2, name=f"decode-{i}", port=7000 + i)[1]
                 for i in range(64)]
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            for info in infos:
                register(nixl.NixlKVManager._add_remote_peer, mgr, info)
        full = [r for r in logs.records if "decode peer: decode-" in r.getMessage()]
        counts = [r for r in logs.records if "decode peer(s) so far" in r.getMessage()
                  and "registration mismatch" in r.getMessage()]
        self.assertEqual(len(full), 1)
        self.assertEqual(len(counts), 1)
        self.assertIn("10 decode peer(s)", counts[0].getMessage())
        self.assertIn("64 decode peer(s)", sglang_dsv4_guard.summary())

    def test_odd_managers_get_sglangs_outcome(self) -> None:
        """A manager whose mode cannot be read as text, or whose peer table is None:
        SGLang's registration decides (its outcome, its exception), never the guard's
        bookkeeping around it (outside review, finding 3)."""
        class Unprintable:
            def __str__(self) -> str:
                raise UnicodeError("mode")

        for name, change in (("mode", {"disaggregation_mode": SimpleNamespace(
                                  value=Unprintable())}),
                             ("table", {"decode_kv_args_table": None})):
            outcomes = []
            for fn in (_RAW["nixl"], nixl.NixlKVManager._add_remote_peer):
                mgr = peers_real.prefill(nixl, "nixl", tp=1)
                mgr.__dict__.update(change)
                outcomes.append(register(fn, mgr, peers_real.registration(
                    nixl, "nixl", tp=1, name=f"decode-{name}-{len(outcomes)}")[1]))
            raw, guarded = outcomes
            self.assertEqual(guarded[0], raw[0], name)
            self.assertEqual(guarded[1].replace("-1", "-0"), raw[1], name)

    def test_hostile_plugin_and_our_bug_leave_sglang_unchanged(self) -> None:
        """A plug-in whose registration check raises is one DSV4G090; a bug in the guard's
        snapshot is one logged internal error; SGLang's outcome is the same either way."""
        class Hostile:
            @hookimpl
            def sglang_dsv4_guard_check_registration(self, registration: Any,
                                                     context: Any) -> list[Any]:
                raise SystemExit("plug-in exits")

        current = installation()
        assert current is not None
        current.runtime.plugins.pm.register(Hostile(), "hostile")
        _, info = peers_real.registration(nixl, "nixl", tp=1)
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            outcome = register(nixl.NixlKVManager._add_remote_peer,
                               peers_real.prefill(nixl, "nixl", tp=1), info)
        self.assertEqual(outcome, ("ok", ""))
        self.assertIn("DSV4G090", "\n".join(r.getMessage() for r in logs.records))
        current.runtime.plugins.pm.unregister(name="hostile")
        _, info = peers_real.registration(nixl, "nixl", tp=2, name="decode-bug")
        mgr = peers_real.prefill(nixl, "nixl", tp=1)

        class Exploding:  # SGLang's registration never reads it; the snapshot does
            def __getattr__(self, name: str) -> Any:
                raise ZeroDivisionError(name)

        mgr.server_args = Exploding()
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            guarded = register(nixl.NixlKVManager._add_remote_peer, mgr, info)
        raw = register(_RAW["nixl"], mgr, peers_real.registration(
            nixl, "nixl", tp=2, name="decode-bug-raw")[1])
        self.assertEqual(guarded[0], raw[0])
        self.assertEqual(len(logs.records), 1)
        self.assertIn("internal error", logs.records[0].getMessage())


class TestNixlStrict(GuardTestCase):
    """Strict mode: a failure of the guard's own never replaces SGLang's error."""

    def test_our_bug_is_a_note_on_sglangs_error(self) -> None:
        """SGLang refuses the registration; the guard's snapshot fails: SGLang's own
        NotImplementedError rises, carrying the guard's strict failure as a note."""
        self.install_guard("strict", load_entry_points=False)
        _, info = peers_real.registration(nixl, "nixl", tp=2, kinds=("DRAM", "DRAM"))
        mgr = peers_real.prefill(nixl, "nixl", tp=1)

        class Exploding:
            def __getattr__(self, name: str) -> Any:
                raise ZeroDivisionError(name)

        mgr.server_args = Exploding()
        with guard_logs_off(), self.assertRaises(NotImplementedError) as caught:
            nixl.NixlKVManager._add_remote_peer(mgr, info)
        self.assertIn("direct-to-host", str(caught.exception))
        self.assertIn("strict mode", "".join(getattr(caught.exception, "__notes__", [])))


def _payload_refusal(outcome: tuple[str, str]) -> str | None:
    return next((code for phrase, code in _PHRASES.items() if phrase in outcome[1]), None)


class TestNixlRegistrationParity(GuardTestCase):
    """The parity property: SGLang's outcome is unchanged, and a report appears at
    registration exactly when SGLang refuses then or later."""

    @settings(max_examples=fixed_examples(40))  # each example: two real registrations and a send
    @given(prefill_tp=st.sampled_from([1, 2, 4]), decode_tp=st.sampled_from([1, 2, 4]),
           hisparse=st.booleans(), draft=st.sampled_from(["none", "decode", "prefill"]),
           mla=st.booleans(), swa=st.booleans(), mode=st.sampled_from(["on", "strict"]))
    def test_parity(self, prefill_tp: int, decode_tp: int, hisparse: bool, draft: str,
                    mla: bool, swa: bool, mode: str) -> None:
        """SGLang's real ``_add_remote_peer`` and ``maybe_send_extra`` are the oracles."""
        sglang_dsv4_guard.install(mode, load_entry_points=False)
        try:
            self._example(prefill_tp, decode_tp, hisparse, draft, mla, swa)
        finally:
            with guard_logs_off():
                sglang_dsv4_guard.uninstall()

    def _example(self, prefill_tp: int, decode_tp: int, hisparse: bool, draft: str,
                 mla: bool, swa: bool) -> None:
        target = ["DRAM" if hisparse else "VRAM"] * 2
        kinds = target + (["VRAM"] * 2 if draft == "decode" else [])
        states = (_SWA,) if swa else ()
        mk = lambda: peers_real.prefill(  # noqa: E731
            nixl, "nixl", tp=prefill_tp, mla=mla, state_types=states,
            regions=4 if draft == "prefill" else 2)
        raw = register(_RAW["nixl"], mk(), peers_real.registration(
            nixl, "nixl", tp=decode_tp, kinds=kinds)[1])
        mgr = mk()  # alive while its reports are read
        with guard_logs_off():
            actual = register(nixl.NixlKVManager._add_remote_peer, mgr,
                              peers_real.registration(nixl, "nixl", tp=decode_tp, kinds=kinds)[1])
        self.assertEqual(actual, raw)
        later = send_extra_refusal("nixl", prefill_tp, decode_tp, 1, mla, ["swa"] if swa else [],
                                   layout="page_major")
        current = installation()
        assert current is not None
        reports = current.peers.reports()
        codes = {c for r in reports for c in r.codes}
        self.assertEqual(_payload_refusal(raw) in codes, _payload_refusal(raw) is not None)
        self.assertEqual("DSV4G040" in codes, later is not None)
        self.assertEqual(bool(reports), bool(_payload_refusal(raw) or later))


def published_configs(case: GuardTestCase) -> None:
    """The server configs Mooncake's registration reads (0.5.23's speculative one, 0.5.22+'s
    memory one), published for the test as a server without either would."""
    for name, config in (("get_spec", SimpleNamespace(speculative_algorithm=None)),
                         ("get_memory", SimpleNamespace(enable_unified_memory=False))):
        if hasattr(mooncake, name):
            patch = mock.patch.object(mooncake, name, lambda config=config: config)
            patch.start()
            case.addCleanup(patch.stop)


_RAW_START = vars(mooncake.MooncakeKVManager)["start_prefill_thread"]
_RAW_PARSE = vars(mooncake.KVArgsRegisterInfo)["from_zmq"]


def sglang_start(mgr: Any) -> None:
    """The oracle: SGLang's own ``start_prefill_thread``, whose thread parses with SGLang's
    own ``from_zmq`` (``bootstrap_threads`` puts it back while the thread runs: the
    guard's parse hook, before 0.5.22, is on the class)."""
    _RAW_START(mgr)


@contextmanager
def _sglang_parse(on: bool) -> Iterator[None]:
    held = vars(mooncake.KVArgsRegisterInfo)["from_zmq"]
    if on:
        mooncake.KVArgsRegisterInfo.from_zmq = _RAW_PARSE
    try:
        yield
    finally:
        mooncake.KVArgsRegisterInfo.from_zmq = held


def bootstrap_threads(mgr: Any, frames: list[list[bytes]],
                      start: Callable[[Any], Any] | None = None
                      ) -> list[tuple[type[BaseException], str]]:
    """SGLang's real Mooncake bootstrap thread (started by ``start``, else the installed
    ``start_prefill_thread``; :func:`sglang_start`: SGLang's alone) reads ``frames``; what
    ended its threads."""
    mgr.server_socket = peers_real.Socket(frames)
    with thread_errors() as died, _sglang_parse(start is sglang_start):
        (start or mooncake.MooncakeKVManager.start_prefill_thread)(mgr)
        for t in threading.enumerate():
            if t is not threading.current_thread() and t.name != "MainThread":
                t.join(5)
    return [(type(e), str(e)) for e in died]


class TestMooncake(GuardTestCase):
    """Mooncake: the prefill's real bootstrap thread writes the peer table; the transfer
    worker dies of a per-request refusal."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)
        published_configs(self)

    def _bootstrap(self, mgr: Any, frames: list[bytes]) -> None:
        self.assertEqual(bootstrap_threads(mgr, [frames]), [])

    def test_registration_reported_once_then_worker_death_named_once(self) -> None:
        """A decode with another attention TP registers through SGLang's real bootstrap
        thread: one DSV4G040 report. Two transfer workers then die of SGLang's own
        refusal: SGLang's RuntimeError is unchanged, the guard names the cause once."""
        frames, _ = peers_real.registration(mooncake, "mooncake", tp=2, name="sess-1")
        mgr = peers_real.prefill(mooncake, "mooncake", tp=1, state_types=(_SWA,))
        with self.assertLogs("sglang_dsv4_guard", level=logging.ERROR) as logs:
            self._bootstrap(mgr, frames)
        self.assertIn("sess-1", mgr.decode_kv_args_table)
        self.assertIs(type(mgr.decode_kv_args_table), dict)  # SGLang's own: reads unslowed
        self.assertEqual(len(logs.records), 1)
        self.assertIn("[DSV4G040]", logs.records[0].getMessage())
        message = send_extra_refusal("mooncake", 1, 2, 1, False, ["swa"], layout="page_major")
        assert message is not None

        class Queue:
            def get(self) -> Any:
                raise RuntimeError(message)

        mgr.enable_trace = False
        errors = []
        with self.assertLogs("sglang_dsv4_guard", level=logging.ERROR) as logs:
            for _ in range(2):
                try:
                    mooncake.MooncakeKVManager.transfer_worker(mgr, Queue(), None)
                except RuntimeError as exc:
                    errors.append(exc)
        self.assertEqual([type(e) for e in errors], [RuntimeError, RuntimeError])
        self.assertIn("is dead", str(errors[0]))
        self.assertEqual(len(logs.records), 1)
        line = logs.records[0].getMessage()
        self.assertIn("[DSV4G040]", line)
        self.assertIn("transfer worker died", line)
        self.assertIn("sess-1", line)
        self.assertIn("now hangs", line)

    def test_parse_hook_is_sglangs_parse_and_restored(self) -> None:
        """Before 0.5.22 the guard wraps ``KVArgsRegisterInfo.from_zmq`` (a classmethod):
        called outside SGLang's bootstrap closure it returns SGLang's parse and says
        nothing; uninstalling puts SGLang's classmethod object back. 0.5.22+ keep theirs."""
        frames, _ = peers_real.registration(mooncake, "mooncake", tp=2, name="sess-p")
        publishes = hasattr(mooncake.MooncakeKVManager, "_publish_peer_registration")
        self.assertIs(vars(mooncake.KVArgsRegisterInfo)["from_zmq"] is _RAW_PARSE, publishes)
        with self.assertNoLogs("sglang_dsv4_guard", level=logging.INFO):
            parsed = mooncake.KVArgsRegisterInfo.from_zmq(frames)
        self.assertEqual(parsed, _RAW_PARSE.__func__(mooncake.KVArgsRegisterInfo, frames))
        self.assertIs(type(parsed), mooncake.KVArgsRegisterInfo)
        with guard_logs_off():
            sglang_dsv4_guard.uninstall()
        self.assertIs(vars(mooncake.KVArgsRegisterInfo)["from_zmq"], _RAW_PARSE)

    def test_other_plugins_wrappers_around_the_parse(self) -> None:
        """Four other plug-ins wrap ``from_zmq`` on top of the guard (SGLang's HookRegistry
        adds two frames per AROUND hook): the mismatched peer registering through SGLang's
        real bootstrap thread is still reported once, and every wrapper ran."""
        ran: list[int] = []
        cls = mooncake.KVArgsRegisterInfo
        held = vars(cls)["from_zmq"]
        for n in range(4):
            below = vars(cls)["from_zmq"]

            def around(klass: Any, *args: Any, below: Any = below, n: int = n) -> Any:
                ran.append(n)
                return below.__get__(None, klass)(*args)
            cls.from_zmq = classmethod(around)
        try:
            frames, _ = peers_real.registration(mooncake, "mooncake", tp=2, name="sess-w")
            mgr = peers_real.prefill(mooncake, "mooncake", tp=1, state_types=(_SWA,))
            with self.assertLogs("sglang_dsv4_guard", level=logging.ERROR) as logs:
                self._bootstrap(mgr, frames)
        finally:
            cls.from_zmq = held
        self.assertIn("sess-w", mgr.decode_kv_args_table)
        self.assertEqual(sorted(set(ran)), [0, 1, 2, 3])
        self.assertEqual(len(logs.records), 1)
        self.assertIn("[DSV4G040]", logs.records[0].getMessage())

    def test_accepted_pair_says_nothing(self) -> None:
        """Equal TP: SGLang's bootstrap thread registers the peer, the guard is silent."""
        frames, _ = peers_real.registration(mooncake, "mooncake", tp=2, name="sess-2")
        mgr = peers_real.prefill(mooncake, "mooncake", tp=2, state_types=(_SWA,))
        with self.assertNoLogs("sglang_dsv4_guard", level=logging.INFO):
            self._bootstrap(mgr, frames)
        self.assertIn("sess-2", mgr.decode_kv_args_table)


class _Engine:
    """Mooncake's transfer engine: every transfer accepted, nothing leaves the process."""

    def batch_transfer_sync(self, *args: Any) -> int:
        return 0


class TestMooncakeDeaths(GuardTestCase):
    """Mooncake: a bootstrap thread that dies of SGLang's DCP relayout and a transfer worker
    that dies of the metadata buffer counts are reported at registration and named once;
    one rank x 64 peers with one mismatch prints one full report."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)
        published_configs(self)

    _threads = staticmethod(bootstrap_threads)

    def test_dcp_refusal_reported_and_bootstrap_death_named_once(self) -> None:
        """A non-MLA prefill and a DCP-2 decode: SGLang's requires_dcp_relayout raises in
        the real bootstrap thread before the peer table is written (0.5.17+). The thread
        dies of SGLang's own error, unchanged; the guard logs one DSV4G036 report naming
        the peer and one line naming the death; a second rank dying of the same cause adds
        nothing. 0.5.16 has no DCP: SGLang registers the peer and the guard is silent."""
        frames, _ = peers_real.registration(mooncake, "mooncake", tp=1, dcp=2, name="sess-dcp")
        raw = self._threads(peers_real.prefill(mooncake, "mooncake", tp=1), [frames],
                           sglang_start)
        mgr = peers_real.prefill(mooncake, "mooncake", tp=1)
        with self.assertLogs(level=logging.INFO) as logs:
            logging.getLogger("sglang_dsv4_guard").info("start")
            died = self._threads(mgr, [frames])
            self.assertEqual(died, raw)
            second, _ = peers_real.registration(mooncake, "mooncake", tp=1, dcp=2,
                                                name="sess-dcp-2", port=7002)
            self.assertEqual(self._threads(peers_real.prefill(mooncake, "mooncake", tp=1),
                                           [second]), raw)
        ours = [r.getMessage() for r in guard_records(logs)][1:]
        if not raw:
            self.assertIn("sess-dcp", mgr.decode_kv_args_table)
            self.assertEqual(ours, [])
            return
        self.assertEqual([t for t, _ in raw], [RuntimeError])
        self.assertIn("Unsupported PD DCP topology: 1 -> 2", raw[0][1])
        self.assertNotIn("sess-dcp", mgr.decode_kv_args_table)
        self.assertEqual(len(ours), 2, [m[:200] for m in ours])
        report, death = ours
        self.assertIn("[DSV4G036]", report)
        self.assertIn("sess-dcp at 10.0.0.2:7001", report)
        self.assertIn("decode dcp_size", report)
        self.assertIn("the registering ranks: prefill DCP rank 0, decode DCP rank 0", report)
        self.assertNotIn("not known for this server", report)
        self.assertIn("[DSV4G036]", death)
        self.assertIn("mooncake bootstrap thread died", death)
        self.assertIn("decode peer sess-dcp", death)
        self.assertIn("times out after", death)

    def test_aux_count_worker_death_named_once(self) -> None:
        """The decode registers 4 metadata buffers, the prefill has 3: one DSV4G045 report
        at registration. SGLang's real send_aux then runs in the real transfer worker on
        the registered buffers: where it raises IndexError (0.5.16 - 0.5.22) the worker
        dies of SGLang's unchanged RuntimeError and the guard names DSV4G045, the peer and
        what hangs, once for two deaths; where it sends the shorter list (0.5.23) the
        worker lives and the guard names nothing."""
        frames, _ = peers_real.registration(mooncake, "mooncake", tp=1, aux=4, name="sess-aux")
        mgr = peers_real.prefill(mooncake, "mooncake", tp=1, aux=3)
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            self.assertEqual(self._threads(mgr, [frames]), [])
        self.assertEqual(len(logs.records), 1)
        self.assertIn("[DSV4G045]", logs.records[0].getMessage())
        mgr.__dict__.update(enable_trace=False, enable_custom_mem_pool=False, engine=_Engine())
        peer = mgr.decode_kv_args_table["sess-aux"]

        class Queue:  # hands the worker one request's metadata, then ends it
            def get(self) -> Any:
                req = SimpleNamespace(mooncake_session_id="sess-aux", dst_aux_index=0, room=0,
                                      endpoint=peer.endpoint, dst_port=peer.dst_port)
                mgr.send_aux(req, 0, peer.dst_aux_ptrs)
                raise SystemExit  # send_aux returned: the worker would go on

        def work(worker: Callable[..., Any]) -> tuple[str, str]:
            try:
                worker(mgr, Queue(), None)
            except (Exception, SystemExit) as exc:
                return type(exc).__name__, str(exc)
            return "ok", ""

        raw = work(_RAW["worker"])
        with self.assertLogs(level=logging.INFO) as logs:
            logging.getLogger("sglang_dsv4_guard").info("start")
            deaths = [work(mooncake.MooncakeKVManager.transfer_worker) for _ in range(2)]
        self.assertEqual(deaths, [raw, raw])
        ours = [r.getMessage() for r in guard_records(logs)][1:]
        if raw[0] == "SystemExit":
            self.assertEqual(ours, [])
            return
        self.assertEqual(raw[0], "RuntimeError")
        self.assertIn("list index out of range", raw[1])
        self.assertEqual(len(ours), 1, [m[:200] for m in ours])
        self.assertIn("[DSV4G045]", ours[0])
        self.assertIn("transfer worker died of 'IndexError: list index out of range'", ours[0])
        self.assertIn("decode peer sess-aux", ours[0])
        self.assertIn("now hangs", ours[0])

    def test_no_plugin_runs_under_sglangs_lock_and_reconfigure_keeps_checking(self) -> None:
        """A registration check (a plug-in's here) never runs while SGLang holds the
        manager's session_lock (0.5.22+ write the table under it); after the guard is
        reconfigured, a manager already running still has its new peers checked, by the
        new installation."""
        held: list[bool] = []

        class Probe:
            @hookimpl
            def sglang_dsv4_guard_check_registration(self, registration: Any,
                                                     context: Any) -> list[Any]:
                held.append(mgr.session_lock.locked())
                return []

        mgr = peers_real.prefill(mooncake, "mooncake", tp=1, state_types=(_SWA,))
        current = installation()
        assert current is not None
        current.runtime.plugins.pm.register(Probe(), "probe")
        frames, _ = peers_real.registration(mooncake, "mooncake", tp=1, name="sess-lock")
        self.assertEqual(self._threads(mgr, [frames]), [])
        self.assertEqual(held, [False])
        self.assertIn("sess-lock", mgr.decode_kv_args_table)
        self.install_guard("strict", load_entry_points=False)  # reconfigure, mgr still live
        frames, _ = peers_real.registration(mooncake, "mooncake", tp=2, name="sess-after",
                                            port=7002)
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            # SGLang's own start: the thread of a manager started under the first install
            self.assertEqual(self._threads(mgr, [frames], _RAW_START), [])
        text = "\n".join(r.getMessage() for r in logs.records)
        self.assertIn("sess-after", text)
        self.assertIn("[DSV4G040]", text)


    def test_64_peers_one_report_and_counts(self) -> None:
        """One prefill rank's real bootstrap thread registers 64 decode peers with the same
        attention-TP mismatch: every peer is in SGLang's table, one full DSV4G040 report, a
        count line at 10 peers, and the exact count in the summary."""
        frames = [peers_real.registration(mooncake, "mooncake", tp=2, name=f"sess-{i}",
                                          port=7000 + i)[0] for i in range(64)]
        mgr = peers_real.prefill(mooncake, "mooncake", tp=1, state_types=(_SWA,))
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            self.assertEqual(self._threads(mgr, frames), [])
        self.assertEqual(len(mgr.decode_kv_args_table), 64)
        full = [r for r in logs.records if "decode peer: sess-" in r.getMessage()]
        counts = [r for r in logs.records if r not in full
                  and "decode peer(s) so far" in r.getMessage()]
        self.assertEqual(len(full), 1)
        self.assertIn("[DSV4G040]", full[0].getMessage())
        self.assertEqual(len(logs.records), 2, [r.getMessage()[:120] for r in logs.records])
        self.assertEqual(len(counts), 1)
        self.assertIn("10 decode peer(s)", counts[0].getMessage())
        self.assertIn("64 decode peer(s)", sglang_dsv4_guard.summary())


    def test_state_layout_rejection_reported_at_registration(self) -> None:
        """A decode whose SWA state entries are 32 bytes wide registers with a prefill whose
        are 64: where SGLang's real bootstrap thread rejects its state transfers (0.5.22+,
        recorded in state_layout_rejections and logged by SGLang), the guard logs one
        DSV4G050 report with SGLang's reason, both servers' item lengths and the peer;
        where SGLang has no such check, the guard says nothing. The peer is registered
        either way."""
        frames, _ = peers_real.registration(mooncake, "mooncake", tp=1, name="sess-st",
                                            state_lens=[(32,)])
        mgr = peers_real.prefill(mooncake, "mooncake", tp=1, state_types=(_SWA,),
                                 state_lens=[(64,)])
        with self.assertLogs(level=logging.INFO) as logs:
            logging.getLogger("sglang_dsv4_guard").info("start")
            self.assertEqual(self._threads(mgr, [frames]), [])
        self.assertIn("sess-st", mgr.decode_kv_args_table)
        rejected = getattr(mgr, "state_layout_rejections", {}).get("sess-st")
        ours = [r.getMessage() for r in guard_records(logs)][1:]
        if rejected is None:
            self.assertEqual(ours, [])
            return
        self.assertIn("item length mismatch", rejected)
        self.assertEqual(len(ours), 1, [m[:200] for m in ours])
        self.assertIn("[DSV4G050]", ours[0])
        self.assertIn(rejected, ours[0])
        self.assertIn("sess-st at 10.0.0.2:7001", ours[0])
        self.assertIn("((64,),)", ours[0])
        self.assertIn("((32,),)", ours[0])


    def test_state_layout_rerun_adds_no_sglang_line(self) -> None:
        """SGLang's state-layout check cannot pre-check a component (its memory config
        read fails) and logs "Could not pre-check" once; the guard running the same
        method for its report adds no second line of SGLang's, and reports nothing."""
        def unpublished() -> Any:
            raise RuntimeError("config namespace 'memory' not published")

        def lines(start: Callable[[Any], Any] | None, name: str) -> list[str]:
            frames, _ = peers_real.registration(mooncake, "mooncake", tp=1, name=name,
                                                state_lens=[(32,)])
            mgr = peers_real.prefill(mooncake, "mooncake", tp=1, state_types=(_SWA,),
                                     state_lens=[(64,)])
            with self.assertLogs(level=logging.INFO) as logs:
                logging.getLogger("sglang_dsv4_guard").info("start")
                self.assertEqual(self._threads(mgr, [frames], start), [])
            return [r.getMessage() for r in logs.records if r.name == mooncake.__name__
                    or r.name == "sglang_dsv4_guard"][1:]

        with mock.patch.object(mooncake, "get_memory", unpublished, create=True):
            raw = lines(sglang_start, "sess-raw")
            guarded = lines(None, "sess-guarded")
        self.assertEqual(guarded, [m.replace("sess-raw", "sess-guarded") for m in raw])
        if hasattr(mooncake.MooncakeKVManager, "_validate_peer_state_layout"):
            self.assertEqual(len(raw), 1, raw)
            self.assertIn("Could not pre-check", raw[0])



class TestMooncakeRegistrationParity(GuardTestCase):
    """The parity property on Mooncake: SGLang's real bootstrap thread ends as it would
    and registers what it would, in every mode; a report appears at registration exactly
    when SGLang refuses the peer then (its DCP relayout) or for every request later (its
    ``maybe_send_extra``)."""

    def setUp(self) -> None:
        super().setUp()
        published_configs(self)

    @settings(max_examples=fixed_examples(30))  # each example: two real bootstrap threads and a send
    @given(prefill_tp=st.sampled_from([1, 2, 4]), decode_tp=st.sampled_from([1, 2, 4]),
           dcp=st.sampled_from([1, 2]), mla=st.booleans(), swa=st.booleans(),
           mode=st.sampled_from(["on", "strict"]))
    def test_parity(self, prefill_tp: int, decode_tp: int, dcp: int, mla: bool, swa: bool,
                    mode: str) -> None:
        """SGLang's real bootstrap thread (unguarded) and ``maybe_send_extra`` are the
        oracles."""
        sglang_dsv4_guard.install(mode, load_entry_points=False)
        try:
            self._example(prefill_tp, decode_tp, dcp, mla, swa)
        finally:
            with guard_logs_off():
                sglang_dsv4_guard.uninstall()

    def _example(self, prefill_tp: int, decode_tp: int, dcp: int, mla: bool,
                 swa: bool) -> None:
        states = (_SWA,) if swa else ()
        frames = peers_real.registration(mooncake, "mooncake", tp=decode_tp, dcp=dcp,
                                         name="sess-p")[0]
        outcomes = []
        mgr = None
        for start in (sglang_start, None):
            mgr = peers_real.prefill(mooncake, "mooncake", tp=prefill_tp, mla=mla,
                                     state_types=states)
            with guard_logs_off():
                died = bootstrap_threads(mgr, [frames], start)
            outcomes.append((died, sorted(mgr.decode_kv_args_table)))
        self.assertEqual(outcomes[1], outcomes[0])
        raw_died = outcomes[0][0]
        current = installation()
        assert current is not None
        reports = current.peers.reports()
        codes = {c for r in reports for c in r.codes}
        if raw_died and raw_died[0][0] is RuntimeError:  # SGLang's relayout refused it
            self.assertEqual(len(raw_died), 1)
            self.assertEqual(codes, {"DSV4G036"}, raw_died)
            return
        if raw_died:  # past the relayout (an MLA pool relayouts DCP) the half-built manager
            # lacks the KV geometry SGLang then prepares: the thread ends before the peer
            # is registered, so there is nothing for the guard to check or name
            self.assertEqual(codes, set(), raw_died)
            return
        later = send_extra_refusal("mooncake", prefill_tp, decode_tp, 1, mla,
                                   ["swa"] if swa else [], layout="page_major")
        self.assertEqual("DSV4G040" in codes, later is not None, (codes, later))
        self.assertEqual(bool(reports), later is not None, codes)


class TestMooncakeStrict(GuardTestCase):
    """Strict mode on Mooncake: a failure of the guard's own never replaces SGLang's error."""

    def test_our_bug_is_a_note_on_the_dying_bootstrap_threads_error(self) -> None:
        """SGLang's relayout refuses a DCP-2 decode (0.5.17+); the guard's snapshot fails:
        the bootstrap thread dies of SGLang's own RuntimeError, carrying the guard's strict
        failure as a note. 0.5.16 has no relayout: SGLang registers the peer, then the
        guard's strict failure rises (strict mode's documented outcome)."""
        self.install_guard("strict", load_entry_points=False)
        frames, _ = peers_real.registration(mooncake, "mooncake", tp=1, dcp=2, name="sess-x")
        mgr = peers_real.prefill(mooncake, "mooncake", tp=1)

        real = mgr.server_args

        class Exploding:  # SGLang's start reads its own flags; the snapshot's explode
            def __getattr__(self, name: str) -> Any:
                if name == "tp_size":
                    raise ZeroDivisionError(name)
                return getattr(real, name)

        mgr.server_args = Exploding()
        mgr.server_socket = peers_real.Socket([frames])
        with guard_logs_off(), thread_errors() as died:  # the exceptions, with their notes
            mooncake.MooncakeKVManager.start_prefill_thread(mgr)
            for t in threading.enumerate():
                if t is not threading.current_thread() and t.name != "MainThread":
                    t.join(5)
        if not hasattr(mooncake.MooncakeKVManager, "requires_dcp_relayout"):
            self.assertIn("sess-x", mgr.decode_kv_args_table)
            self.assertEqual([type(e).__name__ for e in died], ["DSV4GuardError"])
            return
        self.assertEqual([type(e) for e in died], [RuntimeError])
        self.assertIn("Unsupported PD DCP topology", str(died[0]))
        self.assertIn("strict mode", "".join(getattr(died[0], "__notes__", [])))

    def test_manager_started_in_mode_on_then_strict(self) -> None:
        """A manager started in mode ``on`` keeps SGLang's own table; after a
        reconfiguration to strict, a failure of the guard's own while checking its next
        peer: before 0.5.22 (checked at SGLang's parse, before SGLang's write) it is logged
        and SGLang registers the peer, the thread going on; from 0.5.22 (checked after
        SGLang's publishing method returned) it rises from the thread, after SGLang's
        write."""
        published_configs(self)
        self.install_guard("on", load_entry_points=False)
        mgr = peers_real.prefill(mooncake, "mooncake", tp=1)
        self.assertEqual(bootstrap_threads(mgr, []), [])
        self.assertIs(type(mgr.decode_kv_args_table), dict)
        self.install_guard("strict", load_entry_points=False)
        real = mgr.server_args

        class Exploding:
            def __getattr__(self, name: str) -> Any:
                if name == "tp_size":
                    raise ZeroDivisionError(name)
                return getattr(real, name)

        mgr.server_args = Exploding()
        frames, _ = peers_real.registration(mooncake, "mooncake", tp=2, name="sess-o")
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            died = bootstrap_threads(mgr, [frames], _RAW_START)  # the running thread
        self.assertIn("sess-o", mgr.decode_kv_args_table)
        self.assertIn("internal error", logs.records[0].getMessage())
        self.assertIn("ZeroDivisionError", logs.records[0].getMessage())
        if hasattr(mooncake.MooncakeKVManager, "_publish_peer_registration"):
            self.assertEqual([t.__name__ for t, _ in died], ["DSV4GuardError"])
        else:
            self.assertEqual(died, [])


class TestNixlStateLayout(GuardTestCase):
    """NIXL's prepared state transfer (``_prepare_state_xfer``, 0.5.23+): a decode whose
    state slot stride differs is rejected at registration and every request then fails."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)

    def _register(self, decode_item: int) -> tuple[Any, tuple[str, str], list[str]]:
        mgr = peers_real.prefill(nixl, "nixl", tp=2, state_types=(_SWA,), state_item=128)
        info = peers_real.registration(nixl, "nixl", tp=2, state_item=decode_item)[1]
        with self.assertLogs(level=logging.DEBUG) as logs:
            logging.getLogger("sglang_dsv4_guard").debug("start")
            outcome = register(nixl.NixlKVManager._add_remote_peer, mgr, info)
        return mgr, outcome, [r.getMessage() for r in guard_records(logs)][1:]

    def test_stride_mismatch_reported_once_with_sglangs_own_message(self) -> None:
        """Same TP, state slots 128 bytes on the prefill, 256 on the decode: 0.5.23's
        registration records the rejection (the bootstrap thread goes on) and the guard
        logs one DSV4G055 report with both strides and the message SGLang's transfer then
        raises for every request; a release without the preparation accepts the pair and
        the guard says nothing."""
        mgr, outcome, ours = self._register(256)
        self.assertEqual(outcome, ("ok", ""))
        prepares = hasattr(nixl.NixlKVManager, "_prepare_state_xfer")
        if not prepares:
            self.assertEqual(ours, [])
            return
        try:
            list(mgr.maybe_send_extra("decode-0", [[0]], [[0]], [[0]], 0, 2))
            raised = ""
        except RuntimeError as exc:
            raised = str(exc)
        self.assertIn("NIXL state layout rejected for decode-0", raised)
        self.assertEqual(len(ours), 1, ours)
        self.assertIn("[DSV4G055]", ours[0])
        current = installation()
        assert current is not None
        [report] = current.peers.reports()
        self.assertEqual([f.host_message for f in report.findings], [raised])
        self.assertIn("prefill state_item_lens", ours[0])
        self.assertIn("component 0 (swa): prefill [128], decode [256]", ours[0])
        self.assertIn("per request", ours[0])

    def test_equal_strides_say_nothing(self) -> None:
        """Equal strides: SGLang prepares the component, the guard is silent."""
        mgr, outcome, ours = self._register(128)
        self.assertEqual(outcome, ("ok", ""))
        self.assertEqual(ours, [])
        self.assertEqual(getattr(mgr, "_state_layout_rejections", {}), {})



def nixl_mamba_refusal(mgr: Any, decode_tp: int) -> str | None:
    """The oracle: SGLang's real ``NixlKVManager.maybe_send_extra`` on the prefill's own
    manager, one request with one slot per Mamba component, to a decode of ``decode_tp``:
    its refusal of a replicated Mamba state, else ``None`` (past its check the transfer
    fails for want of an engine)."""
    types = [str(getattr(s, "value", s)) for s in mgr.kv_args.state_types]
    wanted: dict[str, Any] = dict(
        peer_name="decode", prefill_state_indices=[[1] if t == "mamba" else None
                                                   for t in types],
        dst_state_data_ptrs=[[0] for _ in types], dst_state_indices=[[1] for _ in types],
        dst_gpu_id=0, notif="n", decode_tp_size=decode_tp)
    params = inspect.signature(nixl.NixlKVManager.maybe_send_extra).parameters
    try:
        out = _RAW["send_extra"](mgr, **{k: v for k, v in wanted.items() if k in params})
        if inspect.isgenerator(out):
            list(out)
    except RuntimeError as exc:
        return str(exc) if "Replicated Mamba" in str(exc) else None
    except Exception:
        return None
    return None


def slice_refusal(conn: Any, mgr: Any, info: Any) -> str | None:
    """The oracle: SGLang's real ``_send_mamba_state_slice`` of the backend (0.5.20+), on
    the prefill manager's first state component and the decode's registration, what it
    transfers stopped (Mooncake's ``_transfer_data``; NIXL's agent accepts everything);
    the ``ValueError`` it raises, if any."""
    cls = conn.NixlKVManager if conn is nixl else conn.MooncakeKVManager
    send = vars(cls).get("_send_mamba_state_slice")
    if send is None:
        return None
    kv = mgr.kv_args
    mgr._transfer_data = lambda *args, **kwargs: 0
    mgr._post_xfer = lambda *args, **kwargs: None
    tp = getattr(info, "dst_attn_tp_size", None) or info.decode_tp_size
    values = {"req": SimpleNamespace(mooncake_session_id="decode", room=0),
              "peer_name": "decode", "notif": "room", "prefill_mamba_index": [0],
              "dst_mamba_index": [0],
              "prefill_state_indices": [0], "dst_state_indices": [0], "dst_tp_rank": 0,
              "decode_tp_rank": 0, "dst_gpu_id": 0, "dst_attn_tp_size": tp,
              "decode_tp_size": tp, "src_state_data_ptrs": kv.state_data_ptrs[0],
              "src_state_item_lens": kv.state_item_lens[0],
              "src_state_dim_per_tensor": kv.state_dim_per_tensor[0],
              "dst_state_data_ptrs": info.dst_state_data_ptrs[0],
              "dst_state_item_lens": info.dst_state_item_lens[0],
              "dst_state_dim_per_tensor": info.dst_state_dim_per_tensor[0],
              "src_layer_ids": kv.state_layer_ids[0], "dst_layer_ids": info.dst_state_layer_ids[0]}
    names = list(inspect.signature(send).parameters)[1:]
    try:
        send(mgr, **{n: values[n] for n in names if n in values})
    except ValueError as exc:
        return str(exc)
    return None


class TestMambaSlice(GuardTestCase):
    """DSV4G059: a Mamba state tensor sharded on one server and replicated on the other
    (or replicated with other item lengths), for a decode of another TP: reported when
    the decode registers (SGLang's real Mooncake bootstrap thread, NIXL's real
    ``_add_remote_peer``), exactly when SGLang's own slice transfer then refuses
    (0.5.20+; never before). NIXL refuses a replicated prefill tensor first (DSV4G058,
    ``TestNixlMambaState``'s oracle): there, no DSV4G059."""

    # (prefill TP, decode TP, prefill dims, decode dims, prefill lens, decode lens, refused)
    # of one Mamba component of two tensors (conv, temporal); a sharded tensor has 8
    # heads on a TP-1 rank, 4 on a TP-2 one.
    CASES = (
        (1, 2, (8, 8), (4, 4), (128, 128), (64, 64), False),  # both sharded: sliced
        (1, 2, (8, 0), (4, 4), (128, 32), (64, 64), True),  # replicated on the prefill only
        (2, 1, (4, 4), (8, 0), (64, 64), (128, 32), True),  # replicated on the decode only
        (1, 2, (8, 0), (4, 0), (128, 32), (64, 32), False),  # replicated alike
        (1, 2, (8, 0), (4, 0), (128, 32), (64, 48), True),  # replicated, other lengths
        (2, 2, (4, 0), (4, 4), (64, 32), (64, 64), False),  # equal TP: whole items copied
    )

    def test_reported_exactly_when_sglangs_slice_transfer_refuses(self) -> None:
        published_configs(self)
        self.install_guard("on", load_entry_points=False)
        current = installation()
        assert current is not None
        has = current.runtime.profile.version >= Version("0.5.20")
        refused = {"mooncake": 0, "nixl": 0}
        for conn, backend in ((mooncake, "mooncake"), (nixl, "nixl")):
            mamba = conn.StateType("mamba")
            for i, (tp, decode_tp, dims, dst_dims, lens, dst_lens, want) in enumerate(
                    self.CASES):
                first = backend == "nixl" and 0 in dims  # DSV4G058 refuses first
                with self.subTest(backend=backend, tp=tp, decode_tp=decode_tp, dims=dims,
                                  dst_dims=dst_dims, lens=lens, dst_lens=dst_lens):
                    name = f"slice-{backend}-{i}"
                    frames, info = peers_real.registration(
                        conn, backend, tp=decode_tp, name=name, state_lens=[dst_lens],
                        state_dims=[dst_dims])
                    mgr = peers_real.prefill(conn, backend, tp=tp, mla=True,
                                             state_types=[mamba], state_lens=[lens],
                                             state_dims=[dims])
                    with guard_logs_off():
                        if backend == "mooncake":
                            bootstrap_threads(mgr, [frames])
                        else:
                            register(nixl.NixlKVManager._add_remote_peer, mgr, info)
                    ours = [f for r in current.peers.reports() for f in r.findings
                            if f.code == "DSV4G059" and f"{name} " in f.details[0]]
                    found = [f.host_message for f in ours]
                    # equal TP copies whole items: a fix for a tensor sharded on one
                    # side, never for replicated ones of other lengths
                    self.assertEqual([any(x.field == "attn_tp_size" for x in f.fixes)
                                      for f in ours],
                                     [str(f.host_message).startswith("Mamba state replication")
                                      for f in ours])
                    # before 0.5.20 the slice sender has no such check (a replicated
                    # tensor divides by its 0 there): nothing to report
                    expected = (slice_refusal(conn, mgr, info)
                                if has and tp != decode_tp and not first else None)
                    self.assertEqual(expected is not None, want and has and not first,
                                     expected)
                    self.assertEqual(found, [expected] if expected else [])
                    refused[backend] += bool(found)
        self.assertEqual(refused, {"mooncake": 3, "nixl": 1} if has else
                         {"mooncake": 0, "nixl": 0})


class TestNixlMambaState(GuardTestCase):
    """NIXL's per-request refusal of a replicated Mamba state for a decode of another TP
    (0.5.20+: ``maybe_send_extra``): reported at registration (DSV4G058), exactly when
    SGLang's own method then refuses, on every release."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)

    def test_reported_exactly_when_sglangs_transfer_refuses(self) -> None:
        """A grid of prefill attention / state TP, decode TP, state components and which
        Mamba tensors are replicated; each decode registers through SGLang's real
        ``_add_remote_peer``; SGLang's ``maybe_send_extra`` on the same manager is the
        oracle."""
        mamba, swa = nixl.StateType("mamba"), nixl.StateType("swa")
        current = installation()
        assert current is not None
        refused = 0
        for i, (tp, state_tp, decode_tp, types, dims) in enumerate(
                (tp, state_tp, decode_tp, types, dims)
                for tp in (1, 2) for state_tp in (None, 1) for decode_tp in (1, 2, 4)
                for types, dims in (((mamba,), [[0, 1]]), ((mamba,), [[1, 1]]),
                                    ((swa, mamba), [[], [1, 0]]),
                                    ((mamba, mamba), [[1], [0]]),  # the second refused
                                    ((mamba, swa, mamba), [[1], [], [1, 0]]))):
            mgr = peers_real.prefill(nixl, "nixl", tp=tp, state_tp=state_tp, mla=True,
                                     state_types=types, state_dims=dims)
            expected = nixl_mamba_refusal(mgr, decode_tp)
            _, info = peers_real.registration(nixl, "nixl", tp=decode_tp, name=f"m-{i}")
            with guard_logs_off():
                register(nixl.NixlKVManager._add_remote_peer, mgr, info)
            found = [(f.code, f.host_message) for r in current.peers.reports()
                     for f in r.findings if f"m-{i} " in f.details[0]]
            with self.subTest(tp=tp, state_tp=state_tp, decode_tp=decode_tp, dims=dims):
                self.assertEqual(found, [("DSV4G058", expected)] if expected else [])
            refused += expected is not None
        has_check = current.runtime.profile.version >= Version("0.5.20")
        self.assertEqual(refused > 0, has_check, refused)

    def test_a_bad_prefill_value_is_not_known_and_the_rest_is_reported(self) -> None:
        """A prefill whose state TP is not a size: the guard's findings for that peer are
        the ones it gives with the state TP unset (SGLang's default: the attention TP),
        not none at all."""
        mamba, swa = nixl.StateType("mamba"), nixl.StateType("swa")
        current = installation()
        assert current is not None
        codes = []
        for i, state_tp in enumerate((None, "x")):
            mgr = peers_real.prefill(nixl, "nixl", tp=1, state_types=(swa, mamba),
                                     state_dims=[[], [1, 1]])
            mgr.state_tp_size = state_tp
            _, info = peers_real.registration(nixl, "nixl", tp=2, name=f"bad-{i}")
            with guard_logs_off():
                register(nixl.NixlKVManager._add_remote_peer, mgr, info)
            codes.append([f.code for r in current.peers.reports() for f in r.findings
                          if f"bad-{i} " in f.details[0]])
        self.assertIn("DSV4G040", codes[0])
        self.assertEqual(codes[1], codes[0])

    def test_a_changed_refusal_is_not_judged(self) -> None:
        """The release's Mamba check, changed (its condition negated) in a copy of the
        connector's source: the verdict is "not judged", never guessed at."""
        import tempfile
        from pathlib import Path

        from sglang_dsv4_guard.host.judgement import imported_package_dir
        from sglang_dsv4_guard.host.pd_digests import NotJudged
        from sglang_dsv4_guard.host.targets import PD_NIXL_SEND_EXTRA
        from sglang_dsv4_guard.pd.endpoint import Endpoint, Value
        from sglang_dsv4_guard.pd.mamba_state import mamba_refusal

        package = imported_package_dir()
        assert package is not None
        source = (package / PD_NIXL_SEND_EXTRA.path).read_text()
        prefill = Endpoint("prefill", {"attn_tp_size": Value(1, "t"),
                                       "state_types": Value(("mamba",), "t"),
                                       "state_dim_per_tensor": Value(((0,),), "t")})
        decode = Endpoint("decode", {"attn_tp_size": Value(2, "t")})
        if "if 0 in src_dims" not in source:  # before 0.5.20: no such check to change
            self.assertIsNone(mamba_refusal("nixl", prefill, decode, package))
            self.assertLess(installation().runtime.profile.version, Version("0.5.20"))
            return
        self.assertIsNotNone(mamba_refusal("nixl", prefill, decode, package))
        with tempfile.TemporaryDirectory() as tmp:
            changed = Path(tmp) / PD_NIXL_SEND_EXTRA.path
            changed.parent.mkdir(parents=True)
            changed.write_text(source.replace("if 0 in src_dims", "if 0 not in src_dims"))
            with self.assertRaisesRegex(NotJudged, "differs from every release this guard knows"):
                mamba_refusal("nixl", prefill, decode, Path(tmp))

    def test_the_fix_names_the_tp_the_release_pairs_by(self) -> None:
        """Attention TP 2, state TP 1, a decode of TP 4: the fix names the prefill TP this
        release's own check accepts (0.5.23: state TP 1; 0.5.20 - 0.5.22: attention TP
        2, with the flag edits that make the attention TP sizes equal)."""
        mamba = nixl.StateType("mamba")
        mgr = peers_real.prefill(nixl, "nixl", tp=2, state_tp=1, mla=True,
                                 state_types=(mamba,), state_dims=[[0]])
        if nixl_mamba_refusal(mgr, 4) is None:  # before 0.5.20: no such refusal
            self.assertLess(installation().runtime.profile.version, Version("0.5.20"))
            return
        by_state = nixl_mamba_refusal(mgr, 1) is None
        _, info = peers_real.registration(nixl, "nixl", tp=4, name="m-fix")
        with guard_logs_off():
            register(nixl.NixlKVManager._add_remote_peer, mgr, info)
        current = installation()
        assert current is not None
        [finding] = [f for r in current.peers.reports() for f in r.findings
                     if "m-fix " in f.details[0]]
        texts = [x.text for x in finding.fixes]
        self.assertIn("give the decode TP 1: this release's NIXL pairs the mamba state by "
                      "the prefill's state TP (1)" if by_state else
                      "give the decode TP 2: this release's NIXL pairs the mamba state by "
                      "the prefill's attention TP (2)", texts[-1])
        self.assertEqual(len(texts), 1 if by_state else 3, texts)
        self.assertIn(("prefill", "state_dim_per_tensor", ((0,),)),
                      [(o.role, o.name, o.value) for o in finding.observations])


if __name__ == "__main__":
    unittest.main()
