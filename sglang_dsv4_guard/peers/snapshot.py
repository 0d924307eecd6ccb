"""A decode peer's registration with a Mooncake or NIXL prefill rank, as two endpoints.

The only module of :mod:`sglang_dsv4_guard.peers` that reads SGLang's objects: the prefill
manager (``MooncakeKVManager`` / ``NixlKVManager``, its ``kv_args`` and ``server_args``)
and the decode's ``KVArgsRegisterInfo`` as the release parsed it (``from_zmq``). Each
value goes into a :class:`~sglang_dsv4_guard.pd.endpoint.Endpoint` under the name the
``pd/`` conditions read, with where it came from; a value the objects do not carry is
left out (not known), never defaulted.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_dsv4_guard.host import targets
from sglang_dsv4_guard.host.releases import HostProfile
from sglang_dsv4_guard.pd.endpoint import PEER, Endpoint, Value

__all__ = ["TIMEOUT_ENV", "Registration", "RegistrationContext", "engine_key", "int_or_none",
           "peer_name", "read_attrs", "snapshot_registration", "state_names"]

TIMEOUT_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
_MASK_ENV = "SGLANG_ENABLE_DISAGG_SAMPLING_MASK"


@dataclass(frozen=True)
class Registration:
    """One decode rank registering with one prefill rank.

    ``peer``: its name on the prefill (NIXL's agent name, Mooncake's session id);
    ``address``: its endpoint and port; ``env``: the prefill's environment variables the
    findings read (its bootstrap timeout, the sampling-mask switch)."""

    backend: str
    peer: str
    address: str
    prefill: Endpoint
    decode: Endpoint
    engine_rank: int | None = None
    bootstrap_port: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RegistrationContext:
    """The prefill's side of a registration: release profile and mode."""

    profile: HostProfile
    mode: str = "on"


def engine_key(peer: object) -> str | None:
    """The peer's engine key (a property over its engine descriptor), or ``None``."""
    try:
        key = peer.engine_key  # type: ignore[attr-defined]
    except Exception:
        return None
    return None if key is None else str(key)


def read_attrs(obj: object, names: tuple[str, ...]) -> dict[str, Any]:
    """``names`` of ``obj`` (``None`` for one it does not carry; any other failure to
    read one is the guard's own, reported as such; ``engine_key``: :func:`engine_key`)."""
    return {name: engine_key(obj) if name == "engine_key" else getattr(obj, name, None)
            for name in names}


def int_or_none(value: object) -> int | None:
    """A value SGLang holds as an integer (a size, a port, a rank), else ``None``: not known."""
    try:
        return int(value)  # type: ignore[call-overload, no-any-return]
    except (TypeError, ValueError):
        return None


def state_names(types: Iterable[object] | None) -> tuple[str, ...]:
    """SGLang's state types (``StateType`` members, or already strings) as plain names."""
    return tuple(str(getattr(s, "value", s)) for s in types or ())


def _sequence(value: object) -> list[Any] | tuple[Any, ...]:
    """A list or tuple as it is; anything else (a string included) is not one."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"not a list: {type(value).__name__}")
    return value


def _put(values: dict[str, Value], name: str, value: object, source: str) -> None:
    if value is not None:
        values[name] = Value(value, source)


def peer_name(info: object) -> str:
    """The name the prefill keys the peer by (NIXL's agent name, Mooncake's session id,
    MORI's engine key), else its id; never its address, unlike MORI's transfers'
    :func:`~sglang_dsv4_guard.mori.snapshot.peer_key_or_address`."""
    for attr in ("agent_name", "mooncake_session_id", "engine_key"):
        try:  # MORI's engine_key is a property over its engine descriptor
            name = getattr(info, attr, None)
        except Exception:
            name = None
        if name is not None:
            return str(name)
    return f"object id 0x{id(info):x}"


def _prefill(backend: str, manager: object) -> tuple[Endpoint, dict[str, Any]]:
    mgr = read_attrs(manager, targets.PEERS_MANAGER_ATTRS)
    kv = read_attrs(mgr["kv_args"], targets.PEERS_KV_ARGS_ATTRS)
    args = read_attrs(mgr["server_args"], targets.PEERS_SERVER_ARGS_ATTRS)
    owner = type(manager).__name__
    values: dict[str, Value] = {"transfer_backend": Value(backend, f"the prefill's {owner}")}
    for name in ("is_mla_backend", "is_hybrid_mla_backend"):
        _put(values, name, mgr[name], f"{owner}.{name} on the prefill")
    for name in ("attn_tp_size", "pp_size", "dcp_size", "dcp_rank", "state_tp_size"):  # else not known
        _put(values, name, int_or_none(mgr[name]), f"{owner}.{name} on the prefill")
    if kv["state_types"] is not None:
        values["state_types"] = Value(
            state_names(kv["state_types"]),
            "kv_args.state_types on the prefill (its pool's state components)")
    for name in ("swa_kv_cache_layout", "mla_compression_ratios"):
        _put(values, name, kv[name], f"kv_args.{name} on the prefill")
    if kv["kv_item_lens"] is not None:
        values["kv_regions"] = Value(len(kv["kv_item_lens"]),
                                     "len(kv_args.kv_item_lens): the prefill's KV regions")
    if kv["aux_data_ptrs"] is not None:
        values["aux_buffer_count"] = Value(len(kv["aux_data_ptrs"]), (
            "len(kv_args.aux_data_ptrs): the prefill's metadata buffers"))
    for name in ("tp_size", "dp_size", "enable_dp_attention", "attn_cp_size",
                 "speculative_algorithm", "enable_unified_memory", "kv_checksum"):
        field = "disaggregation_enable_kv_checksum" if name == "kv_checksum" else name
        _put(values, name, args[field], f"server flag --{field.replace('_', '-')} on the prefill")
    _state_geometry(values, kv, "kv_args.{} on the prefill", "")
    _dims(values, kv["state_dim_per_tensor"], "kv_args.state_dim_per_tensor on the prefill")
    if mgr["state_mem_descs"] is not None:  # MORI
        values["state_components"] = Value(len(mgr["state_mem_descs"]), (
            f"len({owner}.state_mem_descs): the prefill's registered state components"))
    if mgr["_prepared_state_components"] is not None:  # NIXL 0.5.23+
        values["prepared_state_components"] = Value(
            tuple(sorted(mgr["_prepared_state_components"])),
            f"{owner}._prepared_state_components on the prefill (the state components "
            "NIXL prepares: CUDA, UCX, PP, CP and DCP 1)")
    return Endpoint("prefill", values, env=dict(os.environ)), {**mgr, **kv}


def _state_geometry(values: dict[str, Value], read: dict[str, Any], source: str,
                    prefix: str) -> None:
    """The state pool's registration (pointers, slot strides, lengths, layer ids), per
    component, as plain tuples (``prefix``: ``dst_`` for the decode's names)."""
    for name in ("state_data_ptrs", "state_item_lens", "state_data_lens", "state_layer_ids"):
        try:  # a list of int lists (0.5.23); another shape is left out: not known
            per = tuple(tuple(int(x) for x in c) for c in read[prefix + name])
        except (TypeError, ValueError):
            continue
        values[name] = Value(per, source.format(prefix + name))


def _dims(values: dict[str, Value], dims: object, source: str) -> None:
    """Per state component, the TP-sharded dimension of each tensor (0: replicated);
    absent or another shape: not known."""
    with contextlib.suppress(TypeError, ValueError):
        values["state_dim_per_tensor"] = Value(
            tuple(tuple(None if x is None else int(x) for x in _sequence(c))
                  for c in _sequence(dims)),
            f"{source} (per state component, each tensor's TP-sharded dimension; "
            "0: replicated)")


def _decode(backend: str, info: object) -> Endpoint:
    peer = read_attrs(info, targets.PEERS_INFO_ATTRS)
    owner = f"{type(info).__name__} (the decode's registration)"
    values: dict[str, Value] = {"transfer_backend": Value(backend, owner),
                                PEER: Value(peer_name(info), owner)}
    tp_name = "decode_tp_size" if peer["decode_tp_size"] is not None else "dst_attn_tp_size"
    _put(values, "attn_tp_size", int_or_none(peer[tp_name]),
         f"{tp_name} in {owner}: the decode's attention TP size")
    _put(values, "dcp_size", int_or_none(peer["dst_dcp_size"]), f"dst_dcp_size in {owner}")
    _put(values, "dcp_rank", int_or_none(peer["dst_dcp_rank"]), f"dst_dcp_rank in {owner}")
    kinds = peer["dst_kv_mem_kinds"]
    if kinds is not None:
        values["kv_mem_kinds"] = Value(list(kinds), f"dst_kv_mem_kinds in {owner}")
        values["enable_hisparse"] = Value(
            "DRAM" in kinds, f"dst_kv_mem_kinds in {owner} (HiSparse registers host memory)")
    regions = peer["dst_kv_item_lens"] or peer["dst_kv_ptrs"]
    if regions is not None:
        values["kv_regions"] = Value(len(regions), f"the KV regions in {owner}")
    _state_geometry(values, peer, "{} in " + owner, "dst_")
    _dims(values, peer["dst_state_dim_per_tensor"], f"dst_state_dim_per_tensor in {owner}")
    if peer["dst_state_mem_descs"] is not None:  # MORI
        values["state_components"] = Value(len(peer["dst_state_mem_descs"]),
                                           f"len(dst_state_mem_descs) in {owner}")
    aux = "dst_aux_ptrs" if peer["dst_aux_ptrs"] is not None else "dst_aux_mem_descs"  # MORI
    if peer[aux] is not None:
        values["aux_buffer_count"] = Value(len(peer[aux]), f"len({aux}) in {owner}")
    return Endpoint("decode", values)


def snapshot_registration(backend: str, manager: object, info: object) -> Registration:
    """The registration of ``info`` with ``manager``: the values the ``pd/`` conditions
    read, each with its source."""
    prefill, raw = _prefill(backend, manager)
    decode = _decode(backend, info)
    endpoint, port = getattr(info, "endpoint", None), getattr(info, "dst_port", None)
    env = {k: os.environ[k] for k in (TIMEOUT_ENV, _MASK_ENV) if k in os.environ}
    return Registration(backend, peer_name(info), f"{endpoint}:{port}", prefill, decode,
                        int_or_none(raw["engine_rank"]), int_or_none(raw["bootstrap_port"]), env)
