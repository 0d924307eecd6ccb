"""Wrappers around ``MoriKVManager._send_swa_dsa_state`` and ``_add_remote_peer``.

The send path runs per request in MORI's transfer threads, so a passing call costs
one attribute test and a ``try`` (free in CPython 3.11 until something raises):

- SGLang's method raises: the error is bound by name against the installed
  signature; if it is SGLang's TP check (``DSV4G006``), it becomes a
  :class:`DSV4GuardError` with the full report. The report for a (peer, state
  type) is built once; the first failure logs it, later ones log one short line
  with a running count. Any other error is SGLang's and rises untouched.
- a decode peer registers: when this prefill manager carries an ``swa`` state
  component, is not MLA and the peer's TP differs, the report is logged at once,
  before any request. In strict mode transfers to that peer then fail at once.

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

from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Report
from sglang_dsv4_guard.mori.checks import violates
from sglang_dsv4_guard.mori.snapshot import SendContext, SendSnapshot, engine_key, snapshot_send
from sglang_dsv4_guard.patching import AppliedPatch, PatchTarget, apply
from sglang_dsv4_guard.render import render_report
from sglang_dsv4_guard.runtime import Runtime

__all__ = ["MORI_MODULE", "MoriGuard", "patch_module"]

logger = logging.getLogger("sglang_dsv4_guard")

MORI_MODULE = "sglang.srt.disaggregation.mori.conn"
SEND_TARGET = PatchTarget(MORI_MODULE, "MoriKVManager._send_swa_dsa_state")
REGISTER_TARGET = PatchTarget(MORI_MODULE, "MoriKVManager._add_remote_peer")
_FUNCTION = "MoriKVManager._send_swa_dsa_state"


class MoriGuard:
    """Per-process MORI state: cached reports, failure counts, strict-mode blocks."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._lock = threading.Lock()
        self._reports: dict[tuple[str | None, str], tuple[Report, str]] = {}
        self.failures: dict[tuple[str | None, str], int] = {}
        self.registered: dict[str | None, Report] = {}
        self.blocked: dict[str | None, tuple[Report, str]] = {}

    def _report(self, snap: SendSnapshot, phase: str) -> tuple[Report, str]:
        context = SendContext(self.rt.profile, self.rt.settings.mode.value.value, phase)
        findings = self.rt.plugins.collect("sglang_dsv4_guard_check_send",
                                           {"transfer": snap, "context": context})
        report = Report.of(findings, {
            "function": _FUNCTION, "peer": snap.engine_key or "?",
            "sglang": str(self.rt.profile.version), "mode": context.mode,
        })
        return report, render_report(report) or ""

    def on_send_error(self, sig: inspect.Signature, args: tuple[Any, ...],
                      kwargs: dict[str, Any], error: RuntimeError) -> DSV4GuardError | None:
        """Turn SGLang's TP error into a DSV4GuardError; ``None`` for any other error.

        ``args`` and ``kwargs`` are the call's, ``self`` first, bound by name against
        the installed release's signature (8 or 11 parameters).
        """
        bound = sig.bind(*args, **kwargs)
        snap = snapshot_send(bound.arguments["self"], bound.arguments["peer_info"],
                             bound.arguments["state_type"])
        if not violates(snap):
            return None
        key = (snap.engine_key, snap.state_type)
        with self._lock:
            cached = self._reports.get(key)
            if cached is None:
                cached = self._reports[key] = self._report(snap, "send")
            count = self.failures[key] = self.failures.get(key, 0) + 1
        report, rendered = cached
        if count == 1:
            self.rt.publish(report)
        else:
            logger.error("[DSV4G006] transfer to decode peer %s failed again (state %s): %d "
                         "failures so far; the full report was logged at the first",
                         snap.engine_key, snap.state_type, count)
        return DSV4GuardError(str(error), report, rendered, error)

    def on_register(self, manager: object, register_info: object) -> None:
        """Report a TP mismatch for a newly registered decode peer, once per peer."""
        snap = snapshot_send(manager, register_info, "swa")
        if "swa" not in snap.state_types or not violates(snap):
            return
        with self._lock:
            if snap.engine_key in self.registered:
                return
            report, rendered = self._report(snap, "register")
            self.registered[snap.engine_key] = report
            if self.rt.strict:
                self.blocked[snap.engine_key] = (report, rendered)
        self.rt.publish(report)

    def blocked_error(self, peer: object) -> DSV4GuardError | None:
        """Strict mode: the error for a transfer to a peer that registered mismatched."""
        entry = self.blocked.get(engine_key(peer))
        if entry is None:
            return None
        report, rendered = entry
        first = next((f.host_message for f in report.findings if f.host_message), "DSV4G006")
        return DSV4GuardError(f"{first} [sglang-dsv4-guard strict mode: transfer not attempted]",
                              report, rendered)


def _send_wrapper(guard: MoriGuard) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(original)
        blocked = guard.blocked  # the dict itself: a closure read, no attribute lookup

        @functools.wraps(original)
        def _send_swa_dsa_state(*args: Any, **kwargs: Any) -> Any:
            # The pass path: one truth test and a try. `self` stays inside *args so
            # the call is forwarded without building a new tuple.
            if blocked:  # empty unless strict mode found a mismatched peer
                error = guard.blocked_error(args[1] if len(args) > 1 else kwargs.get("peer_info"))
                if error is not None:
                    raise error
            try:
                return original(*args, **kwargs)
            except RuntimeError as error:
                replacement = None
                if guard.rt.active and type(error) is RuntimeError:  # never a subclass
                    try:
                        replacement = guard.on_send_error(sig, args, kwargs, error)
                    except Exception as exc:
                        guard.rt.internal_error("reporting a MORI state-transfer error", exc)
                if replacement is not None:
                    raise replacement from error
                raise

        return _send_swa_dsa_state

    return make


def _register_wrapper(guard: MoriGuard) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def _add_remote_peer(self: Any, register_info: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, register_info, *args, **kwargs)
            if guard.rt.active:
                try:
                    guard.on_register(self, register_info)
                except Exception as exc:
                    guard.rt.internal_error("checking a registering MORI decode peer", exc)
            return result

        return _add_remote_peer

    return make


def patch_module(module: ModuleType, guard: MoriGuard) -> list[AppliedPatch]:
    """Wrap both methods in SGLang's imported MORI connector module."""
    patches = [apply(SEND_TARGET, module, _send_wrapper(guard))]
    patches.append(apply(REGISTER_TARGET, module, _register_wrapper(guard)))
    return patches
