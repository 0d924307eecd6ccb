"""The installed guard's state, shared by the wrappers: settings, plug-ins, release.

Built by :mod:`sglang_dsv4_guard.lifecycle` (``install()``), or not installed by
:func:`standalone_runtime` (for ``check`` and tests), and handed to the wrappers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Report
from sglang_dsv4_guard.host.releases import HostProfile
from sglang_dsv4_guard.host.verdict import judge_imported
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.plugins import GuardPlugins, add_all, build_plugins
from sglang_dsv4_guard.settings import Mode, Settings, settings_for

__all__ = ["Runtime", "add_note", "standalone_runtime"]

logger = logging.getLogger(LOGGER_NAME)


@dataclass
class Runtime:
    """What the wrappers need. ``active`` turns False on uninstall, so a wrapper that
    somebody still holds passes straight through to SGLang."""

    settings: Settings
    plugins: GuardPlugins
    profile: HostProfile
    active: bool = True

    @property
    def strict(self) -> bool:
        """Whether the guard runs in strict mode."""
        return self.settings.mode.value is Mode.STRICT

    def internal_error(self, stage: str, exc: BaseException) -> None:
        """Log a bug of ours. SGLang goes on as if the guard were absent, unless strict."""
        logger.warning(
            "sglang-dsv4-guard internal error while %s (%s: %s); SGLang's call is unaffected",
            stage, type(exc).__name__, exc, exc_info=exc,
        )
        if self.strict:
            report = Report.of((), {"stage": stage})
            raise DSV4GuardError(
                f"sglang-dsv4-guard (strict mode) failed internally while {stage}: "
                f"{type(exc).__name__}: {exc}", report, None) from exc

    def publish(self, report: Report) -> None:
        """Send ``report`` to every reporter; log reporters that fail."""
        for failure in self.plugins.report(report):
            logger.warning("%s: %s", failure.summary, "; ".join(failure.details))


def add_note(exc: BaseException, note: str) -> None:
    """PEP 678 ``add_note``, with the 3.10 fallback of setting ``__notes__`` by hand."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]


def standalone_runtime(plugins: tuple[object, ...] = (), mode: str = "on",
                       autoshare: bool = False, load_entry_points: bool = False) -> Runtime:
    """A runtime that is not installed: the wrappers' machinery for ``check`` and tests.

    The built-ins, then (with ``load_entry_points``) third-party entry points, then
    ``plugins`` registered as a server registers entry points (a refused one raises
    ``ValueError`` with its ``DSV4G090`` details). ``mode`` is ``"on"`` or ``"strict"``
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
