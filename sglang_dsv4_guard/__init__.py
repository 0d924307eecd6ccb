"""sglang-dsv4-guard: every DeepSeek-V4 PD/NextN KV-pool mismatch, reported at once.

Importing this package has no side effects: it imports neither sglang nor torch,
reads no environment and builds no plug-in manager. The public surface is
``__all__``: install/uninstall, the exceptions, and the types a plug-in author meets
(hook arguments and results). :mod:`sglang_dsv4_guard.testing` helps test a plug-in.
Everything else is private.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "DSV4GuardError",
    "DSV4GuardInstallError",
    "DSV4GuardStartupRefused",
    "Finding",
    "Observation",
    "PoolSnapshot",
    "Report",
    "SendContext",
    "SendSnapshot",
    "SettingError",
    "Severity",
    "StateContext",
    "StatePair",
    "__version__",
    "hookimpl",
    "install",
    "is_installed",
    "summary",
    "uninstall",
]

_LAZY = {
    "DSV4GuardError": "sglang_dsv4_guard.errors",
    "DSV4GuardInstallError": "sglang_dsv4_guard.errors",
    "DSV4GuardStartupRefused": "sglang_dsv4_guard.errors",
    "SettingError": "sglang_dsv4_guard.errors",
    "Finding": "sglang_dsv4_guard.findings",
    "Observation": "sglang_dsv4_guard.findings",
    "Report": "sglang_dsv4_guard.findings",
    "Severity": "sglang_dsv4_guard.findings",
    "PoolSnapshot": "sglang_dsv4_guard.state.snapshot",
    "StateContext": "sglang_dsv4_guard.state.snapshot",
    "StatePair": "sglang_dsv4_guard.state.snapshot",
    "SendContext": "sglang_dsv4_guard.mori.snapshot",
    "SendSnapshot": "sglang_dsv4_guard.mori.snapshot",
    "hookimpl": "sglang_dsv4_guard.hookspecs",
    "install": "sglang_dsv4_guard.lifecycle",
    "is_installed": "sglang_dsv4_guard.lifecycle",
    "uninstall": "sglang_dsv4_guard.lifecycle",
    "summary": "sglang_dsv4_guard.lifecycle",
}

if TYPE_CHECKING:
    from sglang_dsv4_guard.errors import (
        DSV4GuardError,
        DSV4GuardInstallError,
        DSV4GuardStartupRefused,
        SettingError,
    )
    from sglang_dsv4_guard.findings import Finding, Observation, Report, Severity
    from sglang_dsv4_guard.hookspecs import hookimpl
    from sglang_dsv4_guard.lifecycle import install, is_installed, summary, uninstall
    from sglang_dsv4_guard.mori.snapshot import SendContext, SendSnapshot
    from sglang_dsv4_guard.state.snapshot import PoolSnapshot, StateContext, StatePair


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sglang_dsv4_guard' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
