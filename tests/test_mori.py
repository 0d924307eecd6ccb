"""SGLang's real MORI connector (over stub ``mori`` modules): DSV4G006, early and cheap."""

from __future__ import annotations

import inspect
import json
import logging
import os
import threading
import unittest
from typing import Any

import mori_stub
from helpers import GuardTestCase, fixed_examples, fresh_python, guard_logs_off
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.codes import CODES
from sglang_dsv4_guard.lifecycle import installation

register_cpu_ci(est_time=62, suite="stage-a-test-cpu")

mori_stub.install_stub()
import sglang.srt.disaggregation.mori.conn as conn  # noqa: E402 - needs the stub first

_RAW = {"send": vars(conn.MoriKVManager)["_send_swa_dsa_state"]}
_G006_MESSAGE = CODES["DSV4G006"].sglang_message.split("(")[0]
STATE_TYPES = ("swa", "dsa", "qsa_pending", "qsa_compressed", "swa_ring", "c128_state",
               "minimax_index_k", "minimax_dense_kv")


def call(fn: Any, mgr: Any, p: Any, state_type: str, by_keyword: bool = False) -> tuple[str, Any]:
    args = mori_stub.send_args(conn, p, state_type)
    try:
        if by_keyword:
            names = list(inspect.signature(_RAW["send"]).parameters)[1:]
            return "ok", fn(mgr, **dict(zip(names, args, strict=True)))
        return "ok", fn(mgr, *args)
    except Exception as exc:
        return "raised", exc


def guarded(mgr: Any, p: Any, state_type: str) -> tuple[str, Any]:
    return call(conn.MoriKVManager._send_swa_dsa_state, mgr, p, state_type)


class TestMoriParity(GuardTestCase):
    """The wrapped send path reaches SGLang's verdict on every drawn configuration.

    Installed once per test; each example's decode peer has its own engine key, so every
    example is a first failure for its peer, as it would be on a fresh install."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)
        self.peers = 0


    @given(state_type=st.one_of(st.sampled_from(STATE_TYPES), st.text(max_size=12)),
           mla=st.booleans(), attn_tp=st.integers(1, 64), decode_tp=st.integers(1, 64),
           same_tp=st.booleans(), pp=st.integers(1, 4), by_keyword=st.booleans())
    def test_parity(self, state_type: str, mla: bool, attn_tp: int, decode_tp: int,
                    same_tp: bool, pp: int, by_keyword: bool) -> None:
        """Same outcome and first line, positional or keyword call, any TP sizes and state
        type (known or not); a DSV4GuardError whose finding carries SGLang's exact message
        exactly when SGLang's own function raised its TP-mismatch error (DSV4G006), and
        SGLang's own exception, untouched, for any other of its errors."""
        decode_tp = attn_tp if same_tp else decode_tp
        mgr = mori_stub.manager(conn, attn_tp=attn_tp, mla=mla, pp=pp)
        self.peers += 1
        p = mori_stub.peer(conn, f"decode-{self.peers}", decode_tp=decode_tp)
        expected = call(_RAW["send"], mgr, p, state_type, by_keyword)
        # Which of SGLang's checks refused is read from SGLang's own error: its exact
        # RuntimeError with the message DSV4G006 documents (up to the sizes).
        tp_refused = (expected[0] == "raised" and type(expected[1]) is RuntimeError
                      and str(expected[1]).startswith(_G006_MESSAGE))
        with guard_logs_off():
            actual = call(conn.MoriKVManager._send_swa_dsa_state, mgr, p, state_type,
                          by_keyword)
        self.assertEqual(actual[0], expected[0])
        if expected[0] == "ok":
            self.assertEqual(actual[1], expected[1])
            return
        self.assertEqual(str(actual[1]).splitlines()[0], str(expected[1]))
        self.assertIs(type(actual[1]), DSV4GuardError if tp_refused else type(expected[1]))
        if tp_refused:
            self.assertIs(type(actual[1].host_error), RuntimeError)  # SGLang's own, chained
            self.assertEqual(actual[1].findings[0].host_message, str(expected[1]))
            self.assertEqual(actual[1].findings[0].value("decode", "decode_tp_size"),
                             decode_tp)


class TestMoriReporting(GuardTestCase):
    """Once per peer, early at registration, strict blocking, threads."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)
        self.mgr = mori_stub.manager(conn, attn_tp=8)

    def test_wrapped_when_already_imported_and_restored(self) -> None:
        """Install wraps the imported connector; uninstall restores the original method."""
        self.assertIsNot(vars(conn.MoriKVManager)["_send_swa_dsa_state"], _RAW["send"])
        sglang_dsv4_guard.uninstall()
        self.assertIs(vars(conn.MoriKVManager)["_send_swa_dsa_state"], _RAW["send"])

    def test_g006_send_failures_carry_the_report_once_and_log_one_line(self) -> None:
        """Every failure raises DSV4GuardError with the report's data; only the first
        exception carries the full text, later ones SGLang's line and a pointer; the log
        never repeats the raised report: one line, not one per failure."""
        p = mori_stub.peer(conn, "decode-a", decode_tp=4)
        with self.assertLogs("sglang_dsv4_guard", level=logging.ERROR) as logs:
            errors = [guarded(self.mgr, p, "swa")[1] for _ in range(3)]
        self.assertTrue(all(isinstance(e, DSV4GuardError) for e in errors))
        self.assertEqual({f.code for e in errors for f in e.findings}, {"DSV4G006"})
        self.assertEqual(errors[0].findings[0].value("decode", "decode_tp_size"), 4)
        self.assertIn("prefill attn_tp_size", str(errors[0]))
        self.assertNotIn("prefill attn_tp_size", str(errors[2]))
        self.assertIn("3 failure(s) to this peer so far", str(errors[2]))
        self.assertEqual(len(logs.records), 1)  # the claimant logs the one full copy
        self.assertIn("also carried by the DSV4GuardError", logs.records[0].getMessage())
        self.assertIn("prefill attn_tp_size", logs.records[0].getMessage())

    def test_report_at_registration(self) -> None:
        """A mismatched decode peer is reported when it registers, once, before any request."""
        p = mori_stub.peer(conn, "decode-b", decode_tp=2)
        with self.assertLogs("sglang_dsv4_guard", level=logging.ERROR) as logs:
            self.mgr._add_remote_peer(p)
            self.mgr._add_remote_peer(p)
        self.assertEqual(len(logs.records), 1)
        self.assertIn("found when the decode peer registered", logs.records[0].getMessage())
        self.assertIn("decode-b", self.mgr.decode_kv_args_table)

    def test_matching_or_mla_peer_is_silent(self) -> None:
        """Equal TP, or an MLA pool, registers without a word."""
        current = installation()
        assert current is not None
        self.mgr._add_remote_peer(mori_stub.peer(conn, "decode-c", decode_tp=8))
        mori_stub.manager(conn, attn_tp=8, mla=True)._add_remote_peer(
            mori_stub.peer(conn, "decode-d", decode_tp=2))
        self.assertEqual(current.mori.registered, {})

    def test_strict_blocks_peer_before_transfer(self) -> None:
        """Strict mode: after a mismatched registration, an ``swa`` transfer to the peer fails
        at once; a ``dsa`` transfer, which SGLang accepts, still goes through."""
        self.install_guard("strict", load_entry_points=False)
        p = mori_stub.peer(conn, "decode-e", decode_tp=4)
        with guard_logs_off():
            self.mgr._add_remote_peer(p)
            kind, err = guarded(self.mgr, p, "swa")
            dsa = guarded(self.mgr, p, "dsa")
        self.assertEqual(kind, "raised")
        self.assertIn("transfer not attempted", str(err).splitlines()[0])
        self.assertEqual(dsa, call(_RAW["send"], self.mgr, p, "dsa"))
        self.assertTrue(str(err).startswith("PD state transfer does not support"))

    def test_threads_exact_counts(self) -> None:
        """8 threads x 400 calls over good and bad peers: exact raised/passed split and counts."""
        peers = [mori_stub.peer(conn, f"decode-{i}", decode_tp=8 if i % 2 else 4)
                 for i in range(4)]
        results: list[tuple[str, int]] = []
        lock = threading.Lock()

        def worker(seed: int) -> None:
            local = []
            for n in range(400):
                index = (seed + n) % 4
                local.append((guarded(self.mgr, peers[index], "swa")[0], index))
            with lock:
                results.extend(local)

        with guard_logs_off():
            threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        raised = [i for kind, i in results if kind == "raised"]
        self.assertEqual(len(results), 3200)
        self.assertEqual(len(raised), 1600)
        self.assertTrue(all(i % 2 == 0 for i in raised))
        current = installation()
        assert current is not None
        self.assertEqual(current.mori.failures, {("decode-0", "swa"): 800,
                                                 ("decode-2", "swa"): 800})


LAZY_PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import sglang_dsv4_guard
sglang_dsv4_guard.install("on", load_entry_points=False)
before = {"conn": "sglang.srt.disaggregation.mori.conn" in sys.modules, "mori": "mori" in sys.modules}
import mori_stub
from helpers import fresh_python, guard_logs_off
mori_stub.install_stub()
import sglang.srt.disaggregation.mori.conn as conn
wrapped = hasattr(vars(conn.MoriKVManager)["_send_swa_dsa_state"], "__sglang_dsv4_guard_original__")
sglang_dsv4_guard.uninstall()
restored = not hasattr(vars(conn.MoriKVManager)["_send_swa_dsa_state"], "__sglang_dsv4_guard_original__")
print(json.dumps({"before": before, "wrapped": wrapped, "restored": restored,
                  "hook_left": any(type(f).__name__ == "PostImportHooks" for f in sys.meta_path)}))
"""


class TestLazyPatch(GuardTestCase):
    """The connector is wrapped the moment SGLang imports it, never imported by us."""

    def test_fresh_interpreter(self) -> None:
        """Fresh interpreter: not imported at install, wrapped on import, restored, hook gone."""
        done = fresh_python(LAZY_PROBE, os.path.dirname(__file__))
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        result = json.loads(done.stdout.strip().splitlines()[-1])
        self.assertEqual(result, {"before": {"conn": False, "mori": False}, "wrapped": True,
                                  "restored": True, "hook_left": False})
        self.assertNotIn("Traceback", done.stderr)


def registered(mgr: Any, p: Any) -> tuple[str, str]:
    """SGLang's MORI registration outcome: ``ok`` or the exception's type and message."""
    try:
        conn.MoriKVManager._add_remote_peer(mgr, p)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


class TestMoriRegistrationParity(GuardTestCase):
    """The parity property on MORI's registration: SGLang's outcome is unchanged in every
    mode, and a report appears at registration exactly when SGLang refuses the peer then
    (its DCP relayout, 0.5.22+) or its own SWA send refuses every request later."""

    # the whole space (ci); each example: two registrations, a send
    @settings(max_examples=fixed_examples(24))
    @given(decode_tp=st.sampled_from([1, 2, 4]), dcp=st.sampled_from([1, 2]),
           mla=st.booleans(), mode=st.sampled_from(["on", "strict"]))
    def test_parity(self, decode_tp: int, dcp: int, mla: bool, mode: str) -> None:
        """SGLang's real ``_add_remote_peer`` (unguarded) and ``_send_swa_dsa_state`` are
        the oracles; the prefill has attention TP 2."""
        def pair(key: str) -> tuple[Any, Any]:
            mgr = mori_stub.manager(conn, attn_tp=2, mla=mla)
            p = mori_stub.peer(conn, key, decode_tp=decode_tp)
            p.dst_dcp_size, p.dst_dcp_rank = dcp, 0
            return mgr, p

        raw = registered(*pair("raw"))  # SGLang's own: nothing installed yet
        sglang_dsv4_guard.install(mode, load_entry_points=False)
        try:
            mgr, p = pair(f"guarded-{decode_tp}-{dcp}-{mla}-{mode}")
            with guard_logs_off():
                self.assertEqual(registered(mgr, p), raw)
            current = installation()
            assert current is not None
            codes = {c for r in [*current.mori.registered.values(), *current.peers.reports()]
                     for c in r.codes}
        finally:
            with guard_logs_off():
                sglang_dsv4_guard.uninstall()
        if raw[0] == "RuntimeError":  # SGLang's registration refused the peer: its relayout
            self.assertEqual(codes, {"DSV4G036"}, raw)
            return
        if raw != ("ok", ""):  # past the relayout (an MLA pool relayouts DCP) the half-built
            # manager lacks the KV geometry SGLang then reads: no refusal of SGLang's
            self.assertNotIn("DSV4G036", codes, raw)
            return
        later = call(_RAW["send"], *pair("later"), "swa")
        refused = (later[0] == "raised" and type(later[1]) is RuntimeError
                   and str(later[1]).startswith(_G006_MESSAGE))
        self.assertEqual("DSV4G006" in codes, refused, (codes, later))
        self.assertEqual(codes - {"DSV4G006"}, set(), codes)


class TestMoriRegistration(GuardTestCase):
    """MORI's registration beyond DSV4G006: the DCP relayout MORI's ``_add_remote_peer``
    decides (0.5.22+) and the metadata buffer counts, under check's codes."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)

    def _pair(self, *, dcp: int = 1, aux: tuple[int, int] = (3, 3), key: str = "d-0",
              mgr: Any = None) -> tuple[Any, Any]:
        mgr = mgr or mori_stub.manager(conn, attn_tp=2)
        mgr.kv_args.aux_data_ptrs = list(range(1, aux[0] + 1))
        p = mori_stub.peer(conn, key, decode_tp=2)
        p.dst_aux_mem_descs = [object()] * aux[1]
        p.dst_dcp_size, p.dst_dcp_rank = dcp, 0
        return mgr, p

    def test_dcp_relayout_reported_where_mori_decides_it(self) -> None:
        """A decode with DCP 2 on a non-MLA prefill with DCP 1: 0.5.22+ MORI raises its own
        relayout error (unchanged) and the guard reports DSV4G036 once with SGLang's
        message; releases whose MORI registration never decides it accept the peer and
        the guard says nothing."""
        raw = registered(*self._pair(dcp=2, key="raw"))
        with guard_logs_off():
            sglang_dsv4_guard.uninstall()
        self.install_guard("on", load_entry_points=False)
        mgr, p = self._pair(dcp=2)
        with self.assertLogs(level=logging.DEBUG) as logs:
            logging.getLogger("sglang_dsv4_guard").debug("start")
            outcome = registered(mgr, p)
        self.assertEqual(outcome, raw)
        ours = [r.getMessage() for r in logs.records if r.name == "sglang_dsv4_guard"][1:]
        if raw == ("ok", ""):
            self.assertEqual(ours, [])
            return
        self.assertEqual(len(ours), 1, ours)
        self.assertIn("[DSV4G036]", ours[0])
        self.assertIn("MORI logs it", ours[0])
        current = installation()
        assert current is not None
        self.assertEqual([f.host_message for r in current.peers.reports() for f in r.findings],
                         [raw[1]])

    def test_metadata_buffer_counts_reported_at_registration(self) -> None:
        """The decode registers three metadata buffers more (a sampling mask on one side):
        SGLang registers the peer (its outcome unchanged); the guard reports DSV4G045 once,
        with both counts; equal counts say nothing."""
        outcome_ok = registered(*self._pair(key="same"))
        self.assertEqual(outcome_ok, ("ok", ""))
        current = installation()
        assert current is not None
        self.assertEqual(current.peers.reports(), [])
        mgr, p = self._pair(aux=(3, 6))
        with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            self.assertEqual(registered(mgr, p), ("ok", ""))
        text = "\n".join(r.getMessage() for r in logs.records)
        self.assertEqual(text.count("[DSV4G045]"), 1, text)
        self.assertRegex(text, r"prefill aux_buffer_count\s+= 3\n")
        self.assertRegex(text, r"decode aux_buffer_count\s+= 6\n")
        self.assertIn("d-0", mgr.decode_kv_args_table)

    def test_state_refusals_reported_exactly_when_sglangs_transfer_refuses(self) -> None:
        """MiniMax and QSA state with another decode TP, and a different number of state
        components: SGLang's own transfer (``send_state`` / ``_send_swa_dsa_state``, per
        request) is the oracle. The guard reports at registration, under DSV4G041 /
        DSV4G056 / DSV4G057, with the message SGLang then raises, exactly for the cases
        this release refuses; the non-MLA swa TP rule stays DSV4G006's alone."""
        cases = [(("minimax_index_k",), 2, 1, 1, "DSV4G041"),
                 (("qsa_pending",), 2, 1, 1, "DSV4G056"),
                 (("dsa",), 2, 2, 1, "DSV4G057"),
                 (("dsa", "qsa_compressed"), 4, 1, 1, None), (("dsa",), 2, 1, 1, None)]
        from sglang.srt.disaggregation.base.conn import StateType

        known = {s.value for s in StateType}  # QSA state from 0.5.20
        cases = [c for c in cases if set(c[0]) <= known]
        self.assertGreaterEqual(len(cases), 3)
        current = installation()
        assert current is not None
        for i, (types_, decode_tp, comps, dst_comps, code) in enumerate(cases):
            mgr = mori_stub.manager(conn, attn_tp=4, mla=True, state_types=types_)
            mgr.state_mem_descs = [[] for _ in range(comps)]
            for name in ("state_item_lens", "state_dim_per_tensor", "state_layer_ids"):
                setattr(mgr.kv_args, name, [])  # KVArgs declares them, some releases unset
            p = mori_stub.peer(conn, f"s-{i}", decode_tp=decode_tp)
            p.dst_state_mem_descs = [[] for _ in range(dst_comps)]
            raised = None
            try:
                conn.MoriKVManager.send_state(mgr, p, [], [])
                for st in types_:
                    _RAW["send"](mgr, *mori_stub.send_args(conn, p, st))
            except RuntimeError as exc:
                raised = str(exc)
            with guard_logs_off():
                self.assertEqual(registered(mgr, p), ("ok", ""))
            found = [(f.code, f.host_message) for r in current.peers.reports()
                     for f in r.findings if f"s-{i} " in f.details[0]]
            with self.subTest(types_=types_, raised=raised):
                self.assertEqual(found, [(code, raised)] if raised else [])
                if raised:
                    self.assertIn(code, ("DSV4G041", "DSV4G056", "DSV4G057"))
        # QSA with state TP 1 under attention TP 4: the fix names the TP this release's
        # own check pairs by (0.5.23: state TP; 0.5.20 - 0.5.22: attention TP).
        if "qsa_pending" not in known:
            return
        mgr = mori_stub.manager(conn, attn_tp=4, mla=True, state_types=("qsa_pending",))
        mgr.state_tp_size = 1
        p = mori_stub.peer(conn, "qsa-state", decode_tp=2)
        state_pairs = call(_RAW["send"], mgr, mori_stub.peer(conn, "x", decode_tp=1),
                           "qsa_pending")[0] == "ok"
        with guard_logs_off():
            registered(mgr, p)
        [fix] = [x.text for r in current.peers.reports() for f in r.findings
                 if "qsa-state " in f.details[0] for x in f.fixes if "pairs the" in x.text]
        self.assertIn("state TP (1)" if state_pairs else "attention TP (4)", fix)

    def test_replicated_mamba_reported_exactly_when_sglangs_send_state_refuses(self) -> None:
        """A Mamba state component with a replicated tensor (0 in its
        ``state_dim_per_tensor``) and another decode TP: SGLang's own ``send_state`` (per
        request) is the oracle, on the same manager and the registered peer. The guard
        reports DSV4G058 at registration with SGLang's message exactly when it refuses
        (0.5.20+), and nothing where it sends."""
        import numpy as np
        from packaging.version import Version

        current = installation()
        assert current is not None
        refused = 0
        # the registered state components (prefill, decode): equal, none on the prefill
        # (SGLang sends nothing), or different (SGLang refuses the count first: DSV4G057)
        for i, (state_tp, decode_tp, dims, (comps, dst)) in enumerate(
                (s, d, dims, c) for s in (2, 1) for d in (1, 2, 4)
                for dims in ([[0, 1]], [[1, 1]]) for c in ((1, 1), (0, 1), (1, 2))):
            mgr = mori_stub.manager(conn, attn_tp=2, mla=True, state_types=("mamba",))
            mgr.state_tp_size = state_tp
            mgr.state_mem_descs = [[] for _ in range(comps)]
            mgr.kv_args.state_dim_per_tensor = dims
            for name in ("state_item_lens", "state_layer_ids"):
                setattr(mgr.kv_args, name, [])  # KVArgs declares them, some releases unset
            p = mori_stub.peer(conn, f"mb-{i}", decode_tp=decode_tp)
            p.dst_state_mem_descs = [[] for _ in range(dst)]
            one = [np.array([1], dtype=np.int32)]
            expected = None
            try:
                conn.MoriKVManager.send_state(mgr, p, one, [one[0].copy()])
            except RuntimeError as exc:
                expected = str(exc) if "Replicated Mamba" in str(exc) else None
            except Exception:  # past the check: the transfer this manager cannot make
                pass
            with guard_logs_off():
                self.assertEqual(registered(mgr, p), ("ok", ""))
            found = [(f.code, f.host_message) for r in current.peers.reports()
                     for f in r.findings if f"mb-{i} " in f.details[0]
                     and f.code == "DSV4G058"]
            with self.subTest(state_tp=state_tp, decode_tp=decode_tp, dims=dims,
                              components=(comps, dst)):
                self.assertEqual(found, [("DSV4G058", expected)] if expected else [])
            refused += expected is not None
        self.assertEqual(refused > 0, current.runtime.profile.version >= Version("0.5.20"))


if __name__ == "__main__":
    unittest.main()
