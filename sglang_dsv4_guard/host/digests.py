"""Digests of what the guard depends on in SGLang's code, from normalised source.

The guard predicts SGLang's verdict from a model of SGLang's checks. That model is
only right for code whose checks are the ones it was written against, so the code is
digested, not the version label: each *part* below is a SHA-256 of ``ast.dump`` of
the relevant nodes (no line numbers, comments or formatting; signatures by parameter
names and kinds, not annotations). Files are parsed, never imported: the MORI connector
imports ``mori``, which is absent on most machines.

Parts (key: what it covers):

- ``setup_state_kv_args.signature``: the wrapped function's parameters.
- ``setup_state_kv_args.dsv4_gate``: the condition of the DeepSeek-V4 target+draft block
  (0.5.16/0.5.17 add ``not is_npu()``).
- ``setup_state_kv_args.dsv4_check.N``: the N-th check of that block (a ``raise`` or an
  ``assert``) in source order, with the tests of every enclosing ``if`` and which branch
  it is in (``else: raise`` included), so a new wrapper condition or a swapped
  unified/paged branch changes it.
- ``setup_state_kv_args.dsv4_geometry``: the geometry tuples the checks compare.
- ``MoriKVManager._send_swa_dsa_state.signature`` / ``.check.N`` (every check of the
  function, hashed the same way) and
  ``MoriKVManager._add_remote_peer.signature``.
- ``DeepSeekV4TokenToKVPool.<attribute>``: which methods of the pool class assign each
  attribute the guard reads (:func:`sglang_dsv4_guard.host.targets.pool_attributes_read`:
  SGLang's check's and auto-share's; 0.5.22 starts setting ``full_to_swa_index_mapping``
  in ``__init__``), and ``DeepSeekV4TokenToKVPool.register_mapping.signature``.

What is digested (files, functions, classes, attributes) is read from
:mod:`sglang_dsv4_guard.host.targets`.

A part that cannot be found has the digest ``"missing"``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sglang_dsv4_guard.findings import LINE_CAP
from sglang_dsv4_guard.host.targets import (
    DSV4_POOL,
    MORI_REGISTER,
    MORI_SEND,
    POOL_REGISTER,
    STATE,
    pool_attributes_read,
)

__all__ = ["MISSING", "POOL_ATTRIBUTES", "Part", "UnreadableSource", "ast_digest",
           "code_version", "differences", "digest_tree", "find_definition", "in_source_order",
           "read_module"]

MISSING = "missing"
UTILS = STATE.path
POOL = DSV4_POOL.path
MORI = MORI_SEND.path
# Every pool attribute the guard reads (the snapshot's, auto-share's, the mapping).
POOL_ATTRIBUTES = pool_attributes_read()
_GEOMETRY_NAMES = {"target_geometry", "draft_geometry", "request_window"}


@dataclass(frozen=True)
class Part:
    """One digested thing: a stable key, a digest and what it is, in words."""

    key: str
    digest: str
    what: str


def ast_digest(*nodes: ast.AST) -> str:
    text = "\n".join(ast.dump(node, include_attributes=False) for node in nodes)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _signature(fn: ast.FunctionDef) -> str:
    """Parameter names, kinds and defaults; annotations left out."""
    a = fn.args
    shape = [
        "posonly:" + ",".join(p.arg for p in a.posonlyargs),
        "args:" + ",".join(p.arg for p in a.args),
        "vararg:" + (a.vararg.arg if a.vararg else ""),
        "kwonly:" + ",".join(p.arg for p in a.kwonlyargs),
        "kwarg:" + (a.kwarg.arg if a.kwarg else ""),
        "defaults:" + ";".join(ast.dump(d) for d in a.defaults),
        "kwdefaults:" + ";".join(ast.dump(d) if d else "-" for d in a.kw_defaults),
    ]
    return hashlib.sha256("\n".join(shape).encode()).hexdigest()[:16]


class UnreadableSource(Exception):
    """A source file of SGLang the guard reads is there but cannot be read, or Python
    could not compile it; ``relative`` (under the package) and ``reason`` say which and
    why."""

    def __init__(self, relative: str, reason: str) -> None:
        super().__init__(f"{relative} {reason}")
        self.relative = relative
        self.reason = reason

    @classmethod
    def of(cls, relative: str, error: OSError) -> UnreadableSource:
        """The file at ``relative`` could not be read: ``error`` says why."""
        return cls(relative, f"cannot be read ({type(error).__name__}: "
                             f"{error.strerror or error})")


@functools.lru_cache(maxsize=32)
def _parse(path: Path, relative: str, mtime_ns: int, size: int) -> ast.Module:
    """``path`` parsed as Python compiles it on import, from its bytes (a UTF-8 byte-order
    mark and a PEP 263 coding declaration honoured); cached by modification time and
    size. Raises :class:`UnreadableSource` naming ``relative``."""
    del mtime_ns, size  # the cache key only
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise UnreadableSource.of(relative, exc) from exc
    try:
        return ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes, on older Pythons
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        text = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise UnreadableSource(relative, f"cannot be parsed by Python: {text}{where}") from exc


def read_module(package_dir: Path, relative: str) -> ast.Module | None:
    """The module at ``package_dir / relative``; ``None`` if there is no such file.
    Raises :class:`UnreadableSource` for a file that is there but cannot be read or
    parsed: that is not a change of SGLang's checks."""
    path = package_dir / relative
    try:
        stat = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # permission on a directory, a symbolic-link loop
        raise UnreadableSource.of(relative, exc) from exc
    return _parse(path, relative, stat.st_mtime_ns, stat.st_size)


def find_definition(body: list[ast.stmt], name: str) -> ast.FunctionDef | ast.ClassDef | None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
    return None


def in_source_order(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node``, in source order (``ast.walk`` is breadth-first)."""
    for child in ast.iter_child_nodes(node):
        yield child
        yield from in_source_order(child)


@dataclass(frozen=True)
class _Check:
    """A raise or an assert, with the chain of conditions it sits under."""

    node: ast.Raise | ast.Assert
    context: tuple[ast.AST, ...]  # enclosing statements' headers and branch markers
    condition: str  # the innermost enclosing condition (or the assert's test), for people


def _headers(node: ast.AST) -> list[ast.AST]:
    """What of a compound statement decides whether its body runs (not its body)."""
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [node.target, node.iter]
    if isinstance(node, ast.While):
        return [node.test]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return list(node.items)
    if isinstance(node, ast.ExceptHandler):
        return [node.type] if node.type else []
    return []


def _checks(root: ast.AST, context: tuple[ast.AST, ...] = (), condition: str = "",
            ) -> Iterator[_Check]:
    """Every ``raise`` and ``assert`` under ``root``, in source order, each with the
    tests of every enclosing ``if`` (and which branch it is in), loop and ``with``: an
    added wrapper condition or a moved branch changes the check."""
    for child in ast.iter_child_nodes(root):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue  # a nested definition's checks run when it is called, not here
        if isinstance(child, ast.Raise):
            yield _Check(child, context, condition)
        elif isinstance(child, ast.Assert):
            yield _Check(child, context, ast.unparse(child.test))
        elif isinstance(child, ast.If):
            text = ast.unparse(child.test)
            for branch, body in (("if", child.body), ("else", child.orelse)):
                marked = (*context, child.test, ast.Constant(branch))
                shown = text if branch == "if" else f"not ({text})"
                for statement in body:
                    yield from _checks(ast.Module(body=[statement], type_ignores=[]),
                                       marked, shown)
        elif not isinstance(child, ast.expr):  # try, loops, with, handlers, match
            inner = (*context, ast.Constant(type(child).__name__), *_headers(child))
            yield from _checks(child, inner, condition)


def _message(raise_node: ast.Raise | ast.Assert) -> str:
    """The first words of what ``raise_node`` raises (or asserts), for people."""
    for node in in_source_order(raise_node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip():
            return node.value.split(":")[0].strip()
    return ast.unparse(raise_node)[:LINE_CAP]


def _state_parts(module: ast.Module | None) -> list[Part]:
    name = STATE.qualname
    fn = find_definition(module.body, name) if module else None
    if not isinstance(fn, ast.FunctionDef):
        return [Part(f"{name}.signature", MISSING, f"{name} ({UTILS})")]
    parts = [Part(f"{name}.signature", _signature(fn), f"{name} parameters")]
    block = next((s for s in fn.body if isinstance(s, ast.If)
                  and DSV4_POOL.qualname in ast.dump(s.test)
                  and "draft_token_to_kv_pool" in ast.dump(s.test)), None)
    if block is None:
        return [*parts, Part(f"{name}.dsv4_gate", MISSING, f"{name} DeepSeek-V4 draft block")]
    parts.append(Part(f"{name}.dsv4_gate", ast_digest(block.test),
                      f"{name} DeepSeek-V4 draft block condition "
                      f"({ast.unparse(block.test)[:LINE_CAP]})"))
    for number, check in enumerate(_checks(block), 1):
        parts.append(Part(f"{name}.dsv4_check.{number}", ast_digest(*check.context, check.node),
                          f"{name} DSV4 check {number} ('{_message(check.node)}')"))
    geometry = [s for s in in_source_order(block) if isinstance(s, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id in _GEOMETRY_NAMES for t in s.targets)]
    parts.append(Part(f"{name}.dsv4_geometry", ast_digest(*geometry) if geometry else MISSING,
                      f"{name} DSV4 geometry tuples (target_geometry / draft_geometry)"))
    return parts


def _mori_parts(module: ast.Module | None) -> list[Part]:
    owner = MORI_SEND.qualname.split(".")[0]
    cls = find_definition(module.body, owner) if module else None
    body = cls.body if isinstance(cls, ast.ClassDef) else []
    send, register = find_definition(body, MORI_SEND.attr), find_definition(body, MORI_REGISTER.attr)
    prefix = f"{owner}."
    parts = []
    for fn, method in ((send, MORI_SEND.attr), (register, MORI_REGISTER.attr)):
        digest = _signature(fn) if isinstance(fn, ast.FunctionDef) else MISSING
        parts.append(Part(f"{prefix}{method}.signature", digest,
                          f"{prefix}{method} parameters ({MORI})"))
    for number, check in enumerate(_checks(send) if send is not None else [], 1):
        parts.append(Part(f"{MORI_SEND.qualname}.check.{number}", ast_digest(*check.context, check.node),
                          f"{MORI_SEND.qualname} check {number} "
                          f"({check.condition or 'unconditional'})"))
    return parts


def _assigned_attributes(cls: ast.ClassDef) -> dict[str, list[str]]:
    """``self.<attr> = ...`` targets per attribute: the methods assigning each."""
    where: dict[str, list[str]] = {}
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef):
            continue
        for node in in_source_order(method):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                for leaf in [target, *getattr(target, "elts", [])]:
                    if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                            and leaf.value.id == "self"
                            and method.name not in where.setdefault(leaf.attr, [])):
                        where[leaf.attr].append(method.name)
    return where


def _pool_parts(module: ast.Module | None) -> list[Part]:
    name = DSV4_POOL.qualname
    cls = find_definition(module.body, name) if module else None
    if not isinstance(cls, ast.ClassDef):
        return [Part(f"{name}.class", MISSING, f"{name} ({POOL})")]
    assigned = _assigned_attributes(cls)
    parts = []
    for attribute in POOL_ATTRIBUTES:
        methods = sorted(assigned.get(attribute, []))
        digest = hashlib.sha256(",".join(methods).encode()).hexdigest()[:16]
        parts.append(Part(f"{name}.{attribute}", digest,
                          f"{name}.{attribute} set in: {', '.join(methods) or 'no method'}"))
    register = find_definition(cls.body, POOL_REGISTER)
    parts.append(Part(f"{name}.{POOL_REGISTER}.signature",
                      _signature(register) if isinstance(register, ast.FunctionDef) else MISSING,
                      f"{name}.{POOL_REGISTER} parameters"))
    return parts


def digest_tree(package_dir: Path) -> dict[str, Part]:
    """The parts of the ``sglang`` package at ``package_dir`` (the directory holding
    ``srt/``), keyed by part key."""
    parts = [*_state_parts(read_module(package_dir, UTILS)),
             *_mori_parts(read_module(package_dir, MORI)),
             *_pool_parts(read_module(package_dir, POOL))]
    return {part.key: part for part in parts}


def differences(found: dict[str, Part], known: dict[str, Part]) -> list[str]:
    """What differs between ``found`` and ``known``, in words (empty: they match)."""
    notes = []
    for key in [*known, *(k for k in found if k not in known)]:
        mine, theirs = found.get(key), known.get(key)
        if mine is None and theirs is not None:
            notes.append(f"{theirs.what}: no longer present")
        elif theirs is None and mine is not None:
            notes.append(f"{mine.what}: new")
        elif mine is not None and theirs is not None and mine.digest != theirs.digest:
            if mine.digest == MISSING:
                notes.append(f"{theirs.what}: not found")
            else:
                notes.append(f"{mine.what}: changed (was {theirs.what})"
                             if mine.what != theirs.what else f"{mine.what}: changed")
    return notes


def code_version(package_dir: Path) -> str | None:
    """The version written in the package's own ``_version.py`` (read, not imported)."""
    module = read_module(package_dir, "_version.py")
    for node in module.body if module else []:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str) \
                and any(isinstance(t, ast.Name) and t.id in ("__version__", "version")
                        for t in node.targets):
            return node.value.value
    return None
