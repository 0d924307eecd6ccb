"""Everything of SGLang the guard depends on, as data: declared once, read everywhere.

Patching (:mod:`sglang_dsv4_guard.patching`), the snapshots (:mod:`sglang_dsv4_guard.state.
snapshot`, :mod:`sglang_dsv4_guard.mori.snapshot`), SGLang's hook registry
(:mod:`sglang_dsv4_guard.hook_registry`), the code digests (:mod:`sglang_dsv4_guard.host.
digests`), rendering and the CLI read these names; none spells one out itself (but
``check/``, which builds SGLang's own parser, config and pools for ``check``:
``tests/test_spelling.py`` holds the rest of the package to it). The pool attributes are
covered by the code digests; the MORI attributes (``MORI_*_ATTRS``) are not, only the
MORI check's source is. A target is a module and a qualified name inside it (``"func"``
or ``"Class.method"``), resolved on the object that defines it (a class's MRO is walked).
Nothing here imports SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AUTOSHARE_POOL_ATTRS",
    "CALLERS",
    "CONTACT_INFO_FIELDS",
    "CONTACT_MANAGER_ATTRS",
    "CUDA_GRAPH_CONFIG",
    "DSV4_LAYOUT_ENV",
    "DSV4_POOL",
    "ENVIRON_MODULE",
    "FLASHMLA_ENV",
    "KV_ARGS",
    "MAPPING_ATTR",
    "MORI_KV_ARGS_ATTRS",
    "MORI_MANAGER_ATTRS",
    "MORI_MODULE",
    "MORI_PEER_ATTRS",
    "MORI_REGISTER",
    "MORI_SEND",
    "MORI_SERVER_ARGS_ATTRS",
    "MORI_TARGETS",
    "PD_AUX_CODEC",
    "PD_AUX_COUNT",
    "PD_BASE_MODULE",
    "PD_COMMON_MANAGER",
    "PD_COMMON_MODULE",
    "PD_DSV4_LAYOUT",
    "PD_ENTRY_PAIRS",
    "PD_FAKE_MANAGER",
    "PD_FIRST_CONTACT",
    "PD_HEAD_SLICE",
    "PD_KV_DTYPE",
    "PD_MAMBA_SENDERS",
    "PD_MAMBA_SLICE",
    "PD_METADATA_BUFFERS",
    "PD_MOONCAKE_MODULE",
    "PD_MOONCAKE_SEND_AUX",
    "PD_MOONCAKE_SEND_EXTRA",
    "PD_MORI_SEND_AUX",
    "PD_MORI_SEND_STATE",
    "PD_NIXL_MODULE",
    "PD_NIXL_PAYLOAD",
    "PD_NIXL_SEND_AUX",
    "PD_NIXL_SEND_EXTRA",
    "PD_NIXL_STATE",
    "PD_POP_PREALLOCATED",
    "PD_QUANT_CONFIG",
    "PD_RECEIVER_INIT",
    "PD_RELAYOUT",
    "PD_SERVER_INFO",
    "PD_STATE_TYPE",
    "PEERS_INFO_ATTRS",
    "PEERS_KV_ARGS_ATTRS",
    "PEERS_MANAGER_ATTRS",
    "PEERS_MOONCAKE_BOOTSTRAP",
    "PEERS_MOONCAKE_PARSE",
    "PEERS_MOONCAKE_START",
    "PEERS_MOONCAKE_VALIDATE",
    "PEERS_MOONCAKE_WORKER",
    "PEERS_NIXL_REGISTER",
    "PEERS_SERVER_ARGS_ATTRS",
    "PLUGINS_MODULE",
    "PLUGIN_GROUP",
    "POOL_ATTRS",
    "POOL_REGISTER",
    "POOL_REGISTER_TARGET",
    "REGISTRY_MODULE",
    "RESOLVED_BAG_ACCESSORS",
    "RUNTIME_CONTEXT",
    "SCHEDULER_MODULE",
    "SERVER_ARGS_ACCESSOR",
    "SERVER_ARGS_MODULE",
    "STATE",
    "STATE_HOLDERS",
    "STATE_IS_NPU",
    "PatchTarget",
    "pool_attributes_read",
]


@dataclass(frozen=True)
class PatchTarget:
    """``module`` and ``qualname`` ("func" or "Class.method") of something in SGLang."""

    module: str
    qualname: str

    def __str__(self) -> str:
        return f"{self.module}.{self.qualname}"

    @property
    def attr(self) -> str:
        """The last component of ``qualname``: the attribute that is wrapped."""
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def path(self) -> str:
        """The module's source file, relative to the ``sglang`` package directory
        (``sglang.srt.disaggregation.utils`` -> ``srt/disaggregation/utils.py``)."""
        parts = self.module.split(".")
        if parts[0] != "sglang":
            raise ValueError(f"not a module of the sglang package: {self.module!r}")
        return "/".join(parts[1:]) + ".py"


# -- SGLang's modules that hold several targets -----------------------------------------

_UTILS_MODULE = "sglang.srt.disaggregation.utils"
_PREFILL_MODULE = "sglang.srt.disaggregation.prefill"
_DECODE_MODULE = "sglang.srt.disaggregation.decode"
_DSV4_POOL_MODULE = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
PD_BASE_MODULE = "sglang.srt.disaggregation.base.conn"
PD_COMMON_MODULE = "sglang.srt.disaggregation.common.conn"
PD_MOONCAKE_MODULE = "sglang.srt.disaggregation.mooncake.conn"
PD_NIXL_MODULE = "sglang.srt.disaggregation.nixl.conn"
MORI_MODULE = "sglang.srt.disaggregation.mori.conn"

# -- Wrapped functions ------------------------------------------------------------------

STATE = PatchTarget(_UTILS_MODULE, "setup_state_kv_args")
#: The modules that bind ``setup_state_kv_args`` to a name: the definer and the two
#: bootstrap queues that import it (``from ..utils import setup_state_kv_args``).
STATE_HOLDERS = (STATE.module, _PREFILL_MODULE, _DECODE_MODULE)

MORI_SEND = PatchTarget(MORI_MODULE, "MoriKVManager._send_swa_dsa_state")
MORI_REGISTER = PatchTarget(MORI_MODULE, "MoriKVManager._add_remote_peer")
MORI_TARGETS = (MORI_SEND, MORI_REGISTER)

#: Decode peers' registration and the threads that die of it (``peers/``): NIXL's
#: registration method (run in its bootstrap thread), Mooncake's transfer worker (a
#: thread target) and the method that starts Mooncake's prefill bootstrap thread, whose
#: ``decode_kv_args_table`` the guard watches (the thread is a closure of it).
PEERS_NIXL_REGISTER = PatchTarget(PD_NIXL_MODULE, "NixlKVManager._add_remote_peer")
PEERS_MOONCAKE_WORKER = PatchTarget(PD_MOONCAKE_MODULE, "MooncakeKVManager.transfer_worker")
PEERS_MOONCAKE_START = PatchTarget(PD_MOONCAKE_MODULE, "MooncakeKVManager.start_prefill_thread")
#: Mooncake's verdict on a registering decode peer's state layout (0.5.22+): a reason
#: rejects every state transfer to that peer (``pd/state_layout.py``).
PEERS_MOONCAKE_VALIDATE = PatchTarget(PD_MOONCAKE_MODULE,
                                      "MooncakeKVManager._validate_peer_state_layout")
#: Mooncake's parse of a decode peer's registration message, a classmethod the bootstrap
#: closure calls once per registration (before 0.5.22 the guard checks the peer there, so
#: the peer table stays SGLang's own ``dict``).
PEERS_MOONCAKE_PARSE = PatchTarget(PD_MOONCAKE_MODULE, "KVArgsRegisterInfo.from_zmq")
#: Mooncake's bootstrap closure (of ``start_prefill_thread``, digested with it as
#: ``peers.mooncake_start``) and its local holding the registering decode peer's
#: ``KVArgsRegisterInfo`` when it calls ``requires_dcp_relayout``.
PEERS_MOONCAKE_BOOTSTRAP = ("bootstrap_thread", "decode_kv_args")


@dataclass(frozen=True)
class _CallerRole:
    """A module of SGLang that calls ``setup_state_kv_args``: its role and, for people,
    the class that calls it."""

    role: str
    describe: str


#: SGLang's own callers of ``setup_state_kv_args``, by module.
CALLERS: dict[str, _CallerRole] = {
    _PREFILL_MODULE: _CallerRole("prefill", "prefill server (PrefillBootstrapQueue)"),
    _DECODE_MODULE: _CallerRole("decode", "decode server (DecodePreallocQueue)"),
}

# -- Other SGLang objects the guard reads -----------------------------------------------

# The prefill/decode contract (``pd/``): where SGLang compares the two servers.
PD_FIRST_CONTACT = PatchTarget(PD_COMMON_MODULE, "CommonKVManager.try_ensure_parallel_info")
#: What the run-time first-contact report reads of the live decode manager (``self`` of
#: ``try_ensure_parallel_info``): the values its comparisons read, by the endpoint name
#: :mod:`sglang_dsv4_guard.pd.first_contact` gives them, and the dotted attribute
#: (0.5.16 compares ``server_args.kv_cache_dtype``; 0.5.17+ ``kv_cache_dtype_str``).
CONTACT_MANAGER_ATTRS = (
    ("page_size", "kv_args.page_size"), ("kv_cache_dtype_str", "kv_cache_dtype_str"),
    ("attn_tp_size", "attn_tp_size"), ("attn_cp_size", "attn_cp_size"),
    ("attn_dp_size", "attn_dp_size"), ("pp_size", "pp_size"), ("dcp_size", "dcp_size"),
    ("is_mla_backend", "is_mla_backend"), ("is_hybrid_mla_backend", "is_hybrid_mla_backend"),
    ("kv_layout", "kv_layout"), ("dsv41_spec_layout", "dsv41_spec_layout"),
    ("state_types", "kv_args.state_types"),
    ("enable_all_cp_ranks_for_transfer", "enable_all_cp_ranks_for_transfer"),
)
#: The ``PrefillServerInfo`` fields (the prefill's ``/route`` answer) by endpoint name.
CONTACT_INFO_FIELDS = (
    ("attn_tp_size", "attn_tp_size"), ("attn_cp_size", "attn_cp_size"),
    ("attn_dp_size", "dp_size"), ("pp_size", "pp_size"), ("page_size", "page_size"),
    ("kv_cache_dtype_str", "kv_cache_dtype"), ("follow_bootstrap_room", "follow_bootstrap_room"),
    ("enable_dsa_cache_layer_split", "enable_dsa_cache_layer_split"),
    ("dsv41_spec_layout", "dsv41_spec_layout"), ("kv_layout", "kv_layout"),
    ("decode_allocation_policy", "decode_allocation_policy"),
    ("enable_kv_cache_sharding", "enable_kv_cache_sharding"),
)
# Decode's first contact (``pd/first_contact.py``) and the DCP relayout at registration
# (``pd/relayout.py``): the manager class whose methods run on a bare instance, the
# ``/route`` answer's dataclass, the state types a pool publishes.
PD_COMMON_MANAGER = "CommonKVManager"
PD_SERVER_INFO = "PrefillServerInfo"
#: The ``fake`` transfer backend's manager (a ``BaseKVManager``, not a ``CommonKVManager``,
#: 0.5.16 - 0.5.23): a decode with it makes no first contact where it lacks
#: :data:`PD_FIRST_CONTACT`'s method.
PD_FAKE_MANAGER = PatchTarget("sglang.srt.disaggregation.fake.conn", "FakeKVManager")
PD_RELAYOUT = PatchTarget(PD_COMMON_MODULE, "CommonKVManager.requires_dcp_relayout")
#: The decode receiver's per-request set-up (0.5.22+: the decode allocation policies).
PD_RECEIVER_INIT = PatchTarget(PD_COMMON_MODULE, "CommonKVReceiver.init")
PD_STATE_TYPE = "StateType"
#: The KV cache dtype string a runner publishes (``configure_kv_cache_dtype``, 0.5.16+).
PD_KV_DTYPE = PatchTarget("sglang.srt.mem_cache.kv_cache_dtype", "configure_kv_cache_dtype")
#: The checkpoint's quantization config as the model loader builds it from config.json
#: (``get_quant_config``, 0.5.16+): the ``model.quant_config`` the KV cache dtype reads.
PD_QUANT_CONFIG = PatchTarget("sglang.srt.model_loader.weight_utils", "get_quant_config")
#: The DeepSeek-V4 pool's PD KV layout (0.5.23): its selector and the pool method.
PD_DSV4_LAYOUT = PatchTarget(_DSV4_POOL_MODULE, "select_dsv4_kv_layout")
#: The transfer-time rows (``pd/send_extra.py``, ``host/pd_digests.py``): the functions
#: whose conditions are digested and evaluated, and the ones called on half-built objects.
PD_MOONCAKE_SEND_EXTRA = PatchTarget(PD_MOONCAKE_MODULE, "MooncakeKVManager.maybe_send_extra")
PD_NIXL_SEND_EXTRA = PatchTarget(PD_NIXL_MODULE, "NixlKVManager.maybe_send_extra")
PD_HEAD_SLICE = PatchTarget(PD_COMMON_MODULE, "CommonKVManager._get_mha_head_slice_blocks")
#: NIXL's and MORI's per-request refusal of a replicated Mamba state (``pd/mamba_state.py``,
#: 0.5.20+): the methods run on a half-built manager (NIXL's ``maybe_send_extra`` above,
#: MORI's ``send_state``) and the instance methods they send Mamba state with, stopped
#: on that manager.
PD_MORI_SEND_STATE = PatchTarget(MORI_MODULE, "MoriKVManager.send_state")
PD_MAMBA_SENDERS = ("_send_mamba_state", "_send_mamba_state_slice")
#: The Mamba slice transfer's byte blocks and entry pairing (``pd/mamba_slice.py``,
#: 0.5.20+), as each connector module binds them (``from ..utils import ...``).
PD_MAMBA_SLICE = PatchTarget(_UTILS_MODULE, "compute_mamba_state_slice_byte_blocks")
PD_ENTRY_PAIRS = PatchTarget(_UTILS_MODULE, "build_transfer_entry_pairs")
PD_NIXL_PAYLOAD = PatchTarget(PD_NIXL_MODULE, "NixlKVManager._prepare_payload_xfer")
#: NIXL's prepared state transfer (0.5.23+), run when a decode peer registers
#: (``pd/nixl_state.py``); its rejection is raised per request by ``maybe_send_extra``.
PD_NIXL_STATE = PatchTarget(PD_NIXL_MODULE, "NixlKVManager._prepare_state_xfer")
PD_POP_PREALLOCATED = PatchTarget(_DECODE_MODULE, "DecodePreallocQueue.pop_preallocated")
PD_AUX_COUNT = PatchTarget(PD_COMMON_MODULE, "CommonKVManager.check_peer_aux_buffer_count")
PD_METADATA_BUFFERS = PatchTarget(_UTILS_MODULE, "MetadataBuffers")
#: The transfer of the metadata buffers (``pd/aux_send.py``, ``pd/aux_count.py``): each backend's
#: ``send_aux`` (digested, run from its parsed source), and the codec its TCP path and the
#: decode's receiving side use.
PD_MOONCAKE_SEND_AUX = PatchTarget(PD_MOONCAKE_MODULE, "MooncakeKVManager.send_aux")
PD_NIXL_SEND_AUX = PatchTarget(PD_NIXL_MODULE, "NixlKVManager.send_aux")
PD_MORI_SEND_AUX = PatchTarget(MORI_MODULE, "MoriKVManager.send_aux")
PD_AUX_CODEC = PatchTarget("sglang.srt.disaggregation.common.utils", "AuxDataCodec")
ENVIRON_MODULE = "sglang.srt.environ"
#: SGLang's plug-in loader (``load_plugins_by_group``), and the entry-point group it loads
#: general plug-ins from (the one ``pyproject.toml`` declares the guard in).
PLUGINS_MODULE = "sglang.srt.plugins"
PLUGIN_GROUP = "sglang.srt.plugins"

REGISTRY_MODULE = "sglang.srt.plugins.hook_registry"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
#: ``ServerArgs`` (its ``add_cli_args`` is the release's flag table, ``host/flags.py``).
SERVER_ARGS_MODULE = "sglang.srt.server_args"
RUNTIME_CONTEXT = "sglang.srt.runtime_context"
#: The accessor of :data:`RUNTIME_CONTEXT` that returns this process' ``ServerArgs`` (the
#: scheduler publishes it before it builds any pool; it raises ``ValueError`` until then).
#: Present from 0.5.16 to 0.5.23; ``server_args.get_global_server_args`` is a shim over it
#: up to 0.5.19 and raises from 0.5.20, so the guard reads this one.
SERVER_ARGS_ACCESSOR = "get_server_args"
#: The accessors of :data:`RUNTIME_CONTEXT` that return its resolved namespace bags (from
#: 0.5.17; ``ValueError`` until published). From 0.5.20 :data:`SERVER_ARGS_ACCESSOR`
#: answers the operator's raw input and these the values in effect, so the guard reads
#: these wherever the release has them.
RESOLVED_BAG_ACCESSORS = ("get_schedule", "get_spec", "get_exec", "get_memory", "get_model",
                          "get_device", "get_disagg", "get_serving", "get_observability",
                          "get_lora", "get_mm")
CUDA_GRAPH_CONFIG = "sglang.srt.model_executor.cuda_graph_config"
KV_ARGS = PatchTarget(PD_BASE_MODULE, "KVArgs")
DSV4_POOL = PatchTarget(_DSV4_POOL_MODULE, "DeepSeekV4TokenToKVPool")
#: The pool method auto-share calls to rebind the draft's mapping (SGLang's own).
POOL_REGISTER = "register_mapping"
#: ``register_mapping`` as the guard observes it (``state/provenance.py``): which code
#: registered each pool's mapping, once the guard is installed.
POOL_REGISTER_TARGET = PatchTarget(DSV4_POOL.module, f"{DSV4_POOL.qualname}.{POOL_REGISTER}")
#: The function of :data:`STATE`'s module its DeepSeek-V4 block calls first on releases
#: with ``npu_gate`` (``not is_npu()``); read from that module as the wrapped code sees it.
STATE_IS_NPU = "is_npu"

# -- Attributes -------------------------------------------------------------------------

#: The pool attributes SGLang's DSV4 draft block reads, in the order it reads them
#: (dotted: an attribute of an attribute).
POOL_ATTRS = (
    "compression_ratios",
    "_unified_kv",
    "unified_swa_window",
    "unified_swa_ring_size",
    "unified_swa_pages",
    "page_size",
    "sliding_window",
    "swa_req_ring_size",
    "request_window.capacity",
)
#: Pool attributes the auto-share rule compares beyond what SGLang's check reads.
AUTOSHARE_POOL_ATTRS = ("swa_size",)
#: The mapping tensor, read by identity, pointer and version (``state/tensors.py``).
MAPPING_ATTR = "full_to_swa_index_mapping"

#: What the MORI snapshot reads from ``MoriKVManager``, from its ``server_args`` and
#: ``kv_args``, and from a decode peer (``KVArgsRegisterInfo``; ``engine_key`` is a
#: property over its engine descriptor). These are not digested: a change in how SGLang
#: sets them is not seen by the code digests (the MORI check's own source is).
MORI_MANAGER_ATTRS = ("server_args", "kv_args", "is_mla_backend", "attn_tp_size", "pp_size")
MORI_SERVER_ARGS_ATTRS = ("tp_size", "dp_size", "enable_dp_attention", "attn_cp_size")
MORI_KV_ARGS_ATTRS = ("state_types",)
MORI_PEER_ATTRS = ("decode_tp_size", "engine_key", "endpoint", "dst_port")

#: What the registration snapshot (``peers/snapshot.py``) reads from a Mooncake, NIXL or
#: MORI prefill manager (and ``disaggregation_mode``: whether it is a prefill's), its
#: ``kv_args`` and ``server_args``, and from a decode peer's ``KVArgsRegisterInfo`` (NIXL
#: and MORI name the decode's TP ``decode_tp_size``, Mooncake ``dst_attn_tp_size``). Not
#: digested, like the MORI attributes; a missing one is "not known" in the endpoint,
#: never a default.
PEERS_MANAGER_ATTRS = ("server_args", "kv_args", "is_mla_backend", "is_hybrid_mla_backend",
                       "attn_tp_size", "pp_size", "dcp_size", "dcp_rank", "bootstrap_port",
                       "decode_kv_args_table", "state_tp_size", "_prepared_state_components",
                       "state_mem_descs", "disaggregation_mode")
PEERS_KV_ARGS_ATTRS = ("state_types", "kv_item_lens", "aux_data_ptrs", "swa_kv_cache_layout",
                       "engine_rank", "state_data_ptrs", "state_item_lens", "state_data_lens",
                       "state_layer_ids", "mla_compression_ratios", "state_dim_per_tensor")
PEERS_SERVER_ARGS_ATTRS = ("tp_size", "dp_size", "enable_dp_attention", "attn_cp_size",
                           "speculative_algorithm", "enable_unified_memory",
                           "disaggregation_enable_kv_checksum")
PEERS_INFO_ATTRS = ("decode_tp_size", "dst_attn_tp_size", "dst_dcp_size", "dst_dcp_rank",
                    "dst_kv_mem_kinds", "dst_kv_item_lens", "dst_kv_ptrs", "dst_aux_ptrs",
                    "agent_name", "mooncake_session_id", "endpoint", "dst_port",
                    "dst_state_data_ptrs", "dst_state_item_lens", "dst_state_data_lens",
                    "dst_state_layer_ids", "dst_aux_mem_descs", "dst_state_mem_descs",
                    "dst_state_dim_per_tensor")

#: The variables SGLang's select_dsv4_kv_layout reads (0.5.21+).
DSV4_LAYOUT_ENV = ("SGLANG_DSV4_KV_LAYOUT", "SGLANG_DSV4_COMPRESSED_KV_LAYOUT")
#: The variable whose ``unified_kv_triton`` puts a DeepSeek-V4 server's SWA state in a
#: unified-KV ring (ROCm; ``is_unified_kv_triton``), read by each pool as it is built.
FLASHMLA_ENV = "SGLANG_HACK_FLASHMLA_BACKEND"


def pool_attributes_read() -> tuple[str, ...]:
    """Every attribute of the pool object itself the guard reads (first component of a
    dotted name), in a stable order: what the code digests must cover."""
    names = [name.split(".", 1)[0] for name in (*POOL_ATTRS, *AUTOSHARE_POOL_ATTRS)]
    return tuple(dict.fromkeys([*names, MAPPING_ATTR]))
