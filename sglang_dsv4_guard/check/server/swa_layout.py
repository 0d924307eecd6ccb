"""The SWA KV cache layout a hybrid sliding-window server registers
(``kv_args.swa_kv_cache_layout``), as SGLang's own pool and ``setup_state_kv_args`` give it.

The head-sliced SWA transfer (0.5.22+, ``common/conn.py``
``CommonKVManager._get_mha_head_slice_blocks``) refuses a prefill whose SWA layout is not
``nhd``. ``setup_state_kv_args`` (``disaggregation/utils.py``) copies it from the pool's
``swa_kv_pool.kv_cache_layout``. Which pool: with ``--enable-unified-memory``,
``mem_cache/kv_cache_configurator.py`` builds the unified SWA pool for a hybrid-SWA model
that is not DeepSeek-V4 (``_init_unified_swa_pools`` -> ``unified_memory_pool.py``
``init_unified_swa_pools``: a ``UnifiedSWAKVPool`` whose SWA pool is ``page_major``);
otherwise the ``SWAKVPool`` :mod:`.state_types` builds. Each is built here by SGLang's own
constructor, on CPU, in the server's environment (``SGLANG_USE_HND_KVCACHE`` gives
``hnd``), with tiny sizes; the layout is what SGLang's ``setup_state_kv_args`` wrote.
``SGLANG_AITER_KV_CACHE_LAYOUT`` only counts on ROCm with AITER (``memory_pool.py``
``MHATokenToKVPool.__init__``): set to anything but ``nhd``, the layout depends on the
hardware, and the value is given as unknown (``None``, its source saying why).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping

from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.check.server.endpoint_values import CONTRIBUTORS, field_source, raw_field
from sglang_dsv4_guard.check.server.state_types import (
    Refused,
    miniature_pool,
    pool_kind,
    probing,
    registered_state,
    unified_pool,
)
from sglang_dsv4_guard.codes import KV_SETUP_REFUSED
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.pd.endpoint import Value

__all__ = ["registered_layout"]

log = logging.getLogger(LOGGER_NAME)
AITER = "SGLANG_AITER_KV_CACHE_LAYOUT"


@functools.lru_cache(maxsize=8)
def registered_layout(unified: bool, env: tuple[tuple[str, str], ...] = ()
                      ) -> tuple[str | None, bool] | Refused | str:
    """``(layout, present)``: ``kv_args.swa_kv_cache_layout`` as the release's
    ``setup_state_kv_args`` writes it for the pool (``present`` False on a release whose
    ``KVArgs`` has no such field); :class:`~.state_types.Refused` when SGLang's own KV
    setup refuses the pool in this environment (``SGLANG_USE_HND_KVCACHE``: the server
    stops); the reason, when the pool could not be built here."""
    from sglang.srt.disaggregation.utils import setup_state_kv_args

    # deferred: samples loads SGLang's KVArgs; check imports it only when a pool is built
    from sglang_dsv4_guard.samples import new_kv_args

    got = registered_state("unified_swa" if unified else "swa", None, (), env)
    if isinstance(got, Refused):
        return got
    try:
        with probing(env):
            kv_args = new_kv_args()
            setup_state_kv_args(kv_args, unified_pool() if unified else miniature_pool("swa"), None)
    except Exception as exc:  # the release's constructor or function refused: unknown
        log.debug("SWA layout (unified=%s) not derived: %s", unified, exc, exc_info=True)
        return f"{type(exc).__name__}: {exc}"
    present = hasattr(kv_args, "swa_kv_cache_layout")
    layout = getattr(kv_args, "swa_kv_cache_layout", None)
    return (None if layout is None else str(layout)), present


def _contribute(side: DerivedServer, values: dict[str, Value]) -> dict[str, Value]:
    if pool_kind(side) not in ("swa", "unified_swa"):
        return {}
    env: Mapping[str, str] = side.args.env
    aiter = env.get(AITER)
    if aiter is not None and aiter.lower() != "nhd":
        return {"swa_kv_cache_layout": Value(None, (
            f"not known here: {AITER}={aiter} in the server's environment gives that layout "
            "on ROCm with AITER and NHD elsewhere (the GPU decides)"))}
    unified = bool(raw_field(side, "enable_unified_memory"))
    got = registered_layout(unified, tuple(sorted(env.items())))
    pool = ("SGLang's unified SWA pool (init_unified_swa_pools; "
            + field_source(side, "enable_unified_memory") + ")"
            if unified else "a miniature SWAKVPool")
    if isinstance(got, Refused):
        return {"swa_kv_cache_layout": Value(None, (
            f"not derived: SGLang's {got.function} refuses {pool} in this server's "
            f"environment ({got.message}): the server stops when its KV transfer is set up "
            f"({KV_SETUP_REFUSED})"))}
    if isinstance(got, str):
        return {"swa_kv_cache_layout": Value(None, f"not known here: {pool} could not be "
                                                   f"built on CPU ({got})")}
    layout, present = got
    if not present:
        return {}  # a release that registers no SWA layout (nor refuses one)
    return {"swa_kv_cache_layout": Value(layout, f"SGLang's setup_state_kv_args on {pool}, "
                                                 "built on CPU in this server's environment")}


CONTRIBUTORS.append(_contribute)
