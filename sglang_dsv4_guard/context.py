"""The context a check runs in: plain values, frozen, built by the wrappers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sglang_dsv4_guard.releases import HostProfile

__all__ = ["SendContext", "StateContext"]


@dataclass(frozen=True)
class StateContext:
    """Where ``setup_state_kv_args`` was called and how the guard is configured.

    ``caller`` is the module that called SGLang's function (prefill or decode
    bootstrap queue), ``environ`` the environment variables that decide pool values.
    """

    profile: HostProfile
    caller: str = "unknown"
    mode: str = "on"
    autoshare: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, str]:
        """The context as strings, for reports."""
        return {
            "function": "sglang.srt.disaggregation.utils.setup_state_kv_args",
            "caller": self.caller,
            "sglang": str(self.profile.version),
            "mode": self.mode,
            "autoshare": "on" if self.autoshare else "off",
        }


@dataclass(frozen=True)
class SendContext:
    """The MORI manager's side of a transfer: the prefill server's view."""

    profile: HostProfile
    mode: str = "on"
    phase: str = "send"  # "register" when a decode peer registers, "send" per transfer
