"""What the prefill's ``send_aux`` does with the metadata buffers when the two servers
register different numbers of them (DSV4G045), run from the release's own source.

Each backend's ``send_aux`` (Mooncake's, NIXL's, MORI's, with the helpers it calls:
``send_aux_tcp``, ``send_aux_rdma``) is digested (``host/pd_digests.py``, sites
``*.send_aux``) and, on a digest a known release has, compiled from the parsed source and
run on a half-built manager whose metadata buffers are real memory (tiny ``ctypes``
arrays): SGLang's own loop decides what is sent. 0.5.20 - 0.5.22's Mooncake and NIXL
``send_aux`` loop over the *decode's* buffers indexing the prefill's item lengths, and raise
``IndexError`` when the decode has more; 0.5.23 stops at the shorter list. The TCP paths
(Mooncake's ``SGLANG_MOONCAKE_SEND_AUX_TCP`` or NVLINK pool, MORI's default and its RDMA
fallback when the counts differ) send each prefill buffer by index: the decode's real
``AuxDataCodec.deserialize_data_to_buffer`` then writes it, and raises for an index past
its own list. The engines (Mooncake's ``_transfer_data``, NIXL's agent, MORI's engine and
sockets) are recorders: what is sent is counted, nothing leaves the process.

The caller applies the prefill's environment (``send_aux`` reads ``envs`` when it runs).
"""

from __future__ import annotations
import __future__

import ast
import ctypes
import importlib
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_dsv4_guard.host.pd_digests import SITES, NotJudged, locate, row_releases
from sglang_dsv4_guard.host.targets import ENVIRON_MODULE, PD_AUX_CODEC

__all__ = ["AUX_BACKENDS", "AuxSend", "aux_details", "aux_send"]

AUX_BACKENDS = ("mooncake", "nixl", "mori")
_ITEM = 8  # bytes of one buffer's row in the miniature
_CUSTOM_POOL = "SGLANG_MOONCAKE_CUSTOM_MEM_POOL"
_HARNESS = (NameError, AttributeError, TypeError)  # what the half-built manager lacks


@dataclass(frozen=True)
class AuxSend:
    """One ``send_aux`` of the prefill to the decode: what raised, on which side, and how
    many of the decode's buffers were written."""

    backend: str
    function: str  # the SGLang function that ran
    prefill_raised: str | None  # ``IndexError: ...`` raised by the prefill's send_aux
    decode_raised: str | None  # raised by the decode writing a buffer sent by index
    written: int  # the decode's buffers the transfer wrote
    by_index: bool  # the TCP path: buffers sent one by one with their index


class _Memory:
    """``count`` real buffers of one row each: their addresses stand for SGLang's."""

    def __init__(self, count: int) -> None:
        self.arrays = [(ctypes.c_byte * _ITEM)() for _ in range(count)]
        self.ptrs = [ctypes.addressof(a) for a in self.arrays]


def _compiled(site: Any, scope: dict[str, Any], owner: Any) -> Any:
    """The site's function and helpers compiled from the parsed source into ``scope``,
    the helpers bound to ``owner``; the function, unbound."""
    local: dict[str, Any] = {}
    module = ast.Module(body=[site.node, *site.methods], type_ignores=[])
    exec(compile(module, site.filename, "exec", flags=__future__.annotations.compiler_flag,
                 dont_inherit=True), scope, local)
    for method in site.methods:
        setattr(owner, method.name, local[method.name].__get__(owner))
    return local[site.node.name]


def _manager(local: _Memory, sent: list[tuple[int, bytes]], written: list[int],
             envs: Any) -> SimpleNamespace:
    def by_index(*args: Any, **kwargs: Any) -> None:
        sent.append((int(kwargs["buffer_index"]), bytes(kwargs["data"])))

    def blocks(_session: Any, transfer_blocks: list[Any]) -> int:
        written.append(len(transfer_blocks))
        return 0

    def descs(addrs: list[Any], _kind: str) -> list[Any]:
        return list(addrs)

    def xfer(_op: str, _src: list[Any], dst: list[Any], *args: Any) -> object:
        written.append(len(dst))
        return object()

    def batch_write(src: list[Any], *args: Any) -> list[Any]:
        written.append(len(src))
        return []

    count = len(local.ptrs)
    rdma = getattr(envs, "SGLANG_MORI_SEND_AUX_RDMA", None)
    # Mooncake's __init__: check_mooncake_custom_mem_pool_enabled() is (False, None) when
    # the variable is unset; the caller refuses to judge a prefill that sets it.
    return SimpleNamespace(
        kv_args=SimpleNamespace(aux_data_ptrs=local.ptrs, aux_item_lens=[_ITEM] * count,
                                aux_data_lens=[_ITEM] * count),
        enable_custom_mem_pool=False, custom_mem_pool_type=None,
        # MoriKVManager.__init__: self._send_aux_rdma = envs.SGLANG_MORI_SEND_AUX_RDMA.get()
        _send_aux_rdma=bool(rdma.get()) if rdma is not None else False,
        aux_mem_descs=[object()] * count, _transfer_data=blocks,
        send_aux_data_to_endpoint=by_index, _send_aux_data_to_endpoint=by_index,
        agent=SimpleNamespace(get_xfer_descs=descs, initialize_xfer=xfer,
                              transfer=lambda *a: "DONE"),
        _post_xfer=lambda *a: None,
        engine=SimpleNamespace(batch_write=batch_write, allocate_transfer_uid=lambda: 0))


def aux_send(backend: str, package: Path, local: int, remote: int) -> AuxSend:
    """Run the release's ``send_aux`` of ``backend`` from a prefill with ``local``
    metadata buffers to a decode with ``remote``. Raises :class:`NotJudged` for a release
    whose function differs from every known one, or a value the guard does not derive."""
    key = f"{backend}.send_aux"
    site = locate(package, SITES[key])
    target = str(SITES[key].target)
    if site is None:
        raise NotJudged(f"the release has no {target}")
    if not row_releases({key: site.digest}, (key,)):
        raise NotJudged(f"SGLang's {target} differs from every release this guard knows")
    if backend == "mooncake" and os.environ.get(_CUSTOM_POOL):
        raise NotJudged(f"{_CUSTOM_POOL} is set on the prefill: whether Mooncake's send_aux "
                        "takes its TCP path (an NVLINK pool) is not derived here")
    codec = getattr(importlib.import_module(PD_AUX_CODEC.module),  # unscanned: targets
                    PD_AUX_CODEC.qualname)
    envs = importlib.import_module(ENVIRON_MODULE).envs  # unscanned: SGLang's environ
    src, dst = _Memory(local), _Memory(remote)
    sent: list[tuple[int, bytes]] = []
    written: list[int] = []
    manager = _manager(src, sent, written, envs)
    function = _compiled(site, {"envs": envs, "AuxDataCodec": codec}, manager)
    peer = SimpleNamespace(endpoint="decode", dst_port=0, room=0, dst_aux_index=0,
                           mooncake_session_id="decode", dst_aux_mem_descs=[object()] * remote)
    offered = {"req": peer, "peer_info": peer, "peer_name": "decode", "prefill_aux_index": 0,
               "dst_aux_ptrs": dst.ptrs, "dst_aux_index": 0, "room": 0, "notif": "decode"}
    wanted = [p for p in inspect.signature(function).parameters if p != "self"]
    if any(p not in offered for p in wanted):
        raise NotJudged(f"SGLang's {target} takes {wanted}, not all of which are derived")
    prefill_raised = None
    try:
        function(manager, **{p: offered[p] for p in wanted})
    except _HARNESS as exc:
        raise NotJudged(f"{target} reads what the guard does not derive "
                        f"({type(exc).__name__}: {exc})") from exc
    except Exception as exc:  # SGLang's own failure on these buffers: the verdict
        prefill_raised = f"{type(exc).__name__}: {exc}"
    decode_raised = None
    decode_args = SimpleNamespace(aux_data_ptrs=dst.ptrs, aux_item_lens=[_ITEM] * remote)
    for index, data in sent:
        try:
            codec.deserialize_data_to_buffer(decode_args, index, 0, data)
        except Exception as exc:  # the decode's real codec refuses this buffer index
            decode_raised = f"{type(exc).__name__}: {exc} (buffer {index})"
            break
        written.append(1)
    return AuxSend(backend, target, prefill_raised, decode_raised, sum(written), bool(sent))


def aux_details(local: int, remote: int, checksum_only: bool, sent: AuxSend) -> list[str]:
    """What happens to the buffers, as SGLang's ``send_aux`` of the backend ran on them."""
    if sent.prefill_raised:
        return [f"SGLang's {sent.function} raises {sent.prefill_raised} on the prefill: it "
                f"loops over the decode's {remote} buffers, indexing the prefill's {local}"]
    if sent.decode_raised:
        return [f"SGLang's {sent.function} sends the prefill's {local} buffers one by one with "
                f"their index; the decode's AuxDataCodec.deserialize_data_to_buffer raises "
                f"{sent.decode_raised}: the decode has {remote}"]
    head = f"only the first {sent.written} buffers are transferred; "
    if checksum_only:
        return [head + (
            "the decode's extra one is the KV checksum, the last: it stays 0 and the decode "
            "skips verification for a 0 digest (decode.py _verify_kv_checksums)"
            if remote > local else
            "the prefill's extra one is the KV checksum, the last: it is not sent and the "
            "decode, without the checksum, verifies nothing")
                + ", so transfers stay correct (a warning, not an error)"]
    return [head + "SGLANG_ENABLE_DISAGG_SAMPLING_MASK on one server adds buffers in the middle "
            "of the list: every later buffer (speculative top-k, hidden states, the bootstrap room) is read "
            "from the wrong slot"]
