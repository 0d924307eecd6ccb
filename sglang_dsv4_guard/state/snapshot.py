"""Plain-value snapshots of SGLang's KV pools, taken without changing them.

With :mod:`sglang_dsv4_guard.state.tensors` (the mapping tensors), the only module of
:mod:`sglang_dsv4_guard.state` that reads SGLang's pools; what it reads is declared in
:mod:`sglang_dsv4_guard.host.targets`. Checks see the frozen dataclasses below, never a
pool. Every read is defensive: a missing attribute becomes :data:`MISSING` (SGLang would
raise ``AttributeError`` there), a property that raises becomes an :class:`Unreadable`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sglang_dsv4_guard.findings import short_repr
from sglang_dsv4_guard.host import targets
from sglang_dsv4_guard.host.releases import HostProfile
from sglang_dsv4_guard.state import provenance
from sglang_dsv4_guard.state.cuda_graphs import CudaGraphs, read_cuda_graphs
from sglang_dsv4_guard.state.tensors import (
    MappingComparison,
    TensorInfo,
    attempt,
    compare_mappings,
    tensor_info,
)

__all__ = [
    "MISSING",
    "MappingComparison",
    "NotASequence",
    "PoolSnapshot",
    "StateContext",
    "StatePair",
    "TensorInfo",
    "Unreadable",
    "change_token",
    "read_attr",
    "snapshot_pair",
]

# What a pool snapshot holds: the attributes SGLang's DSV4 draft block reads, in the
# order it reads them, then those the auto-share rule compares (SWA capacity).
POOL_ATTRS = (*targets.POOL_ATTRS, *targets.AUTOSHARE_POOL_ATTRS)


class _Missing:
    """The value of an attribute the pool does not have."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<not set>"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Unreadable:
    """The value of an attribute whose read raised something other than AttributeError."""

    error: str


@dataclass(frozen=True)
class NotASequence:
    """A value that is not a list or tuple where SGLang iterates one (``compression_ratios``).

    The guard describes it without consuming it: ``text`` is a short repr, ``truthy``
    what SGLang's ``not value`` sees (``None`` when ``bool()`` raised, ``error`` says
    what), ``one_shot`` whether it is an iterator SGLang's own check would consume
    (a generator: the guard must not read it first), ``iterable`` whether it iterates.
    """

    type_name: str
    text: str
    truthy: bool | None
    iterable: bool
    one_shot: bool
    error: str = ""

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class PoolSnapshot:
    """The values SGLang's DSV4 block reads from one pool, keyed as in ``POOL_ATTRS``."""

    role: str
    type_name: str
    is_dsv4: bool
    attrs: Mapping[str, object]
    mapping: TensorInfo
    #: Where this pool's current mapping was registered, when the guard saw the
    #: ``register_mapping`` call (:mod:`~sglang_dsv4_guard.state.provenance`); else ``None``.
    registered_by: str | None = None

    def get(self, name: str) -> object:
        """The value read for ``name``: :data:`MISSING` when the pool lacks it."""
        return self.attrs.get(name, MISSING)

    def has(self, name: str) -> bool:
        """Whether ``name`` was read successfully."""
        value = self.attrs.get(name, MISSING)
        return value is not MISSING and not isinstance(value, Unreadable)


NOT_READ = CudaGraphs(None, "not read (the mappings were not compared)")


@dataclass(frozen=True)
class StatePair:
    """A target/draft pair as SGLang's ``setup_state_kv_args`` sees it."""

    target: PoolSnapshot
    draft: PoolSnapshot
    block_runs: bool
    mapping: MappingComparison | None
    cuda_graphs: CudaGraphs = NOT_READ

    @property
    def predictable(self) -> bool:
        """False when SGLang's verdict depends on a value the guard must not read (a
        generator SGLang's check consumes): the guard then makes no prediction."""
        ratios = self.draft.get("compression_ratios")
        return not (isinstance(ratios, NotASequence) and ratios.one_shot)


@dataclass(frozen=True)
class StateContext:
    """Where ``setup_state_kv_args`` was called and how the guard is configured.

    ``caller`` is the module that called SGLang's function (prefill or decode
    bootstrap queue), ``role`` its side (``prefill``, ``decode`` or ``unknown``; part of
    the report's context, so the two sides' reports never share a fingerprint),
    ``environ`` the environment variables that decide pool values, ``location`` the
    calling line (``file:line``) when the wrapper saw it (a fix naming the call quotes it).
    """

    profile: HostProfile
    caller: str = "unknown"
    role: str = "unknown"
    mode: str = "on"
    autoshare: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)
    location: str = ""

    def __post_init__(self) -> None:
        # Read-only for every plug-in that receives this context after another.
        object.__setattr__(self, "environ", MappingProxyType(dict(self.environ)))

    def describe(self) -> dict[str, str]:
        """The context as strings, for reports."""
        return {
            "function": str(targets.STATE),
            "caller": self.caller,
            "role": self.role,
            "sglang": self.profile.name,
            "mode": self.mode,
            "autoshare": "on" if self.autoshare else "off",
        }


def read_attr(obj: object, dotted: str) -> object:
    """``obj.<dotted>`` as SGLang reads it, never raising: :data:`MISSING` when absent,
    an :class:`Unreadable` when a property raises, a list as a tuple."""
    value: object = obj
    for part in dotted.split("."):
        if value is None:
            return None  # SGLang reads `x.capacity if x is not None else None`
        try:
            value = getattr(value, part)
        except AttributeError:
            return MISSING
        except Exception as exc:  # a property that fails: record it, never raise
            return Unreadable(f"{type(exc).__name__}: {exc}")
    return tuple(value) if isinstance(value, list) else value


def _read_sequence(pool: object, name: str) -> object:
    """``name`` as a tuple when SGLang can iterate it more than once; otherwise a
    :class:`NotASequence` that says what SGLang's ``not value`` / iteration will meet.
    Never consumes a one-shot iterator (SGLang's own check iterates it)."""
    value = read_attr(pool, name)
    if value is MISSING or isinstance(value, Unreadable | tuple):
        return value
    truthy: bool | None
    error = ""
    try:
        truthy = bool(value)
    except Exception as exc:  # e.g. a tensor with several elements
        truthy, error = None, f"{type(exc).__name__}: {exc}"
    try:
        iterator = iter(value)  # type: ignore[call-overload]
        iterable, one_shot = True, iterator is value
    except TypeError:
        iterable, one_shot = False, False
    # SGLang tests `not value` first: a non-empty container it finds false (a one-element
    # array of 0) fails there, whatever it holds, so only a truthy one (or an empty list or
    # tuple, whose falseness a tuple keeps) becomes a tuple for the all() check.
    truth_kept = truthy is True or (truthy is False and isinstance(value, list))
    if iterable and not one_shot and truth_kept:
        try:
            return tuple(value)  # type: ignore[arg-type]
        except Exception as exc:
            return Unreadable(f"{type(exc).__name__}: {exc}")
    return NotASequence(type(value).__name__, short_repr(value), truthy, iterable, one_shot,
                        error)


def snapshot_pool(pool: object, role: str, dsv4_class: type | None) -> PoolSnapshot:
    """Read the attributes SGLang's DSV4 block reads, without changing ``pool``."""
    is_dsv4 = dsv4_class is not None and isinstance(pool, dsv4_class)
    attrs = MappingProxyType({
        name: _read_sequence(pool, name) if name == "compression_ratios" else read_attr(pool, name)
        for name in POOL_ATTRS
    } if is_dsv4 else {})
    return PoolSnapshot(
        role=role,
        type_name=f"{type(pool).__module__}.{type(pool).__qualname__}",
        is_dsv4=is_dsv4,
        attrs=attrs,
        mapping=tensor_info(pool) if is_dsv4 else TensorInfo("none"),
        registered_by=_registered_by(pool) if is_dsv4 else None,
    )


def _registered_by(pool: object) -> str | None:
    current = read_attr(pool, targets.MAPPING_ATTR)
    return None if current is MISSING else provenance.registered_by(pool, current)


def _dsv4_class() -> type | None:
    module = sys.modules.get(targets.DSV4_POOL.module)
    if module is None:
        # SGLang imports it inside setup_state_kv_args; importing it here is the same.
        module = importlib.import_module(targets.DSV4_POOL.module)  # unscanned: SGLang's (host/targets)
    cls = getattr(module, targets.DSV4_POOL.qualname, None)
    return cls if isinstance(cls, type) else None


def snapshot_pair(target_pool: object, draft_pool: object, npu_gate: bool) -> StatePair:
    """Snapshot a target/draft pair and decide whether SGLang's DSV4 block runs for it."""
    cls = _dsv4_class()
    target = snapshot_pool(target_pool, "target pool", cls)
    draft = snapshot_pool(draft_pool, "draft pool", cls)
    is_npu = getattr(sys.modules.get(targets.STATE.module), targets.STATE_IS_NPU, None)
    # SGLang's own is_npu() as the wrapped module sees it
    block_runs = target.is_dsv4 and draft.is_dsv4 and not (
        npu_gate and callable(is_npu) and bool(is_npu()))
    if block_runs and not target.get("_unified_kv"):
        return StatePair(target, draft, block_runs, compare_mappings(target_pool, draft_pool),
                         read_cuda_graphs())
    return StatePair(target, draft, block_runs, None)


def change_token(pool: object) -> tuple[object, ...]:
    """A cheap token of what SGLang reads from ``pool``; it changes when a read would.

    Not a snapshot: scalars by value, sequences by length and hash (a property may build
    a fresh equal tuple on every read, 0.5.16, whose ``id()`` then differs although
    nothing changed; an unhashable one by identity and length), other objects by
    identity; the mapping tensor by identity, data pointer and torch's in-place version
    counter. No tensor data is read.
    """
    parts: list[object] = [id(pool), type(pool)]
    for name in POOL_ATTRS:
        value = read_attr(pool, name)
        if isinstance(value, tuple):
            try:
                parts.append((len(value), hash(value)))  # hash() runs in C: no Python-level walk
            except Exception:  # an unhashable item: identity and length stand alone
                parts.append((id(value), len(value)))
        elif value is None or isinstance(value, bool | int | float | str | Unreadable):
            parts.append(value)
        else:
            parts.append(id(value))
    mapping = getattr(pool, targets.MAPPING_ATTR, MISSING)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(mapping, torch.Tensor):
        # Sparse, meta and nested tensors refuse data_ptr() or _version: such a read is
        # recorded as its failure text, which is stable, so the token still compares.
        failures: list[str] = []
        parts.append((id(mapping), attempt("data_ptr", lambda: int(mapping.data_ptr()), failures),
                      attempt("_version", lambda: int(mapping._version), failures),
                      tuple(failures)))
    else:
        parts.append(id(mapping))
    return tuple(parts)
