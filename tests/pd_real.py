"""SGLang's own prefill/decode comparisons, called once on values the tests give: the
oracles the PD contract tests compare ``check`` with (never the guard's runners).

- :func:`first_contact_raise`: the release's real ``try_ensure_parallel_info`` once, on a
  bare decode manager and a bootstrap answer built here from the prefill's values;
- :func:`decode_manager`, :func:`route_answer` and :func:`bootstrap_server`: those two
  pieces, and a real HTTP server on 127.0.0.1 answering ``/route`` with that answer (the
  run-time first-contact tests drive SGLang's own ``requests`` code through it);
- :func:`send_extra_refusal`: the release's real Mooncake or NIXL ``maybe_send_extra`` on
  a half-built prefill manager (no engine) and the decode's registration;
- :func:`mooncake_mask_rows`: the release's real ``MooncakeKVManager.send_aux`` between
  two servers' real ``MetadataBuffers`` (sampling mask on, each its own width), and what
  the decode's real ``get_buf`` then reads.

Only what cannot run on CPU is stubbed: the bootstrap HTTP GET is answered locally (the
Mooncake module's ``prometheus_client`` is in the CPU closure, requirements/).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import importlib
import inspect
import json
import threading
import types
from collections.abc import Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.offline.parse import offline_env
from sglang_dsv4_guard.host import targets

# SGLang's run_suite.py collects every *.py next to the tests and requires a registry in
# each; a disabled one marks a helper module (listed as skipped, never run).
register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")

# What SGLang's transfer raises when it refuses a state (DSV4G040/041's messages); any
# other exception is past the check, in the transfer a half-built manager cannot do.
_REFUSALS = ("PD Disaggregation ", "PD disagg: ", "Head-sliced PD transfer needs")


def _state_types(values: Sequence[Any]) -> list[Any]:
    from sglang.srt.disaggregation.base.conn import StateType

    return [StateType(getattr(v, "value", v)) for v in values]


def route_answer(prefill: Mapping[str, Any]) -> dict[str, Any]:
    """The bootstrap server's ``/route`` answer for a prefill of these values: the
    release's own ``PrefillServerInfo`` fields (a field the release lacks is left out).

    ``prefill`` holds ``attn_tp_size``, ``attn_cp_size``, ``pp_size``, ``page_size``,
    ``kv_cache_dtype_str``, ``enable_kv_cache_sharding``; optional: ``attn_dp_size``,
    ``kv_layout``, ``dsv41_spec_layout``, ``enable_dsa_cache_layer_split``."""
    module = importlib.import_module(targets.PD_COMMON_MODULE)
    info_fields = {f.name for f in
                   dataclasses.fields(getattr(module, targets.PD_SERVER_INFO))}
    answer = {"attn_tp_size": prefill["attn_tp_size"], "attn_cp_size": prefill["attn_cp_size"],
              "dp_size": prefill.get("attn_dp_size", 1), "pp_size": prefill["pp_size"],
              "page_size": prefill["page_size"], "kv_cache_dtype": prefill["kv_cache_dtype_str"],
              "follow_bootstrap_room": True,
              "enable_kv_cache_sharding": prefill["enable_kv_cache_sharding"],
              "enable_dsa_cache_layer_split": prefill.get("enable_dsa_cache_layer_split", False),
              "kv_layout": prefill.get("kv_layout"),
              "dsv41_spec_layout": prefill.get("dsv41_spec_layout")}
    return {k: v for k, v in answer.items() if k in info_fields}


def decode_manager(decode: Mapping[str, Any]) -> Any:
    """A bare ``CommonKVManager`` (``object.__new__``: its constructor binds sockets)
    holding the attributes its first contact reads, set from ``decode`` (``attn_tp_size``,
    ``attn_cp_size``, ``pp_size``, ``page_size``, ``kv_cache_dtype_str``, ``dcp_size``,
    ``is_mla_backend``; optional ``state_types``, ``is_hybrid_mla_backend``,
    ``kv_layout``, ``dsv41_spec_layout``, ``attn_dp_size``)."""
    module = importlib.import_module(targets.PD_COMMON_MODULE)
    manager = object.__new__(getattr(module, targets.PD_COMMON_MANAGER))
    manager.__dict__.update(
        prefill_info_table={}, kv_cache_dtype_str=decode["kv_cache_dtype_str"],
        server_args=SimpleNamespace(kv_cache_dtype=decode["kv_cache_dtype_str"]),
        kv_args=SimpleNamespace(page_size=decode["page_size"], engine_rank=0, pp_rank=0,
                                state_types=_state_types(decode.get("state_types", ()))),
        attn_tp_size=decode["attn_tp_size"], attn_cp_size=decode["attn_cp_size"],
        attn_cp_rank=0, attn_dp_size=decode.get("attn_dp_size", 1), pp_size=decode["pp_size"],
        pp_rank=0, dcp_size=decode["dcp_size"],
        dcp_rank=0, is_mla_backend=decode["is_mla_backend"],
        is_hybrid_mla_backend=decode.get("is_hybrid_mla_backend", False),
        kv_layout=decode.get("kv_layout"), dsv41_spec_layout=decode.get("dsv41_spec_layout"),
        enable_all_cp_ranks_for_transfer=False)
    return manager


def first_contact_raise(prefill: Mapping[str, Any], decode: Mapping[str, Any]) -> str | None:
    """SGLang's try_ensure_parallel_info called once, on a bare manager set here from
    ``decode`` (:func:`decode_manager`) and a bootstrap answer built here from ``prefill``
    (:func:`route_answer`), answered locally: its first raise."""
    module = importlib.import_module(targets.PD_COMMON_MODULE)
    cls = getattr(module, targets.PD_COMMON_MANAGER)
    body = json.dumps(route_answer(prefill))
    manager = decode_manager(decode)
    response = SimpleNamespace(status_code=200, text="", json=lambda: json.loads(body))
    saved = module.requests
    module.requests = SimpleNamespace(get=lambda url, timeout=None: response)
    try:
        getattr(cls, targets.PD_FIRST_CONTACT.attr)(manager, "bootstrap:1")
    except Exception as exc:
        return str(exc)
    finally:
        module.requests = saved
    return None


@contextlib.contextmanager
def bootstrap_server(answer: Mapping[str, Any] | None, status: int = 200
                     ) -> Iterator[SimpleNamespace]:
    """A real HTTP server on 127.0.0.1 (port 0, one thread) answering every GET as a
    prefill's bootstrap server answers ``/route``: ``answer`` as JSON with ``status``
    (another status: a text, as a bootstrap server not ready yet answers). Yields
    ``addr`` (``host:port``), ``asked`` (the paths asked) and ``answer`` / ``status``,
    which a test may change between requests."""
    state = SimpleNamespace(addr="", asked=[], answer=answer, status=status)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.asked.append(self.path)
            ok = state.status == 200
            body = json.dumps(state.answer).encode() if ok else b"not ready"
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json" if ok else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: the tests assert on what was asked

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.addr = f"127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def _manager_class(backend: str) -> Any:
    if backend == "nixl":
        from sglang.srt.disaggregation.nixl.conn import NixlKVManager

        return NixlKVManager
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    return MooncakeKVManager


def send_extra_refusal(backend: str, prefill_tp: int, decode_tp: int, pp: int, mla: bool,
                       states: Sequence[str], layout: str = "nhd",
                       hybrid_mla: bool = False, state_tp: int | None = None) -> str | None:
    """SGLang's real ``maybe_send_extra`` of ``backend`` (``mooncake`` or ``nixl``) on a
    half-built prefill manager (no engine) sending ``states`` (one request, one page each)
    to a decode of attention TP ``decode_tp``: its RuntimeError's message when it refuses a
    state ("PD Disaggregation ..."), else ``None`` (it then goes on to the transfer, which
    fails for want of an engine or a published runtime context: past the check)."""
    cls = _manager_class(backend)
    count = len(states)
    manager = object.__new__(cls)
    manager.__dict__.update(
        attn_tp_size=prefill_tp, state_tp_size=state_tp or prefill_tp, is_mla_backend=mla,
        is_hybrid_mla_backend=hybrid_mla, pp_size=pp, _state_layout_rejections={},
        _prepared_state_plans={}, kv_args=SimpleNamespace(
            state_types=_state_types(states), state_data_ptrs=[[0, 0]] * count,
            state_item_lens=[[64, 64]] * count, state_dim_per_tensor=[],
            state_layer_ids=[[0]] * count, swa_kv_cache_layout=layout, engine_rank=0,
            gpu_id=0, prefill_start_layer=0))
    registration = SimpleNamespace(
        dst_state_data_ptrs=[[0, 0]] * count, dst_state_item_lens=[[64, 64]] * count,
        dst_state_dim_per_tensor=[], dst_state_layer_ids=[[0]] * count,
        dst_attn_tp_size=decode_tp, dst_tp_rank=0)
    wanted: dict[str, Any] = dict(
        peer_name="decode", prefill_state_indices=[[1]] * count,
        dst_state_data_ptrs=[[0, 0]] * count, dst_state_indices=[[1]] * count, dst_gpu_id=0,
        decode_tp_size=decode_tp, decode_tp_rank=0, dst_state_item_lens=[[64, 64]] * count,
        notif="n", comp_notif="n",
        req=SimpleNamespace(dst_state_indices=[[1]] * count, mooncake_session_id="decode"),
        executor=SimpleNamespace(), target_rank_registration_info=registration)
    params = inspect.signature(cls.maybe_send_extra).parameters
    try:
        out = cls.maybe_send_extra(manager, **{k: v for k, v in wanted.items() if k in params})
        if isinstance(out, types.GeneratorType):
            list(out)
    except RuntimeError as exc:
        text = str(exc)
        return text if text.startswith(_REFUSALS) else None
    except Exception:  # past the check, into the transfer this half-built manager cannot do
        return None
    return None


def _metadata_buffers(width: int | None, rows: int, env: Mapping[str, str] | None) -> Any:
    """SGLang's real ``MetadataBuffers`` of ``rows`` slots as the scheduler builds it with
    ``--sampling-mask-max-tokens width`` (``None``: as 0.5.16 - 0.5.19's scheduler, with no
    width: the class reads its variable), with ``env`` added to the environment."""
    import torch

    cls = getattr(importlib.import_module(targets.PD_METADATA_BUFFERS.module),
                  targets.PD_METADATA_BUFFERS.qualname)
    with offline_env(env):
        return cls(size=rows, hidden_size=4, hidden_states_dtype=torch.float32,
                   max_sampling_mask_tokens=width)


def mooncake_mask_rows(prefill_width: int | None, decode_width: int | None, rows: int = 3,
                       prefill_env: Mapping[str, str] | None = None,
                       decode_env: Mapping[str, str] | None = None
                       ) -> tuple[list[int], list[int]]:
    """SGLang's real Mooncake RDMA ``send_aux`` (its class's own method, on a half-built
    manager whose engine records the copies) from a prefill's real ``MetadataBuffers`` to
    a decode's, once per request slot; each copy made (``ctypes.memmove``) only when it
    falls inside one of the decode's tensors. Returns the slots whose sampling-mask row the
    decode reads (its ``get_buf``'s row) differently from the prefill's, and the slots with a
    copy that falls outside the decode's tensors (not made). Each server's buffers are
    built with its width and environment (:func:`_metadata_buffers`)."""
    import ctypes

    import torch
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    src = _metadata_buffers(prefill_width, rows, prefill_env)
    dst = _metadata_buffers(decode_width, rows, decode_env)
    wide, narrow = (src.output_token_sampling_mask_idx.shape[1],
                    dst.output_token_sampling_mask_idx.shape[1])
    keep = min(wide, narrow)
    src.output_token_sampling_mask_idx.copy_(torch.arange(
        1, 1 + rows * wide, dtype=torch.int32).view(rows, wide))
    ptrs, data_lens, item_lens = src.get_buf_infos()
    dst_ptrs, dst_lens, _ = dst.get_buf_infos()
    misplaced, outside = [], []
    for slot in range(rows):
        blocks: list[tuple[int, int, int]] = []
        manager = object.__new__(MooncakeKVManager)
        manager.__dict__.update(
            enable_custom_mem_pool=False, custom_mem_pool_type=None,
            kv_args=SimpleNamespace(aux_data_ptrs=ptrs, aux_data_lens=data_lens,
                                    aux_item_lens=item_lens),
            _transfer_data=lambda _session, found, into=blocks: into.extend(found) or 0)
        req = SimpleNamespace(dst_aux_index=slot, mooncake_session_id="decode")
        MooncakeKVManager.send_aux(manager, req, slot, dst_ptrs)
        for source, target, length in blocks:
            if any(p <= target and target + length <= p + n
                   for p, n in zip(dst_ptrs, dst_lens, strict=True)):
                ctypes.memmove(target, source, length)
            elif slot not in outside:
                outside.append(slot)
        got = dst.output_token_sampling_mask_idx[slot][:keep]  # what get_buf(slot) clones
        if not torch.equal(got, src.output_token_sampling_mask_idx[slot][:keep]):
            misplaced.append(slot)
    return misplaced, outside
