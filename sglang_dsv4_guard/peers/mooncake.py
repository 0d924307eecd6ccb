"""Mooncake: the registration is a closure of ``start_prefill_thread`` (``bootstrap_thread``)
that parses the decode peer's message (``KVArgsRegisterInfo.from_zmq``) and writes
``decode_kv_args_table[session]``. The peer is checked once per registration, at one of
three points, none on a per-request path:

- 0.5.22+: the write is SGLang's method ``_publish_peer_registration``, under
  ``session_lock``; the manager instance gets one that calls the class's and then checks
  the peer (:func:`_publish_hook`: no plug-in runs under SGLang's lock).
- Before 0.5.22 the closure writes the table itself: ``from_zmq`` (a classmethod, called
  nowhere else) is wrapped, and the parsed peer is checked before SGLang's write
  (:func:`_parsed`).
- Before 0.5.22 in strict mode (the mode when the manager started), the manager's table
  is a :class:`WatchedTable` instead, so a strict failure of the guard's rises after
  SGLang's write; its reads take CPython's generic subscript path (docs/operating.md,
  limitations). The peer table stays SGLang's own ``dict`` in every other case.

The closure calls ``self.requires_dcp_relayout`` *before* that write, and a DCP pair it
refuses (:mod:`..pd.relayout`) raises there: the bootstrap thread ends and the table never
sees the peer. The closure cannot be wrapped, and the method is ``CommonKVManager``'s,
shared with NIXL, MORI and ``check``; so the narrowest hook is on the manager *instance*
(:func:`_relayout_hook`; the closure's source is digested with ``start_prefill_thread``).

``transfer_worker`` (a thread target) is wrapped: when it dies ("Transfer thread failed
... is dead."), the guard names the cause it had reported at registration
(:func:`_died_of`), the peers registered with it and what now hangs, once per cause.

Nothing here imports ``mooncake`` or SGLang's connector module.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sglang_dsv4_guard.host.targets import (
    PD_RELAYOUT,
    PEERS_MOONCAKE_BOOTSTRAP,
    PEERS_MOONCAKE_PARSE,
    PEERS_MOONCAKE_START,
    PEERS_MOONCAKE_WORKER,
)
from sglang_dsv4_guard.patching import AppliedPatch, apply_all
from sglang_dsv4_guard.peers.guard import PeerGuard, checked, judged, timeout_text
from sglang_dsv4_guard.wrapping import note_on, our_failure

__all__ = ["WatchedTable", "patch_mooncake"]

_DEAD = "is dead"  # Mooncake's transfer_worker: "Transfer thread failed ... is dead."
_PUBLISH = "_publish_peer_registration"  # 0.5.22+: SGLang's table write, under its lock


class WatchedTable(dict[Any, Any]):
    """A ``dict`` that checks each peer SGLang writes, after the write."""

    __slots__ = ("_on_set",)

    def __init__(self, data: dict[Any, Any], on_set: Callable[[Any], None]) -> None:
        super().__init__(data)
        self._on_set = on_set

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._on_set(value)


# The guard of the latest installation: hooks set on a live manager by an earlier one
# check with it (a reconfigured guard keeps checking the managers that already run).
_LATEST: list[PeerGuard] = []


def _current(guard: PeerGuard) -> PeerGuard:
    """``guard``, or the latest installation's when ``guard``'s is no longer active."""
    latest = _LATEST[-1] if _LATEST else guard
    return guard if guard.rt.active or not latest.rt.active else latest


def _watched(guard: PeerGuard, manager: object, info: object) -> None:
    """The peer is in SGLang's table: check it; a strict failure of ours rises."""
    ours = checked(_current(guard), "mooncake", manager, info)
    if ours is not None:
        raise ours


def _publish_hook(guard: PeerGuard, manager: object) -> Callable[..., Any]:
    """The instance's ``_publish_peer_registration`` (0.5.22+): the class's, then the
    check, once SGLang's lock is released."""
    def _publish_peer_registration(session: Any, info: Any, *args: Any, **kwargs: Any) -> Any:
        method = getattr(type(manager), _PUBLISH)  # looked up at call time
        result = method(manager, session, info, *args, **kwargs)
        _watched(guard, manager, info)
        return result

    return _publish_peer_registration


def _closure(frame: Any) -> Any:
    """SGLang's bootstrap closure among ``frame`` and its callers, or ``None``. The whole
    stack is walked (once per registration): other plug-ins' wrappers of ``from_zmq``
    (SGLang's HookRegistry adds two frames per AROUND hook) sit between."""
    closure = PEERS_MOONCAKE_BOOTSTRAP[0]
    while frame is not None:
        if frame.f_code.co_name == closure and \
                frame.f_globals.get("__name__") == PEERS_MOONCAKE_START.module:
            return frame
        frame = frame.f_back
    return None


def _parsed(guard: PeerGuard, caller: Any, info: object) -> None:
    """SGLang's bootstrap closure in ``caller`` parsed a registering decode peer: check it,
    on that closure's manager, unless the manager's table is watched. Never raises (that
    would end the thread before SGLang's own outcome): a failure of ours is logged."""
    try:
        found = _closure(caller)
        manager = None if found is None else found.f_locals.get("self")
        if manager is None or type(vars(manager).get("decode_kv_args_table")) is WatchedTable:
            return
        checked(guard, "mooncake", manager, info)  # a strict failure is logged, not raised
    except Exception as exc:
        our_failure(guard.rt, "checking a parsed Mooncake decode peer registration", exc)


def _relayout_refused(guard: PeerGuard, manager: object, caller: Any,
                      error: BaseException) -> None:
    """SGLang's relayout refused the peer registering in ``caller`` (SGLang's bootstrap
    closure, whose local ``decode_kv_args`` it is; anything else: nothing to say): its
    relayout report, then the bootstrap thread's death named once; a failure of ours
    rides as a note (strict). SGLang's exception rises unchanged."""
    ours = None
    try:
        found = _closure(caller)
        info = None if found is None else found.f_locals.get(PEERS_MOONCAKE_BOOTSTRAP[1])
        if info is None:
            return
        ours = checked(guard, "mooncake", manager, info)
        guard.on_death("mooncake", "bootstrap thread", manager, error, timeout_text())
    except Exception as exc:
        ours = ours or our_failure(guard.rt, "naming why the Mooncake bootstrap thread died",
                                   exc)
    if ours is not None:
        note_on(error, ours)


def _relayout_hook(guard: PeerGuard, manager: object) -> Callable[..., Any]:
    """The instance's ``requires_dcp_relayout``: the class's, and the report when it raises."""
    def requires_dcp_relayout(*args: Any, **kwargs: Any) -> Any:
        method = getattr(type(manager), PD_RELAYOUT.attr)  # looked up at call time
        try:
            return method(manager, *args, **kwargs)
        except Exception as error:
            current = _current(guard)
            if current.rt.active:
                _relayout_refused(current, manager, sys._getframe(1), error)
            raise

    return requires_dcp_relayout


def _watch(guard: PeerGuard, manager: Any) -> None:
    """Watch the manager's peer registrations (SGLang's publishing method; before 0.5.22
    the parse hook, or in strict mode its table) and hook its relayout (a release without
    DCP, 0.5.16, has no relayout to hook)."""
    if callable(getattr(type(manager), _PUBLISH, None)):
        if _PUBLISH not in vars(manager):
            setattr(manager, _PUBLISH, _publish_hook(guard, manager))
    elif guard.rt.strict and type(manager.decode_kv_args_table) is dict:
        manager.decode_kv_args_table = WatchedTable(
            manager.decode_kv_args_table, functools.partial(_watched, guard, manager))
    name = PD_RELAYOUT.attr
    if callable(getattr(type(manager), name, None)) and name not in vars(manager):
        setattr(manager, name, _relayout_hook(guard, manager))


def _mooncake_start(guard: PeerGuard, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def start_prefill_thread(self: Any, *args: Any, **kwargs: Any) -> Any:
        ours = None
        if guard.rt.active:
            try:
                _watch(guard, self)
            except Exception as exc:  # strict: rises once SGLang's thread started
                ours = our_failure(guard.rt, "watching Mooncake's decode peer table", exc)
        result = original(self, *args, **kwargs)
        if ours is not None:
            raise ours
        return result

    return start_prefill_thread


_WORKER_HANGS = ("every request sharded to this worker's queue now hangs (its KVPoll "
                 "never completes)")


def _died_of(error: RuntimeError) -> BaseException:
    """What the worker died of, as the registration's finding words it: SGLang's
    ``RuntimeError`` quotes the error it met ("because of <message>"), which is the
    finding's message itself, except for an ``IndexError`` (the buffer count's is recorded as
    ``IndexError: <message>``): then the wrapped error, whose message the finding holds."""
    met = error.__context__
    return met if isinstance(met, IndexError) and str(met) else error


def _mooncake_worker(guard: PeerGuard, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def transfer_worker(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except RuntimeError as error:
            if guard.rt.active and _DEAD in str(error):
                try:
                    guard.on_death("mooncake", "transfer worker", self, _died_of(error),
                                   _WORKER_HANGS)
                except Exception as exc:
                    ours = our_failure(guard.rt, "naming why a Mooncake transfer worker died",
                                       exc)
                    if ours is not None:
                        note_on(error, ours)
            raise

    return transfer_worker


def _mooncake_parse(guard: PeerGuard, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def from_zmq(cls: Any, *args: Any, **kwargs: Any) -> Any:
        info = original(cls, *args, **kwargs)
        current = _current(guard)
        if current.rt.active:
            _parsed(current, sys._getframe(1), info)
        return info

    return from_zmq


def patch_mooncake(module: ModuleType, guard: PeerGuard) -> list[AppliedPatch]:
    """Wrap Mooncake's prefill bootstrap start and transfer worker, and before 0.5.22
    (no publishing method) its parse of a registration."""
    judged("peers.mooncake_start", "peers.mooncake_worker")
    _LATEST[:] = [guard]
    targets = [(PEERS_MOONCAKE_START, functools.partial(_mooncake_start, guard)),
               (PEERS_MOONCAKE_WORKER, functools.partial(_mooncake_worker, guard))]
    if not callable(getattr(getattr(module, "MooncakeKVManager", None), _PUBLISH, None)):
        targets.append((PEERS_MOONCAKE_PARSE, functools.partial(_mooncake_parse, guard)))
    return apply_all(module, targets)
