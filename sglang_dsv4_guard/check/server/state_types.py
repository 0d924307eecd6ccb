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
- ``unified_swa``: ``init_unified_swa_pools``' ``UnifiedSWAKVPool`` (the ``swa`` model
  with ``--enable-unified-memory``, 0.5.22+);
- ``minimax``: ``MiniMaxSparseKVPool`` (MiniMax-M3 sparse, ``is_minimax_sparse``, MHA, not
  hybrid SWA), its dense, sparse and value-less sparse layers read from config.json's
  ``sparse_attention_config`` by SGLang's own ``get_minimax_sparse_*`` helpers, the whole
  model on one rank (PP 1; HiSparse and the NVFP4 pool class, chosen by the GPU, not built);
- DeepSeek-V4 is not built again: the state types are read from the run of
  :mod:`.pools` on the server's own miniature ``DeepSeekV4TokenToKVPool``\\ s.

Anything else stays unknown, and the rows that need it say so in ``unknowns``: DSA/NSA,
MLA with hybrid SWA, Mamba and linear-attention hybrids, other MiniMax sparse servers, a
block-scaled KV dtype (MXFP8, FP4: its own pool classes), the pool classes chosen by flags
(``--enable-page-major-kv-layout``, ``--enable-kv-cache-sharding``,
``--prefill-only-disable-kv-cache``), Ascend, and DeepSeek-V4 without a pool run.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sglang_dsv4_guard.check.offline.chatter import leaving_out
from sglang_dsv4_guard.check.offline.parse import offline_env
from sglang_dsv4_guard.check.server.derive import DerivedServer, ModelFacts, kwargs_for
from sglang_dsv4_guard.check.server.endpoint_values import CONTRIBUTORS, NotDerived, typed_value
from sglang_dsv4_guard.check.server.pools import last_run, state_type_names
from sglang_dsv4_guard.log import LOGGER_NAME, silenced
from sglang_dsv4_guard.pd.endpoint import Value

__all__ = ["Refused", "layers_of", "miniature_pool", "minimax_layers", "model_pool_kind",
           "pool_kind", "probing", "registered_state"]

log = logging.getLogger(LOGGER_NAME)
_ROWS = 64
# Flags with which the release's configurator builds another pool class (page-major,
# page-interleaved, no-op) than the one built here.
_CLASS_FLAGS = ("enable_page_major_kv_layout", "enable_kv_cache_sharding",
                "prefill_only_disable_kv_cache")
_POOLS = {"mha": "MHATokenToKVPool", "mla": "MLATokenToKVPool",
          "swa": "SWAKVPool over MHATokenToKVPool", "minimax": "MiniMaxSparseKVPool",
          "unified_swa": "init_unified_swa_pools' UnifiedSWAKVPool"}


def _typed_and_resolved(side: DerivedServer, name: str) -> tuple[Any, ...]:
    """``name``'s :func:`~.endpoint_values.typed_value` and its value as SGLang's
    resolution left it, each only when there is one."""
    values = (typed_value(side, name), side.args.resolved_field(name, None))
    return tuple(v for v in values if v is not None)


def kv_dtype(side: DerivedServer) -> str:
    """The server's KV cache dtype string as SGLang resolved it, as the line typed it when
    resolution did not complete (``auto`` when neither)."""
    said = _typed_and_resolved(side, "kv_cache_dtype")
    return str(said[-1]) if said else "auto"


def _block_scaled(side: DerivedServer) -> bool:
    """A KV cache dtype with block scales (MXFP8, FP4), as typed or as resolved."""
    return any("mxfp" in str(d) or "fp4" in str(d) for d in _typed_and_resolved(side, "kv_cache_dtype"))


def _other_class(side: DerivedServer) -> bool:
    """A block-scaled KV cache dtype, Ascend, or a flag that makes the release's
    configurator build another pool class, as typed or as resolved."""
    return _block_scaled(side) or any(
        v in ("ascend", "npu") for n in ("attention_backend", "device")
        for v in _typed_and_resolved(side, n)) or any(any(_typed_and_resolved(side, f)) for f in _CLASS_FLAGS)


def model_pool_kind(model: ModelFacts) -> str | None:
    """The pool SGLang's configurator builds for ``model``, by its own predicates, when it
    is one of the kinds built here; ``None`` otherwise."""
    config = model.config
    if config is None or model.is_dsv4:
        return None
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.configs.model_config import is_deepseek_dsa, is_minimax_sparse

    hf = config.hf_config
    if is_minimax_sparse(hf):
        # the configurator's MHA branch: hybrid SWA first, then MiniMax sparse
        plain = model.attention_arch == "MHA" and not model.is_hybrid_swa
        return "minimax" if plain and not is_deepseek_dsa(hf) else None
    if mambaish_config(config) is not None or is_deepseek_dsa(hf):
        return None
    if model.attention_arch == "MLA":
        return None if model.is_hybrid_swa else "mla"
    if model.attention_arch != "MHA":
        return None
    return "swa" if model.is_hybrid_swa else "mha"


def minimax_layers(model: ModelFacts) -> tuple[tuple[int, ...], ...]:
    """``(dense, sparse, value-less sparse)`` layer ids as SGLang's own
    ``get_minimax_sparse_*`` helpers read them from ``model``'s config.json."""
    from sglang.srt.configs import model_config as mc

    config = mc.get_minimax_sparse_attention_config(model.config.hf_config)
    dense, sparse = mc.get_minimax_sparse_layer_ids(config)
    return (tuple(dense), tuple(sparse),
            tuple(mc.get_minimax_sparse_disable_value_layer_ids(config)))


def _unified(side: DerivedServer) -> bool:
    """``--enable-unified-memory`` as resolved (its resolution also sets the page-major
    layout flag, which alone means another pool class)."""
    # Only as resolved: a release whose resolution refuses unified memory with PD (before
    # 0.5.22) never builds that pool, and its line is judged as the pool it types for.
    return side.args.resolved and bool(side.args.resolved_field("enable_unified_memory"))


def pool_kind(side: DerivedServer) -> str | None:
    """The server's pool when it is one this module knows (``"dsv4"`` or one of the
    module docstring's kinds); ``None`` for any other (unknown)."""
    if _unified(side):
        if _block_scaled(side) or side.model.is_dsv4 or model_pool_kind(side.model) != "swa" \
                or _quantized_kv(side):
            return None
        return "unified_swa"
    if _other_class(side):
        return None
    if side.model.is_dsv4:
        return "dsv4"
    if _quantized_kv(side):
        return None
    kind = model_pool_kind(side.model)
    if kind == "minimax" and (int(side.args.get("pp_size") or 1) > 1
                              or any(_typed_and_resolved(side, "enable_hisparse"))
                              or any("nvfp4" in str(q) for q in _typed_and_resolved(side, "quantization"))):
        return None  # per-rank layers, HiSparse's pools, the GPU's NVFP4 pool: not built
    return kind


def _quantized_kv(side: DerivedServer) -> bool:
    """``--kv-cache-dtype auto`` on a model whose quantization config may give a
    block-scaled KV pool."""
    quant = getattr(getattr(side.model.config, "hf_config", None), "quantization_config", None)
    return kv_dtype(side) == "auto" and isinstance(quant, dict) and bool(quant.get("kv_cache_quant_algo"))


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
    return init_unified_swa_pools(**kwargs_for(init_unified_swa_pools, wanted)).token_to_kv_pool


def miniature_pool(kind: str, layers: tuple[tuple[int, ...], ...] = ()) -> Any:
    """A miniature ``kind`` pool by SGLang's own constructor (``layers``: a MiniMax pool's
    :func:`minimax_layers`)."""
    if kind == "unified_swa":
        return unified_pool()
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    common: dict[str, Any] = dict(size=_ROWS, page_size=1, dtype=torch.bfloat16,
                                  device="cpu", enable_memory_saver=False)
    if kind == "minimax":
        from sglang.srt.mem_cache.memory_pool import MiniMaxSparseKVPool

        dense, sparse, value_less = layers
        cls: Any = MiniMaxSparseKVPool
        wanted = dict(common, head_num=1, head_dim=8, idx_head_dim=8,
                      dense_layer_ids=list(dense), sparse_layer_ids=list(sparse),
                      disable_value_sparse_layer_ids=list(value_less), start_layer=0,
                      end_layer=len(dense) + len(sparse))
    elif kind == "mla":
        cls = MLATokenToKVPool
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
    return cls(**kwargs_for(cls.__init__, wanted))


@dataclass(frozen=True)
class Refused:
    """SGLang's own refusal, on every machine, of a pool its constructor built here: an
    ``assert`` or ``NotImplementedError`` in the calls the release's KV manager makes at
    start-up. The server stops when its KV transfer is set up."""

    function: str
    message: str

    def __str__(self) -> str:
        return self.message


def _kv_manager_calls(pool: Any, draft: Any, kv_args: Any) -> None:
    """The calls the release's prefill and decode make on their pools when they set up the
    KV manager (``_init_kv_manager``): the transfer buffers' infos
    (``get_kv_transfer_buf_infos``, 0.5.21+, else the pool's ``get_contiguous_buf_infos``),
    the draft's, then ``setup_state_kv_args``."""
    from sglang.srt.disaggregation import utils

    infos = getattr(utils, "get_kv_transfer_buf_infos", None)
    if infos is not None:
        infos(pool)
    else:
        pool.get_contiguous_buf_infos()
    if draft is not None:
        draft.get_contiguous_buf_infos()
    utils.setup_state_kv_args(kv_args, pool, draft)


# The loggers of SGLang's pool classes: what they say of a miniature probe pool ("KV Cache
# is allocated ... #tokens: 64") is not the server's.
POOL_LOGGERS = "sglang.srt.mem_cache"


@contextmanager
def probing(env: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """A miniature pool's build and set-up: in ``env``, offline, the guard's logger quiet.
    What the pool classes log of it is not kept in ``check``'s ``sglang_output`` (the
    server never builds this pool, and the probe is cached, so a process's first check
    alone would say it); what the server's environment makes SGLang warn meanwhile
    ("Invalid value for SGLANG_USE_HND_KVCACHE") is kept, under the server."""
    with offline_env(dict(env)), silenced(), leaving_out(POOL_LOGGERS):
        yield


@functools.lru_cache(maxsize=32)
def registered_state(kind: str, draft_kind: str | None = None,
                     layers: tuple[tuple[int, ...], ...] = (),
                     env: tuple[tuple[str, str], ...] = ()
                     ) -> tuple[tuple[str, ...], bool] | Refused | str:
    """``(state types, is_hybrid_mla_backend)`` as the release's ``setup_state_kv_args``
    registers them for a miniature ``kind`` pool (and a ``draft_kind`` draft pool), built
    and set up as the KV manager does in the environment ``env``; :class:`Refused` when
    SGLang's own calls refuse the pool; the reason, when it could not be built here."""
    # deferred: samples loads SGLang's KVArgs; check imports it only when a pool is built
    from sglang_dsv4_guard.samples import new_kv_args

    with probing(env):
        try:
            kv_args = new_kv_args()
            draft = miniature_pool(draft_kind) if draft_kind else None
            pool = miniature_pool(kind, layers)
        except Exception as exc:  # the release's constructor refused on this CPU: unknown
            log.debug("a %s pool not built: %s", kind, exc, exc_info=True)
            return f"{type(exc).__name__}: {exc}"
        try:
            _kv_manager_calls(pool, draft, kv_args)
        except (AssertionError, NotImplementedError) as exc:  # SGLang's own refusal
            frame = exc.__traceback__
            while frame is not None and frame.tb_next is not None:
                frame = frame.tb_next
            where = frame.tb_frame.f_code.co_name if frame is not None else "its KV setup"
            return Refused(where, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # anything else: not known to be SGLang's verdict
            log.debug("state types of a %s pool not derived: %s", kind, exc, exc_info=True)
            return f"{type(exc).__name__}: {exc}"
    return state_type_names(kv_args), bool(getattr(kv_args, "is_hybrid_mla_backend", False))


def _built(side: DerivedServer, kind: str) -> dict[str, Value]:
    draft_kind = model_pool_kind(side.draft) if side.draft is not None else None
    if side.draft is not None and draft_kind is None:
        return {}  # a draft pool not built here: what the call registers is unknown
    got = registered_state(kind, draft_kind, layers_of(side, kind))
    if isinstance(got, (str, Refused)) and kind == "unified_swa":
        # SGLang's own setup_state_kv_args refuses the pool it would build (before 0.5.22:
        # "unified layout has no per-layer contiguous regions; ... disaggregation is
        # unsupported"): the server stops when its KV manager is set up, before any request.
        raise NotDerived(f"SGLang's setup_state_kv_args refuses the unified SWA pool "
                         f"--enable-unified-memory gives ({got}): the server would stop when "
                         "its KV transfer is set up; its state types are not derived and the "
                         "rows that need them are not judged")
    if isinstance(got, (str, Refused)):
        return {}  # not built here, or refused (kv_setup.py's row says so: the server stops)
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


def layers_of(side: DerivedServer, kind: str | None) -> tuple[tuple[int, ...], ...]:
    """The layers a ``kind`` pool of ``side`` is built with (a MiniMax pool's only)."""
    return minimax_layers(side.model) if kind == "minimax" else ()


def _from_pool_run(side: DerivedServer) -> dict[str, Value]:
    run = last_run(side)
    if run is None or run.state_types is None:
        return {}
    source = ("SGLang's setup_state_kv_args on the miniature DeepSeekV4TokenToKVPool target "
              f"and draft pools of the {side.role} server (compress ratios "
              f"{list(run.target_ratios)}, draft {list(run.draft_ratios)})")
    return {"state_types": Value(run.state_types, source)}


def _contribute(side: DerivedServer, values: dict[str, Value]) -> dict[str, Value]:
    kind = pool_kind(side)
    if kind is None:
        return {}
    return _from_pool_run(side) if kind == "dsv4" else _built(side, kind)


CONTRIBUTORS.append(_contribute)
