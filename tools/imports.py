"""The import graph of ``sglang_dsv4_guard`` (and of ``tools/``), by layer, and its faults.

Usage: ``python tools/imports.py`` prints every module's imports of the package's own
modules, grouped by :data:`LAYERS` (top first), in three kinds: ``top`` (at import),
``deferred`` (inside a function) and ``typing`` (under ``if TYPE_CHECKING:``), plus
``importlib.import_module("...")`` calls with a literal name (``dynamic``). It then lists
every cycle and every import that points up a layer, and exits 1 if there is one.

The rules (``tests/test_layers.py`` holds the package to them):

- an import points down or stays within its layer; never up;
- no cycle between modules, nor between folders (each sub-package, and each top-level
  module, a node: ``state`` -> ``plugins`` -> ``state`` is one), counting every kind of
  import: a deferred or type-only import is
  never a way around a cycle. Deferred imports remain for start-up cost (SGLang, torch,
  the commands' heavy pieces), each with a comment saying so: a deferred import of our
  own modules without ``# deferred: <why>`` on its line or in the comment lines right
  above its run of imports is a fault;
- the scan sees every import: ``__import__(...)`` and ``importlib.import_module`` of a
  computed or relative name are faults ("unscannable") unless ``# unscanned: <why>`` on
  the call's line says what it imports (SGLang's modules from ``host/targets``, the
  package root's lazy exports, which it also imports under ``TYPE_CHECKING``);
- every module of the package belongs to a layer.

``tools/`` scripts import each other by bare name (``import release_env``); their graph
is checked for cycles too (a script that imports its own importer is loaded twice when
run as ``__main__``, with two sets of globals).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "sglang_dsv4_guard"
PACKAGE_DIR = ROOT / PACKAGE
TOOLS_DIR = ROOT / "tools"
ROOT_MODULE = "(package)"  # sglang_dsv4_guard/__init__.py: the public surface

# Top to bottom. A name covers the module and, for a sub-package, everything in it; the
# longest name that covers a module decides its layer.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("test support for plug-in authors", ("testing",)),
    ("commands and the public surface", ("cli", "demo", "entry", ROOT_MODULE)),
    ("the check command: its child process, the run, --fix's proof, rendering", ("check",)),
    ("check: deployment files read into launch lines and pairs (check -f)", ("check.inputs",)),
    ("check: the contract rows", ("check.rows",)),
    ("check: the findings' fixes", ("check.fixing",)),
    ("check: one server derived from its launch line", ("check.server",)),
    ("check: SGLang's parser and resolution, run offline", ("check.offline",)),
    ("composition root: install, uninstall, summary, standalone runtime",
     ("lifecycle", "assembly")),
    ("wrappers of SGLang's functions and the rules they share",
     ("state.wrapper", "mori.wrapper", "peers.wrapper", "peers.guard", "peers.nixl",
      "peers.mooncake", "contact.wrapper", "hook_registry", "wrapping")),
    ("runtime, plug-in manager and metrics", ("runtime", "plugins", "metrics")),
    ("built-in hook implementations", ("reporter", "state.checks", "state.pool_fixes", "state.sharing",
                                       "mori.checks", "peers.checks", "contact.checks", "autoshare", "pd")),
    ("hook specs, rendering, deduplication, plug-in boundary",
     ("hookspecs", "hookmarkers", "render", "dedup", "boundary")),
    ("snapshots of SGLang's objects, sample objects",
     ("state", "mori", "peers", "contact", "pd.endpoint", "samples")),
    ("patching and what the guard knows of SGLang", ("patching", "host")),
    ("values: findings, codes, settings, errors, undo; our logger",
     ("findings", "fixes", "codes", "settings", "errors", "undo", "log")),
)
KINDS = ("top", "deferred", "typing", "dynamic")


@dataclass(frozen=True)
class Edge:
    """One import of a module by another."""

    source: str
    target: str
    kind: str  # one of KINDS
    line: int

    def describe(self) -> str:
        return f"{self.source} -> {self.target} ({self.kind}, line {self.line})"


def _module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or ROOT_MODULE


def package_modules(base: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Every module of the package by its name without the ``sglang_dsv4_guard.`` prefix."""
    return {_module_name(path, base): path for path in sorted(base.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(nodes: Iterable[ast.AST], kind: str) -> Iterator[tuple[ast.AST, str]]:
    """Every node under ``nodes`` with the kind of import it would be."""
    for node in nodes:
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from _walk(node.body, "typing")
            yield from _walk(node.orelse, kind)
            continue
        yield node, kind
        inner = "deferred" if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef
                                         | ast.Lambda) else kind
        yield from _walk(ast.iter_child_nodes(node), inner)


def _resolve(name: str, modules: dict[str, Path], prefix: str) -> str | None:
    """``name`` as a module of the graph (``None``: not one of ours)."""
    if name == prefix.rstrip("."):
        return ROOT_MODULE
    if prefix and not name.startswith(prefix):
        return None
    short = name[len(prefix):]
    while short and short not in modules:  # an attribute: take its module
        short = short.rpartition(".")[0]
    return short or None


UNSCANNED = "# unscanned:"  # on a call's line: why the scan may not know what it imports
DEFERRED = "# deferred:"  # on a deferred import's line or the line above: why it waits


@dataclass(frozen=True)
class Fault:
    """An import the rules cannot accept as written."""

    module: str
    line: int
    what: str  # "unscannable" or "deferred without a reason"
    text: str

    def describe(self) -> str:
        return f"{self.module} line {self.line}: {self.what}: {self.text}"


def _is_import_module(node: ast.Call) -> bool:
    func = node.func
    return getattr(func, "attr", getattr(func, "id", "")) == "import_module" and isinstance(
        func, ast.Attribute | ast.Name)


def _literal(node: ast.Call) -> str | None:
    """The module name a call passes as a literal string, or ``None``."""
    if node.args and isinstance(node.args[0], ast.Constant) and isinstance(
            node.args[0].value, str):
        return node.args[0].value
    return None


def _import_blocks(tree: ast.AST) -> dict[int, tuple[int, int]]:
    """For each import statement's first line, the first and last line of the run of
    consecutive import statements it belongs to."""
    blocks: dict[int, tuple[int, int]] = {}
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):  # ``x if c else y``: an expression
                continue
            run: list[ast.stmt] = []
            for stmt in [*body, None]:
                if isinstance(stmt, ast.Import | ast.ImportFrom):
                    run.append(stmt)
                    continue
                if run:
                    span = (run[0].lineno, run[-1].end_lineno or run[-1].lineno)
                    blocks.update((imp.lineno, span) for imp in run)
                run = []
    return blocks


def scan(path: Path, module: str, modules: dict[str, Path],
         prefix: str) -> tuple[list[Edge], list[Fault]]:
    """The imports of ``module`` (at ``path``) that name modules of the graph, and the
    faults: a call the scan cannot read (``__import__``, ``import_module`` of a computed
    or relative name) without an ``# unscanned: <why>`` comment on its line, and a deferred
    import of the graph's modules without a ``# deferred: <why>`` comment on its line or
    the line above."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source, filename=str(path))
    edges: list[Edge] = []
    faults: list[Fault] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    blocks = _import_blocks(tree)

    def says(marker: str, node: ast.AST, above: bool) -> bool:
        first = getattr(node, "lineno", 1)
        last = getattr(node, "end_lineno", None) or first
        if above:  # a run of imports shares the comment above its first
            first, last = blocks.get(first, (first, last))
        start = first - 1
        while above and start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1  # the comment lines right above
        return any(marker in lines[i] for i in range(start, last) if i < len(lines))

    def add(name: str, kind: str, node: ast.AST) -> None:
        target = _resolve(name, modules, prefix)
        if target is not None and target != module:
            edges.append(Edge(module, target, kind, getattr(node, "lineno", 0)))
            if kind == "deferred" and not says(DEFERRED, node, above=True):
                faults.append(Fault(module, edges[-1].line, "deferred without a reason",
                                    lines[edges[-1].line - 1].strip()))

    for node, kind in _walk(tree.body, "top"):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, kind, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package and package != ROOT_MODULE else []
                base = base[:len(base) - node.level + 1]
                origin = prefix + ".".join([*base, *filter(None, [node.module])])
                origin = origin.rstrip(".")  # ``from . import x`` at the top: the package
            else:
                origin = node.module or ""
            for alias in node.names:  # ``from pkg import submodule`` imports the submodule
                add(f"{origin}.{alias.name}", kind, node)
        elif isinstance(node, ast.Call) and (_is_import_module(node) or (
                isinstance(node.func, ast.Name) and node.func.id == "__import__")):
            name = _literal(node)
            readable = (name is not None and not name.startswith(".")
                        and getattr(node.func, "id", "") != "__import__")
            if readable and name is not None:
                add(name, "dynamic", node)
            elif not says(UNSCANNED, node, above=False):
                faults.append(Fault(module, node.lineno, "unscannable", ast.unparse(node)))
    return edges, list(dict.fromkeys(faults))  # ``from m import a, b``: one fault


def imports_of(path: Path, module: str, modules: dict[str, Path], prefix: str) -> list[Edge]:
    """The imports of ``module`` (at ``path``) that name modules of the graph."""
    return scan(path, module, modules, prefix)[0]


def package_faults(base: Path = PACKAGE_DIR) -> list[Fault]:
    """Every :class:`Fault` of the package's modules."""
    modules = package_modules(base)
    return [fault for name, path in modules.items()
            for fault in scan(path, name, modules, PACKAGE + ".")[1]]


def tools_faults(base: Path = TOOLS_DIR) -> list[Fault]:
    """Every :class:`Fault` of the scripts of ``tools/``."""
    modules = {path.stem: path for path in sorted(base.glob("*.py"))}
    return [fault for name, path in modules.items()
            for fault in scan(path, name, modules, "")[1]]


def package_graph(base: Path = PACKAGE_DIR) -> list[Edge]:
    """Every import between the package's modules."""
    modules = package_modules(base)
    edges = [edge for name, path in modules.items()
             for edge in imports_of(path, name, modules, PACKAGE + ".")]
    return list(dict.fromkeys(edges))  # ``from m import a, b``: one import of m


def tools_graph(base: Path = TOOLS_DIR) -> list[Edge]:
    """Every import between the scripts of ``tools/`` (imported by bare name)."""
    modules = {path.stem: path for path in sorted(base.glob("*.py"))}
    edges = [edge for name, path in modules.items()
             for edge in imports_of(path, name, modules, "")]
    return list(dict.fromkeys(edges))


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module`` (0 is the top), or ``None``."""
    best: tuple[int, int] | None = None  # (length of the matching name, layer)
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            covers = module == name or module.startswith(name + ".")
            if covers and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def upward(edges: Iterable[Edge]) -> list[Edge]:
    """The imports that point up a layer (or to or from a module in no layer)."""
    bad = []
    for edge in edges:
        source, target = layer_of(edge.source), layer_of(edge.target)
        if source is None or target is None or target < source:
            bad.append(edge)
    return bad


def cycles(edges: Iterable[Edge], collapse: bool = False) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), sorted.

    With ``collapse``, folders are nodes (:func:`folders`), at every depth. Folders import
    each other one way, so ``state.wrapper`` -> ``plugins`` -> ``state.checks`` is a cycle
    though no module is on one, and so is ``check.rows`` -> ``check.server`` ->
    ``check.rows``, or a sub-package importing a module of the package above it.
    """
    edges = list(edges)
    folder_of = folders(edges) if collapse else (lambda name: name)
    graph: dict[str, set[str]] = {}
    for edge in edges:
        source, target = folder_of(edge.source), folder_of(edge.target)
        if collapse and source == target:
            continue
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def folders(edges: Iterable[Edge]) -> Callable[[str], str]:
    """Each module's folder: a package (``check.rows``, its ``__init__``) is its own, a
    module in a package is the package's (``check.rows.contract`` and ``check.predict``
    are ``check.rows`` and ``check``), a top-level module is itself. A name is a package
    when another module of the graph is inside it."""
    names = {n for e in edges for n in (e.source, e.target)}
    packages = {n.rpartition(".")[0] for n in names if "." in n}
    return lambda name: name if name in packages or "." not in name else name.rpartition(".")[0]


def _cycle_edges(edges: list[Edge], group: list[str], collapse: bool) -> list[Edge]:
    node = folders(edges) if collapse else (lambda name: name)
    return [e for e in edges if node(e.source) in group and node(e.target) in group
            and node(e.source) != node(e.target)]


def report(edges: list[Edge], modules: Iterable[str], layered: bool) -> tuple[list[str], bool]:
    """The printed graph and whether it keeps the rules."""
    lines: list[str] = []
    by_source: dict[str, list[Edge]] = {}
    for edge in edges:
        by_source.setdefault(edge.source, []).append(edge)

    def module_lines(module: str) -> Iterator[str]:
        parts = []
        for kind in KINDS:
            targets = sorted({e.target for e in by_source.get(module, []) if e.kind == kind})
            if targets:
                parts.append(f"{kind}: {', '.join(targets)}")
        yield f"    {module}" + (f"  ->  {'; '.join(parts)}" if parts else "")

    ordered = sorted(modules)
    if layered:
        for index, (title, _) in enumerate(LAYERS):
            lines.append(f"  layer {index + 1}: {title}")
            for module in ordered:
                if layer_of(module) == index:
                    lines.extend(module_lines(module))
        loose = [m for m in ordered if layer_of(m) is None]
        if loose:
            lines.append("  in no layer:")
            for module in loose:
                lines.extend(module_lines(module))
    else:
        for module in ordered:
            lines.extend(module_lines(module))
    ok = True
    for collapse, what in ((False, "module"), (True, "folder"))[:2 if layered else 1]:
        groups = cycles(edges, collapse)
        ok &= not groups
        lines.append(f"  {what} cycles: " + ("none" if not groups else str(len(groups))))
        for group in groups:
            lines.append(f"    {' <-> '.join(group)}:")
            lines.extend(f"      {e.describe()}" for e in _cycle_edges(edges, group, collapse))
    if layered:
        bad = upward(edges)
        ok &= not bad
        lines.append("  imports pointing up a layer: " + ("none" if not bad else str(len(bad))))
        for edge in bad:
            source, target = layer_of(edge.source), layer_of(edge.target)
            lines.append(f"    {edge.describe()}: layer {_number(source)} imports layer "
                         f"{_number(target)}")
    return lines, ok


def _number(layer: int | None) -> str:
    return "(none)" if layer is None else str(layer + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    edges = package_graph()
    lines, ok = report(edges, package_modules(), layered=True)
    print(f"{PACKAGE} (top layer first; an import may only point down or within its layer)")
    print("\n".join(lines))
    tool_edges = tools_graph()
    tool_lines, tools_ok = report(tool_edges, [p.stem for p in TOOLS_DIR.glob("*.py")],
                                  layered=False)
    print("tools/ (scripts importing each other by bare name)")
    print("\n".join(tool_lines))
    faults = package_faults() + tools_faults()
    print("imports the rules cannot accept: " + ("none" if not faults else str(len(faults))))
    for fault in faults:
        print(f"    {fault.describe()}")
    return 0 if ok and tools_ok and not faults else 1


if __name__ == "__main__":
    sys.exit(main())
