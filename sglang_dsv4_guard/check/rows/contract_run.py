"""What every prefill/decode contract row of ``check`` reads: the two endpoints and the
two derived sides they came from (its own module, so the rows and the row table that
imports them share one type)."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.pd.endpoint import Endpoint

__all__ = ["ContractRun"]


@dataclass(frozen=True)
class ContractRun:
    """The two endpoints, the two sides they came from and the release's name."""

    prefill: Endpoint
    decode: Endpoint
    prefill_side: DerivedServer
    decode_side: DerivedServer
    release: str
    # False in ``check --fix``'s re-runs (run_check's ``derive``): deriving a fix resolves
    # edited lines again.
    derive: bool = True
