"""What the prefill's ``send_aux`` does with the metadata buffers when the two servers
register different numbers of them (:mod:`.aux_count`), run from the release's own source.

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

:func:`aux_rows` (``check``'s row widths) runs the same functions when the counts agree
but some rows differ in width (``--sampling-mask-max-tokens``). The caller applies the
prefill's environment (``send_aux`` reads ``envs`` when it runs).
"""

from __future__ import annotations

import ctypes
import importlib
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_dsv4_guard.host.pd_digests import SITES, NotJudged, known_sites
from sglang_dsv4_guard.host.targets import ENVIRON_MODULE, PD_AUX_CODEC
from sglang_dsv4_guard.pd.buffers import mask_env

__all__ = ["AUX_BACKENDS", "AuxSend", "RowLanding", "aux_details", "aux_rows", "aux_send"]

AUX_BACKENDS = ("mooncake", "nixl", "mori")
_ITEM = 8  # bytes of one buffer's row in the miniature
_CUSTOM_POOL = "SGLANG_MOONCAKE_CUSTOM_MEM_POOL"


@dataclass(frozen=True)
class AuxSend:
    """One ``send_aux`` of the prefill to the decode: what raised, on which side, and how
    many of the decode's buffers were written."""

    function: str  # the SGLang function that ran
    prefill_raised: str | None  # ``IndexError: ...`` raised by the prefill's send_aux
    decode_raised: str | None  # raised by the decode writing a buffer sent by index
    written: int  # the decode's buffers the transfer wrote


class _Memory:
    """Real buffers of ``rows`` rows of ``item_lens[i]`` bytes each (one row of
    :data:`_ITEM` bytes per buffer when only a count is given), each followed by ``guard``
    spare bytes, so a write past a buffer's end lands in memory this miniature owns and
    is seen; their addresses stand for SGLang's."""

    def __init__(self, count: int, item_lens: list[int] | None = None, rows: int = 1,
                 guard: int = 0) -> None:
        self.item_lens = list(item_lens) if item_lens is not None else [_ITEM] * count
        self.rows = rows
        self.arrays = [(ctypes.c_ubyte * (n * rows + guard))() for n in self.item_lens]
        self.ptrs = [ctypes.addressof(a) for a in self.arrays]
        self.data_lens = [n * rows for n in self.item_lens]

    def fill(self) -> None:
        """Each row's bytes say its buffer and row (never 0: an unwritten byte is 0)."""
        base = bytes(1 + k % 251 for k in range(251))
        for b, (ptr, n) in enumerate(zip(self.ptrs, self.item_lens, strict=True)):
            for row in range(self.rows):
                start = (b * 31 + row * 7) % 251
                ctypes.memmove(ptr + row * n, (base * (n // 251 + 2))[start:start + n], n)

    def clear(self) -> None:
        for array in self.arrays:
            ctypes.memset(array, 0, len(array))

    def inside(self, addr: int, length: int) -> bool:
        """Whether ``length`` bytes at ``addr`` lie inside one buffer (its registered
        region, ``aux_data_lens``)."""
        return any(ptr <= addr and addr + length <= ptr + n
                   for ptr, n in zip(self.ptrs, self.data_lens, strict=True))

    def row(self, buffer: int, row: int, length: int) -> bytes:
        n = self.item_lens[buffer]
        return bytes(self.arrays[buffer][row * n:row * n + length])

    def outside(self, buffer: int, row: int) -> tuple[bool, bool]:
        """Whether bytes were written in ``buffer`` outside its row ``row``: in another
        row, and past the buffer's end (its guard bytes)."""
        array, n, end = self.arrays[buffer], self.item_lens[buffer], self.data_lens[buffer]
        others = bytes(array[:row * n]) + bytes(array[(row + 1) * n:end])
        return any(others), any(bytes(array[end:]))


def _manager(local: _Memory, sent: list[tuple[int, int, bytes]], written: list[int],
             envs: Any, moves: list[tuple[int, int, int]] | None = None) -> SimpleNamespace:
    """A half-built manager of the prefill whose engines record what SGLang hands them:
    ``sent`` the TCP path's (buffer index, row index, bytes), ``moves`` the RDMA paths'
    (source, destination, length) copies, ``written`` how many buffers each call moved."""
    moved: list[tuple[int, int, int]] = [] if moves is None else moves

    def by_index(*args: Any, **kwargs: Any) -> None:
        sent.append((int(kwargs["buffer_index"]), int(kwargs["aux_index"]),
                     bytes(kwargs["data"])))

    def blocks(_session: Any, transfer_blocks: list[Any]) -> int:
        moved.extend((int(s), int(d), int(n)) for s, d, n in transfer_blocks)
        written.append(len(transfer_blocks))
        return 0

    def xfer(_op: str, src: list[Any], dst: list[Any], *args: Any) -> object:
        moved.extend((int(s[0]), int(d[0]), int(s[1])) for s, d in zip(src, dst, strict=True))
        written.append(len(dst))
        return object()

    def batch_write(src: list[Any], local_offsets: list[Any], dst: list[Any],
                    remote_offsets: list[Any], sizes: list[Any], *args: Any) -> list[Any]:
        moved.extend((s.addr + lo[0], d.addr + ro[0], n[0]) for s, lo, d, ro, n in zip(
            src, local_offsets, dst, remote_offsets, sizes, strict=True))
        written.append(len(src))
        return []

    rdma = getattr(envs, "SGLANG_MORI_SEND_AUX_RDMA", None)
    # Mooncake's __init__: check_mooncake_custom_mem_pool_enabled() is (False, None) when
    # the variable is unset; the caller refuses to judge a prefill that sets it.
    return SimpleNamespace(
        kv_args=SimpleNamespace(aux_data_ptrs=local.ptrs, aux_item_lens=local.item_lens,
                                aux_data_lens=local.data_lens),
        enable_custom_mem_pool=False, custom_mem_pool_type=None,
        # MoriKVManager.__init__: self._send_aux_rdma = envs.SGLANG_MORI_SEND_AUX_RDMA.get()
        _send_aux_rdma=bool(rdma.get()) if rdma is not None else False,
        # MORI's registered memory descriptors, one per buffer (its batch_write offsets
        # are from their start)
        aux_mem_descs=[SimpleNamespace(addr=p) for p in local.ptrs],
        _transfer_data=blocks, _record_submitted_statuses=lambda *a: None,
        send_aux_data_to_endpoint=by_index, _send_aux_data_to_endpoint=by_index,
        agent=SimpleNamespace(get_xfer_descs=lambda addrs, _kind: list(addrs),
                              initialize_xfer=xfer, transfer=lambda *a: "DONE"),
        _post_xfer=lambda *a: None,
        engine=SimpleNamespace(batch_write=batch_write, allocate_transfer_uid=lambda: 0))


def _function(backend: str, package: Path) -> tuple[Any, str, Any, Any]:
    """The release's digested ``send_aux`` site of ``backend``, its name, the codec and
    SGLang's ``envs``."""
    key = f"{backend}.send_aux"
    site = known_sites(package, (key,))[key]
    target = str(SITES[key].target)
    if site is None:
        raise NotJudged(f"the release has no {target}")
    if backend == "mooncake" and os.environ.get(_CUSTOM_POOL):
        raise NotJudged(f"{_CUSTOM_POOL} is set on the prefill: whether Mooncake's send_aux "
                        "takes its TCP path (an NVLINK pool) is not derived here")
    codec = getattr(importlib.import_module(PD_AUX_CODEC.module),  # unscanned: targets
                    PD_AUX_CODEC.qualname)
    envs = importlib.import_module(ENVIRON_MODULE).envs  # unscanned: SGLang's environ
    return site, target, codec, envs


def _call(found: tuple[Any, str, Any, Any], src: _Memory, dst: _Memory, row: int,
          sent: list[tuple[int, int, bytes]], written: list[int],
          moves: list[tuple[int, int, int]] | None = None) -> str | None:
    """Run SGLang's ``send_aux`` (``found``: :func:`_function`'s) on a fresh manager of
    ``src`` (:func:`_manager`) for the prefill's row ``row`` into the decode's row ``row``;
    what it raised (SGLang's own failure), ``None`` when it returned."""
    site, target, codec, envs = found
    manager = _manager(src, sent, written, envs, moves)
    function = site.define({"envs": envs, "AuxDataCodec": codec}, manager, function=True)
    peer = SimpleNamespace(endpoint="decode", dst_port=0, room=0, dst_aux_index=row,
                           mooncake_session_id="decode",
                           dst_aux_mem_descs=[SimpleNamespace(addr=p) for p in dst.ptrs])
    offered = {"req": peer, "peer_info": peer, "peer_name": "decode", "prefill_aux_index": row,
               "dst_aux_ptrs": dst.ptrs, "dst_aux_index": row, "room": 0, "notif": "decode"}
    wanted = [p for p in inspect.signature(function).parameters if p != "self"]
    if any(p not in offered for p in wanted):
        raise NotJudged(f"SGLang's {target} takes {wanted}, not all of which are derived")
    try:
        function(manager, **{p: offered[p] for p in wanted})
    except (NameError, AttributeError, TypeError) as exc:  # what the half-built manager lacks
        raise NotJudged(f"{target} reads what the guard does not derive "
                        f"({type(exc).__name__}: {exc})") from exc
    except Exception as exc:  # SGLang's own failure on these buffers: the verdict
        return f"{type(exc).__name__}: {exc}"
    return None


def _receive(codec: Any, dst: _Memory, sent: list[tuple[int, int, bytes]],
             written: list[int]) -> str | None:
    """The decode's real codec writing each buffer the TCP path sent by index into
    ``dst``: what it raised for the first buffer it refuses, ``None`` when it took all."""
    decode_args = SimpleNamespace(aux_data_ptrs=dst.ptrs, aux_item_lens=dst.item_lens)
    for index, row, data in sent:
        try:
            codec.deserialize_data_to_buffer(decode_args, index, row, data)
        except Exception as exc:  # the decode's real codec refuses this buffer index
            return f"{type(exc).__name__}: {exc} (buffer {index})"
        written.append(1)
    return None


def aux_send(backend: str, package: Path, local: int, remote: int) -> AuxSend:
    """Run the release's ``send_aux`` of ``backend`` from a prefill with ``local``
    metadata buffers to a decode with ``remote``. Raises :class:`NotJudged` for a release
    whose function differs from every known one, or a value the guard does not derive."""
    found = _function(backend, package)
    src, dst = _Memory(local), _Memory(remote)
    sent: list[tuple[int, int, bytes]] = []
    written: list[int] = []
    prefill_raised = _call(found, src, dst, 0, sent, written)
    decode_raised = _receive(found[2], dst, sent, written)
    return AuxSend(found[1], prefill_raised, decode_raised, sum(written))


@dataclass(frozen=True)
class RowLanding:
    """Where one request's metadata row lands in the decode's buffers when the two servers'
    rows of some buffers have different widths, for each request slot of the miniature."""

    backend: str
    function: str
    by_index: bool  # the TCP path: each buffer sent with its index, written by the decode
    raised: str | None  # what SGLang raised (the prefill's send_aux or the decode's codec)
    buffers: tuple[int, ...]  # the buffers whose row widths differ
    rows: int  # the miniature's request slots
    misplaced: tuple[int, ...]  # slots whose own row the decode reads with other bytes
    spilled: tuple[int, ...]  # slots whose transfer wrote into another slot's row
    past_end: tuple[int, ...]  # slots whose transfer reaches past the decode buffer's end


def aux_rows(backend: str, package: Path, local: list[int], remote: list[int],
             rows: int = 3) -> RowLanding:
    """Run the release's ``send_aux`` of ``backend`` once per request slot from a prefill
    whose metadata buffers have rows of ``local`` bytes to a decode with ``remote`` (the
    item lengths SGLang's own ``MetadataBuffers`` gives each server; as many buffers on
    each), into a fresh decode each time, and observe where the bytes land: the RDMA
    paths' copies are made where they fall inside the decode's registered buffers (a copy
    reaching past a buffer's end is recorded, never made: the engine would be handed it),
    the TCP path's buffers are written by the decode's real ``AuxDataCodec`` into buffers
    followed by spare bytes. Raises :class:`NotJudged` as :func:`aux_send`."""
    found = _function(backend, package)
    src = _Memory(len(local), local, rows)
    src.fill()
    dst = _Memory(len(remote), remote, rows, guard=max([*local, *remote, 1]) * rows)
    differ = tuple(b for b, (p, d) in enumerate(zip(local, remote, strict=True)) if p != d)
    landed: dict[str, set[int]] = {"misplaced": set(), "spilled": set(), "past_end": set()}
    raised, by_index = None, False
    for row in range(rows):
        dst.clear()
        sent: list[tuple[int, int, bytes]] = []
        moves: list[tuple[int, int, int]] = []
        raised = _call(found, src, dst, row, sent, [], moves)
        by_index = by_index or bool(sent)
        for source, target, length in moves:
            if dst.inside(target, length):
                ctypes.memmove(target, source, length)
            else:  # outside every registered buffer of the decode
                landed["past_end"].add(row)
        raised = _receive(found[2], dst, sent, []) or raised
        if raised:
            break
        for b in differ:
            keep = min(local[b], remote[b])
            if dst.row(b, row, keep) != src.row(b, row, keep):
                landed["misplaced"].add(row)
            other_row, past = dst.outside(b, row)
            if other_row:
                landed["spilled"].add(row)
            if past:
                landed["past_end"].add(row)
    return RowLanding(backend, found[1], by_index, raised, differ, rows,
                      *(tuple(sorted(landed[k])) for k in ("misplaced", "spilled", "past_end")))


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
    return [head + f"{mask_env()} on one server adds buffers in the middle "
            "of the list: every later buffer (speculative top-k, hidden states, the bootstrap room) is read "
            "from the wrong slot"]
