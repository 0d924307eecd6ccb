"""Taking part in SGLang's own ``HookRegistry`` (``sglang/srt/plugins/hook_registry.py``).

When SGLang's ``load_plugins()`` runs the guard's entry point, the guard does not patch
``setup_state_kv_args`` itself: it registers an ``AROUND`` hook with the registry, as
every other plug-in does. ``load_plugins()`` applies all hooks after all plug-ins ran,
``REPLACE`` hooks innermost, so another plug-in's ``REPLACE`` on the same target no
longer removes the guard: the guard wraps it. SGLang logs "Applied N hook(s) ...
(from: plugin=dsv4_guard)" and warns about conflicting hooks as it does for anyone.

What can still take the guard out of the chain (a ``REPLACE`` on another name for the
same function that is applied after ours, a direct assignment) is found right after
``apply_hooks()``: the guard observes the end of that one call (a one-shot wrapper that
puts the registry's own method back on its first call), walks the chain SGLang will
call, and logs a WARNING naming the plug-ins whose hooks are in the way.

The registry has no undo, so this path is only for SGLang's loader. Programmatic
``install()`` patches directly and restores on ``uninstall()``.

The connector methods stay lazily patched (wrapped the moment SGLang imports their
module) on both paths, for reasons that hold in every release 0.5.16 - 0.5.23 (the
registry's ``_wrap_fn`` and ``apply_hooks()`` are the same code in each;
``tests/test_host_hooks.py::TestConnectorsStayLazy`` shows them in a scheduler process):

- every hook type SGLang applies adds its ``_wrap_fn`` frame, with ``*args``/``**kwargs``
  packing, to every call of the target;
- ``apply_hooks()`` imports each target's module (``pkgutil.resolve_name``) in every
  process that runs ``load_plugins()`` (engine, scheduler, detokenizer, DP controller),
  and logs ``Failed to apply hooks`` with a traceback where that import fails.

Per module:

- ``common/conn.py`` (decode's first contact): SGLang's scheduler module imports it
  already, so registering would import nothing new there; but the method runs per
  pending request, and the registry's frame would make the cached call cost more than
  the function itself (the lazy wrapper answers it at about 0.8x on 0.5.23,
  :mod:`sglang_dsv4_guard.contact.cached`).
- ``nixl/conn.py`` (``_add_remote_peer``) and ``mooncake/conn.py`` (the bootstrap
  thread, the transfer worker): no scheduler imports them unless it is that backend's
  server; registering would import the NIXL connector into every process of every server
  (Mooncake, MORI, not PD at all), and the Mooncake one too, which needs
  ``prometheus_client``: where it is absent, ``apply_hooks()`` would log an ERROR
  traceback in every process of a server that never uses Mooncake.
- ``mori/conn.py``: imports ``mori``, which needs ROCm: ``apply_hooks()`` would fail on
  it (an ERROR traceback per process) on every other machine.

MORI's and first contact's targets are in the chain check after ``apply_hooks()``
(:data:`LAZY_TARGETS`).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sglang_dsv4_guard.host.loader import guard_names
from sglang_dsv4_guard.host.targets import (
    MORI_TARGETS,
    PD_FIRST_CONTACT,
    PLUGINS_MODULE,
    REGISTRY_MODULE,
    STATE,
    STATE_HOLDERS,
)
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.patching import is_ours

__all__ = [
    "GUARD_TARGETS",
    "HookRecord",
    "StateHook",
    "chain_blockers",
    "effect",
    "hooks_on",
    "loader_is_running",
    "other_plugins_hooks",
    "register_state_hook",
    "verify_after_apply_hooks",
]

logger = logging.getLogger(LOGGER_NAME)

STATE_PATH = str(STATE)
#: The methods the guard patches lazily when SGLang imports their connector module:
#: MORI's, and decode's first contact (``CommonKVManager.try_ensure_parallel_info``).
LAZY_TARGETS = (*MORI_TARGETS, PD_FIRST_CONTACT)
#: The names the guard wraps; a hook on any target ending in one of them is on the
#: guard's target or on another name for it (``prefill.setup_state_kv_args``).
GUARD_TARGETS = (STATE.qualname, *(target.qualname for target in LAZY_TARGETS))


@dataclass(frozen=True)
class HookRecord:
    """One hook in SGLang's registry: its target, type, plug-in and callable."""

    target: str
    kind: str
    plugin: str
    hook: str

    def describe(self) -> str:
        """``replace on <target> by <hook> (plugin=x, dist=y)``."""
        return f"{self.kind} on {self.target} by {self.hook} ({self.plugin})"


def _registry() -> Any | None:
    module = sys.modules.get(REGISTRY_MODULE)
    return getattr(module, "HookRegistry", None)


def loader_is_running() -> bool:
    """Whether SGLang's ``load_plugins()`` is running a plug-in right now and has not
    applied the hooks for our target yet (then a registered hook will be applied)."""
    source = getattr(sys.modules.get(REGISTRY_MODULE), "_current_plugin_source", None)
    registry = _registry()
    if source is None or registry is None or source.get() is None:
        return False
    return STATE_PATH not in registry._patched


def _source_text(source: Any) -> str:
    if source is None:
        return "unknown plug-in"
    if getattr(source, "dist_name", None):
        return f"plugin={source.plugin_name}, dist={source.dist_name}"
    return f"plugin={source.plugin_name}"


def _name(obj: object) -> str:
    module = getattr(obj, "__module__", None) or "?"
    return f"{module}.{getattr(obj, '__qualname__', None) or type(obj).__qualname__}"


def hooks_on(names: Iterable[str] = GUARD_TARGETS, *,
             exclude: object = None) -> list[tuple[HookRecord, object]]:
    """Every hook in SGLang's registry whose target ends in one of ``names``, except
    ``exclude``; with the hook object itself."""
    registry = _registry()
    if registry is None:
        return []
    found = []
    for target, entries in list(registry._hooks.items()):
        if not any(target == n or target.endswith("." + n) for n in names):
            continue
        for kind, hook, source in entries:
            if hook is exclude:
                continue
            found.append((HookRecord(target, kind.value, _source_text(source), _name(hook)),
                          hook))
    return found


def _closure(fn: object) -> dict[str, object]:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    values = {}
    for name, cell in zip(code.co_freevars, cells, strict=False):
        try:
            values[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return values


def chain_blockers(fn: object, is_ours: Callable[[object], bool],
                   records: list[tuple[HookRecord, object]]) -> list[str] | None:
    """Walk the call chain from ``fn`` inwards; ``None`` when it reaches the guard, else
    what stops it (a ``REPLACE`` hook, a function without ``__wrapped__``), in words.

    SGLang's ``_wrap_fn`` keeps the hook in a closure cell ``hook`` and, except for
    ``REPLACE``, the next function in ``original_fn``; ``__wrapped__`` points inwards.
    """
    seen: set[int] = set()
    current: object = fn
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        cells = _closure(current)
        hook = cells.get("hook")
        if is_ours(current) or (hook is not None and is_ours(hook)):
            return None
        if hook is not None and "original_fn" not in cells:
            named = [r.describe() for r, h in records if h is hook]
            return named or [f"a REPLACE hook {_name(hook)}"]
        inner = getattr(current, "__wrapped__", None)
        if inner is None:
            return [f"{_name(current)}, which the guard does not wrap"]
        current = inner
    return ["a call chain that never reaches the guard"]


class StateHook:
    """The guard's ``AROUND`` hook on ``setup_state_kv_args`` (one per installation)."""

    def __init__(self, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]],
                 sglang_function: Callable[..., Any], active: Callable[[], bool]) -> None:
        self._make_wrapper = make_wrapper
        self._sglang_function = sglang_function
        self.active = active
        self._wrappers: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}
        self.calls = 0
        self.__qualname__ = self.__name__ = "sglang_dsv4_guard_around_setup_state_kv_args"

    def __call__(self, original_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self.active():
            return original_fn(*args, **kwargs)
        entry = self._wrappers.get(id(original_fn))
        if entry is None or entry[0] is not original_fn:
            entry = (original_fn, self._make_wrapper(original_fn))
            self._wrappers[id(original_fn)] = entry
            self._check_inner(original_fn)
        self.calls += 1
        return entry[1](*args, **kwargs)

    def _check_inner(self, original_fn: Callable[..., Any]) -> None:
        """Under the guard should be SGLang's function, or hooks that call it; name whoever
        replaced it."""
        records = hooks_on((STATE.qualname,), exclude=self)
        blockers = chain_blockers(original_fn, lambda f: f is self._sglang_function, records)
        if blockers is None:
            return
        logger.warning(
            "sglang-dsv4-guard: setup_state_kv_args under the guard is not SGLang's function "
            "but %s; the guard checks the pools and calls it, and SGLang's own check runs only "
            "if it does", "; ".join(blockers))


def _bound_functions() -> list[tuple[str, object]]:
    """Where SGLang looks the guard's targets up, and what it finds there now."""
    found: list[tuple[str, object]] = []
    for name in STATE_HOLDERS:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, STATE.attr):
            found.append((f"{name}.{STATE.attr}", getattr(module, STATE.attr)))
    for target in LAZY_TARGETS:
        owner_name, method = target.qualname.rsplit(".", 1)
        owner = getattr(sys.modules.get(target.module), owner_name, None)
        if owner is not None and method in vars(owner):
            found.append((str(target), vars(owner)[method]))
    return found


def _verify(hook: StateHook | None, active: Callable[[], bool]) -> None:
    """After ``apply_hooks()``: is the guard (its ``hook``, or its patched wrappers) in every
    chain SGLang calls?"""
    if not active():
        return
    records = hooks_on(exclude=hook)
    out = {}
    for where, fn in _bound_functions():
        blockers = chain_blockers(fn, lambda f: (hook is not None and f is hook)
                                  or is_ours(f), records)
        if blockers:
            out[where] = blockers
    if not out:
        logger.debug("sglang-dsv4-guard is in the call chain of everything it wraps")
        return
    blockers = sorted({b for found in out.values() for b in found})
    logger.warning(
        "sglang-dsv4-guard is NOT in the call chain of %s: another plug-in's hook takes its "
        "place: %s. The guard stays installed but will not see those calls; remove that "
        "hook, or make it an AROUND hook that calls original_fn",
        ", ".join(out), "; ".join(blockers))


def effect(record: HookRecord) -> tuple[str, bool]:
    """What another plug-in's hook does to the guard, and whether that is a problem."""
    if record.target.endswith(tuple("." + target.attr for target in LAZY_TARGETS)):
        if record.kind == "replace":
            return ("applied after the guard wrapped the connector: takes the guard out of "
                    "that call chain", True)
        return "wraps the guard's wrapper of the connector method", False
    if record.kind == "replace":
        if record.target == STATE_PATH or record.target < STATE_PATH:
            return ("replaces SGLang's function under the guard: the guard wraps the "
                    "replacement, and SGLang's own check runs only if the replacement "
                    "calls it", False)
        return ("applied after the guard's hook: takes the guard out of the call chain",
                True)
    if record.kind == "around":
        return "wraps or is wrapped by the guard's hook; fine if it calls original_fn", False
    return f"runs {record.kind} the function; the guard stays in the chain", False


def other_plugins_hooks(own: str = "dsv4_guard") -> tuple[list[HookRecord], list[str]]:
    """Run every other SGLang plug-in's function as ``load_plugins()`` does, but apply no
    hook; return their hooks on the guard's targets and the plug-ins that failed.
    The registry's records are put back as they were."""
    host = importlib.import_module(PLUGINS_MODULE)  # unscanned: SGLang's plug-in loader
    hook_registry = importlib.import_module(REGISTRY_MODULE)  # unscanned: its registry

    registry = hook_registry.HookRegistry
    saved = {target: list(entries) for target, entries in registry._hooks.items()}
    problems = []
    registry._hooks.clear()  # only what the other plug-ins register now, not the guard's
    try:
        found = host.load_plugins_by_group(host.GENERAL_PLUGINS_GROUP,
                                           excluded_dists=host._get_excluded_dists())
        guard = {own, *guard_names(found)}  # the guard under any entry-point name
        for name, (func, dist) in found.items():
            if name in guard:
                continue
            token = hook_registry._current_plugin_source.set(
                hook_registry.HookSource(plugin_name=name, dist_name=dist))
            try:
                func()
            except (Exception, SystemExit) as exc:
                problems.append(f"SGLang plug-in {name} failed: {type(exc).__name__}: {exc}")
            finally:
                hook_registry._current_plugin_source.reset(token)
        return [record for record, _ in hooks_on()], problems
    finally:
        registry._hooks.clear()
        registry._hooks.update(saved)


def _after_apply_hooks(callback: Callable[[], None]) -> None:
    """Run ``callback`` once, right after the registry's next ``apply_hooks()``; the
    registry's own method is put back on that call."""
    registry = _registry()
    assert registry is not None
    own = vars(registry)["apply_hooks"]

    def apply_hooks(cls: Any) -> None:
        if vars(registry).get("apply_hooks") is ours:
            registry.apply_hooks = own
        try:
            own.__get__(None, cls)()
        finally:
            try:
                callback()
            except Exception:
                logger.warning("sglang-dsv4-guard could not check its place in SGLang's hook "
                               "chain", exc_info=True)

    ours = classmethod(apply_hooks)
    registry.apply_hooks = ours


def register_state_hook(make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]],
                        sglang_function: Callable[..., Any],
                        active: Callable[[], bool]) -> StateHook:
    """Register the guard's ``AROUND`` hook with SGLang's registry (from ``activate()``,
    while ``load_plugins()`` runs it) and check the chain after ``apply_hooks()``."""
    module = sys.modules[REGISTRY_MODULE]
    hook = StateHook(make_wrapper, sglang_function, active)
    module.HookRegistry.register(STATE_PATH, hook, module.HookType.AROUND)
    _after_apply_hooks(lambda: _verify(hook, hook.active))
    return hook


def verify_after_apply_hooks(active: Callable[[], bool]) -> None:
    """A guard installed by patching before ``load_plugins()``: check after ``apply_hooks()``
    that no other plug-in's hook took its wrappers out of the chain."""
    if _registry() is not None:
        _after_apply_hooks(lambda: _verify(None, active))
