"""Plain-value snapshot of one MORI state transfer, as the prefill manager sees it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SendSnapshot"]


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
    pp_size: int | None = None
    engine_key: str | None = None
    endpoint: str | None = None
    dst_port: int | None = None
