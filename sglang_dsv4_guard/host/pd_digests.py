"""Conditions of SGLang's transfer-time prefill/decode checks: located, digested, evaluated.

Some of SGLang's comparisons of the two servers sit inside a transfer thread that cannot
be driven on CPU (Mooncake's and NIXL's ``maybe_send_extra``). For those the guard reads
the installed release's source (parsed, never imported: ``mooncake/conn.py`` needs
``prometheus_client``), finds the check (a ``raise`` whose message holds a phrase, or a
call to a method) and takes its *site*: the tests of every enclosing ``if`` (and which
branch it sits in) and the assignments before it that those tests read. The site is
digested (``ast.dump`` without positions, :mod:`.digests`' helpers) and, where the digest is
one a known release has (``pd_digests.json``, written by ``tools/pd_digests.py``), its own
tests are evaluated on the values the two launch lines imply: SGLang's condition, not a
re-derivation of it. A site whose digest no known release has is not judged.
"""

from __future__ import annotations
import __future__

import ast
import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FunctionType
from typing import Any

from sglang_dsv4_guard.host.digests import MISSING, ast_digest, find_definition, in_source_order, read_module
from sglang_dsv4_guard.host.targets import (
    MORI_REGISTER,
    PD_FIRST_CONTACT,
    PD_HEAD_SLICE,
    PD_MOONCAKE_SEND_AUX,
    PD_MOONCAKE_SEND_EXTRA,
    PD_MORI_SEND_AUX,
    PD_MORI_SEND_STATE,
    PD_NIXL_PAYLOAD,
    PD_NIXL_SEND_AUX,
    PD_NIXL_SEND_EXTRA,
    PD_NIXL_STATE,
    PD_POP_PREALLOCATED,
    PD_RECEIVER_INIT,
    PEERS_MOONCAKE_START,
    PEERS_MOONCAKE_VALIDATE,
    PEERS_MOONCAKE_WORKER,
    PEERS_NIXL_REGISTER,
    PatchTarget,
)

__all__ = ["PD_DIGESTS_FILE", "SITES", "Located", "NotJudged", "SiteSpec", "digest_pd_tree",
           "first_statement", "known_releases", "known_sites", "locate", "row_releases",
           "unjudged_sites", "with_globals"]

PD_DIGESTS_FILE = Path(__file__).with_name("pd_digests.json")


class NotJudged(Exception):
    """A site that cannot be evaluated here (absent, changed, or reading a value the guard
    does not give it); the message says which."""


@dataclass(frozen=True)
class SiteSpec:
    """A check in SGLang: the function, and the phrase its raised message holds (or, with
    ``call``, the method it calls there; or, with ``helpers``, the whole function and those
    of its class's methods it calls, run as they are rather than evaluated; or, with
    ``first``, the function's first statement after its docstring)."""

    key: str
    target: PatchTarget
    phrase: str = ""
    call: str = ""
    helpers: tuple[str, ...] = ()
    # The phrase of a message assigned there, not raised (a failure SGLang records).
    assigned: str = ""
    first: bool = False


SITES: dict[str, SiteSpec] = {spec.key: spec for spec in (
    SiteSpec("mooncake.hetero_tp", PD_MOONCAKE_SEND_EXTRA,
             phrase="different TP sizes for non-MLA"),
    SiteSpec("mooncake.swa_slice", PD_MOONCAKE_SEND_EXTRA, call="_send_swa_state_slice"),
    SiteSpec("mooncake.minimax", PD_MOONCAKE_SEND_EXTRA, phrase="heterogeneous TP not supported for MiniMax"),
    SiteSpec("mooncake.minimax_pp", PD_MOONCAKE_SEND_EXTRA,
             phrase="PP>1 not supported for MiniMax"),
    SiteSpec("nixl.hetero_tp", PD_NIXL_SEND_EXTRA, phrase="different TP sizes for non-MLA"),
    SiteSpec("nixl.swa_slice", PD_NIXL_SEND_EXTRA, call="_send_swa_state_slice"),
    SiteSpec("nixl.minimax", PD_NIXL_SEND_EXTRA, phrase="heterogeneous TP not supported for MiniMax"),
    SiteSpec("nixl.minimax_pp", PD_NIXL_SEND_EXTRA, phrase="PP>1 not supported for MiniMax"),
    SiteSpec("head_slice.pp", PD_HEAD_SLICE, phrase="pipeline parallelism"),
    SiteSpec("head_slice.layout", PD_HEAD_SLICE, phrase="needs the NHD KV cache layout"),
    SiteSpec("nixl.hisparse_spec", PD_NIXL_PAYLOAD, phrase="decode-only speculative"),
    SiteSpec("nixl.direct_to_host", PD_NIXL_PAYLOAD, phrase="direct-to-host"),
    SiteSpec("nixl.fewer_regions", PD_NIXL_PAYLOAD, phrase="registered fewer KV regions"),
    # NIXL's prepared state transfer (0.5.23+): the whole method and the helpers it calls,
    # run on a half-built manager; maybe_send_extra's per-request refusal of its rejection.
    SiteSpec("nixl.state_layout", PD_NIXL_STATE,
             helpers=("_plan_prepared_state_component", "_prepared_state_pairs",
                      "_state_component_is_whole_slot", "_build_prepared_state_plan")),
    SiteSpec("nixl.state_rejected", PD_NIXL_SEND_EXTRA, phrase="NIXL state layout rejected"),
    # NIXL's and MORI's per-request refusal of a replicated Mamba state (0.5.20+), whose
    # methods run on a half-built manager (pd/mamba_state.py).
    SiteSpec("nixl.mamba_replicated", PD_NIXL_SEND_EXTRA,
             phrase="Replicated Mamba PD state transfer"),
    SiteSpec("mori.mamba_replicated", PD_MORI_SEND_STATE,
             phrase="Replicated Mamba PD state transfer"),
    SiteSpec("decode.hisparse_mooncake", PD_POP_PREALLOCATED, phrase="requires the"),
    SiteSpec("first_contact.minimax", PD_FIRST_CONTACT,
             phrase="MiniMax sparse PD requires matching attention TP"),
    # Decode's cached first contact (``if bootstrap_addr in self.prefill_info_table:
    # return True``), which the first-contact wrapper answers itself (contact/cached.py).
    SiteSpec("first_contact.cached", PD_FIRST_CONTACT, first=True),
    SiteSpec("mooncake.send_aux", PD_MOONCAKE_SEND_AUX, helpers=("send_aux_tcp",)),
    SiteSpec("nixl.send_aux", PD_NIXL_SEND_AUX, helpers=("send_aux_tcp",)),
    SiteSpec("mori.send_aux", PD_MORI_SEND_AUX, helpers=("send_aux_tcp", "send_aux_rdma")),
    # What the registration guard (peers/) relies on: NIXL's registration as a whole (its
    # order: relayout, table, aux count, payload, state), Mooncake's bootstrap closure
    # (it writes decode_kv_args_table) and the transfer worker's dying re-raise.
    SiteSpec("peers.nixl_register", PEERS_NIXL_REGISTER, helpers=("_prepare_payload_xfer",)),
    SiteSpec("peers.mooncake_start", PEERS_MOONCAKE_START,
             helpers=("_publish_peer_registration",)),
    SiteSpec("peers.mooncake_worker", PEERS_MOONCAKE_WORKER, phrase="is dead"),
    # Mooncake's state-layout verdict on a registering peer (0.5.22+), run by
    # pd/state_layout.py as it is, with the stride comparison it calls.
    SiteSpec("mooncake.state_layout", PEERS_MOONCAKE_VALIDATE,
             helpers=("_state_stride_mismatch",)),
    # MORI's registration decides the DCP relayout from 0.5.22 (earlier ones never call it).
    SiteSpec("peers.mori_relayout", MORI_REGISTER, call="requires_dcp_relayout"),
    SiteSpec("receiver.allocation_policy", PD_RECEIVER_INIT,
             assigned="allocation policy mismatch"),
    SiteSpec("receiver.prefill_complete_peer", PD_RECEIVER_INIT,
             assigned="prefill_complete requires peer attention"),
)}


@dataclass(frozen=True)
class Located:
    """One found check: its statement, the enclosing tests with the branch each must take,
    the assignments before it the tests read, and the class's methods they call."""

    spec: SiteSpec
    node: ast.stmt
    chain: tuple[tuple[ast.expr, bool], ...]
    assigns: tuple[ast.Assign, ...]
    methods: tuple[ast.FunctionDef, ...]
    filename: str

    @functools.cached_property
    def digest(self) -> str:
        """The site's digest: tests, branches, assignments, methods and the statement
        (once per located site: a located site is cached per file version)."""
        marks = [n for test, wanted in self.chain for n in (test, ast.Constant(wanted))]
        return ast_digest(*marks, *self.assigns, *self.methods, self.node)

    def holds(self, names: Mapping[str, Any]) -> bool:
        """Whether the check's statement runs for ``names`` (``self``, ``st`` ...): the
        assignments it depends on run, then every enclosing test is evaluated in order.
        Raises :class:`NotJudged` when a test reads what ``names`` does not give."""
        scope = self._scope(names)
        return all(bool(self._eval(test, scope)) == wanted for test, wanted in self.chain)

    def message(self, names: Mapping[str, Any]) -> str:
        """What the check raises for ``names``, built by its own expression."""
        if not isinstance(self.node, ast.Raise) or self.node.exc is None:
            return ""
        return str(self._eval(self.node.exc, self._scope(names)))

    def _scope(self, names: Mapping[str, Any]) -> dict[str, Any]:
        scope = dict(names)
        for assign in self.assigns:
            target = assign.targets[0]
            if isinstance(target, ast.Name) and target.id not in names:
                try:
                    scope[target.id] = self._eval(assign.value, scope)
                except NotJudged:
                    scope.pop(target.id, None)
        self.define(scope, scope.get("self"))
        return scope

    def define(self, scope: dict[str, Any], owner: Any, function: bool = False) -> Any:
        """The site's methods defined in ``scope`` (each compiled once) and bound to
        ``owner`` (unless ``None``); with ``function`` (a ``helpers`` site, whose node is
        the whole function), that function too, returned unbound."""
        local: dict[str, Any] = {}
        for node in (self.node, *self.methods) if function else self.methods:
            exec(self._compiled(node), scope, local)
        if owner is not None:
            for method in self.methods:
                setattr(owner, method.name, local[method.name].__get__(owner))
        return local[self.node.name] if function else None  # type: ignore[attr-defined]

    @functools.cached_property
    def _code(self) -> dict[int, CodeType]:
        """Each of this site's nodes compiled once (by the node's id: the site holds its
        nodes for its lifetime)."""
        return {}

    def _compiled(self, node: ast.stmt | ast.expr) -> CodeType:
        """``node`` compiled (a method defined, an expression evaluated), once."""
        code = self._code.get(id(node))
        if code is None:
            if isinstance(node, ast.stmt):
                code = compile(ast.Module(body=[node], type_ignores=[]), self.filename, "exec",
                               flags=__future__.annotations.compiler_flag, dont_inherit=True)
            else:
                assert isinstance(node, ast.expr)
                code = compile(ast.Expression(body=node), self.filename, "eval")
            self._code[id(node)] = code
        return code

    def _eval(self, node: ast.expr, scope: dict[str, Any]) -> Any:
        try:
            return eval(self._compiled(node), scope)
        except Exception as exc:  # a value the guard does not give it: not judged
            raise NotJudged(f"{self.spec.target}: {ast.unparse(node)[:120]} reads what "
                            f"the guard does not derive ({type(exc).__name__}: {exc})") from exc


def with_globals(function: FunctionType, **names: Any) -> FunctionType:
    """A copy of SGLang's ``function`` (its very code) that reads ``names`` instead of its
    module's globals of those names; the module and the function stay untouched."""
    copy = FunctionType(function.__code__, {**function.__globals__, **names},
                        function.__name__, function.__defaults__, function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__  # keyword-only defaults, as SGLang wrote them
    return copy


def _names_read(nodes: Sequence[ast.AST]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _holds(stmt: ast.stmt, phrase: str) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and phrase in n.value
               for n in in_source_order(stmt))


def _matches(spec: SiteSpec, stmt: ast.stmt) -> bool:
    if spec.phrase:
        return isinstance(stmt, ast.Raise) and _holds(stmt, spec.phrase)
    if spec.assigned:
        return isinstance(stmt, ast.Assign) and _holds(stmt, spec.assigned)
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == spec.call for n in in_source_order(stmt))


_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
             ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _walk(body: list[ast.stmt], spec: SiteSpec, chain: tuple[tuple[ast.expr, bool], ...],
          seen: tuple[ast.Assign, ...]
          ) -> Iterator[tuple[ast.stmt, tuple[tuple[ast.expr, bool], ...], tuple[ast.Assign, ...]]]:
    """Every simple statement of ``body`` matching ``spec``, with its tests and the simple
    assignments (one name) that come before it in the blocks enclosing it."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _walk(stmt.body, spec, (*chain, (stmt.test, True)), seen)
            yield from _walk(stmt.orelse, spec, (*chain, (stmt.test, False)), seen)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # a nested definition runs when called, not here
        elif isinstance(stmt, _COMPOUND):
            blocks = [getattr(stmt, "body", []), getattr(stmt, "orelse", []),
                      getattr(stmt, "finalbody", [])]
            blocks += [h.body for h in getattr(stmt, "handlers", [])]
            for block in blocks:
                yield from _walk(block, spec, chain, seen)
        elif _matches(spec, stmt):
            yield stmt, chain, seen
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            seen = (*seen, stmt)


def _needed(chain: Sequence[tuple[ast.expr, bool]], node: ast.stmt,
            seen: Sequence[ast.Assign], message: bool) -> tuple[ast.Assign, ...]:
    """The assignments (last of each name, transitively) that the tests (and, with
    ``message``, the raised or assigned message) read."""
    wanted = _names_read([t for t, _ in chain] + ([node] if message else []))
    kept: list[ast.Assign] = []
    for assign in reversed(seen):
        name = assign.targets[0].id  # type: ignore[attr-defined]
        if name in wanted and all(k.targets[0].id != name  # type: ignore[attr-defined]
                                  for k in kept):
            kept.append(assign)
            wanted |= _names_read([assign.value])
    return tuple(reversed(kept))


def _self_methods(cls: ast.ClassDef, nodes: Sequence[ast.AST]) -> tuple[ast.FunctionDef, ...]:
    called = {n.func.attr for node in nodes for n in ast.walk(node)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"}
    return tuple(m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name in called)


def first_statement(fn: ast.FunctionDef) -> ast.stmt | None:
    """The first statement of ``fn``'s body after its docstring (``None`` for none)."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body[0] if body else None


def locate(package_dir: Path, spec: SiteSpec) -> Located | None:
    """The first statement of ``spec``'s function matching it; ``None`` when the function
    or the check is absent from the release. Raises
    :class:`~.digests.UnreadableSource` for a file that cannot be parsed."""
    path = package_dir / spec.target.path
    try:
        stat = path.stat()
    except OSError:  # absent or unreadable: read_module says which, uncached
        return _locate(package_dir, spec)
    return _located(package_dir, spec, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _located(package_dir: Path, spec: SiteSpec, mtime_ns: int, size: int) -> Located | None:
    """:func:`_locate`, once per file version (a check looks up every site per row, and
    ``check --fix`` runs many checks; a changed file has another mtime or size)."""
    return _locate(package_dir, spec)


def _locate(package_dir: Path, spec: SiteSpec) -> Located | None:
    module = read_module(package_dir, spec.target.path)
    owner, method = spec.target.qualname.split(".")
    cls = find_definition(module.body, owner) if module else None
    fn = find_definition(cls.body, method) if isinstance(cls, ast.ClassDef) else None
    if not isinstance(cls, ast.ClassDef) or not isinstance(fn, ast.FunctionDef):
        return None
    filename = str(package_dir / spec.target.path)
    if spec.first:
        node = first_statement(fn)
        return None if node is None else Located(spec, node, (), (), (), filename)
    if spec.helpers:  # the whole function, with the helpers it calls that the class has
        helpers = tuple(m for m in cls.body if isinstance(m, ast.FunctionDef)
                        and m.name in spec.helpers)
        return Located(spec, fn, (), (), helpers, filename)
    for node, chain, seen in _walk(fn.body, spec, (), ()):
        assigns = _needed(chain, node, seen,
                          isinstance(node, ast.Raise) or bool(spec.assigned))
        tests: list[ast.AST] = [t for t, _ in chain]
        methods = _self_methods(cls, [*tests, *(a.value for a in assigns)])
        return Located(spec, node, chain, assigns, methods, filename)
    return None


def digest_pd_tree(package_dir: Path) -> dict[str, str]:
    """Every site's digest in the ``sglang`` package at ``package_dir`` (``missing`` for
    one the release does not have)."""
    found = {key: locate(package_dir, spec) for key, spec in SITES.items()}
    return {key: site.digest if site else MISSING for key, site in found.items()}


@functools.lru_cache(maxsize=4)
def known_releases(path: Path = PD_DIGESTS_FILE) -> dict[str, dict[str, str]]:
    """``{release: {site key: digest}}`` as stored."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): dict(v) for k, v in data.get("releases", {}).items()}


def row_releases(found: Mapping[str, str], keys: Sequence[str]) -> list[str]:
    """The known releases whose digests of ``keys`` are all those ``found``."""
    return [release for release, stored in known_releases().items()
            if all(stored.get(k) == found.get(k) for k in keys)]


def known_sites(package: Path | None, keys: Sequence[str]) -> dict[str, Located | None]:
    """The sites ``keys`` of the release at ``package`` (``None`` for one it has not), when
    their digests (an absent site's is ``missing``) are all a known release's. Raises
    :class:`NotJudged` otherwise, naming the functions, or when the source was not found."""
    if package is None:
        raise NotJudged("the imported SGLang's source was not found")
    sites = {key: locate(package, SITES[key]) for key in keys}
    if not row_releases({k: s.digest if s else MISSING for k, s in sites.items()}, keys):
        targets = " / ".join(sorted({str(SITES[k].target) for k in keys}))
        raise NotJudged(f"SGLang's {targets} differs from every release this guard knows")
    return sites


def unjudged_sites(package: Path | None, keys: Sequence[str], code: str) -> str | None:
    """The ``unknowns`` line of a condition reading sites ``keys`` when :func:`known_sites`
    does not judge them, else ``None``."""
    try:
        known_sites(package, keys)
    except NotJudged as exc:
        return f"{code}: not judged: {exc}"
    return None
