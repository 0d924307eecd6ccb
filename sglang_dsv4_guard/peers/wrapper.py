"""The registration wrappers the composition root installs: NIXL's (:mod:`.nixl`) and
Mooncake's (:mod:`.mooncake`), each patched the moment SGLang imports its connector module,
sharing one :class:`~sglang_dsv4_guard.peers.guard.PeerGuard` per process.

Nothing here imports ``nixl``, ``mooncake`` or SGLang's connector modules.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.host.targets import PEERS_MOONCAKE_WORKER, PEERS_NIXL_REGISTER
from sglang_dsv4_guard.patching import AppliedPatch
from sglang_dsv4_guard.peers.guard import PeerGuard, checked, is_prefill
from sglang_dsv4_guard.peers.mooncake import patch_mooncake
from sglang_dsv4_guard.peers.nixl import patch_nixl

__all__ = ["CONNECTORS", "PeerGuard", "mori_registration", "patch_mooncake",
           "patch_nixl"]

#: The connector modules whose import the composition root watches, and their patchers.
CONNECTORS: tuple[tuple[str, Callable[[ModuleType, PeerGuard], list[AppliedPatch]]], ...] = (
    (PEERS_NIXL_REGISTER.module, patch_nixl), (PEERS_MOONCAKE_WORKER.module, patch_mooncake))


def mori_registration(guard: PeerGuard) -> Callable[[object, object], DSV4GuardError | None]:
    """What MORI's registration wrapper calls for a decode peer registering with a prefill
    rank: its conditions besides MORI's TP rule, checked and reported as NIXL's are."""
    def check(manager: object, info: object) -> DSV4GuardError | None:
        return checked(guard, "mori", manager, info) if is_prefill(manager) else None

    return check
