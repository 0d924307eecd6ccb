"""When SGLang finds a broken prefill/decode contract, and what the operator then sees.

The texts are built from the phase, the transfer backend and the release's own timeout
(``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` as the server's environment sets it, else the
release's default), never written per finding.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from sglang_dsv4_guard.findings import STOPS_AT_START, Phase, When
from sglang_dsv4_guard.host.targets import ENVIRON_MODULE

__all__ = ["bootstrap_timeout", "when_of"]

_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"


def bootstrap_timeout(env: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """Seconds a request waits for a rank that never answers, and where that comes from.

    The server's value is read with SGLang's own parser (``EnvInt.parse``): a value it
    rejects is what SGLang does with it, its default with a warning."""
    try:  # SGLang's own EnvField for the timeout (its parse and default)
        field = getattr(importlib.import_module(ENVIRON_MODULE).envs,  # unscanned: SGLang
                        _TIMEOUT_ENV)
    except Exception:  # an unknown release layout: say so, do not guess a number
        field = None
    default = getattr(field, "default", None)
    raw = (env or {}).get(_TIMEOUT_ENV)
    if raw is not None:
        try:
            parsed = field.parse(raw) if field is not None else int(raw)
        except ValueError:
            if isinstance(default, int):
                return default, (f"{_TIMEOUT_ENV}={raw!r} in the server's environment is not a "
                                 f"number SGLang accepts: it warns and uses its default {default}")
            return None, f"{_TIMEOUT_ENV}={raw!r} in the server's environment (not a number)"
        return int(parsed), f"{_TIMEOUT_ENV}={raw} in the server's environment"
    if isinstance(default, int):
        return default, f"the release's default {_TIMEOUT_ENV}"
    return None, f"{_TIMEOUT_ENV} (its default was not readable here)"


def _timeout_words(env: Mapping[str, str] | None) -> str:
    seconds, source = bootstrap_timeout(env)
    if seconds is None:
        return f"after the bootstrap timeout ({source})"
    if seconds <= 0:  # CommonKVSender._check_bootstrap_timeout: elapsed is never below it
        return f"at their first poll ({source}: {seconds} s)"
    return f"after {seconds} s ({source})"


# The phases whose effect depends on nothing else. RECEIVER: decode.py's prealloc queue
# reads KVPoll.Failed, logs "Decode handshake failed ... with exception <reason>" and aborts
# the request (prepare_abort, HTTP 500), 0.5.22 - 0.5.23; the scheduler goes on.
_FIXED = {STOPS_AT_START.phase: STOPS_AT_START, **{phase: When(phase, effect) for phase, effect in (
    (Phase.FIRST_CONTACT, "at decode's first contact with the prefill (the first request that "
     "pairs them): SGLang raises in the decode scheduler and the decode server exits, naming "
     "only this mismatch"),
    (Phase.FIRST_REQUEST, "at the decode's first request (its scheduler takes the request from "
     "the preallocation queue, DecodePreallocQueue.pop_preallocated): SGLang raises in the "
     "decode scheduler and the decode server exits"),
    (Phase.RECEIVER, "per request, when the decode sets up its receiver: every request fails "
     "(the decode logs \"Decode handshake failed ... with exception\" and SGLang's message, "
     "the client gets HTTP 500 with it); both servers keep running"))}}


def when_of(phase: Phase, backend: str, env: Mapping[str, str] | None = None,
            logged: bool = False, aligned: bool = False, receiver: bool = False) -> When:
    """``when:`` for a finding SGLang makes at ``phase`` on ``backend``.

    ``env`` is the prefill server's environment (its timeout); ``logged``: SGLang logs the
    condition at registration instead of failing (phase registration); ``aligned``: the
    data transferred stays where the decode reads it; ``receiver``: the decode's receiving
    thread raises per request, not the prefill's transfer.
    """
    if phase in _FIXED:
        return _FIXED[phase]
    if phase is Phase.REGISTRATION:
        if backend == "mori":
            return When(phase, "when a decode rank registers with the prefill: MORI logs it, "
                        "then each request to that rank fails")
        return When(phase, "when a decode rank registers with the prefill: the prefill "
                    f"rank's {backend} bootstrap thread dies, and every later request to "
                    f"that rank times out {_timeout_words(env)}")
    if phase is Phase.PER_REQUEST:
        if receiver:
            return When(phase, f"per request, in the decode's {backend} thread that "
                        "receives the prefill's metadata buffers one by one: it raises for "
                        "a buffer index the decode does not have")
        if backend == "mooncake":
            return When(phase, "per request, in the prefill's Mooncake transfer worker: the "
                        "worker thread exits (\"Transfer thread failed ... Prefill instance "
                        "... is dead.\") and every request sharded to its queue hangs")
        return When(phase, f"per request, in the prefill's {backend} transfer: each request fails")
    if logged:
        return When(Phase.REGISTRATION, "when a decode rank registers: SGLang logs an error" + (
            "; the transfers stay correct" if aligned else " and transfers go on with misaligned data"))
    return When(phase, "never reported (no error, no log line); the transfers stay correct"
                if aligned else "never reported: transfers go on with misaligned data (no "
                "error, no log line)")
