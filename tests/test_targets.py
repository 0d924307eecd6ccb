"""What the guard reads of SGLang is declared once and covered by the code digests."""

from __future__ import annotations

import importlib
import sys
import types
import unittest
from pathlib import Path
from typing import Any

import mori_stub
import sglang
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.host import targets
from sglang_dsv4_guard.host.digests import digest_tree
from sglang_dsv4_guard.log import silenced
from sglang_dsv4_guard.state.snapshot import change_token, snapshot_pair
from sglang_dsv4_guard.testing import PoolSpec, build_pair, check_pools

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

_POOL_PREFIX = f"{targets.DSV4_POOL.qualname}."


def _digested_attributes() -> set[str]:
    parts = digest_tree(Path(sglang.__file__).parent)
    return {key[len(_POOL_PREFIX):] for key in parts if key.startswith(_POOL_PREFIX)}


def _recording(pool: Any, seen: set[str]) -> Any:
    """``pool`` itself, its class swapped for a subclass that records every attribute read
    on it (SGLang's class stays its base: ``isinstance`` checks still hold)."""
    base = type(pool)

    def __getattribute__(self: Any, name: str) -> Any:
        if not name.startswith("__"):
            seen.add(name)
        return base.__getattribute__(self, name)

    pool.__class__ = type(f"Recording{base.__name__}", (base,),
                          {"__getattribute__": __getattribute__})
    return pool


class TestDigestsCoverWhatIsRead(GuardTestCase):
    """A change in how SGLang sets an attribute the guard reads changes the digests."""

    def test_declared_attributes_are_digested(self) -> None:
        """Every pool attribute the targets module declares as read (SGLang's check's,
        auto-share's, the mapping) has a digest part on the installed release."""
        missing = set(targets.pool_attributes_read()) - _digested_attributes()
        self.assertEqual(missing, set())

    def test_attributes_the_snapshots_touch_are_digested(self) -> None:
        """Reading a real pair as the guard does (snapshot, change token, auto-share's
        rule and remedy) touches only digested attributes and methods of the pool."""
        seen: set[str] = set()
        target, draft = build_pair(PoolSpec(), PoolSpec(), mapping="clone")
        target, draft = _recording(target, seen), _recording(draft, seen)
        snapshot_pair(target, draft, npu_gate=False)
        change_token(target)
        check_pools(target, draft, autoshare=True)
        self.assertIn("swa_size", seen)  # auto-share's read is among them
        covered = _digested_attributes() | {targets.POOL_REGISTER}
        self.assertEqual(seen - covered, set())


def _guard_reads(seen: set[str]) -> Any:
    """A ``__getattribute__`` that adds to ``seen`` each attribute the guard's own code
    reads (not SGLang's: a property of SGLang's reads what it reads)."""
    def __getattribute__(self: Any, name: str) -> Any:
        reader = sys._getframe(1).f_globals.get("__name__", "")
        if not name.startswith("__") and reader.split(".")[0] == "sglang_dsv4_guard":
            seen.add(name)
        return super(type(self), self).__getattribute__(name)
    return __getattribute__


def _recording_guard_reads(obj: Any, seen: set[str]) -> Any:
    """``obj`` itself, its class swapped for a subclass of SGLang's that records the
    guard's reads (``isinstance`` checks still hold)."""
    base = type(obj)
    obj.__class__ = type(f"Recording{base.__name__}", (base,),
                         {"__getattribute__": _guard_reads(seen)})
    return obj


class TestMoriReadsAreDeclared(GuardTestCase):
    """What the guard reads of SGLang's MORI manager and peer is declared in targets."""

    def test_every_attribute_the_mori_guard_reads_is_declared(self) -> None:
        """A decode peer registering and a state transfer, through SGLang's real
        ``MoriKVManager`` methods wrapped by the guard, on a manager and peer (and the
        manager's ``server_args`` and ``kv_args``) that record every attribute the
        guard reads: each read is in ``MORI_*_ATTRS``, and each declared one is read."""
        mori_stub.install_stub()
        conn = importlib.import_module(targets.MORI_MODULE)
        self.install_guard("on", load_entry_points=False)
        seen: dict[str, set[str]] = {k: set() for k in ("manager", "server_args", "kv_args",
                                                         "peer")}
        mgr = mori_stub.manager(conn, attn_tp=8)
        recording_args = type("RecordingArgs", (types.SimpleNamespace,),
                              {"__getattribute__": _guard_reads(seen["server_args"])})
        mgr.server_args = recording_args(**vars(mgr.server_args))
        _recording_guard_reads(mgr.kv_args, seen["kv_args"])
        _recording_guard_reads(mgr, seen["manager"])
        peer = _recording_guard_reads(mori_stub.peer(conn, "decode-a", decode_tp=4),
                                      seen["peer"])
        with silenced():
            mgr._add_remote_peer(peer)
            with self.assertRaises(DSV4GuardError):  # TP 8 to 4: SGLang refuses, reported
                mgr._send_swa_dsa_state(*mori_stub.send_args(conn, peer, "swa"))
        # The registration's other conditions are read by the peers' snapshot (PEERS_*).
        declared = {"manager": targets.MORI_MANAGER_ATTRS + targets.PEERS_MANAGER_ATTRS,
                    "server_args": targets.MORI_SERVER_ARGS_ATTRS
                    + targets.PEERS_SERVER_ARGS_ATTRS,
                    "kv_args": targets.MORI_KV_ARGS_ATTRS + targets.PEERS_KV_ARGS_ATTRS,
                    "peer": targets.MORI_PEER_ATTRS + targets.PEERS_INFO_ATTRS}
        self.maxDiff = None
        self.assertEqual({k: sorted(v) for k, v in seen.items()},
                         {k: sorted(set(v)) for k, v in declared.items()})


if __name__ == "__main__":
    unittest.main()
