"""Who registered each pool's SWA index mapping: ``register_mapping`` observed, not assumed.

Once the guard is installed (in a scheduler: before any pool is built), SGLang's
``DeepSeekV4TokenToKVPool.register_mapping`` is wrapped
(:data:`~sglang_dsv4_guard.host.targets.POOL_REGISTER_TARGET`). The wrapper calls SGLang's
method with the caller's arguments and returns its result unchanged; before that it
records, keyed weakly by the pool, the caller's ``file:line`` and the ``id()`` of the
tensor registered. Nothing else: no tensor is read or held. ``DSV4G004``'s ``from:``
lines then say what was seen (:func:`registered_by`); a record whose tensor is not the
pool's current mapping any more (set another way since) is not used.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Registration", "forget", "make_register_wrapper", "registered_by"]


@dataclass(frozen=True)
class Registration:
    """One observed ``register_mapping`` call: where it was made and what it registered."""

    caller: str  # "path/to/file.py:123 (function)"
    tensor_id: int


_SEEN: weakref.WeakKeyDictionary[object, Registration] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _record(pool: object, tensor: object) -> None:
    frame = sys._getframe(2)  # the caller of the wrapper
    where = f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"
    try:
        with _LOCK:
            _SEEN[pool] = Registration(where, id(tensor))
    except TypeError:  # a pool that refuses weak references: nothing is recorded
        pass


def make_register_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """A factory for :func:`sglang_dsv4_guard.patching.apply`: SGLang's method, observed."""

    @functools.wraps(original)
    def register_mapping(self: object, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # observing never changes SGLang's behaviour
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
    if seen is None or seen.tensor_id != id(current):
        return None
    return seen.caller


def forget() -> None:
    """Drop every record (a fresh process' state, for :func:`~sglang_dsv4_guard.lifecycle.reset`)."""
    with _LOCK:
        _SEEN.clear()
