"""Whether SGLang's plug-in loader will run the guard, read from the installed release.

SGLang runs the guard only through ``load_plugins()``: the guard's entry point must pass
SGLang's own filter (``SGLANG_PLUGINS``, ``SGLANG_PLATFORM``), and the process that builds
the scheduler must call ``load_plugins()`` before it does.

- :func:`loader_judgement` asks SGLang's own ``load_plugins_by_group`` (what
  ``load_plugins()`` runs) whether it yields the guard's function, under this
  distribution's entry-point name or any other (another distribution may declare it);
  when not, it says why and derives the fix.
- :func:`scheduler_entry_points` reads the release's sources (never imports them) for
  every function that constructs SGLang's ``Scheduler``, and whether it, or every caller
  of it in its module, calls ``load_plugins()`` first. Nothing here touches the network.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.metadata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_dsv4_guard.host.digests import UnreadableSource, read_module
from sglang_dsv4_guard.host.targets import (
    ENVIRON_MODULE,
    PLUGIN_GROUP,
    PLUGINS_MODULE,
    SCHEDULER_MODULE,
)

__all__ = ["LoaderJudgement", "SchedulerEntry", "guard_names", "loader_judgement",
           "scheduler_entry_points"]

_DISTRIBUTION = "sglang-dsv4-guard"


@dataclass(frozen=True)
class LoaderJudgement:
    """What SGLang's ``load_plugins()`` will do with the guard's entry point."""

    name: str  # the guard's entry point, from the distribution's metadata ("" if none)
    runs: bool  # load_plugins() would call it
    plugins: str  # SGLANG_PLUGINS as SGLang reads it ("": every plug-in)
    reason: str = ""  # why it would not, empty when it would
    fix: str = ""  # what to set, when that is known


def _own_entry_point() -> importlib.metadata.EntryPoint | None:
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    return next((ep for ep in dist.entry_points if ep.group == PLUGIN_GROUP), None)


def _why_not(name: str, plugins: str, excluded: set[str],
             ep: importlib.metadata.EntryPoint) -> tuple[str, str]:
    # SGLANG_PLUGINS split as SGLang's loader splits it (for the message and the fix; the
    # verdict is SGLang's own function's)
    listed = [item.strip() for item in plugins.split(",") if item.strip()]
    if plugins and name not in listed:
        same = [item for item in listed if item.lower() == name.lower()]
        if same:
            kept = [name if item == same[0] else item for item in listed]
            return (f"SGLANG_PLUGINS={plugins!r} names {same[0]!r}, which differs from {name} "
                    "only in case (SGLang compares names exactly)",
                    "SGLANG_PLUGINS=" + ",".join(kept))
        close = difflib.get_close_matches(name, listed, n=1, cutoff=0.6)
        if close:
            kept = [name if item == close[0] else item for item in listed]
            return (f"SGLANG_PLUGINS={plugins!r} does not name {name} ({close[0]!r} is the "
                    f"closest: a misspelling?)", "SGLANG_PLUGINS=" + ",".join(kept))
        return (f"SGLANG_PLUGINS={plugins!r} does not name {name} (SGLang loads only the "
                f"plug-ins it names)", "SGLANG_PLUGINS=" + ",".join([*listed, name]))
    if _DISTRIBUTION in excluded:
        return (f"SGLANG_PLATFORM excludes the distribution {_DISTRIBUTION}",
                "unset SGLANG_PLATFORM or select a platform this distribution provides")
    try:
        ep.load()
    except Exception as exc:
        return f"SGLang cannot load {ep.value}: {type(exc).__name__}: {exc}", ""
    return "SGLang's loader did not yield it", ""


def guard_names(found: Mapping[str, tuple[Any, Any]],
                ep: importlib.metadata.EntryPoint | None = None) -> list[str]:
    """The names of the entry points SGLang's loader yielded (``found``, name to
    ``(function, distribution)``) whose function is the guard's (``ep``'s object), under
    whatever name another distribution declares it."""
    ep = ep or _own_entry_point()
    if ep is None:
        return []
    try:
        target = ep.load()
    except Exception:  # the guard's own import fails: _why_not says so
        return []
    return [name for name, (func, _) in found.items() if func is target]


def loader_judgement() -> LoaderJudgement:
    """Whether ``load_plugins()`` in a process with this environment runs the guard."""
    ep = _own_entry_point()
    if ep is None:
        return LoaderJudgement("", False, "", f"{_DISTRIBUTION} declares no entry point in "
                             f"group {PLUGIN_GROUP}", "reinstall sglang-dsv4-guard")
    try:
        host = importlib.import_module(PLUGINS_MODULE)  # unscanned: SGLang's loader
        envs = importlib.import_module(ENVIRON_MODULE).envs  # unscanned: SGLang's environ
        plugins = envs.SGLANG_PLUGINS.get() or ""
        excluded = host._get_excluded_dists()
        found = host.load_plugins_by_group(host.GENERAL_PLUGINS_GROUP, excluded_dists=excluded)
    except (Exception, SystemExit) as exc:  # a plug-in's import ends SGLang's loader too
        return LoaderJudgement(ep.name, False, "", f"SGLang's plug-in loader fails: "
                             f"{type(exc).__name__}: {exc}")
    guard = guard_names(found, ep)
    if guard:
        return LoaderJudgement(guard[0], True, plugins)
    reason, fix = _why_not(ep.name, plugins, excluded, ep)
    return LoaderJudgement(ep.name, False, plugins, reason, fix)


@dataclass(frozen=True)
class SchedulerEntry:
    """A function of SGLang that constructs its ``Scheduler``."""

    where: str  # "srt/ray/scheduler_actor.py SchedulerActor.__init__"
    loads_plugins: bool  # it, or every caller of it in its module, calls load_plugins() first


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function of ``tree`` with its qualified name (``Class.method``)."""
    def walk(body: list[ast.stmt], prefix: str) -> Iterator[
            tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + node.name, node
                yield from walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.")
    yield from walk(tree.body, "")


def _own_calls(fn: ast.AST) -> Iterator[ast.Call]:
    """The calls ``fn`` itself makes (not those of functions defined inside it)."""
    for child in ast.iter_child_nodes(fn):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(child, ast.Call):
            yield child
        yield from _own_calls(child)


def _called(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else ""


def _scheduler_names(tree: ast.Module, module: str) -> set[str]:
    """The names under which ``module`` binds SGLang's ``Scheduler`` class."""
    names = {"Scheduler"} if module == SCHEDULER_MODULE else set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            if base == SCHEDULER_MODULE:
                names |= {a.asname or a.name for a in node.names if a.name == "Scheduler"}
    return names


def _loads_first(name: str, fn: ast.AST, before: int,
                 functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef],
                 seen: frozenset[str] = frozenset()) -> bool:
    """Whether ``fn`` calls ``load_plugins()`` before line ``before``, or has callers in
    its module and every one of them calls ``fn`` after loading the plug-ins."""
    calls = list(_own_calls(fn))
    if any(_called(c) == "load_plugins" and c.lineno < before for c in calls):
        return True
    simple = name.rsplit(".", 1)[-1]
    if simple.startswith("__"):  # a special method is called by Python or a framework
        return False
    callers = [(n, f, c.lineno) for n, f in functions.items() if n not in seen | {name}
               for c in _own_calls(f) if _called(c) == simple]
    return bool(callers) and all(_loads_first(n, f, line, functions, seen | {name})
                                 for n, f, line in callers)


def scheduler_entry_points(package: Path) -> list[SchedulerEntry]:
    """Every function under ``package/srt`` (the ``sglang`` package directory) that
    constructs SGLang's ``Scheduler``, in path order. Files that cannot be read are
    skipped (the host judgement names those it depends on)."""
    entries = []
    for path in sorted((package / "srt").rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        try:
            if b"Scheduler" not in path.read_bytes():
                continue
            tree = read_module(package, relative)
        except (OSError, UnreadableSource):
            continue
        if tree is None:
            continue
        module = "sglang." + relative.removesuffix(".py").replace("/", ".")
        names = _scheduler_names(tree, module)
        functions = dict(_functions(tree))
        for qualified, fn in functions.items():
            builds = [c.lineno for c in _own_calls(fn)
                      if isinstance(c.func, ast.Name) and c.func.id in names]
            if builds:
                entries.append(SchedulerEntry(f"{relative} {qualified}", _loads_first(
                    qualified, fn, min(builds), functions)))
    return entries
