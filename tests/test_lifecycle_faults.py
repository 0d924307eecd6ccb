"""install() keeps its promises under faults: reconfigure cleanly, own undo, all or nothing."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import mori_stub
import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, guard_logs_off, outcome, raw_setup_state_kv_args
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError, DSV4GuardStartupRefused
from sglang_dsv4_guard.entry import activate
from sglang_dsv4_guard.testing import PoolSpec, build_pair

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

mori_stub.install_stub()
import sglang.srt.disaggregation.mori.conn as conn  # noqa: E402 - needs the stub first

_RAW = {name: vars(conn.MoriKVManager)[name] for name in ("_send_swa_dsa_state",
                                                           "_add_remote_peer")}
STATE_TYPES = ("swa", "dsa", "qsa_pending", "qsa_compressed", "swa_ring", "c128_state",
               "minimax_index_k", "minimax_dense_kv")


def send(fn: Any, mgr: Any, peer: Any, state_type: str) -> tuple[str, str]:
    """('ok', repr of the result) or ('raised', the first line of the error)."""
    try:
        return "ok", repr(fn(mgr, *mori_stub.send_args(conn, peer, state_type)))
    except Exception as exc:
        return "raised", str(exc).splitlines()[0]


def guarded_send(mgr: Any, peer: Any, state_type: str) -> tuple[str, str]:
    return send(conn.MoriKVManager._send_swa_dsa_state, mgr, peer, state_type)


class TestReconfigure(GuardTestCase):
    """Items 1-3: a new install() leaves nothing of the earlier one behind."""

    def test_on_after_strict_lets_every_transfer_reach_sglang(self) -> None:
        """install("strict"), a mismatched peer registers (blocked), then install("on"):
        every transfer to that peer has SGLang's own outcome and first line."""
        mgr = mori_stub.manager(conn, attn_tp=8)
        peer = mori_stub.peer(conn, "decode-x", decode_tp=4)
        expected = {s: send(_RAW["_send_swa_dsa_state"], mgr, peer, s) for s in STATE_TYPES}
        with guard_logs_off():
            self.install_guard("strict", load_entry_points=False)
            mgr._add_remote_peer(peer)
            self.assertIn("transfer not attempted", guarded_send(mgr, peer, "swa")[1])
            self.install_guard("on", load_entry_points=False)
            actual = {s: guarded_send(mgr, peer, s) for s in STATE_TYPES}
        self.assertEqual(actual, expected)

    def test_strict_blocks_only_the_state_type_sglang_rejects(self) -> None:
        """Strict mode, a mismatched peer registered: only ``swa`` is refused early; every
        other state type gets SGLang's own outcome."""
        mgr = mori_stub.manager(conn, attn_tp=8)
        peer = mori_stub.peer(conn, "decode-y", decode_tp=4)
        expected = {s: send(_RAW["_send_swa_dsa_state"], mgr, peer, s)
                    for s in STATE_TYPES if s != "swa"}
        with guard_logs_off():
            self.install_guard("strict", load_entry_points=False)
            mgr._add_remote_peer(peer)
            actual = {s: guarded_send(mgr, peer, s) for s in STATE_TYPES if s != "swa"}
        self.assertEqual(actual, expected)

    def test_json_over_text_install_logs_json(self) -> None:
        """install(log_format="json") over a text install: the next report is on the record
        as JSON-ready data (the message stays readable text)."""
        pair = build_pair(draft=PoolSpec(compression_ratios=(4,)))
        self.install_guard("on", load_entry_points=False)
        self.install_guard("on", load_entry_points=False, log_format="json")
        with self.assertLogs("sglang_dsv4_guard", level=logging.ERROR) as logs:
            kind, _ = outcome(utils.setup_state_kv_args, *pair)
        self.assertEqual(kind, "raised")
        data = getattr(logs.records[0], "sglang_dsv4_guard", None)
        self.assertIsNotNone(data, "a text install's record carries no structured report")
        document = json.loads(json.dumps(data["report"]))
        self.assertEqual(document["findings"][0]["code"], "DSV4G001")

    def test_each_install_returns_its_own_undo(self) -> None:
        """An old undo does nothing once a newer install replaced it; the newer undo
        uninstalls; an identical repeat install returns the same undo."""
        first = self.install_guard("on", load_entry_points=False)
        self.assertIs(sglang_dsv4_guard.install("on", load_entry_points=False), first)
        second = self.install_guard("strict", load_entry_points=False)
        self.assertFalse(first())
        self.assertTrue(sglang_dsv4_guard.is_installed())
        self.assertTrue(second())
        self.assertFalse(sglang_dsv4_guard.is_installed())
        self.assertFalse(second())


@contextmanager
def connector_without_register() -> Iterator[type]:
    """SGLang's imported MORI connector with a copy of ``MoriKVManager`` that lacks
    ``_add_remote_peer`` (the eager-path target missing); the real class is put back."""
    real = conn.MoriKVManager
    namespace = {k: v for k, v in vars(real).items()
                 if k not in ("_add_remote_peer", "__dict__", "__weakref__")}
    copy = type(real.__name__, real.__bases__, namespace)
    conn.MoriKVManager = copy  # type: ignore[misc]
    try:
        yield copy
    finally:
        conn.MoriKVManager = real  # type: ignore[misc]


class TestAllOrNothing(GuardTestCase):
    """Item 4: a failure while installing rolls back every applied patch."""

    def test_missing_mori_target_rolls_back_every_patch_in_mode_on(self) -> None:
        """Mode on, ``_add_remote_peer`` missing: a warning, nothing installed, the send
        method and setup_state_kv_args are SGLang's own, uninstall() has nothing to do."""
        with connector_without_register() as copy:
            with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
                undo = self.install_guard("on", load_entry_points=False)
            self.assertFalse(sglang_dsv4_guard.is_installed())
            self.assertIs(vars(copy)["_send_swa_dsa_state"], _RAW["_send_swa_dsa_state"])
            self.assertIs(utils.setup_state_kv_args, raw_setup_state_kv_args())
            self.assertFalse(sglang_dsv4_guard.uninstall())
            self.assertFalse(undo())
        self.assertTrue(any("rolled back" in r.getMessage() and "_add_remote_peer" in
                            r.getMessage() for r in logs.records))

    def test_missing_mori_target_in_strict_refuses_sglang_startup(self) -> None:
        """Strict mode through SGLang's entry point: DSV4GuardStartupRefused, and SGLang is
        left exactly as it was."""
        with connector_without_register() as copy, \
                mock.patch.dict(os.environ, {"SGLANG_DSV4_GUARD": "strict"}):
            with self.assertRaises(DSV4GuardStartupRefused) as caught:
                activate()
            self.assertIs(vars(copy)["_send_swa_dsa_state"], _RAW["_send_swa_dsa_state"])
        self.assertIn("_add_remote_peer", str(caught.exception))
        self.assertFalse(sglang_dsv4_guard.is_installed())
        self.assertIs(utils.setup_state_kv_args, raw_setup_state_kv_args())


@contextmanager
def lazy_modules() -> Iterator[dict[str, types.ModuleType]]:
    """Two modules in ``sys.modules`` behind ``importlib.util.LazyLoader``: one healthy
    (it records its own execution), one whose import fails. Removed afterwards."""
    with tempfile.TemporaryDirectory() as root:
        sources = {"dsv4_lazy_ok": "import sys\nsys.dsv4_lazy_ran = True\n",
                   "dsv4_lazy_broken": "raise ImportError('a lazy module that cannot load')\n"}
        modules = {}
        for name, source in sources.items():
            path = os.path.join(root, f"{name}.py")
            with open(path, "w") as handle:
                handle.write(source)
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            spec.loader = importlib.util.LazyLoader(spec.loader)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            modules[name] = module
        try:
            yield modules
        finally:
            for name in sources:
                sys.modules.pop(name, None)
            sys.__dict__.pop("dsv4_lazy_ran", None)


class TestBindingScan(GuardTestCase):
    """Item 4: the stale-binding scan never forces a lazy module to load."""

    def test_scan_leaves_lazy_modules_unloaded(self) -> None:
        """install()/uninstall() with a healthy and a broken lazy module in sys.modules:
        both stay unloaded and install() guards as usual."""
        with lazy_modules() as modules:
            self.install_guard("on", load_entry_points=False)
            self.assertTrue(sglang_dsv4_guard.is_installed())
            self.assertTrue(sglang_dsv4_guard.uninstall())
            for module in modules.values():
                self.assertIs(type(module), importlib.util._LazyModule)  # type: ignore[attr-defined]
            self.assertNotIn("dsv4_lazy_ran", sys.__dict__)

    def test_guarded_call_still_reports_with_lazy_modules_present(self) -> None:
        """With a broken lazy module present, the guard still turns SGLang's error into
        its report."""
        pair = build_pair(draft=PoolSpec(compression_ratios=(4,)))
        with lazy_modules():
            self.install_guard("on", load_entry_points=False)
            with guard_logs_off():
                kind, error = outcome(utils.setup_state_kv_args, *pair)
        self.assertEqual(kind, "raised")
        self.assertIsInstance(error, DSV4GuardError)


if __name__ == "__main__":
    import unittest

    unittest.main()
