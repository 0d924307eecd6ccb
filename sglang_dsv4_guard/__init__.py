"""sglang-dsv4-guard: every DeepSeek-V4 PD/NextN KV-pool mismatch, reported at once.

Importing this package has no side effects: it imports neither sglang nor torch,
reads no environment and builds no plug-in manager (each name below is imported when
first used). The public surface is ``__all__``: install/uninstall and their settings and
undo, the exceptions, and every type a plug-in author meets (hook arguments, the values
their snapshots hold, findings and reports); ``tests/test_public_surface.py`` checks that
every type reachable from it is in it. :mod:`sglang_dsv4_guard.testing` helps test a
plug-in. Everything else is private.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "MISSING",
    "ContactContext",
    "ContactSnapshot",
    "Cost",
    "CudaGraphs",
    "DSV4GuardError",
    "DSV4GuardInstallError",
    "DSV4GuardStartupRefused",
    "Edit",
    "Endpoint",
    "Finding",
    "Fix",
    "FixKind",
    "GeometryField",
    "HostProfile",
    "MappingComparison",
    "Mode",
    "NotASequence",
    "Observation",
    "PairContext",
    "Phase",
    "PlacedContext",
    "PoolSnapshot",
    "Registration",
    "RegistrationContext",
    "Report",
    "SendContext",
    "SendSnapshot",
    "Setting",
    "SettingError",
    "Settings",
    "Severity",
    "StateContext",
    "StatePair",
    "TensorInfo",
    "Undo",
    "Unreadable",
    "Value",
    "When",
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
    "Cost": "sglang_dsv4_guard.fixes",
    "Edit": "sglang_dsv4_guard.fixes",
    "Fix": "sglang_dsv4_guard.fixes",
    "FixKind": "sglang_dsv4_guard.fixes",
    "Finding": "sglang_dsv4_guard.findings",
    "Observation": "sglang_dsv4_guard.findings",
    "Report": "sglang_dsv4_guard.findings",
    "Severity": "sglang_dsv4_guard.findings",
    "Phase": "sglang_dsv4_guard.findings",
    "When": "sglang_dsv4_guard.findings",
    "PlacedContext": "sglang_dsv4_guard.findings",
    "GeometryField": "sglang_dsv4_guard.host.releases",
    "HostProfile": "sglang_dsv4_guard.host.releases",
    "Mode": "sglang_dsv4_guard.settings",
    "Setting": "sglang_dsv4_guard.settings",
    "Settings": "sglang_dsv4_guard.settings",
    "MISSING": "sglang_dsv4_guard.state.snapshot",
    "NotASequence": "sglang_dsv4_guard.state.snapshot",
    "PoolSnapshot": "sglang_dsv4_guard.state.snapshot",
    "StateContext": "sglang_dsv4_guard.state.snapshot",
    "StatePair": "sglang_dsv4_guard.state.snapshot",
    "Unreadable": "sglang_dsv4_guard.state.snapshot",
    "CudaGraphs": "sglang_dsv4_guard.state.cuda_graphs",
    "MappingComparison": "sglang_dsv4_guard.state.tensors",
    "TensorInfo": "sglang_dsv4_guard.state.tensors",
    "SendContext": "sglang_dsv4_guard.mori.snapshot",
    "ContactContext": "sglang_dsv4_guard.contact.snapshot",
    "ContactSnapshot": "sglang_dsv4_guard.contact.snapshot",
    "SendSnapshot": "sglang_dsv4_guard.mori.snapshot",
    "Endpoint": "sglang_dsv4_guard.pd.endpoint",
    "Value": "sglang_dsv4_guard.pd.endpoint",
    "PairContext": "sglang_dsv4_guard.pd.endpoint",
    "Registration": "sglang_dsv4_guard.peers.snapshot",
    "RegistrationContext": "sglang_dsv4_guard.peers.snapshot",
    "hookimpl": "sglang_dsv4_guard.hookmarkers",
    "install": "sglang_dsv4_guard.lifecycle",
    "is_installed": "sglang_dsv4_guard.lifecycle",
    "summary": "sglang_dsv4_guard.lifecycle",
    "uninstall": "sglang_dsv4_guard.lifecycle",
    "Undo": "sglang_dsv4_guard.undo",
}

if TYPE_CHECKING:
    from sglang_dsv4_guard.contact.snapshot import ContactContext, ContactSnapshot
    from sglang_dsv4_guard.errors import (
        DSV4GuardError,
        DSV4GuardInstallError,
        DSV4GuardStartupRefused,
        SettingError,
    )
    from sglang_dsv4_guard.findings import (
        Finding,
        Observation,
        Phase,
        PlacedContext,
        Report,
        Severity,
        When,
    )
    from sglang_dsv4_guard.fixes import Cost, Edit, Fix, FixKind
    from sglang_dsv4_guard.hookmarkers import hookimpl
    from sglang_dsv4_guard.host.releases import GeometryField, HostProfile
    from sglang_dsv4_guard.lifecycle import install, is_installed, summary, uninstall
    from sglang_dsv4_guard.mori.snapshot import SendContext, SendSnapshot
    from sglang_dsv4_guard.pd.endpoint import Endpoint, PairContext, Value
    from sglang_dsv4_guard.peers.snapshot import Registration, RegistrationContext
    from sglang_dsv4_guard.settings import Mode, Setting, Settings
    from sglang_dsv4_guard.state.cuda_graphs import CudaGraphs
    from sglang_dsv4_guard.state.snapshot import (
        MISSING,
        NotASequence,
        PoolSnapshot,
        StateContext,
        StatePair,
        Unreadable,
    )
    from sglang_dsv4_guard.state.tensors import MappingComparison, TensorInfo
    from sglang_dsv4_guard.undo import Undo


def __dir__() -> list[str]:
    """The package's namespace and every lazy export (``__getattr__`` stores none)."""
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sglang_dsv4_guard' has no attribute {name!r}")
    import importlib  # deferred: the package imports nothing until a name is used

    # The scan reads each lazy export's import under TYPE_CHECKING above instead.
    return getattr(importlib.import_module(module), name)  # unscanned: _LAZY's modules
