"""NIXL: ``NixlKVManager._add_remote_peer`` (run by the prefill's bootstrap thread) is
wrapped. A new peer's registration is checked (:mod:`.checks`) once SGLang's own code ran;
when SGLang raised there (the bootstrap thread then dies, and every later request to the
rank times out), the guard's log names the cause's code, the peer and what now hangs, once
per distinct cause in this process. SGLang's exception rises unchanged.

Nothing here imports ``nixl`` or SGLang's connector module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sglang_dsv4_guard.host.targets import PEERS_NIXL_REGISTER
from sglang_dsv4_guard.patching import AppliedPatch, apply_all
from sglang_dsv4_guard.peers.guard import PeerGuard, checked, is_new_peer, judged, timeout_text
from sglang_dsv4_guard.wrapping import note_on, our_failure

__all__ = ["patch_nixl"]


def _nixl_register(guard: PeerGuard, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _add_remote_peer(self: Any, decode_kv_args: Any, *args: Any, **kwargs: Any) -> Any:
        fresh = guard.rt.active and is_new_peer(self, decode_kv_args)
        try:
            result = original(self, decode_kv_args, *args, **kwargs)
        except Exception as error:
            if fresh:
                ours = checked(guard, "nixl", self, decode_kv_args)
                try:
                    guard.on_death("nixl", "bootstrap thread", self, error, timeout_text())
                except Exception as exc:
                    ours = ours or our_failure(
                        guard.rt, "naming why the NIXL bootstrap thread died", exc)
                if ours is not None:
                    note_on(error, ours)
            raise
        ours = checked(guard, "nixl", self, decode_kv_args) if fresh else None
        if ours is not None:
            raise ours
        return result

    return _add_remote_peer


def patch_nixl(module: ModuleType, guard: PeerGuard) -> list[AppliedPatch]:
    """Wrap NIXL's registration in SGLang's imported connector module."""
    judged("peers.nixl_register")
    return apply_all(module, [(PEERS_NIXL_REGISTER, functools.partial(_nixl_register, guard))])
