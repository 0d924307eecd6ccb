"""Where the guard is put together: its built-in hook implementations paired with their
names, the plug-in manager built with them, and a runtime that is not installed.

It sits above every wrapped place (``state``, ``mori``, ``peers``, ``contact``), so those
packages, whose wrappers use the manager and whose checks are registered in it, never
reach their own checks through it: the import graph has no folder-level cycle.
"""

from __future__ import annotations

from sglang_dsv4_guard.autoshare import rebind as autoshare_rebind
from sglang_dsv4_guard.contact import checks as contact_checks
from sglang_dsv4_guard.host.judgement import judge_imported
from sglang_dsv4_guard.mori import checks as mori_checks
from sglang_dsv4_guard.pd import conditions as pd_conditions
from sglang_dsv4_guard.peers import checks as peers_checks
from sglang_dsv4_guard.plugins import BUILTIN_NAMES, GuardPlugins, add_all, build_manager
from sglang_dsv4_guard.runtime import Runtime
from sglang_dsv4_guard.settings import Mode, settings_for
from sglang_dsv4_guard.state import checks as state_checks

__all__ = ["BUILTIN_PLUGINS", "build_plugins", "standalone_runtime"]

#: The built-in hook implementations by name, registered first as ordinary plug-ins (so,
#: in pluggy's order, they run after third-party ones).
BUILTIN_PLUGINS: tuple[tuple[str, object], ...] = tuple(zip(BUILTIN_NAMES, (
    autoshare_rebind, state_checks, mori_checks, peers_checks, pd_conditions,
    contact_checks), strict=True))


def build_plugins(load_entry_points: bool = True, log_format: str = "text") -> GuardPlugins:
    """A manager with the built-ins and, unless told not to, third-party plug-ins.

    ``log_format`` (``"text"`` or ``"json"``) is the built-in log reporter's.
    """
    return build_manager(BUILTIN_PLUGINS, load_entry_points, log_format)


def standalone_runtime(plugins: tuple[object, ...] = (), mode: str = "on",
                       autoshare: bool = False, load_entry_points: bool = False) -> Runtime:
    """A runtime that is not installed: the wrappers' machinery for ``check`` and tests.

    The built-ins, then (with ``load_entry_points``) third-party entry points, then
    ``plugins`` registered as a server registers entry points (a refused one raises
    ``ValueError`` with its plug-in failure's details). ``mode`` is ``"on"`` or ``"strict"``
    (a bad one is a :class:`~sglang_dsv4_guard.errors.SettingError`).
    """
    settings = settings_for(mode, autoshare, "text", None)
    if settings.mode.value is Mode.OFF:
        raise ValueError(f"mode must be 'on' or 'strict' (got {mode!r}): with the guard off "
                         "there is nothing to check")
    host = judge_imported()  # the checks of the imported code, as install() uses
    if host.behaves_as is None:
        raise RuntimeError(f"the guard cannot model this SGLang: {host.message}")
    manager = build_plugins(load_entry_points=load_entry_points)
    add_all(manager, plugins)
    return Runtime(settings, manager, host.profile())
