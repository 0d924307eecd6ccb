"""The composition root: ``install()`` / ``uninstall()`` / ``is_installed()``, idempotent
both ways, and ``summary()`` (a runtime that is not installed, for ``check`` and tests, is
:func:`sglang_dsv4_guard.assembly.standalone_runtime`).

``install`` builds the runtime (settings, plug-in manager, release profile), hands it to
the wrappers, wraps ``setup_state_kv_args`` (and every stale binding of it), and arranges
for the connector modules (MORI's, the common one's first contact, NIXL's and Mooncake's
peers) to be wrapped when SGLang imports them. Every module below this one receives what
it needs as arguments; none imports this one.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

from sglang_dsv4_guard.assembly import build_plugins
from sglang_dsv4_guard.contact.wrapper import CONTACT_MODULE, contact_patcher
from sglang_dsv4_guard.dedup.markers import cleanup_at_exit
from sglang_dsv4_guard.errors import DSV4GuardInstallError
from sglang_dsv4_guard.hook_registry import (
    StateHook,
    loader_is_running,
    register_state_hook,
    verify_after_apply_hooks,
)
from sglang_dsv4_guard.host.judgement import forget_judgements, judge_imported
from sglang_dsv4_guard.host.targets import DSV4_POOL, POOL_REGISTER_TARGET, STATE
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.metrics import Exporter, judgement_label
from sglang_dsv4_guard.mori.wrapper import MORI_MODULE, MoriGuard, patch_module
from sglang_dsv4_guard.patching import AppliedPatch, PostImportHooks, apply, restore
from sglang_dsv4_guard.peers.wrapper import CONNECTORS, PeerGuard, mori_registration
from sglang_dsv4_guard.plugins import GuardPlugins
from sglang_dsv4_guard.runtime import Runtime
from sglang_dsv4_guard.settings import Mode, Settings, settings_for
from sglang_dsv4_guard.state import provenance
from sglang_dsv4_guard.state.checks import MAPPING_CODE
from sglang_dsv4_guard.state.wrapper import make_state_wrapper
from sglang_dsv4_guard.undo import Undo, nothing_to_undo

__all__ = ["Installation", "install", "install_from_sglang_loader", "installation",
           "is_installed", "reset", "summary", "uninstall"]

logger = logging.getLogger(LOGGER_NAME)
Patcher = Callable[[ModuleType, PeerGuard], list[AppliedPatch]]


@dataclass
class Installation:
    """What one ``install()`` did; kept until ``uninstall()`` (``undo``: what ``install()``
    returned for it)."""

    runtime: Runtime
    mori: MoriGuard
    hooks: PostImportHooks
    peers: PeerGuard
    plugins: GuardPlugins  # the runtime's Hooks, as the manager they are (to register on)
    patches: list[AppliedPatch] = field(default_factory=list)
    undo: Undo = field(default=nothing_to_undo)
    ready: bool = False  # True once install() has returned it
    host_hook: StateHook | None = None  # registered with SGLang's HookRegistry (no undo)
    at_exit: Callable[[], None] | None = None  # registered with atexit until uninstall()


_lock = threading.RLock()
# Set while this thread runs _install(): a nested install() (a plug-in calling it while
# build_plugins imports it, under the re-entrant lock) is refused, so it cannot take over.
_installing = threading.local()
_current: Installation | None = None


def installation() -> Installation | None:
    """The current installation (for diagnostics and tests), or ``None``."""
    return _current


def is_installed() -> bool:
    """Whether the guard is installed in this process."""
    return _current is not None


def _nothing_to_undo() -> bool:
    """The undo of an ``install()`` that installed nothing."""
    logger.debug("sglang-dsv4-guard: this install() installed nothing; nothing to undo")
    return False


def _undo_for(current: Installation) -> Undo:
    def undo() -> bool:
        """Uninstall the installation this ``install()`` made, if it is still the current one."""
        with _lock:
            if _current is not current:
                logger.debug("sglang-dsv4-guard: this install() was already undone or "
                             "replaced by a newer one; nothing to undo")
                return False
            return uninstall()
    return undo


_warned: set[str] = set()  # reasons already warned about in this process (reset() clears)


def reset() -> None:
    """Put the process back as a fresh import of the guard left it, as structlog's
    ``reset_defaults`` does: uninstall (if installed), forget the warnings already given
    (each is given once per process) and the memoised judgements of the imported SGLang.
    Run by the project's test case before and after every test, so that whether a warning
    appears never depends on which test ran before. The launch identity
    (:mod:`sglang_dsv4_guard.dedup.identity`) is not reset: it is opened once per process
    by SGLang's loader, and the processes this one starts inherit it."""
    uninstall()
    with _lock:
        _warned.clear()
    forget_judgements()
    provenance.forget()


def _refuse(settings: Settings, reason: str, target: str | None = None) -> Undo:
    """Strict: raise. Otherwise warn (once per reason and process) and stay inert."""
    error = DSV4GuardInstallError(reason, target)
    if settings.mode.value is Mode.STRICT:
        raise error
    with _lock:
        first = reason not in _warned
        _warned.add(reason)
    if first:
        logger.warning("sglang-dsv4-guard stays inert: %s", reason)
    else:
        logger.debug("sglang-dsv4-guard stays inert: %s (already warned)", reason)
    return _nothing_to_undo


def _failure_reason(stage: str, exc: Exception) -> tuple[str, str | None]:
    if isinstance(exc, DSV4GuardInstallError):
        return f"{stage}: {exc.reason}", exc.target
    return f"{stage}: {type(exc).__name__}: {exc}", None


def install(mode: str | Mode = "on", autoshare: bool = False, *, log_format: str = "text",
            load_entry_points: bool = True, settings: Settings | None = None,
            metrics: str = "auto") -> Undo:
    """Install the guard; return this installation's own undo.

    ``mode`` is ``"on"`` or ``"strict"`` (``"off"`` uninstalls). ``metrics`` is
    ``"auto"``, ``"on"`` or ``"off"``, as ``SGLANG_DSV4_GUARD_METRICS`` says for the entry
    point (:mod:`sglang_dsv4_guard.metrics`). Calling it again
    with the same settings is harmless and returns the same undo; with other
    settings it uninstalls and installs afresh, so nothing of the earlier settings
    (strict-mode blocks, log format, registered plug-ins) stays behind. The undo
    removes only the installation it belongs to: once a newer ``install()`` replaced
    it, calling it does nothing and returns ``False``.

    All or nothing: when any patch cannot be applied, every patch already applied
    is restored. When the imported SGLang's code matches no release the guard knows
    (judged by the code, not the label: :mod:`sglang_dsv4_guard.host.judgement`), or when
    patching fails, it warns and leaves SGLang exactly as it was, or raises
    :class:`DSV4GuardInstallError` in strict mode. (Run by SGLang's ``load_plugins()``,
    the entry point uses :func:`install_from_sglang_loader` instead.) A nested call (a
    plug-in calling ``install()`` while this one imports it) raises
    :class:`DSV4GuardInstallError`, which the plug-in loader reports as that plug-in's
    failure to load.
    """
    if getattr(_installing, "active", False):
        raise DSV4GuardInstallError(
            "install() was called while the guard is installing (a plug-in calling it at "
            "import?); the operator's install() goes on, this call changed nothing")
    chosen = settings_for(mode, autoshare, log_format, settings, metrics)
    return _install_or_reuse(chosen, load_entry_points, via_sglang_registry=False)


def install_from_sglang_loader(settings: Settings) -> Undo:
    """The entry point's install: while SGLang's ``load_plugins()`` runs the guard, register
    an ``AROUND`` hook with SGLang's ``HookRegistry`` instead of patching (see
    :mod:`sglang_dsv4_guard.hook_registry`); otherwise (the registry would never apply the
    hook) patch as :func:`install` does. A guard already installed by patching with the same
    settings stays so, and its place in the chain is checked after ``apply_hooks()``."""
    running = loader_is_running()
    with _lock:
        same = _current is not None and _current.runtime.settings == settings
        if same and running and _current is not None and _current.host_hook is None:
            runtime = _current.runtime
            verify_after_apply_hooks(lambda: runtime.active)
        return _install_or_reuse(settings, True, via_sglang_registry=running)


def _install_or_reuse(chosen: Settings, load_entry_points: bool,
                      via_sglang_registry: bool) -> Undo:
    if chosen.mode.value is Mode.OFF:
        uninstall()
        return _nothing_to_undo
    with _lock:
        if _current is not None:
            if _current.runtime.settings == chosen:
                logger.debug("sglang-dsv4-guard is already installed; nothing to do")
                return _current.undo
            logger.info("sglang-dsv4-guard reconfiguring: uninstalling, then installing with "
                        "mode=%s autoshare=%s log_format=%s metrics=%s", chosen.mode.value.value,
                        chosen.autoshare.value, chosen.log_format.value, chosen.metrics.value)
            uninstall()
        _installing.active = True
        try:
            return _install(chosen, load_entry_points, via_sglang_registry)
        finally:
            _installing.active = False


def _install(chosen: Settings, load_entry_points: bool,
             via_sglang_registry: bool) -> Undo:
    global _current
    host = judge_imported()  # by the imported code, not the label
    if host.behaves_as is None:
        return _refuse(chosen, host.message)
    if host.message:
        logger.log(host.level, "sglang-dsv4-guard: %s", host.message)
    try:
        utils = importlib.import_module(STATE.module)  # unscanned: SGLang's (host/targets)
    except Exception as exc:
        return _refuse(chosen, f"importing {STATE.module} failed: {exc}",
                       str(STATE))
    current: Installation | None = None
    try:
        plugins = build_plugins(load_entry_points, chosen.log_format.value)
        runtime = Runtime(chosen, plugins, host.profile(), metrics=Exporter(
            chosen.metrics.value, chosen.mode.value.value, str(host.behaves_as),
            judgement_label(host), pending=tuple(plugins.load_problems)))
        peers = PeerGuard(runtime)
        current = Installation(runtime, MoriGuard(runtime, mori_registration(peers)),
                               PostImportHooks(), peers, plugins)
        current.undo = _undo_for(current)
        if via_sglang_registry:
            current.host_hook = register_state_hook(
                make_state_wrapper(runtime), utils.setup_state_kv_args,
                lambda: runtime.active)
            how = f"registered an AROUND hook on {STATE} with SGLang's HookRegistry"
        else:
            current.patches.append(apply(STATE, utils, make_state_wrapper(runtime)))
            how = "patched " + ", ".join(current.patches[0].rebound)
        _current = current
        current.hooks.watch(MORI_MODULE, functools.partial(
            _on_connector, current, MORI_MODULE, functools.partial(patch_module, guard=current.mori)))
        current.hooks.watch(CONTACT_MODULE, functools.partial(
            _on_connector, current, CONTACT_MODULE, contact_patcher(runtime)))
        current.hooks.watch(DSV4_POOL.module, functools.partial(_on_pool_module, current))
        for name, patcher in CONNECTORS:
            current.hooks.watch(name, functools.partial(_on_peers, current, patcher))
    except BaseException as exc:  # KeyboardInterrupt included: roll back, then let it rise
        if current is not None:
            if _current is current:
                _current = None
            _dismantle(current, "rollback")
        if not isinstance(exc, Exception):
            raise
        reason, target = _failure_reason("installing failed, every patch was rolled back",
                                         exc)
        return _refuse(chosen, reason, target)
    current.ready = True
    current.at_exit = functools.partial(_at_exit, current)
    atexit.register(current.at_exit)
    wrapped = {p.target.module for p in current.patches}
    lazy = (MORI_MODULE, CONTACT_MODULE, *(name for name, _ in CONNECTORS))
    logger.info("sglang-dsv4-guard installed: mode=%s autoshare=%s metrics=%s SGLang %s; %s; "
                "wrapped now: %s; when SGLang imports them: %s", chosen.mode.value.value,
                chosen.autoshare.value, chosen.metrics.value, host.name, how, ", ".join(
                    m for m in lazy if m in wrapped) or "-",
                ", ".join(m for m in lazy if m not in wrapped) or "-")
    return current.undo


def _on_connector(current: Installation, name: str,
                  patch: Callable[[ModuleType], list[AppliedPatch]], module: ModuleType) -> None:
    """Wrap an SGLang connector module (MORI's; the common one, for decode's first
    contact): now (inside ``install()``) or when SGLang imports it.

    Inside ``install()`` a failure rises to it, which rolls everything back. Later, at
    SGLang's import, a failure uninstalls the whole guard (installed means guarding)
    and warns, or, in strict mode, fails the import with the guard's reason.
    """
    with _lock:
        if _current is not current:
            return
        try:
            current.patches.extend(patch(module))
            current.runtime.metrics.ready(at_report=False)
        except Exception as exc:
            if not current.ready:
                raise
            uninstall()
            reason, target = _failure_reason(
                f"wrapping {name} after SGLang imported it failed, the guard was "
                "uninstalled", exc)
            _refuse(current.runtime.settings, reason, target)


def _on_pool_module(current: Installation, module: ModuleType) -> None:
    """Observe ``register_mapping`` (:mod:`sglang_dsv4_guard.state.provenance`). Optional:
    a failure is logged and the guard goes on without the observation."""
    with _lock:
        if _current is not current:
            return
        try:
            current.patches.append(apply(POOL_REGISTER_TARGET, module,
                                         provenance.make_register_wrapper))
        except Exception as exc:
            logger.info("sglang-dsv4-guard does not observe %s (%s); %s says what usually "
                        "registers the mappings instead", POOL_REGISTER_TARGET, exc, MAPPING_CODE)


def _on_peers(current: Installation, patcher: Patcher, module: ModuleType) -> None:
    """Check decode peers registering on Mooncake / NIXL (optional: a failure is logged)."""
    with _lock:
        try:
            if _current is current:
                current.patches.extend(patcher(module, current.peers))
                current.runtime.metrics.ready(at_report=False)
        except Exception as exc:
            logger.warning("sglang-dsv4-guard does not check the decode peers registering "
                           "through %s (%s: %s)", module.__name__, type(exc).__name__, exc)


def _dismantle(current: Installation, what: str) -> None:
    current.runtime.active = False
    current.runtime.metrics.retire()
    current.mori.blocked.clear()  # a wrapper held by someone else must refuse nothing
    current.hooks.unwatch_all()
    for patch in reversed(current.patches):
        for note in restore(patch):
            logger.warning("sglang-dsv4-guard %s: %s", what, note)
    current.patches.clear()


def _at_exit(current: Installation) -> None:
    """At interpreter exit (schedulers never call ``uninstall()``): the exact counts, if
    there was anything to count, and this process' marker clean-up."""
    try:
        _log_counts(current)
    except Exception as exc:
        logger.debug("sglang-dsv4-guard: no summary at exit (%s: %s)", type(exc).__name__, exc)
    cleanup_at_exit()


def _log_counts(current: Installation) -> None:
    """Log the summary if the installation counted anything: MORI or peer mismatches, reports."""
    reporter = current.runtime.plugins.log_reporter
    if current.mori.mismatches or current.peers.mismatches or (reporter is not None and reporter.counts):
        logger.info("%s", _summary_of(current))


def summary() -> str:
    """Exact counts of this process' reports, MORI peers and failed transfers, as text
    (``uninstall()`` logs them for the installation it removes)."""
    return _summary_of(_current)


def _summary_of(current: Installation | None) -> str:
    if current is None:
        return "sglang-dsv4-guard: not installed"
    reporter = current.runtime.plugins.log_reporter
    lines = reporter.summary_lines() if reporter is not None else []
    lines += current.mori.summary_lines() + current.peers.summary_lines()
    return "\n".join(["sglang-dsv4-guard summary (this process):",
                      *(f"  {line}" for line in lines or ["no reports"])])


def uninstall() -> bool:
    """Restore every original object; ``False`` (and a debug line) when not installed.
    An auto-shared mapping stays shared: the draft pool keeps the target's tensor."""
    global _current
    with _lock:
        current, _current = _current, None
        if current is None:
            logger.debug("sglang-dsv4-guard is not installed; nothing to uninstall")
            return False
        if current.at_exit is not None:
            atexit.unregister(current.at_exit)
        _log_counts(current)
        _dismantle(current, "uninstall")
        if current.host_hook is not None:
            logger.info("sglang-dsv4-guard: its AROUND hook stays in SGLang's HookRegistry, "
                        "which has no undo; it now passes every call straight to SGLang")
        logger.info("sglang-dsv4-guard uninstalled; originals restored")
        return True
