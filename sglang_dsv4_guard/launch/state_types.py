"""The state types each server's KV pool registers, as SGLang's own code registers them.

Where the release's pool class can be built on CPU, a miniature real pool (one SWA and one
full layer, one head, tiny sizes) is built by SGLang's own constructor and SGLang's real
``setup_state_kv_args`` runs on it: the state types (and ``is_hybrid_mla_backend``) are
what that call wrote into a fresh ``KVArgs``. That covers the hybrid SWA pool
(``SWAKVPool``: gpt-oss and other sliding-window models) and the plain MHA pool. Other
pools (DeepSeek-V4's, MLA, Mamba hybrids, MiniMax sparse) are not built here: their state
types are left unknown, and the endpoint's note says so.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from sglang_dsv4_guard.launch.derive import Side
from sglang_dsv4_guard.launch.endpoint import CONTRIBUTORS
from sglang_dsv4_guard.launch.parse import offline_env
from sglang_dsv4_guard.log import LOGGER_NAME, silenced
from sglang_dsv4_guard.pd.endpoint import Value

__all__ = ["pool_kind", "registered_state"]

log = logging.getLogger(LOGGER_NAME)
_ROWS = 64


def pool_kind(side: Side) -> str | None:
    """Which buildable pool SGLang gives the server's model: ``"swa"``, ``"mha"``, or
    ``None`` (a pool not built here)."""
    m = side.model
    if m.is_dsv4 or m.uses_mla_pool or m.attention_arch != "MHA":
        return None
    return "swa" if m.is_hybrid_swa else "mha"


def _pool(kind: str) -> Any:
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    cls = SWAKVPool if kind == "swa" else MHATokenToKVPool
    wanted: dict[str, Any] = dict(
        size=_ROWS, size_swa=_ROWS, page_size=1, dtype=torch.bfloat16, head_num=1,
        head_dim=8, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
        layer_num=1 if kind == "mha" else 2, device="cpu", enable_memory_saver=False,
        enable_kvcache_transpose=False)
    params = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in wanted.items() if k in params})


@functools.lru_cache(maxsize=4)
def registered_state(kind: str) -> tuple[tuple[str, ...], bool] | str:
    """``(state types, is_hybrid_mla_backend)`` as the release's ``setup_state_kv_args``
    registers them for a miniature ``kind`` pool, or the reason it could not run."""
    from sglang.srt.disaggregation.utils import setup_state_kv_args

    # deferred: samples loads SGLang's KVArgs; check imports it only when a pool is built
    from sglang_dsv4_guard.samples import new_kv_args

    try:
        with offline_env(), silenced():
            kv_args = new_kv_args()
            setup_state_kv_args(kv_args, _pool(kind), None)
    except Exception as exc:  # the release's constructor or function refused: unknown
        log.debug("state types of a %s pool not derived: %s", kind, exc, exc_info=True)
        return f"{type(exc).__name__}: {exc}"
    types = tuple(str(getattr(t, "value", t)) for t in getattr(kv_args, "state_types", []))
    return types, bool(getattr(kv_args, "is_hybrid_mla_backend", False))


def _contribute(side: Side, values: dict[str, Value]) -> dict[str, Value]:
    del values
    kind = pool_kind(side)
    if kind is None:
        return {}
    got = registered_state(kind)
    if isinstance(got, str):
        return {}
    types, hybrid_mla = got
    pool = "SWAKVPool" if kind == "swa" else "MHATokenToKVPool"
    source = (f"SGLang's setup_state_kv_args on a miniature {pool} (the pool SGLang builds "
              f"for {side.model.path}/config.json: attention {side.model.attention_arch}"
              + (", hybrid SWA" if kind == "swa" else "") + ")")
    return {"state_types": Value(types, source),
            "is_hybrid_mla_backend": Value(hybrid_mla, source)}


CONTRIBUTORS.append(_contribute)
