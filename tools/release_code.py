"""One SGLang release's code, read as the code each test drove (``tools/selection.py``).

:class:`ReleaseCode` parses the files of one release's ``sglang`` package (never imports
them) and digests, for a function by its file and qualified name: its ``def`` as
``ast.dump`` (comments, formatting and line numbers do not count), the fields and bases
of the classes around it, and the module-level bindings of the names it reads (an import
by the one name it binds). It also gives what the guard reads of a release rather than
runs: the profile of the release the guard's judgement guards it as, the guard's patch
series for it, and the guard's digests of SGLang's checks (``host/pd_digests.py``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglang_dsv4_guard.host.digests import digest_tree  # noqa: E402
from sglang_dsv4_guard.host.judgement import judge  # noqa: E402
from sglang_dsv4_guard.host.pd_digests import digest_pd_tree, known_releases  # noqa: E402

__all__ = ["ReleaseCode", "def_path", "find", "find_all", "module_bindings", "module_effects"]

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def def_path(qualname: str) -> tuple[str, ...]:
    """The named definitions that hold code with ``qualname``: ``A.f.<locals>.<lambda>``
    is in ``A.f``; ``<module>`` code is in none (the module's skeleton)."""
    parts: list[str] = []
    for part in qualname.split("."):
        if part == "<locals>":
            continue
        if part.startswith("<"):
            break
        parts.append(part)
    return tuple(parts)


def _statements(body: Iterable[ast.stmt]) -> Iterable[ast.stmt]:
    """``body``'s statements, and those in its ``if``/``try``/``with``/loop blocks (a
    definition under ``if TYPE_CHECKING:`` or ``try: ... except ImportError:``)."""
    for node in body:
        yield node
        if not isinstance(node, _DEFS):
            for name in ("body", "orelse", "finalbody"):
                yield from _statements(getattr(node, name, ()) or ())
            for handler in getattr(node, "handlers", ()) or ():
                yield from _statements(handler.body)


def module_bindings(body: list[ast.stmt]) -> dict[str, list[ast.stmt]]:
    """Each name a module's ``body`` binds (a definition, an import by the one name it
    binds, an assignment), in its ``if``, ``try``, ``with`` and loop blocks too, with the
    statements that bind it."""
    found: dict[str, list[ast.stmt]] = {}
    for node in _statements(body):
        names: list[str] = []
        if isinstance(node, _DEFS):
            names = [node.name]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        for name in names:
            found.setdefault(name, []).append(node)
    return found


def module_effects(body: list[ast.stmt]) -> list[ast.AST]:
    """What a module's ``body`` runs at import for its effect rather than to bind a
    name: the expressions of its statements that bind none (a call, an ``if``'s test, a
    loop's iterable), in its blocks too; not the statements inside."""
    binds = (*_DEFS, ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.AugAssign)
    return [child for node in _statements(body) if not isinstance(node, binds)
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, (ast.stmt, ast.excepthandler))]


def find_all(body: list[ast.stmt], name: str) -> list[ast.AST]:
    """Every definition of ``name`` in ``body`` (one per branch of an ``if``), in order."""
    return [node for node in _statements(body) if isinstance(node, _DEFS) and node.name == name]


def find(body: list[ast.stmt], name: str) -> ast.AST | None:
    """The definition of ``name`` in ``body`` (the last, where several are)."""
    found = find_all(body, name)
    return found[-1] if found else None


def _stub(node: ast.AST) -> ast.AST:
    """``node`` with every function body in it emptied (a shallow copy: ``node`` is kept)."""
    fields: dict[str, Any] = {name: getattr(node, name, None) for name in node._fields}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        fields["body"] = []
    else:
        for name in ("body", "orelse", "finalbody", "handlers"):
            if isinstance(fields.get(name), list):
                fields[name] = [_stub(child) for child in fields[name]]
    return type(node)(**fields)


def _skeleton(node: ast.AST) -> str:
    """``node`` (a module or class) without the bodies of its functions."""
    return ast.dump(_stub(node))


def _class_data(node: ast.ClassDef) -> str:
    """A class without its methods: bases, decorators, and its other statements."""
    header = [ast.dump(n) for n in (*node.bases, *node.keywords, *node.decorator_list)]
    data = [_skeleton(n) for n in node.body
            if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return "\n".join([node.name, *header, *data])


def _binding(node: ast.stmt, name: str) -> str:
    if isinstance(node, ast.ClassDef):
        return _class_data(node)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        origin = f"{'.' * node.level if isinstance(node, ast.ImportFrom) else ''}" \
                 f"{getattr(node, 'module', '') or ''}"
        return " ".join(f"import {origin}:{a.name} as {a.asname}" for a in node.names
                        if (a.asname or a.name).split(".")[0] == name)
    return _skeleton(node)


class ReleaseCode:
    """One release's ``sglang`` package, its files parsed when first asked."""

    def __init__(self, path: Path, base: ReleaseCode | None = None) -> None:
        self.path = path
        self.base = base or self  # where the traces' line numbers were taken

    @functools.cache  # noqa: B019
    def def_at(self, rel: str, line: int) -> tuple[str, ...]:
        """The named definitions that hold ``line`` of ``rel``, outermost first."""
        path: list[str] = []
        tree = self.tree(rel)
        body: list[ast.stmt] = tree.body if tree else []
        while True:
            inner = [n for n in _statements(body) if isinstance(n, _DEFS)
                     and min([n.lineno, *(d.lineno for d in n.decorator_list)])
                     <= line <= (n.end_lineno or n.lineno)]
            if not inner:
                return tuple(path)
            path.append(inner[-1].name)
            body = inner[-1].body

    @functools.cache  # noqa: B019 (one instance per release and run)
    def tree(self, rel: str) -> ast.Module | None:
        try:
            return ast.parse((self.path / rel).read_bytes())
        except (OSError, SyntaxError, ValueError):
            return None

    @functools.cache  # noqa: B019
    def function(self, rel: str, qualname: str) -> str:
        """What one function that ran depends on here: its definition, the skeletons of
        the classes around it, and the module-level bindings of the names it reads."""
        tree = self.tree(rel)
        if tree is None:
            return f"{rel}\0absent"
        path = self.base.def_at(rel, int(qualname[1:])) if qualname.startswith("@") \
            else def_path(qualname)
        if not path:  # a comprehension or lambda at module level: the whole skeleton
            return f"{rel}\0{_skeleton(tree)}"
        node: ast.AST | None = tree
        parts = []
        parent: ast.AST | None = None
        for depth, name in enumerate(path):
            body = getattr(node, "body", None)
            parent, node = node, find(body, name) if isinstance(body, list) else None
            if node is None:
                return f"{rel}::{qualname}\0absent"
            if isinstance(node, ast.ClassDef) and depth < len(path) - 1:
                parts.append(self.skeleton(rel, path[:depth + 1]))
        assert node is not None
        owner = getattr(parent, "body", [])
        parts.append("\n".join(ast.dump(n) for n in find_all(owner, path[-1])) or ast.dump(node))
        parts.append(self.bindings(rel, frozenset(
            n.id for n in ast.walk(node) if isinstance(n, ast.Name))))
        return f"{rel}::{qualname}\0" + "\n".join(parts)

    @functools.cache  # noqa: B019
    def _module_bindings(self, rel: str) -> dict[str, list[ast.stmt]]:
        """Each name bound at ``rel``'s module level, and the statements that bind it."""
        tree = self.tree(rel)
        return module_bindings(tree.body if tree else [])

    @functools.cache  # noqa: B019
    def binding(self, rel: str, name: str, depth: int = 2) -> str:
        """The module-level statements binding ``name`` in ``rel`` (a definition without
        its function bodies, an import by the one name it binds) and, ``depth`` imports
        down, the name's binding in the SGLang module it is imported from. An
        assignment's own reads are not followed: ``envs = Envs()`` would make every
        function that reads ``envs`` depend on every environment variable SGLang
        declares, which each release adds to."""
        texts = []
        for node in self._module_bindings(rel).get(name, ()):
            texts.append(_binding(node, name))
            if depth <= 0:
                continue
            if isinstance(node, ast.ImportFrom):
                source = self._module_file(rel, node)
                for alias in node.names:  # the release's label is not its code
                    if source and (alias.asname or alias.name) == name and \
                            alias.name != "__version__":
                        texts.append(f"{source}:{alias.name}="
                                     f"{self.binding(source, alias.name, depth - 1)}")
        return "\n".join(texts)

    def _module_file(self, rel: str, node: ast.ImportFrom) -> str | None:
        """The file of this package an ``from ... import`` in ``rel`` reads, if any."""
        if node.level:
            base = Path(rel).parent.parts[:len(Path(rel).parent.parts) - node.level + 1]
            module = "/".join([*base, *(node.module or "").split(".")]).strip("/")
        elif (node.module or "").startswith("sglang."):
            module = (node.module or "").removeprefix("sglang.").replace(".", "/")
        else:
            return None
        module = module.replace(".", "/")
        for candidate in (f"{module}.py", f"{module}/__init__.py"):
            if (self.path / candidate).is_file():
                return candidate
        return None

    def bindings(self, rel: str, names: frozenset[str]) -> str:
        """The module-level bindings of ``names`` in ``rel``."""
        return hashlib.sha256("\n".join(
            f"{name}={self.binding(rel, name)}" for name in sorted(names)).encode()).hexdigest()

    @functools.cache  # noqa: B019
    def imported(self, module: str, name: str) -> str:
        """What a test file's ``from sglang.<module> import <name>`` binds here: the
        definition without its bodies (a dataclass's fields, say), or the assignment."""
        rel = module.replace(".", "/")
        for candidate in (f"{rel}.py", f"{rel}/__init__.py"):
            if (self.path / candidate).is_file():
                return f"{candidate}:{name}\0{self.binding(candidate, name) or 'absent'}"
        return f"{module}:{name}\0absent"

    @functools.cache  # noqa: B019
    def declared(self, item: str) -> str:
        """A process test's declared code (``tools/suite.py``): a whole file, or
        ``path::name``, one top-level definition of it, as ``ast.dump``."""
        rel, _, name = item.partition("::")
        tree = self.tree(rel)
        if tree is None:
            return "absent"
        node = find(tree.body, name) if name else tree
        return "absent" if node is None else hashlib.sha256(ast.dump(node).encode()).hexdigest()

    @functools.cache  # noqa: B019
    def skeleton(self, rel: str, owner: tuple[str, ...]) -> str:
        """The class ``owner`` of ``rel`` without its methods: its bases, decorators and
        the statements of its body that are not functions (fields, class attributes)."""
        node: ast.AST | None = self.tree(rel)
        for name in owner:
            body = getattr(node, "body", None)
            node = find(body, name) if isinstance(body, list) else None
        if not isinstance(node, ast.ClassDef):
            return "absent"
        return hashlib.sha256(_class_data(node).encode()).hexdigest()

    @functools.cached_property
    def judgement(self) -> str:
        """The guard's judgement of this package: the profile of the release it guards
        it as (what the guard does differently per release; its name left out), or,
        where it matches no release the guard knows, its digests of SGLang's checks."""
        judgement = judge(self.path, None)
        if judgement.behaves_as is None:
            return json.dumps({k: v.digest for k, v in digest_tree(self.path).items()},
                              sort_keys=True)
        profile = dataclasses.asdict(judgement.profile())
        for name in ("version", "label"):
            profile.pop(name, None)
        return json.dumps(profile, sort_keys=True, default=str)

    @functools.cached_property
    def sites(self) -> str:
        """Whether the guard knows SGLang's checks it evaluates (``host/pd_digests.py``):
        ``known`` where every check's digest is the one it stores for one release (each
        group of checks it asks about then matches that release; it evaluates the
        checks' own statements, which a trace counts as the functions holding them), else
        the digests themselves (a release that mixes checks of two releases is not one
        the guard knows)."""
        found = digest_pd_tree(self.path)
        if any(found == stored for stored in known_releases().values()):
            return "known"
        return json.dumps(found, sort_keys=True)

    @functools.cached_property
    def series(self) -> str:
        """The guard's patch series (``patches/``) for the release it guards this as."""
        judgement = judge(self.path, None)
        folder = ROOT / "patches" / f"sglang-{judgement.behaves_as}"
        return "\n".join(f"{p.name}\0{p.read_text(encoding='utf-8')}"
                         for p in sorted(folder.glob("*.patch")))
