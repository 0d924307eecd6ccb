"""The plug-in manager: built by a factory, never at import, and fault-isolating.

pluggy calls all implementations of a hook in one go, so one failing
implementation would take the others (and our verdict) down with it. The guard
instead calls each implementation on its own, in registration order (built-ins
first), and turns a failure into a ``DSV4G090`` finding naming the plug-in.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pluggy

from sglang_dsv4_guard import hookspecs
from sglang_dsv4_guard.codes import docs_url
from sglang_dsv4_guard.findings import Finding, Report, Severity

__all__ = ["BUILTIN_PLUGINS", "GuardPlugins", "add_plugin", "build_plugins"]

logger = logging.getLogger("sglang_dsv4_guard")

BUILTIN_PLUGINS = (
    ("builtin_autoshare", "sglang_dsv4_guard.autoshare.remedy"),
    ("builtin_state", "sglang_dsv4_guard.state.checks"),
    ("builtin_mori", "sglang_dsv4_guard.mori.checks"),
)


def plugin_failure(name: str, stage: str, problem: str) -> Finding:
    """The finding for a plug-in that could not load, raised, or returned garbage."""
    return Finding(
        code="DSV4G090",
        severity=Severity.WARNING,
        summary=f"guard plug-in {name!r} failed ({stage}); the guard went on without it",
        subject=f"plug-in {name}",
        details=(problem, "SGLang's verdict is not affected"),
        fixes=(f"fix or uninstall the plug-in {name!r} (entry-point group sglang_dsv4_guard)",),
        docs=docs_url("DSV4G090"),
        origin=name,
    )


@dataclasses.dataclass
class GuardPlugins:
    """A plug-in manager plus the problems met while building it."""

    pm: pluggy.PluginManager
    load_problems: list[Finding]

    def names(self) -> list[str]:
        """The registered plug-ins' names, built-ins first."""
        return [name for name, _ in self.pm.list_name_plugin()]

    def _call_each(self, hook: str, kwargs: Mapping[str, Any]
                   ) -> Iterator[tuple[str, object, Finding | None]]:
        """Call each implementation of ``hook`` on its own, built-ins first.

        Yields (plug-in name, result, ``None``) or, when it raised,
        (plug-in name, ``None``, its ``DSV4G090`` finding).
        """
        for impl in getattr(self.pm.hook, hook).get_hookimpls():
            try:
                result = impl.function(*(kwargs[arg] for arg in impl.argnames))
            except Exception as exc:
                yield impl.plugin_name, None, plugin_failure(
                    impl.plugin_name, hook, f"raised {type(exc).__name__}: {exc}")
                continue
            yield impl.plugin_name, result, None

    def collect(self, hook: str, kwargs: Mapping[str, Any]) -> list[Finding]:
        """Call every implementation of ``hook`` on its own and gather its findings."""
        findings: list[Finding] = []
        for name, result, failure in self._call_each(hook, kwargs):
            if failure is not None:
                findings.append(failure)
                continue
            if result is None:
                continue
            if not isinstance(result, Sequence) or not all(
                isinstance(f, Finding) for f in result
            ):
                findings.append(plugin_failure(
                    name, hook, f"returned {type(result).__name__} {result!r:.120}; accepted: "
                    "a list of sglang_dsv4_guard.Finding (or None)"))
                continue
            findings.extend(
                f if f.origin == name else dataclasses.replace(f, origin=name) for f in result
            )
        return findings

    def report(self, report: Report) -> list[Finding]:
        """Hand ``report`` to every reporter; return the reporters that failed, as findings."""
        return [failure for _, _, failure in
                self._call_each("sglang_dsv4_guard_report", {"report": report})
                if failure is not None]


def _register(pm: pluggy.PluginManager, obj: object, name: str) -> str | None:
    try:
        pm.register(obj, name=name)
    except Exception as exc:  # PluginValidationError, ValueError (duplicate name), ...
        return f"could not be registered: {type(exc).__name__}: {exc}"
    return None


def add_plugin(plugins: GuardPlugins, obj: object, name: str) -> Finding | None:
    """Register a third-party plug-in as a server does; ``None``, or its ``DSV4G090``.

    A plug-in is refused (and left unregistered) when pluggy refuses it, when it
    implements a hook the guard does not define, or when it implements none of the
    guard's hooks (an entry point naming a function instead of a module or object).
    The problem is also appended to ``plugins.load_problems``.
    """
    stage, error = "register", _register(plugins.pm, obj, name)
    if error is None:
        hooks = [caller.name for caller in plugins.pm.get_hookcallers(obj) or ()]
        unknown = [hook for hook in hooks if hook not in _HOOK_NAMES]
        if unknown:
            stage = "validate"
            error = ("implements a hook the guard does not define: "
                     + ", ".join(sorted(unknown)))
        elif not hooks:
            stage = "validate"
            error = (f"implements none of the guard's hooks ({', '.join(_HOOK_NAMES)}); "
                     f"got a {type(obj).__name__}: point the entry point at a module or "
                     "object with @sglang_dsv4_guard.hookimpl methods")
        if error is not None:
            plugins.pm.unregister(obj)
    if error is None:
        return None
    failure = plugin_failure(name, stage, error)
    plugins.load_problems.append(failure)
    return failure


_HOOK_NAMES = tuple(name for name in vars(hookspecs) if name.startswith("sglang_dsv4_guard_"))


def build_plugins(load_entry_points: bool = True, log_format: str = "text") -> GuardPlugins:
    """Build a manager with the built-ins and, unless told not to, third-party plug-ins."""
    from sglang_dsv4_guard.reporter import LogReporter

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    plugins = GuardPlugins(pm, [])
    for name, module in BUILTIN_PLUGINS:
        error = _register(pm, importlib.import_module(module), name)
        if error:  # a bug of ours: say so loudly, but carry on
            plugins.load_problems.append(plugin_failure(name, "register", error))
    _register(pm, LogReporter(log_format), "builtin_log_reporter")
    if load_entry_points:
        for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
            try:
                obj = ep.load()
            except Exception as exc:
                plugins.load_problems.append(plugin_failure(
                    ep.name, "load", f"importing {ep.value} raised {type(exc).__name__}: {exc}"))
                continue
            add_plugin(plugins, obj, ep.name)
    for problem in plugins.load_problems:
        logger.warning("%s: %s", problem.summary, "; ".join(problem.details))
    return plugins
