"""The registration wrappers the composition root installs: NIXL's (:mod:`.nixl`) and
Mooncake's (:mod:`.mooncake`), each patched the moment SGLang imports its connector module,
sharing one :class:`~sglang_dsv4_guard.peers.guard.PeerGuard` per process.

Nothing here imports ``nixl``, ``mooncake`` or SGLang's connector modules.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from sglang_dsv4_guard.host.targets import PEERS_MOONCAKE_WORKER, PEERS_NIXL_REGISTER
from sglang_dsv4_guard.patching import AppliedPatch
from sglang_dsv4_guard.peers.guard import PeerGuard
from sglang_dsv4_guard.peers.mooncake import WatchedTable, patch_mooncake
from sglang_dsv4_guard.peers.nixl import patch_nixl

__all__ = ["CONNECTORS", "PeerGuard", "WatchedTable", "patch_mooncake", "patch_nixl"]

#: The connector modules whose import the composition root watches, and their patchers.
CONNECTORS: tuple[tuple[str, Callable[[ModuleType, PeerGuard], list[AppliedPatch]]], ...] = (
    (PEERS_NIXL_REGISTER.module, patch_nixl), (PEERS_MOONCAKE_WORKER.module, patch_mooncake))
