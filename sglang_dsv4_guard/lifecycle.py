"""``install()`` / ``uninstall()`` / ``is_installed()``: idempotent both ways.

``install`` judges the imported SGLang by its code (``host.py``) before patching,
wraps ``setup_state_kv_args`` (and every stale binding of it), and arranges for the
MORI connector to be wrapped when SGLang imports it. ``uninstall`` restores every
original object where our wrapper still stands and removes the pending import hook.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType

from sglang_dsv4_guard.errors import DSV4GuardInstallError, SettingError
from sglang_dsv4_guard.host import judge_imported
from sglang_dsv4_guard.mori.wrapper import MORI_MODULE, MoriGuard, patch_module
from sglang_dsv4_guard.patching import AppliedPatch, PatchTarget, PostImportHooks, apply, restore
from sglang_dsv4_guard.plugins import build_plugins
from sglang_dsv4_guard.releases import profile_for
from sglang_dsv4_guard.runtime import Runtime
from sglang_dsv4_guard.settings import LOG_FORMATS, Mode, Setting, Settings, parse_mode
from sglang_dsv4_guard.state.wrapper import make_state_wrapper

__all__ = ["install", "installation", "is_installed", "uninstall"]

logger = logging.getLogger("sglang_dsv4_guard")

STATE_TARGET = PatchTarget("sglang.srt.disaggregation.utils", "setup_state_kv_args")


@dataclass
class Installation:
    """What one ``install()`` did; kept until ``uninstall()``."""

    runtime: Runtime
    mori: MoriGuard
    hooks: PostImportHooks
    patches: list[AppliedPatch] = field(default_factory=list)


_lock = threading.RLock()
_current: Installation | None = None


def installation() -> Installation | None:
    """The current installation (for diagnostics and tests), or ``None``."""
    return _current


def is_installed() -> bool:
    """Whether the guard is installed in this process."""
    return _current is not None


_warned: set[str] = set()


def _refuse(settings: Settings, reason: str, target: str | None = None) -> Callable[[], bool]:
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
    return uninstall


def _settings_for(mode: str | Mode, autoshare: bool, log_format: str,
                  settings: Settings | None) -> Settings:
    if settings is not None:
        return settings
    chosen = parse_mode(mode.value if isinstance(mode, Mode) else str(mode), "install(mode=...)")
    if not isinstance(autoshare, bool):
        raise SettingError("install(autoshare=...)", autoshare, ("True", "False"),
                           "nothing was installed")
    if log_format not in LOG_FORMATS:
        raise SettingError("install(log_format=...)", log_format, LOG_FORMATS,
                           "nothing was installed")
    return Settings(Setting(chosen, f"install(mode={mode!r})"),
                    Setting(autoshare, f"install(autoshare={autoshare!r})"),
                    Setting(log_format, f"install(log_format={log_format!r})"))


def install(mode: str | Mode = "on", autoshare: bool = False, *, log_format: str = "text",
            load_entry_points: bool = True,
            settings: Settings | None = None) -> Callable[[], bool]:
    """Install the guard; return the undo (``uninstall``).

    ``mode`` is ``"on"`` or ``"strict"`` (``"off"`` uninstalls). Calling it again
    with the same settings is harmless; with other settings it reconfigures. When the
    imported SGLang's code matches no release the guard knows, it warns and stays
    inert, or raises :class:`DSV4GuardInstallError` in strict mode.
    """
    global _current
    chosen = _settings_for(mode, autoshare, log_format, settings)
    if chosen.mode.value is Mode.OFF:
        uninstall()
        return uninstall
    with _lock:
        if _current is not None:
            if _current.runtime.settings == chosen:
                logger.debug("sglang-dsv4-guard is already installed; nothing to do")
            else:
                _current.runtime.settings = chosen
                logger.info("sglang-dsv4-guard reconfigured: mode=%s autoshare=%s",
                            chosen.mode.value.value, chosen.autoshare.value)
            return uninstall
        host = judge_imported()  # by the imported code, not the label (host.py)
        if host.behaves_as is None:
            return _refuse(chosen, host.message)
        if host.message:
            logger.log(host.level, "sglang-dsv4-guard: %s", host.message)
        version = host.version or host.behaves_as
        try:
            utils = importlib.import_module(STATE_TARGET.module)
        except Exception as exc:
            return _refuse(chosen, f"importing {STATE_TARGET.module} failed: {exc}",
                           str(STATE_TARGET))
        runtime = Runtime(chosen, build_plugins(load_entry_points, chosen.log_format.value),
                          replace(profile_for(host.behaves_as), version=version))
        current = Installation(runtime, MoriGuard(runtime), PostImportHooks())
        try:
            current.patches.append(apply(STATE_TARGET, utils, make_state_wrapper(runtime)))
        except DSV4GuardInstallError as exc:
            return _refuse(chosen, exc.reason, exc.target)

        def on_mori(module: ModuleType) -> None:
            with _lock:
                if _current is current:
                    current.patches.extend(patch_module(module, current.mori))

        _current = current
        current.hooks.watch(MORI_MODULE, on_mori)
        logger.info(
            "sglang-dsv4-guard installed: mode=%s autoshare=%s SGLang %s; patched %s; "
            "MORI connector %s",
            chosen.mode.value.value, chosen.autoshare.value, version,
            ", ".join(current.patches[0].rebound),
            "wrapped" if len(current.patches) > 1 else "will be wrapped when SGLang imports it",
        )
        return uninstall


def uninstall() -> bool:
    """Restore every original object; ``False`` (and a debug line) when not installed.

    An auto-shared mapping stays shared: the draft pool keeps the target's tensor.
    """
    global _current
    with _lock:
        current, _current = _current, None
        if current is None:
            logger.debug("sglang-dsv4-guard is not installed; nothing to uninstall")
            return False
        current.runtime.active = False
        current.hooks.unwatch_all()
        for patch in reversed(current.patches):
            for note in restore(patch):
                logger.warning("sglang-dsv4-guard uninstall: %s", note)
        logger.info("sglang-dsv4-guard uninstalled; originals restored")
        return True
