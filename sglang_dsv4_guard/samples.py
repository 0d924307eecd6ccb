"""Sample SGLang objects built without a GPU or a model: pool pairs and an empty ``KVArgs``.

:func:`build_pair` makes a target and a draft pool of SGLang's own
``DeepSeekV4TokenToKVPool`` class, built with ``object.__new__`` plus the attributes
``setup_state_kv_args`` reads, as SGLang's CPU tests build theirs; :class:`PoolSpec`
says how each differs from a healthy paged pool. The ``demo`` command and the ``check``
command's miniature run use them; :mod:`sglang_dsv4_guard.testing` offers them to
plug-in authors. Imports sglang and torch only when a function that needs them is
called (``import sglang_dsv4_guard.testing`` stays cheap).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from sglang_dsv4_guard.host.targets import DSV4_POOL, KV_ARGS, MAPPING_ATTR, POOL_REGISTER

__all__ = ["MAPPING_KINDS", "PoolSpec", "build_pair", "new_kv_args", "three_mismatch_pair"]

# How the draft's mapping relates to the target's.
MAPPING_KINDS = ("shared", "view", "clone", "different", "none", "missing")


@dataclass(frozen=True)
class PoolSpec:
    """The values one pool is built with. Defaults describe a healthy paged pool."""

    compression_ratios: tuple[int, ...] = (0,)
    unified: bool = False
    page_size: int = 256
    sliding_window: int = 128
    ring: tuple[int, int, int] = (128, 130, 2)  # unified: window, ring size, ring pages
    request_capacity: int | None = None  # target: encoder-replay rows asked (SGLang rounds)
    swa_req_ring_size: int | None = None  # draft: DSpark SWA ring
    swa_size: int = 64
    layers: int = 1
    extra: dict[str, Any] = field(default_factory=dict, hash=False)


class _Buffers:
    """Stands in for an SGLang sub-pool: only the attributes the buf-info getters read."""

    def __init__(self, page_size: int, rows: int, layers: int, swa_pages: int = 0) -> None:
        import torch  # deferred: importing this module costs no torch

        self.page_size = page_size
        self.swa_pages = swa_pages
        self.kv_buffer = [torch.zeros(rows, 8, dtype=torch.uint8) for _ in range(layers)]


class _RequestWindow:
    """SGLang 0.5.23's ``RequestWindow`` as the comparison reads it: ``capacity`` is the
    asked-for rows (sliding_window + D) rounded up to whole SWA pages, as
    ``RequestWindow.__init__`` rounds it (and ``get_draft_swa_ring_size`` the draft's ring)."""

    def __init__(self, capacity: int, page_size: int, layers: int) -> None:
        self.capacity = -(-capacity // page_size) * page_size if page_size > 0 else capacity
        self.state = _Buffers(page_size, 4, layers)


def _sglang(target: Any) -> Any:
    """SGLang's object ``target`` names, imported when first needed (importing this
    module imports no sglang)."""
    module = importlib.import_module(target.module)  # unscanned: SGLang's (host/targets)
    return getattr(module, target.qualname)


def _pool(spec: PoolSpec) -> Any:
    pool = object.__new__(_sglang(DSV4_POOL))
    values: dict[str, Any] = {
        "compression_ratios": list(spec.compression_ratios),
        "_unified_kv": spec.unified,
        "_unified_kv_fp8": False,
        "page_size": spec.page_size,
        "swa_page_size": spec.page_size,
        "sliding_window": spec.sliding_window,
        "swa_size": spec.swa_size,
        "layer_num": spec.layers,
        "start_layer": 0,
        "end_layer": spec.layers,
        "compress_state_pools": [],
        "indexer_compress_state_pools": [],
        "swa_valid_from": None,
        "swa_req_ring_size": spec.swa_req_ring_size,
        "request_window": None,
        "swa_kv_pool": None if spec.unified else _Buffers(spec.page_size, 4, spec.layers),
        "unified_kv_pool": None,
        "kpool_use_compress": False,
    }
    if spec.request_capacity is not None:
        values["request_window"] = _RequestWindow(spec.request_capacity, spec.page_size,
                                                  spec.layers)
    if spec.unified:
        window, ring_size, pages = spec.ring
        values.update(unified_swa_window=window, unified_swa_ring_size=ring_size,
                      unified_swa_pages=pages,
                      unified_kv_pool=_Buffers(spec.page_size, 4, spec.layers, pages))
    values.update(spec.extra)
    for name, value in values.items():
        setattr(pool, name, value)
    return pool


def _draft_mapping(kind: str, target_mapping: Any) -> Any:
    if kind == "shared":
        return target_mapping
    if kind == "view":
        return target_mapping.view(target_mapping.shape)
    if kind == "clone":
        return target_mapping.clone()
    if kind == "different":
        other = target_mapping.clone()
        other[3] = -7
        return other
    return None


def build_pair(target: PoolSpec | None = None, draft: PoolSpec | None = None,
               mapping: str = "shared", target_mapping: str = "tensor",
               mapping_size: int = 16) -> tuple[Any, Any]:
    """A target and a draft pool. ``mapping`` is how the draft's mapping relates to the
    target's (:data:`MAPPING_KINDS`); ``target_mapping`` is ``"tensor"``, ``"none"`` or
    ``"missing"``. Unified pools get no mapping unless asked for one."""
    import torch  # deferred: importing this module costs no torch

    if mapping not in MAPPING_KINDS:
        raise ValueError(f"mapping must be one of {', '.join(MAPPING_KINDS)} (got {mapping!r})")
    if target_mapping not in ("tensor", "none", "missing"):
        raise ValueError("target_mapping must be one of tensor, none, missing "
                         f"(got {target_mapping!r})")
    target_pool = _pool(target or PoolSpec())
    draft_pool = _pool(draft or PoolSpec())
    if target_mapping == "tensor":
        tensor = torch.arange(mapping_size, dtype=torch.int64)
        getattr(target_pool, POOL_REGISTER)(tensor)
    elif target_mapping == "none":
        getattr(target_pool, POOL_REGISTER)(None)
    if mapping != "missing":
        tensor = getattr(target_pool, MAPPING_ATTR, None)
        if tensor is None and mapping in ("view", "clone", "different"):
            tensor = torch.arange(mapping_size, dtype=torch.int64)
        getattr(draft_pool, POOL_REGISTER)(_draft_mapping(mapping, tensor))
    return target_pool, draft_pool


def three_mismatch_pair() -> tuple[Any, Any]:
    """The demo's pair: a compressed draft layer, a draft mapping that differs and another
    page size and window (three of the state checks). SGLang reports only the first."""
    return build_pair(PoolSpec(compression_ratios=(4, 128, 0)),
                      PoolSpec(compression_ratios=(0, 4), page_size=64, sliding_window=64),
                      mapping="different")


def new_kv_args() -> Any:
    """An empty ``KVArgs``, as the bootstrap queues start with."""
    return _sglang(KV_ARGS)()
