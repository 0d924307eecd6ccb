"""Stub ``mori``, ``mori.cpp`` and ``mori.io`` so SGLang's real ``mori/conn.py`` imports on CPU.

AMD's MORI needs ROCm and cannot be installed here. Only the C library is stubbed:
the connector under test is SGLang's own module. Managers are built with
``object.__new__`` plus the attributes the tested methods read.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
from sglang.test.ci.ci_register import register_cpu_ci

# SGLang's run_suite.py collects every *.py next to the tests and requires a registry in
# each; a disabled one marks a helper module (listed as skipped, never run).
register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")

MORI_NAMES = {
    "mori.cpp": ("TransferStatus",),
    "mori.io": ("BackendType", "EngineDesc", "IOEngine", "IOEngineConfig", "MemoryDesc",
                "MemoryLocationType", "PollCqMode", "RdmaBackendConfig", "StatusCode"),
}


def install_stub() -> None:
    """Put the stub modules in ``sys.modules`` (idempotent)."""
    root = sys.modules.setdefault("mori", types.ModuleType("mori"))
    for name, attrs in MORI_NAMES.items():
        module = sys.modules.get(name) or types.ModuleType(name)
        for attr in attrs:
            setattr(module, attr, type(attr, (), {}))
        sys.modules[name] = module
        setattr(root, name.split(".")[1], module)


class _Engine:
    def __init__(self) -> None:
        self.registered: list[Any] = []

    def register_remote_engine(self, desc: Any) -> None:
        self.registered.append(desc)


class _EngineDesc:
    def __init__(self, key: str) -> None:
        self.key = key


def manager(conn: Any, *, attn_tp: int = 8, mla: bool = False, pp: int = 1,
            state_types: tuple[str, ...] = ("swa",)) -> Any:
    """A prefill MoriKVManager with the attributes the wrapped methods read."""
    from sglang.srt.disaggregation.base.conn import KVArgs, StateType
    from sglang.srt.disaggregation.utils import DisaggregationMode

    mgr = object.__new__(conn.MoriKVManager)
    kv_args = KVArgs()
    kv_args.state_types = [StateType(s) for s in state_types]
    kv_args.aux_data_ptrs = []
    kv_args.kv_item_lens = []
    kv_args.num_draft_entries = 0
    values = dict(is_mla_backend=mla, is_hybrid_mla_backend=False, attn_tp_size=attn_tp,
                  state_tp_size=attn_tp, pp_size=pp, kv_args=kv_args, dcp_size=1, dcp_rank=0,
                  server_args=types.SimpleNamespace(tp_size=attn_tp, dp_size=1,
                                                    enable_dp_attention=False),
                  engine=_Engine(), decode_kv_args_table={},
                  disaggregation_mode=DisaggregationMode.PREFILL)
    for name, value in values.items():
        setattr(mgr, name, value)
    return mgr


def peer(conn: Any, key: str = "decode-0", decode_tp: int = 8) -> Any:
    """A real KVArgsRegisterInfo for a decode peer."""
    return conn.KVArgsRegisterInfo(
        endpoint="10.0.0.2", dst_port=17000, engine_desc=_EngineDesc(key),
        dst_kv_mem_descs=[], dst_aux_mem_descs=[], dst_state_mem_descs=[], gpu_id=0,
        decode_tp_size=decode_tp, decode_tp_rank=0, dst_kv_item_len=0,
        dst_state_item_lens=[], dst_state_dim_per_tensor=[])


def send_args(conn: Any, p: Any, state_type: str) -> tuple[Any, ...]:
    """Positional arguments after ``self`` for the installed signature: a trivial plan."""
    import inspect

    params = list(inspect.signature(conn.MoriKVManager._send_swa_dsa_state).parameters)[1:]
    one = np.array([0], dtype=np.int32)
    values = {"peer_info": p, "src_state_indices": one, "dst_state_indices": one.copy(),
              "src_state_mem_descs": [], "src_state_item_lens": [], "dst_state_mem_descs": [],
              "dst_state_item_lens": [], "state_type": state_type, "src_layer_ids": [],
              "dst_layer_ids": []}
    return tuple(values[name] for name in params)
