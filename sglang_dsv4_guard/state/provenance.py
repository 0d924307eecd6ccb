"""Who registered each pool's SWA index mapping: ``register_mapping`` observed, not assumed.

Once the guard is installed (in a scheduler: before any pool is built), SGLang's
``DeepSeekV4TokenToKVPool.register_mapping`` is wrapped
(:data:`~sglang_dsv4_guard.host.targets.POOL_REGISTER_TARGET`). The wrapper calls SGLang's
method with the caller's arguments and returns its result unchanged; before that it
records, keyed weakly by the pool, the caller's ``file:line`` and a weak reference to the
tensor registered (never its ``id()``, which CPython gives to the next object once the
tensor is freed). Nothing else: no tensor is read or held. The shared-mapping check's ``from:``
lines then say what was seen (:func:`registered_by`); a record whose tensor is not the
pool's current mapping any more (set another way since, or freed) is not used.

The caller named is the first frame above every ``register_mapping`` (:func:`_caller`).
A wrapper of ours left in another's ``__wrapped__`` chain by an uninstall (the newer
wrapper kept in place) records nothing: only the applied one does, so a reinstall never
records a call twice.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from sglang_dsv4_guard.patching import is_ours

__all__ = ["MappingRegistration", "forget", "make_register_wrapper", "registered_by"]


@dataclass(frozen=True)
class MappingRegistration:
    """One observed ``register_mapping`` call: where it was made and what it registered."""

    caller: str  # "path/to/file.py:123 (function)"
    tensor: Callable[[], object] | None  # a weak reference; None: None was registered


_SEEN: weakref.WeakKeyDictionary[object, MappingRegistration] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _wrapper_codes(pool: object) -> set[CodeType]:
    """The code of every ``register_mapping`` along the pool class' MRO (a subclass'
    override calling ``super()`` included) and of their ``__wrapped__`` chains (another
    plug-in's wrapper around ours, ``functools.wraps``)."""
    codes: set[CodeType] = set()
    for cls in type(pool).__mro__:
        fn = vars(cls).get("register_mapping")
        for _ in range(32):  # a cycle of __wrapped__ ends too
            if fn is None:
                break
            code = getattr(fn, "__code__", None)
            if isinstance(code, CodeType):
                codes.add(code)
            fn = getattr(fn, "__wrapped__", None)
    return codes


def _caller(pool: object) -> FrameType | None:
    """The first frame above our wrapper (whose own frame is never named) that is not a
    ``register_mapping`` (:func:`_wrapper_codes`): those are skipped, never the registrar."""
    skip = _wrapper_codes(pool)
    frame: FrameType | None = sys._getframe(3)  # above _caller, _record and our wrapper
    while frame is not None and frame.f_code in skip:
        frame = frame.f_back
    return frame


def _record(pool: object, tensor: object) -> None:
    frame = _caller(pool)
    if frame is None:
        return
    where = f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"
    try:
        ref = None if tensor is None else weakref.ref(tensor)
        with _LOCK:
            _SEEN[pool] = MappingRegistration(where, ref)
    except TypeError:  # a pool or tensor that refuses weak references: nothing recorded
        pass


def make_register_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """A factory for :func:`sglang_dsv4_guard.patching.apply`: SGLang's method, observed."""

    @functools.wraps(original)
    def register_mapping(self: object, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # observing never changes SGLang's behaviour
            if is_ours(register_mapping):  # only the applied wrapper records, not a stale one
                _record(self, args[0] if args else next(iter(kwargs.values()), None))
        return original(self, *args, **kwargs)

    return register_mapping


def registered_by(pool: object, current: object) -> str | None:
    """Where ``pool``'s mapping ``current`` was registered, if the guard saw it."""
    try:
        with _LOCK:
            seen = _SEEN.get(pool)
    except TypeError:
        return None
    if seen is None:
        return None
    held = None if seen.tensor is None else seen.tensor()
    if held is not current or (held is None and seen.tensor is not None):
        return None
    return seen.caller


def forget() -> None:
    """Drop every record (a fresh process' state, for :func:`~sglang_dsv4_guard.lifecycle.reset`)."""
    with _LOCK:
        _SEEN.clear()
