"""The state types each server's KV pool registers, as SGLang's own code registers them.

For a hybrid sliding-window MHA model (gpt-oss and the like) a miniature real
``SWAKVPool`` (one SWA and one full layer, one head, tiny sizes) is built by SGLang's own
constructor and SGLang's real ``setup_state_kv_args`` runs on it: the state types (and
``is_hybrid_mla_backend``) are what that call wrote into a fresh ``KVArgs``. Other pools
(plain MHA, whose class depends on more than config.json; DeepSeek-V4's; MLA; Mamba and
linear-attention hybrids; MiniMax sparse; MXFP8 block-scaled KV) are not built here: their
state types are left unknown, and the rows that need them say so in ``unknowns``.
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
    """``"swa"`` when SGLang gives the server's model the hybrid SWA pool built here (MHA
    attention, hybrid SWA by SGLang's ``ModelConfig``, a KV cache dtype without block
    scales); ``None`` for any other pool (not built here: its state types stay unknown)."""
    m = side.model
    dtype = str(getattr(side.args.server_args, "kv_cache_dtype", None)
                or side.args.typed.get("kv_cache_dtype") or "auto")
    if m.is_dsv4 or m.uses_mla_pool or m.attention_arch != "MHA" or not m.is_hybrid_swa \
            or "mxfp" in dtype or "fp4" in dtype:
        return None
    return "swa"


def _pool(kind: str) -> Any:
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    del kind  # the one kind built here
    wanted: dict[str, Any] = dict(
        size=_ROWS, size_swa=_ROWS, page_size=1, dtype=torch.bfloat16, head_num=1,
        head_dim=8, swa_attention_layer_ids=[0], full_attention_layer_ids=[1], layer_num=2,
        device="cpu", enable_memory_saver=False, enable_kvcache_transpose=False,
        token_to_kv_pool_class=MHATokenToKVPool)
    params = inspect.signature(SWAKVPool.__init__).parameters
    return SWAKVPool(**{k: v for k, v in wanted.items() if k in params})


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
    source = ("SGLang's setup_state_kv_args on a miniature SWAKVPool (the pool SGLang builds "
              f"for {side.model.path}/config.json: attention {side.model.attention_arch}, "
              "hybrid SWA)")
    return {"state_types": Value(types, source),
            "is_hybrid_mla_backend": Value(hybrid_mla, source)}


CONTRIBUTORS.append(_contribute)
