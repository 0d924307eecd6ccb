"""Decode peers registering with a Mooncake or NIXL prefill rank, and the threads that die.

- NIXL: ``NixlKVManager._add_remote_peer`` (run by the prefill's bootstrap thread) is
  wrapped. A new peer's registration is checked (:mod:`.checks`) once SGLang's own code
  ran; when SGLang raised there (the bootstrap thread then dies, and every later request
  to the rank times out), the guard's log names the cause's code, the peer and what now
  hangs, once per distinct cause in this process. SGLang's exception rises unchanged.
- Mooncake: the registration is a closure of ``start_prefill_thread`` that writes
  ``decode_kv_args_table[session]``; the wrapper of ``start_prefill_thread`` gives the
  manager a watched table (a ``dict`` whose ``__setitem__`` also checks the peer, after
  SGLang's write). ``transfer_worker`` (a thread target) is wrapped: when it dies
  ("Transfer thread failed ... is dead."), the guard names the cause it had reported at
  registration, the peers registered with it and what now hangs, once per cause.

One report per distinct mismatch (the findings' codes and both sides' values, never the
peer): the first peer gets the full report (fingerprinted across the server's processes,
:mod:`sglang_dsv4_guard.dedup.markers`), later peers are counted, and the count is logged
at 1, 10, 100 ... peers (:mod:`sglang_dsv4_guard.dedup.mismatch`). Strict mode refuses no
peer here: every condition is one SGLang meets by itself, and raising from the
registration would end the bootstrap thread, worse than SGLang's own outcome. A failure of
the guard's own is logged; in strict mode it rises once SGLang's outcome is in (a note on
SGLang's exception when SGLang raised, never in its place).

Nothing here imports ``nixl``, ``mooncake`` or SGLang's connector modules.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sglang_dsv4_guard.dedup.mismatch import Mismatch
from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Finding, Report
from sglang_dsv4_guard.host.pd_digests import SITES, NotJudged, locate, row_releases
from sglang_dsv4_guard.host.targets import (
    PEERS_MOONCAKE_START,
    PEERS_MOONCAKE_WORKER,
    PEERS_NIXL_REGISTER,
)
from sglang_dsv4_guard.host.verdict import imported_package_dir
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.patching import AppliedPatch, apply_all
from sglang_dsv4_guard.pd.when import Phase, when_text
from sglang_dsv4_guard.peers.snapshot import (
    TIMEOUT_ENV,
    Registration,
    RegistrationContext,
    peer_name,
    snapshot_registration,
)
from sglang_dsv4_guard.reporter import EXTRA_KEY
from sglang_dsv4_guard.runtime import Runtime
from sglang_dsv4_guard.wrapping import note_on, our_failure, publish_registration

__all__ = ["CONNECTORS", "PeerGuard", "WatchedTable", "patch_mooncake", "patch_nixl"]

logger = logging.getLogger(LOGGER_NAME)

_HOOK = "sglang_dsv4_guard_check_registration"
_DEAD = "is dead"  # Mooncake's transfer_worker: "Transfer thread failed ... is dead."
MismatchKey = tuple[str, tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...]]


def mismatch_key(backend: str, findings: list[Finding]) -> MismatchKey:
    """What makes two peers' reports the same problem: the codes and both sides' values."""
    return backend, tuple((f.code, tuple((o.role, o.name, repr(o.value))
                                         for o in f.observations)) for f in findings)


def _label(reg: Registration, findings: list[Finding]) -> str:
    codes = ", ".join(dict.fromkeys(f.code for f in findings))
    return (f"{reg.backend} {codes}: prefill attention TP {reg.prefill.get('attn_tp_size')}, "
            f"decode {reg.decode.get('attn_tp_size')}")


class PeerGuard:
    """Per-process state: each peer checked once, reports per mismatch, causes of death."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._lock = threading.Lock()
        # per live manager: each peer checked, and its report (``None``: nothing found)
        self.checked: weakref.WeakKeyDictionary[Any, dict[str, Report | None]] = (
            weakref.WeakKeyDictionary())
        self.mismatches: dict[MismatchKey, Mismatch] = {}
        # per live manager: (code, SGLang's message) -> the peers registered with it
        self.causes: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], list[str]]] = (
            weakref.WeakKeyDictionary())
        self.deaths: dict[tuple[str, str], int] = {}

    def on_register(self, backend: str, manager: object, info: object) -> Report | None:
        """Check a newly registered decode peer; report once per distinct mismatch."""
        ident = peer_name(info)
        with self._lock:
            checked = self.checked.setdefault(manager, {})
            if ident in checked:
                return checked[ident]
            checked[ident] = None
        reg = snapshot_registration(backend, manager, info)
        context = RegistrationContext(self.rt.profile, self.rt.settings.mode.value.value)
        findings = self.rt.plugins.collect(_HOOK, {"registration": reg, "context": context})
        if not findings:
            return None
        report = Report.of(findings, {"function": f"{type(manager).__name__} registration",
                                      "peer": f"{reg.peer} at {reg.address}",
                                      "sglang": self.rt.profile.name, "mode": context.mode})
        mkey = mismatch_key(backend, findings)
        with self._lock:
            checked[ident] = report
            causes = self.causes.setdefault(manager, {})
            for f in findings:
                if f.host_message:
                    causes.setdefault((f.code, f.host_message), []).append(ident)
            m = self.mismatches.setdefault(mkey, Mismatch(_label(reg, findings)))
            peers, quiet = m.claim(f"{ident}@{id(manager):x}", report)
        if publish_registration(self.rt, report, m, peers, quiet, {
                "mismatch": m.label, "peer": reg.peer, "peers": peers}):
            self._count_line(m, peers, [f.code for f in findings])
        return report

    def _count_line(self, m: Mismatch, peers: int, codes: list[str]) -> None:
        logger.warning("[%s] decode peer registration mismatch (%s): %d decode peer(s) so far "
                       "(fingerprint %s); the full report was printed once; counts are logged "
                       "at 1, 10, 100, ...; exact ones: sglang_dsv4_guard.summary()",
                       ", ".join(dict.fromkeys(codes)), m.label, peers, m.fingerprint,
                       extra={EXTRA_KEY: {"codes": codes, "fingerprint": m.fingerprint,
                                          "count": "peers", "mismatch": m.label,
                                          "peers": peers}})

    def _cause(self, manager: object, error: BaseException) -> tuple[str, str, list[str]] | None:
        """The registered finding whose SGLang message the dying error carries."""
        text = str(error)
        with self._lock:
            for (code, message), peers in self.causes.get(manager, {}).items():
                if message and (message in text or text in message):
                    return code, message, list(peers)
        return None

    def on_death(self, backend: str, what: str, manager: object, error: BaseException,
                 hangs: str) -> None:
        """Name why ``what`` died, the peer(s) and what now hangs: once per cause."""
        cause = self._cause(manager, error)
        if cause is None:
            return
        code, message, peers = cause
        with self._lock:
            n = self.deaths[(code, message)] = self.deaths.get((code, message), 0) + 1
        if n > 1:
            return
        more = f" (and {len(peers) - 1} more registered with it)" if len(peers) > 1 else ""
        logger.error("[%s] sglang-dsv4-guard: the prefill's %s %s died of %r (decode peer %s%s); "
                     "what now hangs: %s. The full report was logged when the peer registered "
                     "(sglang-dsv4-guard explain %s); SGLang's exception is unchanged",
                     code, backend, what, message, peers[0] if peers else "?", more, hangs,
                     code,
                     extra={EXTRA_KEY: {"codes": [code], "thread": what, "peer": peers[:1],
                                        "peers": len(peers)}})

    def reports(self) -> list[Report]:
        """The reports of the peers checked on the managers still alive."""
        with self._lock:
            return [r for peers in self.checked.values() for r in peers.values()
                    if r is not None]

    def summary_lines(self) -> list[str]:
        """Exact counts per registration mismatch and per thread death."""
        with self._lock:
            lines = [f"decode peer registration mismatch ({m.label}; fingerprint "
                     f"{m.fingerprint}): {len(m.peers)} decode peer(s)"
                     for m in self.mismatches.values()]
            lines += [f"{code} thread deaths ({message[:80]}): {n}"
                      for (code, message), n in self.deaths.items()]
            return lines


class WatchedTable(dict[Any, Any]):
    """Mooncake's ``decode_kv_args_table``: a ``dict`` that checks each peer SGLang writes
    (after the write). Reads are a plain dict's."""

    __slots__ = ("_on_set",)

    def __init__(self, data: dict[Any, Any], on_set: Callable[[Any], None]) -> None:
        super().__init__(data)
        self._on_set = on_set

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._on_set(value)


def _prefill(manager: Any) -> bool:
    mode = getattr(manager, "disaggregation_mode", None)
    return str(getattr(mode, "value", mode)) == "prefill"


def _checked(guard: PeerGuard, backend: str, manager: object, info: object
             ) -> DSV4GuardError | None:
    """Check the peer; a failure of ours is logged, and in strict mode returned to raise
    once SGLang's outcome is in (a note on SGLang's own error when it raised)."""
    if guard.rt.active:
        try:
            guard.on_register(backend, manager, info)
        except Exception as exc:
            return our_failure(guard.rt, f"checking a registering {backend} decode peer", exc)
    return None


def _watched(guard: PeerGuard, manager: object, info: object) -> None:
    """Mooncake's table write: the peer is in the table; a strict failure of ours rises."""
    ours = _checked(guard, "mooncake", manager, info)
    if ours is not None:
        raise ours


def _timeout() -> str:
    """What now hangs: SGLang's own words for a dead bootstrap thread, with the timeout of
    this server's environment."""
    env = {TIMEOUT_ENV: os.environ[TIMEOUT_ENV]} if TIMEOUT_ENV in os.environ else {}
    return when_text(Phase.REGISTRATION, "nixl", env).split("dies, and ", 1)[-1]


def _nixl_register(guard: PeerGuard) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def _add_remote_peer(self: Any, decode_kv_args: Any, *args: Any, **kwargs: Any) -> Any:
            fresh = (guard.rt.active and _prefill(self) and peer_name(decode_kv_args)
                     not in getattr(self, "decode_kv_args_table", {}))
            try:
                result = original(self, decode_kv_args, *args, **kwargs)
            except Exception as error:
                if fresh:
                    ours = _checked(guard, "nixl", self, decode_kv_args)
                    try:
                        guard.on_death("nixl", "bootstrap thread", self, error, _timeout())
                    except Exception as exc:
                        ours = ours or our_failure(
                            guard.rt, "naming why the NIXL bootstrap thread died", exc)
                    if ours is not None:
                        note_on(error, ours)
                raise
            ours = _checked(guard, "nixl", self, decode_kv_args) if fresh else None
            if ours is not None:
                raise ours
            return result

        return _add_remote_peer

    return make


def _mooncake_start(guard: PeerGuard) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def start_prefill_thread(self: Any, *args: Any, **kwargs: Any) -> Any:
            if guard.rt.active:
                try:
                    table = self.decode_kv_args_table
                    if type(table) is dict:
                        self.decode_kv_args_table = WatchedTable(
                            table, functools.partial(_watched, guard, self))
                except Exception as exc:  # strict: rises before SGLang's thread starts
                    guard.rt.internal_error("watching Mooncake's decode peer table", exc)
            return original(self, *args, **kwargs)

        return start_prefill_thread

    return make


_WORKER_HANGS = ("every request sharded to this worker's queue now hangs (its KVPoll "
                 "never completes)")


def _mooncake_worker(guard: PeerGuard) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def transfer_worker(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(self, *args, **kwargs)
            except RuntimeError as error:
                if guard.rt.active and _DEAD in str(error):
                    try:
                        guard.on_death("mooncake", "transfer worker", self, error,
                                       _WORKER_HANGS)
                    except Exception as exc:
                        ours = our_failure(guard.rt, "naming why a Mooncake transfer worker "
                                           "died", exc)
                        if ours is not None:
                            note_on(error, ours)
                raise

        return transfer_worker

    return make


def _judged(*keys: str) -> None:
    """Raise :class:`NotJudged` unless the imported release's code at ``keys`` is one a
    known release has (``host/pd_digests.json``): a changed release is "unknown for this
    release", never guessed at."""
    package = imported_package_dir()
    if package is None:
        raise NotJudged("the imported SGLang's source was not found")
    found = {}
    for key in keys:
        site = locate(package, SITES[key])
        found[key] = site.digest if site is not None else "missing"
    if not row_releases(found, keys):
        names = " / ".join(str(SITES[k].target) for k in keys)
        raise NotJudged(f"SGLang's {names} differs from every release this guard knows: "
                        "unknown for this release")


def patch_nixl(module: ModuleType, guard: PeerGuard) -> list[AppliedPatch]:
    """Wrap NIXL's registration in SGLang's imported connector module."""
    _judged("peers.nixl_register")
    return apply_all(module, [(PEERS_NIXL_REGISTER, _nixl_register(guard))])


def patch_mooncake(module: ModuleType, guard: PeerGuard) -> list[AppliedPatch]:
    """Wrap Mooncake's prefill bootstrap start and transfer worker."""
    _judged("peers.mooncake_start", "peers.mooncake_worker")
    return apply_all(module, [(PEERS_MOONCAKE_START, _mooncake_start(guard)),
                              (PEERS_MOONCAKE_WORKER, _mooncake_worker(guard))])


#: The connector modules whose import the composition root watches, and their patchers.
CONNECTORS: tuple[tuple[str, Callable[[ModuleType, PeerGuard], list[AppliedPatch]]], ...] = (
    (PEERS_NIXL_REGISTER.module, patch_nixl), (PEERS_MOONCAKE_WORKER.module, patch_mooncake))
