"""The pluggy markers of the guard's hooks: a leaf, so that a hook implementation
(built-in or a plug-in's) imports nothing of the hook specs' argument types.

Plug-ins keep importing :data:`hookimpl` from :mod:`sglang_dsv4_guard` or
:mod:`sglang_dsv4_guard.hookspecs`; both are this one marker.
"""

from __future__ import annotations

import pluggy

__all__ = ["PAIR_HOOK", "PROJECT", "hookimpl", "hookspec"]

#: The pluggy project, and the entry-point group plug-ins register under.
PROJECT = "sglang_dsv4_guard"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: The pair hook's name (``hookspecs.sglang_dsv4_guard_check_pair``), for its callers:
#: ``check``'s contract and the registration guard.
PAIR_HOOK = "sglang_dsv4_guard_check_pair"
