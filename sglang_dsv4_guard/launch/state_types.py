"""The state types each server's KV pool registers, as SGLang's own code registers them.

Which pool a server gets is decided as the release's ``KVCacheConfigurator`` decides it
(``_build_token_to_kv_pool``: DeepSeek-V4 first, then MLA, then hybrid SWA, MiniMax
sparse, Mamba / linear attention, plain MHA), with SGLang's own predicates on the
server's ``ModelConfig``: ``attention_arch``, ``is_hybrid_swa``,
``hybrid_arch.mambaish_config``, ``is_minimax_sparse`` and ``is_deepseek_dsa``. For the
pools built here a miniature real pool (one or two layers, one head, tiny sizes) is made
by SGLang's own constructor and SGLang's real ``setup_state_kv_args`` runs on it, with a
miniature draft pool of the draft model's kind when the server has one; the state types
(and ``is_hybrid_mla_backend``) are what that call wrote into a fresh ``KVArgs``:

- ``mha``: ``MHATokenToKVPool`` (plain MHA);
- ``mla``: ``MLATokenToKVPool`` (MLA, not DSA/NSA, not hybrid SWA: DeepSeek-V3 and the like);
- ``swa``: ``SWAKVPool`` over ``MHATokenToKVPool`` (hybrid sliding-window MHA: gpt-oss);
- DeepSeek-V4 is not built again: the state types are read from the run of
  :mod:`.pools` on the server's own miniature ``DeepSeekV4TokenToKVPool``\\ s.

Anything else stays unknown, and the rows that need it say so in ``unknowns``: DSA/NSA,
MLA with hybrid SWA, Mamba and linear-attention hybrids, MiniMax sparse, a block-scaled KV
dtype (MXFP8, FP4: its own pool classes), the pool classes chosen by flags
(``--enable-page-major-kv-layout``, ``--enable-kv-cache-sharding``,
``--prefill-only-disable-kv-cache``), Ascend, and DeepSeek-V4 without a pool run.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from sglang_dsv4_guard.launch.derive import ModelFacts, Side
from sglang_dsv4_guard.launch.edit import typed_flags
from sglang_dsv4_guard.launch.endpoint import CONTRIBUTORS, NotDerived
from sglang_dsv4_guard.launch.parse import offline_env
from sglang_dsv4_guard.launch.pools import last_run, state_type_names
from sglang_dsv4_guard.log import LOGGER_NAME, silenced
from sglang_dsv4_guard.pd.endpoint import Value

__all__ = ["pool_kind", "registered_state"]

log = logging.getLogger(LOGGER_NAME)
_ROWS = 64
# Flags with which the release's configurator builds another pool class (page-major,
# page-interleaved, no-op) than the one built here.
_CLASS_FLAGS = ("enable_page_major_kv_layout", "enable_kv_cache_sharding",
                "prefill_only_disable_kv_cache")
_POOLS = {"mha": "MHATokenToKVPool", "mla": "MLATokenToKVPool",
          "swa": "SWAKVPool over MHATokenToKVPool",
          "unified_swa": "init_unified_swa_pools' UnifiedSWAKVPool"}


def _said(side: Side, name: str) -> tuple[Any, ...]:
    """``name`` as the line typed it (``True`` for a switch) and as SGLang's resolution
    left it, each only when there is one."""
    typed = typed_flags(list(side.args.argv)).get(name)
    values = [] if typed is None else [True if typed[1] is None else typed[1]]
    resolved = side.args.resolved_field(name, None)
    return tuple(v for v in (*values, resolved) if v is not None)


def kv_dtype(side: Side) -> str:
    """The server's KV cache dtype string as SGLang resolved it, as the line typed it when
    resolution did not complete (``auto`` when neither)."""
    said = _said(side, "kv_cache_dtype")
    return str(said[-1]) if said else "auto"


def _other_class(side: Side) -> bool:
    """A KV cache dtype with block scales (MXFP8, FP4) or a flag that makes the release's
    configurator build another pool class, as typed or as resolved."""
    if any("mxfp" in str(d) or "fp4" in str(d) for d in _said(side, "kv_cache_dtype")):
        return True
    return any(v in ("ascend", "npu") for n in ("attention_backend", "device")
               for v in _said(side, n)) or any(any(_said(side, f)) for f in _CLASS_FLAGS)


def _model_kind(model: ModelFacts) -> str | None:
    """The pool SGLang's configurator builds for ``model``, by its own predicates, when it
    is one of the kinds built here; ``None`` otherwise."""
    config = model.config
    if config is None or model.is_dsv4:
        return None
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.configs.model_config import is_deepseek_dsa, is_minimax_sparse

    hf = config.hf_config
    if mambaish_config(config) is not None or is_minimax_sparse(hf) or is_deepseek_dsa(hf):
        return None
    if model.attention_arch == "MLA":
        return None if model.is_hybrid_swa else "mla"
    if model.attention_arch != "MHA":
        return None
    return "swa" if model.is_hybrid_swa else "mha"


def _unified(side: Side) -> bool:
    """``--enable-unified-memory`` as resolved (its resolution also sets the page-major
    layout flag, which alone means another pool class)."""
    # Only as resolved: a release whose resolution refuses unified memory with PD (before
    # 0.5.22) never builds that pool, and its line is judged as the pool it types for.
    return side.args.resolved and bool(side.args.resolved_field("enable_unified_memory"))


def pool_kind(side: Side) -> str | None:
    """``"dsv4"``, ``"mha"``, ``"mla"``, ``"swa"`` or ``"unified_swa"`` (a hybrid-SWA MHA
    model with unified memory: SGLang's configurator builds ``init_unified_swa_pools``'
    pool for it, 0.5.22+): the server's pool when it is one this module knows (see the
    module's docstring); ``None`` for any other (unknown)."""
    if _unified(side):
        dtype_other = any("mxfp" in str(d) or "fp4" in str(d)
                          for d in _said(side, "kv_cache_dtype"))
        if dtype_other or side.model.is_dsv4 or _model_kind(side.model) != "swa" \
                or (kv_dtype(side) == "auto" and _quantized_kv(side.model)):
            return None
        return "unified_swa"
    if _other_class(side):
        return None
    if side.model.is_dsv4:
        return "dsv4"
    if kv_dtype(side) == "auto" and _quantized_kv(side.model):
        return None  # the model's quantization config may give a block-scaled KV pool
    return _model_kind(side.model)


def _quantized_kv(model: ModelFacts) -> bool:
    quant = getattr(getattr(model.config, "hf_config", None), "quantization_config", None)
    return isinstance(quant, dict) and bool(quant.get("kv_cache_quant_algo"))


def unified_pool() -> Any:
    """A miniature unified SWA pool by SGLang's own ``init_unified_swa_pools``."""
    import torch
    from sglang.srt.mem_cache.unified_memory_pool import init_unified_swa_pools

    wanted: dict[str, Any] = dict(
        device="cpu", kv_cache_dtype=torch.bfloat16, head_num=1, head_dim=8, v_head_dim=8,
        swa_head_num=1, swa_head_dim=8, swa_v_head_dim=8, page_size=1, start_layer=0,
        end_layer=2, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
        full_max_total_num_tokens=_ROWS, swa_max_total_num_tokens=_ROWS, total_bytes=None,
        enable_memory_saver=False, need_sort=True)
    params = inspect.signature(init_unified_swa_pools).parameters
    return init_unified_swa_pools(**{k: v for k, v in wanted.items() if k in params}
                                  ).token_to_kv_pool


def _pool(kind: str) -> Any:
    if kind == "unified_swa":
        return unified_pool()
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    common: dict[str, Any] = dict(size=_ROWS, page_size=1, dtype=torch.bfloat16,
                                  device="cpu", enable_memory_saver=False)
    if kind == "mla":
        cls: Any = MLATokenToKVPool
        wanted = dict(common, kv_lora_rank=8, qk_rope_head_dim=8, layer_num=1)
    elif kind == "mha":
        cls = MHATokenToKVPool
        wanted = dict(common, head_num=1, head_dim=8, layer_num=1)
    else:
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        cls = SWAKVPool
        wanted = dict(common, size_swa=_ROWS, head_num=1, head_dim=8,
                      swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
                      layer_num=2, enable_kvcache_transpose=False,
                      token_to_kv_pool_class=MHATokenToKVPool)
    params = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in wanted.items() if k in params})


@functools.lru_cache(maxsize=16)
def registered_state(kind: str, draft_kind: str | None = None
                     ) -> tuple[tuple[str, ...], bool] | str:
    """``(state types, is_hybrid_mla_backend)`` as the release's ``setup_state_kv_args``
    registers them for a miniature ``kind`` pool (and a ``draft_kind`` draft pool), or
    the reason it could not run."""
    from sglang.srt.disaggregation.utils import setup_state_kv_args

    # deferred: samples loads SGLang's KVArgs; check imports it only when a pool is built
    from sglang_dsv4_guard.samples import new_kv_args

    try:
        with offline_env(), silenced():
            kv_args = new_kv_args()
            draft = _pool(draft_kind) if draft_kind else None
            setup_state_kv_args(kv_args, _pool(kind), draft)
    except Exception as exc:  # the release's constructor or function refused: unknown
        log.debug("state types of a %s pool not derived: %s", kind, exc, exc_info=True)
        return f"{type(exc).__name__}: {exc}"
    return state_type_names(kv_args), bool(getattr(kv_args, "is_hybrid_mla_backend", False))


def _built(side: Side, kind: str) -> dict[str, Value]:
    draft_kind = _model_kind(side.draft) if side.draft is not None else None
    if side.draft is not None and draft_kind is None:
        return {}  # a draft pool not built here: what the call registers is unknown
    got = registered_state(kind, draft_kind)
    if isinstance(got, str) and kind == "unified_swa":
        # SGLang's own setup_state_kv_args refuses the pool it would build (before 0.5.22:
        # "unified layout has no per-layer contiguous regions; ... disaggregation is
        # unsupported"): the server stops when its KV manager is set up, before any request.
        raise NotDerived(f"SGLang's setup_state_kv_args refuses the unified SWA pool "
                         f"--enable-unified-memory gives ({got}): the server would stop when "
                         "its KV transfer is set up; its state types are not derived and the "
                         "rows that need them are not judged")
    if isinstance(got, str):
        return {}
    types, hybrid_mla = got
    m = side.model
    draft = (f", with a miniature {_POOLS[draft_kind]} draft pool for {side.draft.path}"
             if side.draft is not None and draft_kind else "")
    source = (f"SGLang's setup_state_kv_args on a miniature bf16 {_POOLS[kind]}{draft} (the pool "
              f"SGLang's KV-cache configurator builds for {m.path}/config.json: attention "
              f"{m.attention_arch}{', hybrid SWA' if m.is_hybrid_swa else ''}, KV cache "
              f"dtype {kv_dtype(side)})")
    return {"state_types": Value(types, source),
            "is_hybrid_mla_backend": Value(hybrid_mla, source)}


def _from_pool_run(side: Side) -> dict[str, Value]:
    run = last_run(side)
    if run is None or run.state_types is None:
        return {}
    source = ("SGLang's setup_state_kv_args on the miniature DeepSeekV4TokenToKVPool target "
              f"and draft pools of the {side.role} server (compress ratios "
              f"{list(run.target_ratios)}, draft {list(run.draft_ratios)})")
    return {"state_types": Value(run.state_types, source)}


def _contribute(side: Side, values: dict[str, Value]) -> dict[str, Value]:
    del values
    kind = pool_kind(side)
    if kind is None:
        return {}
    return _from_pool_run(side) if kind == "dsv4" else _built(side, kind)


CONTRIBUTORS.append(_contribute)
