"""The plug-in manager: built by a factory, never at import, and fault-isolating.

pluggy calls all implementations of a hook in one go, so one failing
implementation would take the others (and our report) down with it. The guard
instead calls each implementation on its own, in pluggy's order (as
:mod:`sglang_dsv4_guard.hookspecs` tells plug-in authors), checks what it hands back
at the plug-in boundary (:mod:`sglang_dsv4_guard.boundary`), and turns a failure into a
plug-in failure finding naming the plug-in.

One rule for failures, in every mode: a plug-in's failure is reported
(:func:`~sglang_dsv4_guard.boundary.plugin_failure`) and never blocks, in strict mode
either; it never changes SGLang's verdict. That covers ``BaseException`` too. A
``SystemExit`` (argparse at import), a ``GeneratorExit`` or any other ``BaseException``
raised while importing, registering or calling a plug-in is its failure: a server must
not die because a diagnostics plug-in called ``sys.exit()``. The one exception is
``KeyboardInterrupt`` in the main thread: Python delivers Ctrl-C (SIGINT) only
there, so it is taken as the operator's interrupt and propagates, as it would
without the guard. In any other thread no operator can have sent it, so it is the
plug-in's failure like any other.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import threading
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import pluggy

from sglang_dsv4_guard import hookspecs
from sglang_dsv4_guard.boundary import (
    BUILTIN_NAMES,
    LOG_REPORTER,
    clean_finding,
    is_builtin,
    plugin_failure,
    raised_text,
    safe_text,
)
from sglang_dsv4_guard.findings import Finding, Report
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.reporter import LogReporter

__all__ = ["BUILTIN_NAMES", "LOG_REPORTER", "GuardPlugins", "add_all", "add_plugin",
           "build_manager", "is_builtin", "operator_interrupt", "plugin_failure"]

logger = logging.getLogger(LOGGER_NAME)

def operator_interrupt(exc: BaseException) -> bool:
    """A ``KeyboardInterrupt`` in the main thread: the operator's Ctrl-C, to let through."""
    return (isinstance(exc, KeyboardInterrupt)
            and threading.current_thread() is threading.main_thread())


@dataclasses.dataclass
class GuardPlugins:
    """A plug-in manager plus the problems met while building it."""

    pm: pluggy.PluginManager
    load_problems: list[Finding]

    def names(self) -> list[str]:
        """The registered plug-ins' names, built-ins first."""
        return [name for name, _ in self.pm.list_name_plugin()]

    @property
    def log_reporter(self) -> LogReporter | None:
        """The built-in log reporter (``None`` if it could not be registered)."""
        reporter = self.pm.get_plugin(LOG_REPORTER)
        return reporter if isinstance(reporter, LogReporter) else None

    def _call_each(self, hook: str, kwargs: Mapping[str, Any]
                   ) -> Iterator[tuple[str, object, Finding | None]]:
        """Call each implementation of ``hook`` on its own, in pluggy's order.

        Yields (plug-in name, result, ``None``) or, when it failed,
        (plug-in name, ``None``, its failure finding).
        """
        # pluggy keeps implementations in reverse call order (trylast first).
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            if impl.wrapper or impl.hookwrapper:  # registered around add_plugin(): never run
                yield impl.plugin_name, None, plugin_failure(
                    impl.plugin_name, hook, "is a hook wrapper (wrapper=True or "
                    "hookwrapper=True), which the guard does not call")
                continue
            try:
                result = impl.function(*(kwargs[arg] for arg in impl.argnames))
            except BaseException as exc:
                if operator_interrupt(exc):
                    raise
                yield impl.plugin_name, None, plugin_failure(impl.plugin_name, hook,
                                                             raised_text(exc))
                continue
            yield impl.plugin_name, result, None

    def collect_each(self, hook: str, kwargs: Mapping[str, Any]
                     ) -> Iterator[tuple[str, list[Finding]]]:
        """Per implementation of ``hook``, in call order: its name and checked findings.

        A failure, a result that is not a list of findings, or a finding with a bad
        field is replaced by a plug-in failure finding naming the plug-in.
        """
        for name, result, failure in self._call_each(hook, kwargs):
            if failure is not None:
                yield name, [failure]
                continue
            if result is None:
                yield name, []
                continue
            try:
                if not isinstance(result, list | tuple):
                    raise TypeError("not a list")
                items = list(result)
            except BaseException as exc:
                if operator_interrupt(exc):
                    raise
                yield name, [plugin_failure(
                    name, hook, f"returned {type(result).__name__} "
                    f"{safe_text(repr, result, 120)}; accepted: a list of "
                    "sglang_dsv4_guard.Finding (or None)")]
                continue
            findings: list[Finding] = []
            if len(items) > MAX_FINDINGS:  # each is checked, kept and printed: bounded
                findings.append(plugin_failure(
                    name, hook, f"returned {len(items)} findings; the first {MAX_FINDINGS} "
                    "are kept", "excess"))
                del items[MAX_FINDINGS:]
            for index, finding in enumerate(items):
                try:
                    findings.append(clean_finding(finding, name))
                except BaseException as exc:
                    if operator_interrupt(exc):
                        raise
                    problem = str(exc) if type(exc) is TypeError else raised_text(exc)
                    findings.append(plugin_failure(
                        name, hook, f"returned a bad finding at index {index}: {problem}",
                        "finding"))
            yield name, findings

    def collect(self, hook: str, kwargs: Mapping[str, Any]) -> list[Finding]:
        """Call every implementation of ``hook`` on its own and gather its findings."""
        return [f for _, found in self.collect_each(hook, kwargs) for f in found]

    def report(self, report: Report) -> list[Finding]:
        """Hand ``report`` to every reporter; return the reporters that failed, as findings."""
        return [failure for _, _, failure in
                self._call_each("sglang_dsv4_guard_report", {"report": report})
                if failure is not None]


def _register(pm: pluggy.PluginManager, obj: object, name: str) -> str | None:
    try:
        pm.register(obj, name=name)
    except BaseException as exc:  # PluginValidationError, ValueError (duplicate name), ...
        if operator_interrupt(exc):
            raise
        return f"could not be registered: {type(exc).__name__}: {safe_text(str, exc)}"
    return None


def add_plugin(plugins: GuardPlugins, obj: object, name: str) -> Finding | None:
    """Register a third-party plug-in as a server does; ``None``, or its failure finding.

    A plug-in is refused (and left unregistered) when pluggy refuses it, when it
    implements a hook the guard does not define, when it implements none of the
    guard's hooks (an entry point naming a function instead of a module or object),
    or when it declares a hook wrapper (``wrapper=True`` or ``hookwrapper=True``): the
    guard calls each implementation on its own and would never run a wrapper.
    The problem is also appended to ``plugins.load_problems``.
    """
    stage, error = "register", _register(plugins.pm, obj, name)
    if error is None:
        callers = plugins.pm.get_hookcallers(obj) or ()
        hooks = [caller.name for caller in callers]
        unknown = [hook for hook in hooks if hook not in _HOOK_NAMES]
        wrappers = [caller.name for caller in callers for impl in caller.get_hookimpls()
                    if impl.plugin is obj and (impl.wrapper or impl.hookwrapper)]
        if wrappers:
            error = (f"implements {', '.join(wrappers)} as a hook wrapper (wrapper=True or "
                     "hookwrapper=True); the guard calls each implementation on its own and "
                     "does not support hook wrappers: drop the option and return findings "
                     "instead")
        elif unknown:
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


#: Findings kept from one implementation's call: past any real pair's problems.
MAX_FINDINGS = 256
_HOOK_NAMES = tuple(name for name in vars(hookspecs) if name.startswith("sglang_dsv4_guard_"))


def build_manager(builtins: tuple[tuple[str, object], ...], load_entry_points: bool = True,
                  log_format: str = "text") -> GuardPlugins:
    """Build a manager with ``builtins`` (name and hook module, in :data:`BUILTIN_NAMES`'
    order: see :func:`sglang_dsv4_guard.assembly.build_plugins`), the log reporter and,
    unless told not to, third-party plug-ins.

    ``log_format`` (``"text"`` or ``"json"``) is the built-in log reporter's.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    plugins = GuardPlugins(pm, [])
    for name, module in builtins:
        error = _register(pm, module, name)
        if error:  # a bug of ours: say so loudly, but carry on
            plugins.load_problems.append(plugin_failure(name, "register", error))
    _register(pm, LogReporter(log_format), LOG_REPORTER)
    if load_entry_points:
        for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
            try:
                obj = ep.load()
            except BaseException as exc:  # SystemExit from argparse at import, ...
                if operator_interrupt(exc):
                    raise
                plugins.load_problems.append(plugin_failure(
                    ep.name, "load", f"importing {ep.value} {raised_text(exc)}"))
                continue
            add_plugin(plugins, obj, ep.name)
    for problem in plugins.load_problems:
        logger.warning("%s: %s", problem.summary, "; ".join(problem.details))
    return plugins


def _plugin_name(obj: object, taken: list[str]) -> str:
    """A readable name: a module's own name, else its class's; ``#2``... when taken."""
    base = obj.__name__ if isinstance(obj, ModuleType) else type(obj).__qualname__
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}#{n}"
    return name


def add_all(manager: GuardPlugins, plugins: tuple[object, ...]) -> list[object]:
    """Register ``plugins`` as a server registers entry points; all or nothing.

    Raises ``ValueError`` with the plug-in's failure details when one is refused
    (the ones registered before it are unregistered again).
    """
    added: list[object] = []
    for plugin in plugins:
        failure = add_plugin(manager, plugin, _plugin_name(plugin, manager.names()))
        if failure is not None:
            manager.load_problems.remove(failure)
            for done in added:
                manager.pm.unregister(done)
            raise ValueError(f"{failure.summary}: {'; '.join(failure.details)}")
        added.append(plugin)
    return added
