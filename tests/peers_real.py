"""Decode registrations and prefill managers for SGLang's real NIXL and Mooncake connectors.

The decode's registration message is built by the release's own sending code (the
receiver's ``_register_kv_args``, which on 0.5.23 calls the manager's
``build_receiver_registration_message``) on a half-built decode manager, captured from a
socket stub and parsed by the release's ``KVArgsRegisterInfo.from_zmq``. The prefill
manager is half-built (``object.__new__`` plus the attributes SGLang's registration code
reads); only the engines (NIXL's agent, Mooncake's transfer engine) and sockets are stubs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import ModuleType, SimpleNamespace
from typing import Any

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")

ITEM = 64
SLOTS = 8


class Agent:
    """NIXL's agent (the ``nixl`` engine): every call accepted, nothing leaves the process."""

    def __init__(self, name: str = "prefill-agent") -> None:
        self.name = name

    def get_agent_metadata(self) -> bytes:
        return b"metadata-of-" + self.name.encode()

    def add_remote_agent(self, metadata: bytes) -> str:
        return metadata.decode().removeprefix("metadata-of-")

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: object()


class Socket:
    """A ZMQ socket: records what is sent; ``recv_multipart`` hands out ``inbox`` then
    ends the thread that reads it (``SystemExit``: a thread ends silently on it)."""

    def __init__(self, inbox: Sequence[list[bytes]] = ()) -> None:
        self.sent: list[list[bytes]] = []
        self.inbox = list(inbox)

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append(list(frames))

    def recv_multipart(self) -> list[bytes]:
        if self.inbox:
            return self.inbox.pop(0)
        raise SystemExit


def _kv_args(regions: int, kinds: Sequence[str], aux: int, state_types: Sequence[Any],
             base: int, state_lens: Sequence[Sequence[int]] = (),
             state_item: int | None = None) -> SimpleNamespace:
    """SGLang's ``KVArgs`` as the tests need it. The SWA KV cache is in the unified pool's
    ``page_major`` layout: 0.5.22+ refuse to head-slice it, earlier releases refuse SWA
    across TP sizes at all, so a non-MLA SWA pool with different TP is refused on every
    release. ``state_lens``: each state component's entries' item lengths (none: the
    components registered no entries); ``state_item``: instead, one state component of
    ``SLOTS`` slots that wide (bytes per slot), registered as the release's pools register
    it."""
    state: dict[str, Any]
    if state_item is not None:
        state = {"state_data_ptrs": [[base + (1 << 16)]], "state_item_lens": [[state_item]],
                 "state_data_lens": [[state_item * SLOTS]], "state_layer_ids": [[0]],
                 "state_dim_per_tensor": [[0]]}
    else:
        state = {"state_data_ptrs": [[base + 65536 * (i + 1) + 4096 * j
                                      for j in range(len(lens))]
                                     for i, lens in enumerate(state_lens)],
                 "state_item_lens": [list(lens) for lens in state_lens],
                 "state_data_lens": [[n * SLOTS for n in lens] for lens in state_lens],
                 "state_layer_ids": [[] for _ in state_lens], "state_dim_per_tensor": []}
    return SimpleNamespace(
        kv_data_ptrs=[base + 4096 * i for i in range(regions)], kv_data_mem_kinds=list(kinds),
        kv_item_lens=[ITEM] * regions, kv_data_lens=[ITEM * SLOTS] * regions,
        kv_layer_ids=list(range(regions)), aux_data_ptrs=[base + 1 + i for i in range(aux)],
        aux_item_lens=[8] * aux, aux_data_lens=[8 * SLOTS] * aux, state_types=list(state_types),
        **state, gpu_id=0, engine_rank=0, page_size=1, num_draft_entries=0,
        swa_kv_cache_layout="page_major")


def registration(conn: ModuleType, backend: str, *, tp: int = 1,
                 kinds: Sequence[str] = ("VRAM", "VRAM"), aux: int = 3, dcp: int = 1,
                 dcp_rank: int = 0, name: str = "decode-0", port: int = 7001,
                 state_lens: Sequence[Sequence[int]] = (), state_item: int | None = None,
                 state_dims: Sequence[Sequence[int]] | None = None) -> Any:
    """A decode rank's registration, sent by the release's own receiver code and parsed by
    its ``KVArgsRegisterInfo.from_zmq``. Returns (the frames, the parsed registration).
    ``state_dims``: each state component's tensors' TP-sharded dimensions (0: replicated)."""
    manager_cls = conn.NixlKVManager if backend == "nixl" else conn.MooncakeKVManager
    receiver_cls = conn.NixlKVReceiver if backend == "nixl" else conn.MooncakeKVReceiver
    mgr = object.__new__(manager_cls)
    mgr.__dict__.update(
        kv_args=_kv_args(len(kinds), kinds, aux, (), 1 << 20, state_lens, state_item),
        enable_staging=False,
        local_ip="10.0.0.2", rank_port=port, agent=Agent(name), attn_tp_size=tp,
        dcp_size=dcp, dcp_rank=dcp_rank, session_id=name,
        engine=SimpleNamespace(get_session_id=lambda: name))
    mgr.get_session_id = lambda: name
    if state_dims is not None:
        mgr.kv_args.state_dim_per_tensor = [list(d) for d in state_dims]
    receiver = object.__new__(receiver_cls)
    sock = Socket()
    receiver.__dict__.update(kv_mgr=mgr, bootstrap_infos=[{"rank_ip": "10.0.0.1",
                                                           "rank_port": 8998}],
                             session_id=name)
    receiver._connect_to_bootstrap_server = lambda info: (sock, threading.Lock())
    receiver._register_kv_args()
    frames = sock.sent[0]
    body = frames[1:] if backend == "nixl" else frames  # NIXL's GUARD frame first
    return frames, conn.KVArgsRegisterInfo.from_zmq(body)


def prefill(conn: ModuleType, backend: str, *, tp: int = 1, regions: int = 2, aux: int = 3,
            mla: bool = False, dcp: int = 1, state_types: Sequence[Any] = (),
            speculative: str | None = None, state_lens: Sequence[Sequence[int]] = (),
            state_item: int | None = None, state_tp: int | None = None,
            state_dims: Sequence[Sequence[int]] | None = None) -> Any:
    """A prefill rank's manager, half-built, in prefill mode. With ``state_item``, its
    first state component is one NIXL 0.5.23 prepares (as on CUDA with UCX).
    ``state_tp``: its state TP (else its attention TP); ``state_dims``: each state
    component's tensors' TP-sharded dimensions (0: replicated)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    cls = conn.NixlKVManager if backend == "nixl" else conn.MooncakeKVManager
    mgr = object.__new__(cls)
    mgr.__dict__.update(
        kv_args=_kv_args(regions, ["VRAM"] * regions, aux, state_types, 1 << 30, state_lens,
                         state_item),
        decode_kv_args_table={}, agent=Agent(), disaggregation_mode=DisaggregationMode.PREFILL,
        attn_tp_size=tp, state_tp_size=state_tp or tp, is_mla_backend=mla,
        is_hybrid_mla_backend=False,
        dcp_size=dcp, dcp_rank=0, pp_size=1, src_mem_kind="VRAM", prep_handles={},
        _num_slots_src=SLOTS, _prepared_state_plans={}, _state_layout_rejections={},
        _prepared_state_components=frozenset() if state_item is None else frozenset({0}),
        _use_strided_descs=False, bootstrap_port=8998, _stopped=False,
        deferred_bootstrap=None, enable_staging=False, session_lock=threading.Lock(),
        failed_sessions=set(), session_failures={}, failed_session_probes={},
        state_layout_rejections={},
        state_strides_validated=set(), transfer_infos={}, _worker_threads=[],
        server_args=SimpleNamespace(tp_size=tp, dp_size=1, enable_dp_attention=False,
                                    speculative_algorithm=speculative,
                                    enable_pd_role_switch=False,
                                    disaggregation_enable_kv_checksum=False))
    if state_dims is not None:
        mgr.kv_args.state_dim_per_tensor = [list(d) for d in state_dims]
    return mgr
