"""Which tests each release of the matrix runs, by the digests of the SGLang code each drives.

``make test`` runs every test on the base release first, with ``tools/trace_drives.py``
recording what each test ran. A test's *key* on a release (:func:`key`) is a digest of that release's code for
everything the test drove (``tools/release_code.py``): each SGLang function that ran, the
SGLang names its test class reaches in its file and the test helpers
(:func:`imports_reached`), and what the guard read of SGLang rather than ran
(the profile its judgement picks, its patch series, the digests of the checks of SGLang
that the guard's functions that ran name). SGLang's test runner (``sglang/test/``) runs
every test and is in no key.

A test runs on a release when its key there is new (the base release's first, then the
others oldest first) and is left out where the key equals that of a release that ran it:
the same code gives the same outcome. A process test (``PROCESS_TESTS``) counts, for its
children, the SGLang code it declares they drive. A test that cannot be placed (it
forked, or started a Python interpreter, without being a declared process test; an
untraced record) runs everywhere, and so does every test on a release whose code cannot
be read (no ``sglang`` package found). What counts for a left-out test (its outcome, the
codes it produced) is its run on the named release.

What a trace cannot see, and so what the selection does not account for: a value SGLang
computed before the test and kept (an import-time registry, a cache filled by an earlier
test), files SGLang reads that are not Python, a thread already running when the test
started. ``EVERY_RELEASE`` lists the test files that run everywhere whatever their key,
with the reason.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release_code import ReleaseCode, module_bindings, module_effects
from suite import PROCESS_TESTS, process_test
from trace_drives import TESTS_FILE

ROOT = Path(__file__).resolve().parent.parent


# Test files that run on every release, whatever the code they drive, and why.
EVERY_RELEASE = {
    # It checks that the process imports the release the matrix asked for, which is
    # what makes every other row of that release mean anything.
    "tests/test_releases.py": "checks that the release's environment imports that release",
}
# SGLang's test runner, which runs every test and is in no test's key but those of the
# file that tests it.
RUNNER = "test/"
RUNNER_TESTS = "tests/test_harness.py"
# What the guard reads of SGLang besides the code a test runs, by the guard's function
# that reads it: a test that ran it depends on that, on every release.
JUDGEMENT = ("host/judgement.py", "judge")  # the release it guards as, and that one's profile
SERIES = "host/patchset.py"  # the patch series of the release it guards as
SITES = {("host/pd_digests.py", "locate"), ("host/pd_digests.py", "digest_pd_tree"),
         ("host/pd_digests.py", "row_releases")}  # whether it knows SGLang's checks


@dataclass(frozen=True)
class Trace:
    """What one test drove on the base release (its children: as ``PROCESS_TESTS`` says)."""

    test: str
    file: str
    sglang: tuple[tuple[str, str], ...] = ()
    reads: frozenset[str] = frozenset()  # "judgement", "series", "sites": what the guard read
    unplaced: str = ""  # why the test cannot be placed (it then runs everywhere)
    children: int = 0  # Python interpreters it started (process tests)


def _reads(record: Mapping[str, Any]) -> set[str]:
    """What the guard read of SGLang in one record, besides what ran: its judgement, its
    patch series, whether it knows SGLang's checks (``host/pd_digests.py``)."""
    ran = {(str(path), str(name)) for path, name in record.get("guard", ())}
    return ({"judgement"} if JUDGEMENT in ran else set()) \
        | ({"series"} if any(path == SERIES for path, _ in ran) else set()) \
        | ({"sites"} if ran & SITES else set())


def read_traces(where: Path, tests: Iterable[str] = ()) -> dict[str, Trace]:
    """Every test's trace in the directory ``where`` (``tools/trace_drives.py``); each of
    ``tests`` (the base release's run) that has no readable record there is unplaced."""
    path = where / TESTS_FILE
    if not path.is_file():
        raise SystemExit(f"selection: {path} is missing: the base release's traced run "
                         "wrote no trace (is tools/trace_drives.py loaded with -p?)")
    traces = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record: dict[str, Any] = json.loads(line)
            test, starts = str(record["test"]), record.get("starts", {})
        except (ValueError, KeyError, TypeError, AttributeError):
            print(f"selection: {path}:{number}: not a trace record, left out: "
                  f"{line[:80]!r}", file=sys.stderr)
            continue
        declared = process_test(test) is not None
        unplaced = str(record.get("untraced", ""))
        if not unplaced and not declared and starts.get("fork"):
            unplaced = "it forked a process, which records nothing"
        elif not unplaced and not declared and starts.get("python"):
            unplaced = "it started a Python interpreter and is not in PROCESS_TESTS"
        functions = sorted({(str(f), str(n)) for f, n in record.get("sglang", ())
                            if record["file"] == RUNNER_TESTS or not str(f).startswith(RUNNER)})
        traces[test] = Trace(test, str(record["file"]), tuple(functions),
                             frozenset(_reads(record)), unplaced,
                             int(starts.get("python", 0)))
    for test in tests:
        if test not in traces:
            traces[test] = Trace(test, test.partition("::")[0],
                                 unplaced="no trace was recorded for it")
    return traces


@functools.cache
def _test_module(path: Path) -> tuple[dict[str, list[ast.stmt]], tuple[ast.AST, ...]] | None:
    """A module under ``tests/``: the names its module level binds, with the statements
    that bind them, and what it runs at import for its effect; ``None``: no such file."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    return module_bindings(tree.body), tuple(module_effects(tree.body))


@functools.cache
def imports_reached(test: str, root: Path = ROOT) -> tuple[tuple[str, str], ...]:
    """The SGLang names (``from sglang.X import Y``: ``("X", "Y")``) a test (its node id)
    reaches by name: from its class or function, through the definitions, assignments and
    imports of its file and of the modules under ``tests/`` (a name imported from one, or
    by ``*``, is followed there; ``import helpers`` reaches all of it), with what every
    module the test loads runs at import for its effect (those its file imports at module
    level, and ``conftest.py``, whatever the test reaches). A name the test does not reach
    is not in its key, whatever else its file imports. A class a test builds runs no
    code of its own when it is a dataclass without a ``__post_init__``; its fields count
    through this. By name only: ``getattr`` by a computed name, and a registry filled by
    decorators, are not followed. A test whose class or function is not at its file's
    module level reaches all of its file."""
    path, _, rest = test.partition("::")
    found: set[tuple[str, str]] = set()
    seen: set[tuple[Path, str | None]] = set()
    opened: set[Path] = set()
    start = root / path
    owner = rest.split("::", 1)[0].split("[", 1)[0]
    module = _test_module(start)
    # (module, name): a name it binds the test reaches; None: all it binds
    todo: list[tuple[Path, str | None]] = [
        (start, owner if module and owner in module[0] else None),
        (start.parent / "conftest.py", None)]  # pytest runs its hooks around every test

    def reach(where: Path, nodes: Iterable[ast.AST]) -> None:
        for node in nodes:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Name):
                    todo.append((where, inner.id))
                elif isinstance(inner, (ast.Import, ast.ImportFrom)):
                    imported(where, inner, None)

    def imported(where: Path, node: ast.Import | ast.ImportFrom, name: str | None) -> None:
        """What an import statement in ``where`` brings, of ``name`` (None: all of it)."""
        if isinstance(node, ast.ImportFrom):
            if not node.module or node.level:
                return
            # each name imported (a * import: the one asked for; all, asked for none)
            names = [name if a.name == "*" else a.name for a in node.names
                     if name is None or (a.asname or a.name) in (name, "*")]
            if node.module.startswith("sglang."):
                if not node.module.startswith("sglang." + RUNNER.replace("/", ".")):
                    found.update((node.module.removeprefix("sglang."), n)
                                 for n in names if n)
                return
            source = where.parent / f"{node.module.split('.')[0]}.py"
            load(source)
            todo.extend((source, n) for n in names)
        else:
            for alias in node.names:
                if name is None or (alias.asname or alias.name).split(".")[0] == name:
                    source = where.parent / f"{alias.name.split('.')[0]}.py"
                    load(source)
                    todo.append((source, None))

    def load(where: Path) -> None:
        """The test imports ``where``: what it runs at import, and what the modules it
        imports at its module level run, count whatever the test reaches of them."""
        module = _test_module(where)
        if where in opened or module is None:
            return
        opened.add(where)
        bound, effects = module
        reach(where, effects)
        for node in {id(n): n for stmts in bound.values() for n in stmts}.values():
            if isinstance(node, ast.Import):
                for alias in node.names:
                    load(where.parent / f"{alias.name.split('.')[0]}.py")
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                load(where.parent / f"{node.module.split('.')[0]}.py")

    load(start)
    while todo:
        where, name = todo.pop()
        if (where, name) in seen:
            continue
        seen.add((where, name))
        module = _test_module(where)
        if module is None:
            continue
        load(where)
        bound = module[0]
        nodes = {id(n): n for stmts in bound.values() for n in stmts}.values() if name is None \
            else bound.get(name) or bound.get("*", ())  # not bound by name: a * import's
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imported(where, node, name)
            else:
                reach(where, [node])
    return tuple(sorted(found))


def parts(trace: Trace, package: ReleaseCode) -> dict[str, str]:
    """What ``trace``'s test drives in ``package``, by name: what its key digests, and
    what :func:`differences` names."""
    found = {f"{rel}::{qualname}": package.function(rel, qualname)
             for rel, qualname in trace.sglang}
    found.update({f"import sglang.{module}.{name}": package.imported(module, name)
                  for module, name in imports_reached(trace.test)})
    entry = process_test(trace.test)
    if entry is not None:  # what its children drive, as PROCESS_TESTS declares it
        found.update({f"children: {item}": package.declared(item)
                      for item in PROCESS_TESTS[entry].drives})
    readers = {"judgement": lambda: package.judgement, "series": lambda: package.series,
               "sites": lambda: package.sites}
    found.update({f"the guard's {read}": readers[read]() for read in sorted(trace.reads)})
    return found


def key(trace: Trace, package: ReleaseCode) -> str | None:
    """``trace``'s test's key on ``package`` (``None``: it cannot be placed)."""
    if trace.unplaced or not package.path.is_dir():
        return None
    digest = hashlib.sha256()
    for name, text in sorted(parts(trace, package).items()):
        digest.update(f"{name}\0{text}\n".encode())
    return digest.hexdigest()


def differences(trace: Trace, one: ReleaseCode, other: ReleaseCode) -> list[str]:
    """What ``trace``'s test drives that differs between two packages."""
    mine, theirs = parts(trace, one), parts(trace, other)
    return sorted(name for name in mine if mine[name] != theirs.get(name))


@dataclass
class Plan:
    """What each release runs: ``runs[release]`` the node ids it runs, ``covered[release]``
    each left-out test and the release whose run counts for it."""

    runs: dict[str, list[str]] = field(default_factory=dict)
    covered: dict[str, dict[str, str]] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)


def plan(traces: Mapping[str, Trace], base: str, releases: list[str],
         packages: Mapping[str, Path]) -> Plan:
    """The tests each of ``releases`` (oldest first; ``base`` ran every test) runs."""
    chosen = Plan(runs={r: [] for r in releases}, covered={r: {} for r in releases})
    origin = ReleaseCode(packages[base])
    loaded = {r: origin if r == base else ReleaseCode(packages[r], origin)
              for r in {base, *releases}}
    for test, trace in sorted(traces.items()):
        first: dict[str, str] = {}
        start = key(trace, loaded[base])
        if start is None:
            chosen.unplaced.append(test)
        elif trace.file not in EVERY_RELEASE:
            first[start] = base
        for release in releases:
            if release == base:
                continue
            here = key(trace, loaded[release])
            if here is not None and here in first and trace.file not in EVERY_RELEASE:
                chosen.covered[release][test] = first[here]
            else:
                chosen.runs[release].append(test)
                if here is not None:
                    first[here] = release
    return chosen


def first_runs(chosen: Plan, releases: list[str]) -> dict[str, str]:
    """Each test's first release in ``releases`` (oldest first) that runs it."""
    first: dict[str, str] = {}
    for release in releases:
        for test in chosen.runs[release]:
            first.setdefault(test, release)
    return first


def undeclared_process_tests(traces: Mapping[str, Trace]) -> list[str]:
    """The tests that started a Python interpreter without being in ``PROCESS_TESTS``:
    ``make check-fast`` would run them, and nothing declares what their children drive."""
    return [f"{test} starts Python interpreters but is not in PROCESS_TESTS (tools/suite.py)"
            for test, trace in sorted(traces.items())
            if trace.children and process_test(test) is None]


def idle_process_entries(traces: Mapping[str, Trace]) -> list[str]:
    """What is wrong with each ``PROCESS_TESTS`` entry that is not one: none of its traced
    tests started an interpreter, or it names no traced test (a renamed file, class or
    test). Either way ``make check-fast`` leaves out tests it should run."""
    used = {process_test(test) for test, trace in traces.items() if trace.children}
    named = {process_test(test) for test in traces}
    return [f"PROCESS_TESTS lists {entry}, whose tests started no Python interpreter"
            if entry in named else f"PROCESS_TESTS lists {entry}, which names no test"
            for entry in sorted(PROCESS_TESTS) if entry not in used]
