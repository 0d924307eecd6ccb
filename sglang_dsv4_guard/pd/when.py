"""When SGLang finds a broken prefill/decode contract, and what the operator then sees.

The texts are built from the phase, the transfer backend and the release's own timeout
(``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` as the server's environment sets it, else the
release's default), never written per finding.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Mapping

from sglang_dsv4_guard.host.targets import ENVIRON_MODULE

__all__ = ["Phase", "bootstrap_timeout", "when_text"]

_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"


class Phase(enum.Enum):
    """Where in a pair's life SGLang makes the comparison."""

    START_UP = "start-up"
    FIRST_CONTACT = "first contact"
    REGISTRATION = "registration"
    PER_REQUEST = "per request"
    RECEIVER = "per request, at the decode's receiver"
    SILENT = "silent"


def bootstrap_timeout(env: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """Seconds a request waits for a rank that never answers, and where that comes from."""
    raw = (env or {}).get(_TIMEOUT_ENV)
    if raw is not None:
        try:
            return int(raw), f"{_TIMEOUT_ENV}={raw} in the server's environment"
        except ValueError:
            return None, f"{_TIMEOUT_ENV}={raw!r} in the server's environment (not a number)"
    try:
        envs = importlib.import_module(ENVIRON_MODULE).envs  # unscanned: SGLang's environ
        default = getattr(envs, _TIMEOUT_ENV).default
        return int(default), f"the release's default {_TIMEOUT_ENV}"
    except Exception:  # an unknown release layout: say so, do not guess a number
        return None, f"{_TIMEOUT_ENV} (its default was not readable here)"


def _timeout_words(env: Mapping[str, str] | None) -> str:
    seconds, source = bootstrap_timeout(env)
    return (f"after {seconds} s ({source})" if seconds is not None
            else f"after the bootstrap timeout ({source})")


def when_text(phase: Phase, backend: str, env: Mapping[str, str] | None = None,
              logged: bool = False) -> str:
    """``when:`` for a finding SGLang makes at ``phase`` on ``backend``.

    ``env`` is the prefill server's environment (its timeout); ``logged`` says that SGLang
    logs the condition instead of failing (a silent row in releases that log it).
    """
    if phase is Phase.START_UP:
        return "at start-up: the server stops with SGLang's error"
    if phase is Phase.FIRST_CONTACT:
        return ("at decode's first contact with the prefill (the first request that pairs "
                "them): SGLang raises in the decode scheduler and the decode server exits, "
                "naming only this mismatch")
    if phase is Phase.REGISTRATION:
        if backend == "mori":
            return ("when a decode rank registers with the prefill: MORI logs it, then each "
                    "request to that rank fails")
        return ("when a decode rank registers with the prefill: the prefill rank's "
                f"{backend} bootstrap thread dies, and every later request to that rank "
                f"times out {_timeout_words(env)}")
    if phase is Phase.RECEIVER:
        # decode.py: the prealloc queue's handshake poll reads KVPoll.Failed, logs
        # "Decode handshake failed ... with exception <reason>" and aborts the request
        # (prepare_abort, HTTP 500), 0.5.22 - 0.5.23; the scheduler goes on.
        return ("per request, when the decode sets up its receiver: every request fails "
                "(the decode logs \"Decode handshake failed ... with exception\" and "
                "SGLang's message, the client gets HTTP 500 with it); both servers keep "
                "running")
    if phase is Phase.PER_REQUEST:
        if backend == "mooncake":
            return ("per request, in the prefill's Mooncake transfer worker: the worker "
                    "thread exits (\"Transfer thread failed ... Prefill instance ... is "
                    "dead.\") and every request sharded to its queue hangs")
        return f"per request, in the prefill's {backend} transfer: each request fails"
    if logged:
        return ("when a decode rank registers: SGLang logs an error and transfers go on "
                "with misaligned data")
    return ("never reported: transfers go on with misaligned data (no error, no log "
            "line)")
