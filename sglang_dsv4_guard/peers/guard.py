"""What every registration wrapper shares: the per-process state (each peer checked once,
one report per distinct mismatch, :func:`registration_mismatch_key` and
:mod:`sglang_dsv4_guard.dedup.mismatch`; the causes a dying thread is named by), the
guard's own failures, and the digest gate that makes a changed release "unknown", never
guessed at.

Strict mode refuses no peer here: every condition is one SGLang meets by itself, and
raising from the registration would end the bootstrap thread, worse than SGLang's own
outcome. A failure of the guard's own is logged; in strict mode it rises once SGLang's
outcome is in (a note on SGLang's exception when SGLang raised, never in its place).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

from sglang_dsv4_guard.boundary import is_builtin
from sglang_dsv4_guard.dedup.mismatch import Mismatch
from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Finding, Phase, Report, Severity
from sglang_dsv4_guard.hookmarkers import PAIR_HOOK
from sglang_dsv4_guard.host.judgement import imported_package_dir
from sglang_dsv4_guard.host.pd_digests import known_sites
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.pd.endpoint import PairContext
from sglang_dsv4_guard.pd.relayout import CODE as RELAYOUT_CODE
from sglang_dsv4_guard.pd.when import when_of
from sglang_dsv4_guard.peers.checks import with_peer
from sglang_dsv4_guard.peers.snapshot import (
    Registration,
    RegistrationContext,
    peer_name,
    snapshot_registration,
)
from sglang_dsv4_guard.reporter import EXTRA_KEY
from sglang_dsv4_guard.runtime import Runtime
from sglang_dsv4_guard.wrapping import our_failure, publish_registration

__all__ = ["PeerGuard", "checked", "is_new_peer", "is_prefill", "judged", "timeout_text"]

logger = logging.getLogger(LOGGER_NAME)

_HOOK = "sglang_dsv4_guard_check_registration"
RegistrationMismatchKey = tuple[str, tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...]]


def registration_mismatch_key(backend: str, findings: list[Finding]) -> RegistrationMismatchKey:
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
        self.mismatches: dict[RegistrationMismatchKey, Mismatch] = {}
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
        # SGLang registered the peer unless its own relayout refused it (a plug-in's
        # finding under that code does not switch the pair conditions off)
        if not any(f.code == RELAYOUT_CODE and is_builtin(f.origin) for f in findings):
            pair = PairContext("registration", backend, self.rt.profile)
            findings += [with_peer(reg, f) for f in self.rt.plugins.collect(
                PAIR_HOOK, {"prefill": reg.prefill, "decode": reg.decode, "context": pair})]
        if not findings:
            return None
        report = Report.of(findings, {"function": f"{type(manager).__name__} registration",
                                      "peer": f"{reg.peer} at {reg.address}",
                                      "sglang": self.rt.profile.name, "mode": context.mode})
        mkey = registration_mismatch_key(backend, findings)
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
        # every death is an occurrence of the mismatch reported at registration
        self.rt.metrics.occurrence(code, Severity.ERROR, Phase.REGISTRATION, "prefill")
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


def is_prefill(manager: Any) -> bool:
    """Whether ``manager`` is a prefill rank's; anything unreadable is not (never raises:
    it runs next to SGLang's registration, outside the checks' own ``try``)."""
    try:
        mode = getattr(manager, "disaggregation_mode", None)
        return str(getattr(mode, "value", mode)) == "prefill"
    except Exception:
        return False


def is_new_peer(manager: Any, info: object) -> bool:
    """Whether ``info``'s peer is not yet in the prefill ``manager``'s peer table (read
    before SGLang registers it); a table or name that cannot be read: not new (never
    raises: SGLang's own registration decides what such a table means)."""
    try:
        return is_prefill(manager) and peer_name(info) not in getattr(
            manager, "decode_kv_args_table", {})
    except Exception:
        return False


def checked(guard: PeerGuard, backend: str, manager: object, info: object
             ) -> DSV4GuardError | None:
    """Check the peer; a failure of ours is logged, and in strict mode returned."""
    if guard.rt.active:
        try:
            guard.on_register(backend, manager, info)
        except Exception as exc:
            return our_failure(guard.rt, f"checking a registering {backend} decode peer", exc)
    return None


def timeout_text() -> str:
    """What now hangs: SGLang's own words for a dead bootstrap thread, with the timeout of
    this server's environment."""
    return when_of(Phase.REGISTRATION, "nixl", os.environ).effect.split("dies, and ", 1)[-1]


def judged(*keys: str) -> None:
    """Raise :class:`NotJudged` unless the imported release's code at ``keys`` is one a
    known release has (``host/pd_digests.json``; :func:`known_sites`): a changed release is
    never guessed at."""
    known_sites(imported_package_dir(), keys)
