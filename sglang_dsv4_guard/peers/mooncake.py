"""Mooncake: the registration is a closure of ``start_prefill_thread`` that writes
``decode_kv_args_table[session]``; the wrapper of ``start_prefill_thread`` gives the
manager a watched table (a ``dict`` whose ``__setitem__`` also checks the peer, after
SGLang's write). ``transfer_worker`` (a thread target) is wrapped: when it dies
("Transfer thread failed ... is dead."), the guard names the cause it had reported at
registration, the peers registered with it and what now hangs, once per cause.

Nothing here imports ``mooncake`` or SGLang's connector module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sglang_dsv4_guard.host.targets import PEERS_MOONCAKE_START, PEERS_MOONCAKE_WORKER
from sglang_dsv4_guard.patching import AppliedPatch, apply_all
from sglang_dsv4_guard.peers.guard import PeerGuard, checked, judged
from sglang_dsv4_guard.wrapping import note_on, our_failure

__all__ = ["WatchedTable", "patch_mooncake"]

_DEAD = "is dead"  # Mooncake's transfer_worker: "Transfer thread failed ... is dead."


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


def _watched(guard: PeerGuard, manager: object, info: object) -> None:
    """Mooncake's table write: the peer is in the table; a strict failure of ours rises."""
    ours = checked(guard, "mooncake", manager, info)
    if ours is not None:
        raise ours


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


def patch_mooncake(module: ModuleType, guard: PeerGuard) -> list[AppliedPatch]:
    """Wrap Mooncake's prefill bootstrap start and transfer worker."""
    judged("peers.mooncake_start", "peers.mooncake_worker")
    return apply_all(module, [(PEERS_MOONCAKE_START, _mooncake_start(guard)),
                              (PEERS_MOONCAKE_WORKER, _mooncake_worker(guard))])
