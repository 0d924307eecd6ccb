"""Wrappers around ``MoriKVManager._send_swa_dsa_state`` and ``_add_remote_peer``.

The send path runs per request in MORI's transfer threads, so a passing call costs
one truth test and a ``try`` (free in CPython 3.11 until something raises).

Peers are told apart by :func:`~sglang_dsv4_guard.mori.snapshot.peer_key_or_address`; reports
are built and cached per peer and shown once per *mismatch* (:func:`send_mismatch_key`;
:mod:`sglang_dsv4_guard.dedup.mismatch`), so a TP-8 prefill rank meeting 8 decode peers
with the same TP shows one report, not eight:

- a decode peer registers mismatched (the manager carries an ``swa`` state component,
  is not MLA, and the TPs differ): reported as every registering peer is
  (:func:`~sglang_dsv4_guard.wrapping.publish_registration`). In strict mode, ``swa``
  transfers to that peer then fail at once (only ``swa``: SGLang accepts every other
  state type).
- SGLang's TP check raises in a transfer: a :class:`DSV4GuardError` rises with the
  peer's report, in full only the first time the mismatch is met in the server, else
  SGLang's line and a one-line pointer. Failures are counted exactly per (peer, state
  type) and logged per mismatch at 1 (when the registration report came first), 10,
  100, ... failures; :func:`~sglang_dsv4_guard.reporter.summary` and ``uninstall()``
  show the exact counts.

Nothing here imports ``mori`` or SGLang's MORI connector: :func:`patch_module` is
called with the module after SGLang imported it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sglang_dsv4_guard.dedup.markers import Seen, fingerprint
from sglang_dsv4_guard.dedup.mismatch import PLACED_WAIT, Mismatch, sparse
from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import LIST_CAP, Phase, Report
from sglang_dsv4_guard.host.targets import MORI_MODULE, MORI_REGISTER, MORI_SEND
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.mori.checks import CODE, violates
from sglang_dsv4_guard.mori.snapshot import (
    SendContext,
    SendSnapshot,
    peer_key_or_address,
    snapshot_send,
)
from sglang_dsv4_guard.patching import AppliedPatch, apply_all
from sglang_dsv4_guard.render import render_report
from sglang_dsv4_guard.reporter import EXTRA_KEY, Delivery, pointer, prints_in_full
from sglang_dsv4_guard.runtime import Runtime
from sglang_dsv4_guard.wrapping import (
    note_on,
    publish,
    publish_registration,
    replacing,
    upgrades,
)

__all__ = ["MORI_MODULE", "MoriGuard", "patch_module"]

logger = logging.getLogger(LOGGER_NAME)

SendMismatchKey = tuple[int | None, int | None, tuple[str, ...], bool]


def send_mismatch_key(snap: SendSnapshot) -> SendMismatchKey:
    """What makes two peers' reports the same problem: both TP sizes and the layout."""
    return (snap.attn_tp_size, snap.decode_tp_size, snap.state_types, snap.is_mla_backend)


def describe(key: SendMismatchKey) -> str:
    """``prefill attention TP 8, decode TP 4, state layout swa``."""
    attn, decode, layout, _ = key
    return (f"prefill attention TP {attn}, decode TP {decode}, state layout "
            f"{'+'.join(layout) or '?'}")


class MoriGuard:
    """Per-process MORI state: reports per peer, exact counts, strict-mode blocks."""

    def __init__(self, rt: Runtime,
                 registration: Callable[[object, object], DSV4GuardError | None]) -> None:
        self.rt = rt
        # The registration's conditions besides MORI's TP rule: the peer guard's
        # (``peers.wrapper.mori_registration``); a strict failure of ours to raise.
        self.registration = registration
        self._lock = threading.Lock()
        self._reports: dict[tuple[str, str], tuple[Report, str]] = {}
        self._objects: dict[str, object] = {}  # keeps "object id" identities unique
        self.failures: dict[tuple[str, str], int] = {}
        self.registered: dict[str, Report] = {}
        self.blocked: dict[str, tuple[Report, str]] = {}
        self.mismatches: dict[SendMismatchKey, Mismatch] = {}

    def identity(self, peer: object) -> str:
        """The peer's identity; an object without one is kept alive so its id stays its own."""
        ident = peer_key_or_address(peer)
        if ident.startswith("object id "):
            self._objects.setdefault(ident, peer)
        return ident

    def _report(self, snap: SendSnapshot, peer: str, place: str) -> tuple[Report, str]:
        context = SendContext(self.rt.profile, self.rt.settings.mode.value.value, place)
        findings = self.rt.plugins.collect("sglang_dsv4_guard_check_send",
                                           {"transfer": snap, "context": context})
        report = Report.of(findings, {
            "function": MORI_SEND.qualname, "peer": peer,
            "sglang": self.rt.profile.name, "mode": context.mode,
        })
        return report, render_report(report) or ""

    def _count_line(self, m: Mismatch, what: str, peers: int, failures: int) -> None:
        """The running count; ``peers`` and ``failures`` as captured under the lock."""
        logger.log(logging.ERROR if what == "failures" else logging.WARNING,
                   "[%s] MORI mismatch (%s): %d decode peer(s), %d failed state "
                   "transfer(s) so far (fingerprint %s); the full report was printed once; "
                   "counts are logged at 1, 10, 100, ...; exact ones: "
                   "sglang_dsv4_guard.summary()", CODE, m.label, peers, failures,
                   m.fingerprint, extra={EXTRA_KEY: {
                       "codes": [CODE], "fingerprint": m.fingerprint, "count": what,
                       "mismatch": m.label, "peers": peers,
                       "failures": failures}})

    def on_send_error(self, sig: inspect.Signature, args: tuple[Any, ...],
                      kwargs: dict[str, Any], error: RuntimeError) -> DSV4GuardError | None:
        """Turn SGLang's TP error into a DSV4GuardError; ``None`` for any other error.

        ``args`` and ``kwargs`` are the call's, ``self`` first, bound by name against
        the installed release's signature (8 or 11 parameters).
        """
        bound = sig.bind(*args, **kwargs)
        peer = bound.arguments["peer_info"]
        snap = snapshot_send(bound.arguments["self"], peer, bound.arguments["state_type"])
        if not violates(snap):
            return None
        ident = self.identity(peer)
        key, mkey = (ident, snap.state_type), send_mismatch_key(snap)
        with self._lock:
            cached = self._reports.get(key)
            if cached is None:
                cached = self._reports[key] = self._report(snap, ident, "send")
            count = self.failures[key] = self.failures.get(key, 0) + 1
            m = self.mismatches.setdefault(mkey, Mismatch(describe(mkey)))
            m.peers.add(ident)
            m.failures += 1
            total, show_full, m.shown = m.failures, not m.shown, True
            peers = len(m.peers)
            if show_full:  # pure: concurrent failures name it in their pointers
                m.fingerprint = fingerprint(cached[0])
        report, rendered = cached
        seen: Seen | None = Seen.HERE
        if count == 1:  # a new (peer, state type): an occurrence for every reporter
            d = publish(self.rt, report, Delivery(raised=True, quiet=not show_full, extra={
                "mismatch": m.label, "peer": ident, "failures": count},
                phase=Phase.PER_REQUEST, role="prefill"))
            seen = d.seen
        else:  # the same transfer failing again: a pointer, still an occurrence
            self.rt.metrics.count(report, Delivery(raised=True, quiet=True, seen=Seen.HERE,
                                                   phase=Phase.PER_REQUEST, role="prefill"))
        if show_full:
            m.place(seen)
        if sparse(total) and not (show_full and total == 1):
            self._count_line(m, "failures", peers, total)
        if show_full and prints_in_full(seen):
            text = rendered
        else:
            if not show_full:
                m.placed.wait(PLACED_WAIT)  # the first failure is being published now
            where = seen if show_full else m.where
            text = (f"{pointer(report, m.fingerprint, where)}; {count} failure(s) to this "
                    "peer so far")
        return DSV4GuardError(str(error), report, text, error)

    def on_register(self, manager: object, register_info: object) -> None:
        """Report a TP mismatch for a newly registered decode peer, once per mismatch."""
        snap = snapshot_send(manager, register_info, "swa")
        if "swa" not in snap.state_types or not violates(snap):
            return
        ident = self.identity(register_info)
        mkey = send_mismatch_key(snap)
        with self._lock:
            if ident in self.registered:
                return
            report, rendered = self._report(snap, ident, "registration")
            self.registered[ident] = report
            if self.rt.strict:
                self.blocked[ident] = (report, rendered)
            m = self.mismatches.setdefault(mkey, Mismatch(describe(mkey)))
            peers, quiet = m.claim(ident, report)
            failures = m.failures
        if publish_registration(self.rt, report, m, peers, quiet, {
                "mismatch": m.label, "peer": ident, "peers": peers}):
            self._count_line(m, "peers", peers, failures)

    def blocked_error(self, sig: inspect.Signature, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> DSV4GuardError | None:
        """Strict mode: the error for an ``swa`` transfer to a peer that registered
        mismatched. Other state types pass to SGLang, which accepts them."""
        try:
            bound = sig.bind_partial(*args, **kwargs)
        except TypeError:  # SGLang raises its own TypeError for these arguments
            return None
        state_type = bound.arguments.get("state_type")
        if str(getattr(state_type, "value", state_type)) != "swa":
            return None
        entry = self.blocked.get(peer_key_or_address(bound.arguments.get("peer_info")))
        if entry is None:
            return None
        report, rendered = entry
        # a refused transfer is an occurrence of the registration's mismatch
        self.rt.metrics.count(report, Delivery(raised=True, quiet=True, seen=Seen.HERE,
                                               phase=Phase.PER_REQUEST, role="prefill"))
        first = next((f.host_message for f in report.findings if f.host_message), CODE)
        return DSV4GuardError(f"{first} [sglang-dsv4-guard strict mode: transfer not attempted]",
                              report, rendered)

    def summary_lines(self) -> list[str]:
        """Exact counts per mismatch and per (peer, state type); at most ``LIST_CAP`` (16)
        peers each."""
        with self._lock:
            lines = []
            for m in self.mismatches.values():
                lines.append(f"{CODE} MORI mismatch ({m.label}; fingerprint "
                             f"{m.fingerprint}): {len(m.peers)} decode peer(s), {m.failures} "
                             "failed state transfer(s)")
                per_peer = [(k, n) for k, n in self.failures.items() if k[0] in m.peers]
                lines += [f"  failed transfers to {peer} ({state}): {n}"
                          for (peer, state), n in per_peer[:LIST_CAP]]
                if len(per_peer) > LIST_CAP:
                    lines.append(f"  ... and {len(per_peer) - LIST_CAP} more peer(s)")
            return lines


def _send_wrapper(guard: MoriGuard, original: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(original)
    blocked = guard.blocked  # the dict itself: a closure read, no attribute lookup

    @functools.wraps(original)
    def _send_swa_dsa_state(*args: Any, **kwargs: Any) -> Any:
        # The pass path: one truth test and a try. `self` stays inside *args so
        # the call is forwarded without building a new tuple.
        # `blocked` first: empty unless strict mode found a mismatched peer. Once this
        # installation is gone (reconfigured, uninstalled) it refuses nothing, even
        # when another plug-in's wrapper still holds this one.
        if blocked and guard.rt.active:
            error = guard.blocked_error(sig, args, kwargs)
            if error is not None:
                raise error
        try:
            return original(*args, **kwargs)
        except RuntimeError as error:
            if guard.rt.active and upgrades(error):
                replacement = replacing(
                    guard.rt, error, "reporting a MORI state-transfer error",
                    lambda: guard.on_send_error(sig, args, kwargs, error))
                if replacement is not None:
                    raise replacement from error
            raise

    return _send_swa_dsa_state


def _register_wrapper(guard: MoriGuard, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _add_remote_peer(self: Any, register_info: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = original(self, register_info, *args, **kwargs)
        except Exception as error:  # e.g. the DCP relayout (0.5.22+): MORI logs it
            ours = guard.registration(self, register_info) if guard.rt.active else None
            if ours is not None:
                note_on(error, ours)
            raise
        if guard.rt.active:
            try:
                guard.on_register(self, register_info)
            except Exception as exc:
                guard.rt.internal_error("checking a registering MORI decode peer", exc)
            ours = guard.registration(self, register_info)
            if ours is not None:
                raise ours
        return result

    return _add_remote_peer


def patch_module(module: ModuleType, guard: MoriGuard) -> list[AppliedPatch]:
    """Wrap both methods in SGLang's imported MORI connector module."""
    return apply_all(module, [(MORI_SEND, functools.partial(_send_wrapper, guard)),
                              (MORI_REGISTER, functools.partial(_register_wrapper, guard))])
