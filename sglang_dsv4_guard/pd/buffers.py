"""The metadata (aux) buffers each server registers, counted by SGLang's own classes.

The prefill and the decode each allocate ``MetadataBuffers`` and register the list
``get_buf_infos`` gives; the transfer pairs them by position. A buffer enabled on one
server only (``SGLANG_ENABLE_DISAGG_SAMPLING_MASK`` from 0.5.20, whose three buffers sit in
the middle of the list; ``--disaggregation-enable-kv-checksum`` from 0.5.21, whose buffer
is last) shifts every later one. 0.5.23 logs it when the decode registers
(``check_peer_aux_buffer_count``); earlier releases say nothing.

The buffers are built for real on CPU with the smallest sizes giving the same count, in the
server's environment (the caller applies it: SGLang reads the variable in the constructor).
In 0.5.16 - 0.5.19 the scheduler passes the class no width: it reads
``SGLANG_DISAGGREGATION_SAMPLING_MASK_MAX_TOKENS`` (default 0), which both switches the
sampling-mask buffers on (above 0) and sizes them; such a class is built with no width, so
the count and the widths are the ones it gives in the server's environment.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from types import SimpleNamespace
from typing import Any

from sglang_dsv4_guard.host.targets import ENVIRON_MODULE, PD_AUX_COUNT, PD_METADATA_BUFFERS

__all__ = ["MASK_ENABLE_ENV", "MASK_WIDTH_ENV", "MAX_WIDTH", "aux_buffer_count",
           "aux_row_widths", "mask_env", "peer_count_log"]

#: The variable 0.5.16 - 0.5.19's ``MetadataBuffers`` reads when it is given no width
#: (0.5.20+ refuse it at start-up: ``validate_sampling_mask_max_tokens``).
MASK_WIDTH_ENV = "SGLANG_DISAGGREGATION_SAMPLING_MASK_MAX_TOKENS"
#: The variable 0.5.20+'s ``MetadataBuffers`` reads to build the sampling-mask buffers.
MASK_ENABLE_ENV = "SGLANG_ENABLE_DISAGG_SAMPLING_MASK"

_ROWS = 1
#: The widest ``--sampling-mask-max-tokens`` whose buffers are built at their real width
#: (one row: 4 bytes a token in each of its two buffers); a wider one is not judged.
MAX_WIDTH = 1 << 20


def aux_buffer_count(kv_checksum: bool, sampling_mask_tokens: int | None) -> int:
    """How many metadata buffers the release's ``MetadataBuffers`` registers for these
    settings (the environment as it is now), built as the module says: never at the flags'
    widths (a server's ``--sampling-mask-max-tokens`` may be far more than this machine
    holds). Read in each release's ``MetadataBuffers.__init__`` / ``get_buf_infos``: the KV
    checksum's buffer (0.5.21+) exists iff ``kv_checksum_enabled``, the DSA top-k one iff
    ``output_dsa_topk_indices_dim > 0`` (built with 0), every other buffer always."""
    cls = _buffers_class()
    params = inspect.signature(cls.__init__).parameters
    if sampling_mask_tokens is None and _reads_env(params):
        _env_width()  # the class reads the variable itself; too wide to build: ValueError
        width = None
    else:
        width = 1 if sampling_mask_tokens is None else min(max(int(sampling_mask_tokens), 0), 1)
    return len(_built(cls, params, width, kv_checksum).get_buf_infos()[0])


def _buffers_class() -> Any:
    return getattr(importlib.import_module(PD_METADATA_BUFFERS.module),  # unscanned: targets
                   PD_METADATA_BUFFERS.qualname)


def _built(cls: Any, params: Any, width: int | None, kv_checksum: bool) -> Any:
    """The release's class with one row and the smallest sizes, given what it takes of
    these (``width``: ``max_sampling_mask_tokens``, ``None`` its default)."""
    import torch

    wanted: dict[str, Any] = dict(
        size=_ROWS, hidden_size=1, hidden_states_dtype=torch.float32,
        max_sampling_mask_tokens=width, max_top_logprobs_num=1,
        output_dsa_topk_indices_dim=0, kv_checksum_enabled=kv_checksum)
    return cls(**{k: v for k, v in wanted.items() if k in params})


def _reads_env(params: Any) -> bool:
    """Whether the class, given no width, reads :data:`MASK_WIDTH_ENV` (0.5.16 - 0.5.19:
    the parameter defaults to ``None``)."""
    width = params.get("max_sampling_mask_tokens")
    return width is not None and width.default is None


def _env_width() -> int:
    """:data:`MASK_WIDTH_ENV` as SGLang's ``envs`` reads it in the environment as it is
    now (the read the class makes); ``ValueError`` when wider than :data:`MAX_WIDTH`."""
    envs = importlib.import_module(ENVIRON_MODULE).envs  # unscanned: SGLang's environ
    width = int(getattr(envs, MASK_WIDTH_ENV).get() or 0)
    if width > MAX_WIDTH:
        raise ValueError(f"{MASK_WIDTH_ENV}={width} is wider than {MAX_WIDTH}, the widest "
                         "row this check builds")
    return width


def mask_env() -> str:
    """The variable that switches the release's sampling-mask buffers on:
    :data:`MASK_WIDTH_ENV` where the class reads it (0.5.16 - 0.5.19), else
    :data:`MASK_ENABLE_ENV`."""
    params = inspect.signature(_buffers_class().__init__).parameters
    return MASK_WIDTH_ENV if _reads_env(params) else MASK_ENABLE_ENV


def aux_row_widths(kv_checksum: bool,
                   sampling_mask_tokens: int | None) -> list[tuple[str, int]]:
    """The name and row width in bytes (``item_lens``) of each metadata buffer the release's
    ``MetadataBuffers`` registers, built as the scheduler builds it (from 0.5.20:
    ``max_sampling_mask_tokens=server_args.sampling_mask_max_tokens``; ``None``, a server
    without the flag, for a class that reads :data:`MASK_WIDTH_ENV`) with one row, in the
    environment as it is now. Raises ``ValueError`` for a width over :data:`MAX_WIDTH` (not
    built here), ``TypeError`` when the width and the release disagree."""
    import torch

    cls = _buffers_class()
    params = inspect.signature(cls.__init__).parameters
    if "max_sampling_mask_tokens" not in params or (
            _reads_env(params) != (sampling_mask_tokens is None)):
        raise TypeError("this release's MetadataBuffers takes no --sampling-mask-max-tokens"
                        if sampling_mask_tokens is not None else
                        "this release's MetadataBuffers needs a --sampling-mask-max-tokens")
    if sampling_mask_tokens is None:
        _env_width()  # the class reads the variable itself; too wide to build: ValueError
        buffers = _built(cls, params, None, kv_checksum)
    elif int(sampling_mask_tokens) > MAX_WIDTH:
        # built at widths 1 and 2: when no row changes, the width sizes nothing here (the
        # sampling mask is off) and the narrow build is the answer
        buffers = _built(cls, params, 1, kv_checksum)
        if buffers.get_buf_infos()[2] != _built(cls, params, 2, kv_checksum).get_buf_infos()[2]:
            raise ValueError(f"--sampling-mask-max-tokens {sampling_mask_tokens} is wider than "
                             f"{MAX_WIDTH}, the widest row this check builds")
    else:
        buffers = _built(cls, params, int(sampling_mask_tokens), kv_checksum)
    ptrs, _, item_lens = buffers.get_buf_infos()
    names = {t.data_ptr(): name for name, t in vars(buffers).items()
             if isinstance(t, torch.Tensor)}
    return [(names.get(ptr, f"buffer {i}"), int(n))
            for i, (ptr, n) in enumerate(zip(ptrs, item_lens, strict=True))]


def peer_count_log(local: int, remote: int) -> str | None:
    """What the release's ``check_peer_aux_buffer_count`` logs when a decode with
    ``remote`` buffers registers with a prefill with ``local`` ones (run on a half-built
    manager); ``None`` when it logs nothing. Raises ``AttributeError`` on a release without
    the check."""
    module = importlib.import_module(PD_AUX_COUNT.module)  # unscanned: targets
    owner, method = PD_AUX_COUNT.qualname.split(".")
    cls = getattr(module, owner)
    manager = object.__new__(cls)
    manager.kv_args = SimpleNamespace(aux_data_ptrs=[0] * local)
    records: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = module.logger
    handler, propagate, disabled = _Keep(logging.DEBUG), logger.propagate, logger.disabled
    logger.addHandler(handler)
    logger.propagate, logger.disabled = False, False
    try:
        getattr(cls, method)(manager, "<decode address>", remote)
    finally:
        logger.removeHandler(handler)
        logger.propagate, logger.disabled = propagate, disabled
    return records[0].getMessage() if records else None
