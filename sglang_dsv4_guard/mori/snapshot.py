"""Plain-value snapshot of one MORI state transfer, as the prefill manager sees it.

The only module of :mod:`sglang_dsv4_guard.mori` that reads SGLang's MORI objects
(``MoriKVManager``, ``KVArgsRegisterInfo``). Checks see :class:`SendSnapshot` and
:class:`SendContext`, never a manager or a peer.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_dsv4_guard.findings import PlacedContext
from sglang_dsv4_guard.host import targets
from sglang_dsv4_guard.host.releases import HostProfile
from sglang_dsv4_guard.peers.snapshot import engine_key, int_or_none, read_attrs, state_names

__all__ = ["SendContext", "SendSnapshot", "peer_key_or_address", "snapshot_send"]


@dataclass(frozen=True)
class SendSnapshot:
    """The values SGLang's MORI TP check reads, plus what helps a reader act on it.

    ``None`` marks a value the manager or peer does not carry.
    """

    state_type: str
    is_mla_backend: bool
    attn_tp_size: int | None
    decode_tp_size: int | None
    state_types: tuple[str, ...] = ()
    tp_size: int | None = None
    dp_size: int | None = None
    enable_dp_attention: bool | None = None
    attn_cp_size: int | None = None
    pp_size: int | None = None
    engine_key: str | None = None
    endpoint: str | None = None
    dst_port: int | None = None
    # The decode server's layout, known only before launch (``check``: its launch line);
    # at run time the peer sends its attention TP size alone.
    decode_tp: int | None = None
    decode_dp_size: int | None = None
    decode_enable_dp_attention: bool | None = None
    # The fields the prefill's line typed (check); None at run time: typed or default unknown
    typed: frozenset[str] | None = None


@dataclass(frozen=True)
class SendContext(PlacedContext):
    """The MORI manager's side of a transfer: the prefill server's view."""

    profile: HostProfile
    mode: str = "on"
    # "registration" when a decode peer registers, "send" per transfer, "check" before launch
    # (the check command, on the transfer a launch pair implies)
    place: str = "send"


def snapshot_send(manager: object, peer: object, state_type: str) -> SendSnapshot:
    """The values SGLang's TP check reads, and the layout around them: the attributes
    ``host/targets`` declares (``MORI_*_ATTRS``), and nothing else."""
    mgr = read_attrs(manager, targets.MORI_MANAGER_ATTRS)
    server_args = read_attrs(mgr["server_args"], targets.MORI_SERVER_ARGS_ATTRS)
    kv_args = read_attrs(mgr["kv_args"], targets.MORI_KV_ARGS_ATTRS)
    info = read_attrs(peer, targets.MORI_PEER_ATTRS)
    return SendSnapshot(
        state_type=str(getattr(state_type, "value", state_type)),
        is_mla_backend=bool(mgr["is_mla_backend"]),
        attn_tp_size=mgr["attn_tp_size"],
        decode_tp_size=info["decode_tp_size"],
        state_types=state_names(kv_args["state_types"]),
        tp_size=int_or_none(server_args["tp_size"]),
        dp_size=int_or_none(server_args["dp_size"]),
        enable_dp_attention=server_args["enable_dp_attention"],
        attn_cp_size=int_or_none(server_args["attn_cp_size"]),
        pp_size=int_or_none(mgr["pp_size"]),
        engine_key=info["engine_key"],
        endpoint=info["endpoint"],
        dst_port=int_or_none(info["dst_port"]),
    )


def peer_key_or_address(peer: object) -> str:
    """Who a decode peer is in MORI's transfers. Unlike
    :func:`~sglang_dsv4_guard.peers.snapshot.peer_name`, a key-less peer is told apart by
    its address: each gets its own report and counts. The object fallback is unique only
    while the object lives: the caller keeps a reference to it."""
    key = engine_key(peer)
    if key is not None:
        return key
    endpoint, port = getattr(peer, "endpoint", None), getattr(peer, "dst_port", None)
    if endpoint is not None and port is not None:
        return f"endpoint {endpoint}:{port}"
    return f"object id 0x{id(peer):x}"
