"""The pools' SWA index mapping tensors: what each is, and how the two relate.

Every tensor read is defensive. A mapping may be any tensor a plug-in or a port
registered: meta (no data), sparse (no data pointer), nested (no sizes), on a device
we cannot read. What cannot be read is recorded (``TensorInfo.unreadable``,
``MappingComparison.note``) and reported, never raised: the guard must not fail on a
tensor SGLang's identity check handles without looking inside.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sglang_dsv4_guard.findings import failure_text
from sglang_dsv4_guard.host.targets import MAPPING_ATTR

__all__ = ["MappingComparison", "TensorInfo", "attempt", "compare_mappings",
           "count_differences", "other_references", "tensor_info"]

_T = TypeVar("_T")
_ABSENT = object()


@dataclass(frozen=True)
class TensorInfo:
    """What a pool holds as its ``full_to_swa_index_mapping``.

    ``kind`` is ``"tensor"``, ``"none"`` (registered as / initialised to ``None``),
    ``"missing"`` (the attribute was never set) or ``"other"`` (not a torch tensor).
    A field whose read raised is ``None`` and named in ``unreadable``.
    ``other_references`` counts references to the tensor beyond the pool's own attribute
    (:func:`other_references`); ``None`` when the interpreter cannot count them.
    """

    kind: str
    type_name: str = ""
    object_id: int | None = None
    data_ptr: int | None = None
    storage_ptr: int | None = None
    shape: tuple[int, ...] | None = None
    stride: tuple[int, ...] | None = None
    dtype: str | None = None
    device: str | None = None
    layout: str | None = None
    unreadable: tuple[str, ...] = ()
    other_references: int | None = None

    def describe(self) -> str:
        """One line: id, data_ptr, shape, dtype, device; or why there is no tensor."""
        if self.kind == "missing":
            return "missing (the pool has no full_to_swa_index_mapping attribute)"
        if self.kind == "none":
            return "None (no mapping registered)"
        if self.kind == "other":
            where = f" (id=0x{self.object_id:x})" if self.object_id is not None else ""
            return f"a {self.type_name} object, not a torch.Tensor{where}"
        ptr = "n/a" if self.data_ptr is None else f"0x{self.data_ptr:x}"
        text = (f"id=0x{self.object_id:x} data_ptr={ptr} shape={self.shape} "
                f"stride={self.stride} dtype={self.dtype} device={self.device}")
        if self.layout not in (None, "torch.strided"):
            text += f" layout={self.layout}"
        if self.unreadable:
            text += f" (unreadable: {'; '.join(self.unreadable)})"
        return text


@dataclass(frozen=True)
class MappingComparison:
    """How the two pools' mappings relate. Computed only when SGLang's check reads them.

    ``note`` says why the contents were not compared, when they were not.
    """

    identical: bool
    same_storage: bool = False
    same_layout: bool = False
    contents_equal: bool | None = None
    differing: int | None = None
    first_difference: tuple[int, object, object] | None = None
    note: str = ""


def attempt(label: str, read: Callable[[], _T], failures: list[str]) -> _T | None:
    """``read()``, or ``None`` with the failure recorded under ``label``."""
    try:
        return read()
    except Exception as exc:  # recorded in the report, not swallowed
        failures.append(f"{label}: {failure_text(exc)}")
        return None


class _Holder:
    held: object = None


def _references_of_a_singly_held_object() -> int:
    holder = _Holder()
    holder.held = object()
    value = holder.held
    return sys.getrefcount(value)


def other_references(value: object) -> int | None:
    """References to ``value`` besides one attribute of its pool, or ``None`` when unknown.

    ``sys.getrefcount`` of a tensor held by exactly one attribute, read into one local
    variable of the caller, is the same figure as for a fresh object held the same way
    (:func:`_references_of_a_singly_held_object`, measured on this interpreter rather than
    assumed to be 3). Any surplus is somebody else: the draft's own allocator, a captured
    closure, a cache. Call with the value in exactly one local of the caller, plus the
    argument, as ``tensor_info`` does.
    """
    if not hasattr(sys, "getrefcount"):
        return None
    # -1: the argument of this function holds one more reference than the baseline's local.
    return max(0, sys.getrefcount(value) - 1 - _references_of_a_singly_held_object())


def tensor_info(pool: object) -> TensorInfo:
    """Describe ``pool.full_to_swa_index_mapping`` without ever raising."""
    try:
        value = getattr(pool, MAPPING_ATTR)
    except AttributeError:
        return TensorInfo("missing")
    except Exception as exc:
        return TensorInfo("other", type_name=f"unreadable ({type(exc).__name__})")
    if value is None:
        return TensorInfo("none")
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return TensorInfo("other", type_name=type(value).__name__, object_id=id(value))
    failed: list[str] = []
    others = other_references(value)
    return TensorInfo(
        "tensor",
        type_name=type(value).__name__,
        object_id=id(value),
        data_ptr=attempt("data_ptr", lambda: int(value.data_ptr()), failed),
        storage_ptr=attempt("storage", lambda: int(value.untyped_storage().data_ptr()), failed),
        shape=attempt("shape", lambda: tuple(int(d) for d in value.shape), failed),
        stride=attempt("stride", lambda: tuple(int(s) for s in value.stride()), failed),
        dtype=str(value.dtype),
        device=attempt("device", lambda: str(value.device), failed),
        layout=attempt("layout", lambda: str(value.layout), failed),
        unreadable=tuple(failed),
        other_references=others,
    )


def _not_comparable(torch: Any, a: Any, b: Any) -> str:
    """Why the contents of ``a`` and ``b`` cannot be compared element by element, or ``""``."""
    for role, t in (("target", a), ("draft", b)):
        if t.is_nested:
            return f"the {role} mapping is a nested tensor"
        if t.layout != torch.strided:
            return f"the {role} mapping has layout {t.layout}, not strided"
        if t.device.type == "meta":
            return f"the {role} mapping is on the meta device (it has no data)"
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return "shape, dtype or device differ"
    return ""


def compare_mappings(target_pool: object, draft_pool: object) -> MappingComparison:
    """Compare the two mappings: identity, storage, layout and, when comparable, contents."""
    a = getattr(target_pool, MAPPING_ATTR, _ABSENT)
    b = getattr(draft_pool, MAPPING_ATTR, _ABSENT)
    if a is b:
        return MappingComparison(identical=True, same_storage=True, same_layout=True,
                                 contents_equal=True, differing=0)
    torch = sys.modules.get("torch")
    if torch is None or not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return MappingComparison(identical=False)
    ta, tb = tensor_info(target_pool), tensor_info(draft_pool)
    # A pointer of 0 (meta tensors, empty storage) is no memory at all: never "the same".
    same_storage = bool(ta.storage_ptr) and ta.storage_ptr == tb.storage_ptr
    same_layout = (bool(ta.data_ptr) and not ta.unreadable and not tb.unreadable
                   and (ta.data_ptr, ta.shape, ta.stride, ta.dtype, ta.device, ta.layout)
                   == (tb.data_ptr, tb.shape, tb.stride, tb.dtype, tb.device, tb.layout))
    failed: list[str] = []
    why = attempt("comparable", lambda: _not_comparable(torch, a, b), failed)
    if why is None or why:
        return MappingComparison(False, same_storage, same_layout, note=why or failed[0])
    counted = attempt("contents", lambda: count_differences(torch, a, b), failed)
    if counted is None:
        return MappingComparison(False, same_storage, same_layout, note=failed[0])
    differing, first = counted
    return MappingComparison(False, same_storage, same_layout, differing == 0, differing, first)


# Elements compared per step: the temporary boolean chunk is at most 1/64 of a mapping's
# element count, so at most 1/64 of its bytes (1/512 for int64) and never 1/8.
_CHUNK_DIVISOR = 64
_MIN_CHUNK = 1 << 16


def count_differences(torch: Any, a: Any, b: Any) -> tuple[int, tuple[int, object, object] | None]:
    """How many elements of two same-shape strided tensors differ, and the first difference.

    Chunked: never allocates a tensor of differing indices (which is 8 bytes per
    difference: 160 MB for 20M entries that all differ) nor a full boolean mask. The
    per-chunk counts stay on the tensors' device; the host reads them once (one sync),
    and once more for the first difference.
    """
    flat_a = a if a.dim() == 1 else a.reshape(-1)  # a view for contiguous tensors
    flat_b = b if b.dim() == 1 else b.reshape(-1)
    n = int(flat_a.numel())
    if n == 0:
        return 0, None
    step = max(_MIN_CHUNK, -(-n // _CHUNK_DIVISOR))
    starts = range(0, n, step)
    with torch.no_grad():
        counts = torch.stack([torch.count_nonzero(flat_a[i:i + step] != flat_b[i:i + step])
                              for i in starts])
        per_chunk = counts.tolist()
        differing = int(sum(per_chunk))
        if not differing:
            return 0, None
        k = next(k for k, c in enumerate(per_chunk) if c)
        start = starts[k]
        chunk = flat_a[start:start + step] != flat_b[start:start + step]
        index = start + int(torch.argmax(chunk.view(torch.uint8)).item())
        return differing, (index, flat_a[index].item(), flat_b[index].item())
