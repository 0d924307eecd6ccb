"""The function SGLang's ``load_plugins()`` calls in each process that loads plug-ins.

Registered as entry point ``dsv4_guard`` in group ``sglang.srt.plugins``. It reads
``SGLANG_DSV4_GUARD`` and stays inert unless the variable asks for the guard.
"""

from __future__ import annotations

import logging

from sglang_dsv4_guard.log import LOGGER_NAME

__all__ = ["activate"]

logger = logging.getLogger(LOGGER_NAME)


def activate() -> None:
    """Install the guard as the environment says; warn about every bad setting.

    When the guard is on it first opens this process' launch identity
    (:func:`~sglang_dsv4_guard.dedup.identity.open_launch`), then installs as
    :func:`~sglang_dsv4_guard.lifecycle.install_from_sglang_loader` says.

    In strict mode, a guard that cannot install raises
    :class:`~sglang_dsv4_guard.errors.DSV4GuardStartupRefused` (a ``SystemExit``),
    which SGLang's loader does not swallow.
    """
    # deferred: SGLang's loader imports this module in every process; it loads nothing until called
    from sglang_dsv4_guard.errors import DSV4GuardInstallError, DSV4GuardStartupRefused
    from sglang_dsv4_guard.settings import Mode, settings_from_env

    settings, problems = settings_from_env()
    for problem in problems:
        logger.warning("sglang-dsv4-guard: %s", problem)
    if settings.mode.value is Mode.OFF:
        logger.debug("sglang-dsv4-guard is off (%s)", settings.mode.source)
        return
    # deferred: only when the guard is on: off, SGLang never loads the guard's runtime
    from sglang_dsv4_guard.dedup.identity import open_launch
    from sglang_dsv4_guard.lifecycle import install_from_sglang_loader

    open_launch()
    try:
        install_from_sglang_loader(settings)
    except DSV4GuardInstallError as error:
        raise DSV4GuardStartupRefused(error) from error
