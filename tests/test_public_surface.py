"""The public surface is closed: every type a user meets through ``__all__`` is exported,
every hook spec is documented and implemented by a test plug-in, and the undo of every
call that changes the installed guard is the one exported ``Undo``."""

from __future__ import annotations

import ast
import inspect
import types
import typing
import unittest
from collections.abc import Iterator
from pathlib import Path

from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import hookspecs, testing

register_cpu_ci(est_time=32, suite="stage-a-test-cpu")

TESTS = Path(__file__).resolve().parent
PACKAGE = "sglang_dsv4_guard"


def _ours(kind: type) -> bool:
    return kind.__module__.split(".")[0] == PACKAGE


def _classes_in(hint: object) -> Iterator[type]:
    """Every class a type hint names: ``X | None``, ``tuple[X, ...]``, ``Setting[Mode]``..."""
    if isinstance(hint, type) and not isinstance(hint, types.GenericAlias):
        yield hint
    origin = typing.get_origin(hint)
    if isinstance(origin, type):
        yield origin
    for arg in typing.get_args(hint):
        if isinstance(arg, list):  # Callable[[A, B], R]
            for item in arg:
                yield from _classes_in(item)
        else:
            yield from _classes_in(arg)


def _hints(obj: object) -> dict[str, object]:
    """The resolved annotations of a function or class (``from __future__`` strings too)."""
    return typing.get_type_hints(_function(obj))


def _function(member: object) -> object:
    if isinstance(member, property):
        return member.fget
    return member.__func__ if isinstance(member, staticmethod | classmethod) else member


def _members(kind: type) -> Iterator[tuple[str, object]]:
    """A class's own annotations, and its public methods and properties (``__init__`` too).

    A method put on the class from outside the package (the matrix's conftest wraps
    ``Report.of`` to count codes) is not part of the surface and is left out."""
    yield kind.__qualname__, kind
    for name, member in vars(kind).items():
        if (name == "__init__" or not name.startswith("_")) and (
                inspect.isfunction(member) or isinstance(member, property | staticmethod
                                                         | classmethod)) and \
                getattr(_function(member), "__module__", "").split(".")[0] == PACKAGE:
            yield f"{kind.__qualname__}.{name}", member


def reachable() -> dict[type, str]:
    """Every class of the package reachable from ``__all__``, and the first path to it."""
    found: dict[type, str] = {}
    todo: list[tuple[str, object]] = [(name, getattr(sglang_dsv4_guard, name))
                                      for name in sglang_dsv4_guard.__all__]
    while todo:
        where, obj = todo.pop()
        if isinstance(obj, type):
            if not _ours(obj) or obj in found:
                continue
            found[obj] = where
            for base in obj.__mro__[1:]:
                if _ours(base):
                    todo.append((f"{where} (base class)", base))
            for path, member in _members(obj):
                todo.extend((f"{path} -> {kind.__qualname__}", kind)
                            for hint in _hints(member).values() for kind in _classes_in(hint))
        elif inspect.isfunction(obj):
            todo.extend((f"{where}() -> {kind.__qualname__}", kind)
                        for hint in _hints(obj).values() for kind in _classes_in(hint))
    return found


class TestEveryReachableTypeIsExported(GuardTestCase):
    """What ``install()``, the hook arguments and the reports hand a user is importable
    from ``sglang_dsv4_guard`` by the name it has."""

    def test_every_reachable_class_is_exported(self) -> None:
        """Every class of the package named by the signature of an exported function or
        the fields, methods and properties of an exported class, recursively, is in
        ``__all__`` under its own name."""
        missing = {kind.__qualname__: where for kind, where in reachable().items()
                   if getattr(sglang_dsv4_guard, kind.__name__, None) is not kind
                   or kind.__name__ not in sglang_dsv4_guard.__all__}
        self.assertEqual(missing, {}, "reachable from __all__ but not exported")

    def test_the_walk_reaches_nested_types(self) -> None:
        """The walk follows fields into fields: a snapshot's tensor description and a
        setting's mode are found (so the test above can fail)."""
        names = {kind.__name__ for kind in reachable()}
        self.assertTrue({"TensorInfo", "MappingComparison", "CudaGraphs", "Mode", "Setting",
                         "HostProfile", "Observation"} <= names, sorted(names))

    def test_every_name_in_all_resolves(self) -> None:
        """Each name of ``__all__`` is an attribute of the package (imported lazily)."""
        for name in sglang_dsv4_guard.__all__:
            with self.subTest(name=name):
                self.assertIsNotNone(getattr(sglang_dsv4_guard, name))


    def test_dir_lists_every_export(self) -> None:
        """``dir(sglang_dsv4_guard)`` lists every name of ``__all__``, the lazy ones too
        (``__getattr__`` resolves them on use and never stores them in the package's
        namespace), so completion and ``help()`` see them."""
        self.assertEqual(set(sglang_dsv4_guard.__all__) - set(dir(sglang_dsv4_guard)), set())


class TestOneUndo(GuardTestCase):
    """``install()``, ``testing.register`` and ``testing.record`` hand back one undo type."""

    def test_undo_is_one_exported_type(self) -> None:
        """``install`` and ``register`` are annotated to return the exported ``Undo``, a
        callable without arguments that returns ``bool``."""
        undo = sglang_dsv4_guard.Undo
        for function in (sglang_dsv4_guard.install, testing.register):
            with self.subTest(function=function.__qualname__):
                self.assertEqual(inspect.get_annotations(function)["return"], "Undo")
                self.assertEqual(_hints(function)["return"], undo)
        self.assertEqual(typing.get_args(undo), ([], bool))

    def test_record_comes_with_an_undo(self) -> None:
        """``record()``'s recorder stops receiving reports once its ``undo`` ran; the undo
        says ``True`` once, then ``False``."""
        self.install_guard("on", load_entry_points=False)
        recorder = testing.record()
        manager = sglang_dsv4_guard.lifecycle.installation()
        assert manager is not None
        self.assertTrue(manager.runtime.plugins.pm.is_registered(recorder))
        self.assertTrue(recorder.undo())
        self.assertFalse(manager.runtime.plugins.pm.is_registered(recorder))
        self.assertFalse(recorder.undo())

    def test_register_undo_after_uninstall_is_false(self) -> None:
        """After ``uninstall()`` a registration's undo has nothing left to reverse."""
        self.install_guard("on", load_entry_points=False)
        undo = testing.register(testing.Recorder())
        sglang_dsv4_guard.uninstall()
        self.assertFalse(undo())


def _spec_names() -> list[str]:
    return [name for name, obj in vars(hookspecs).items()
            if name.startswith(f"{PACKAGE}_") and inspect.isfunction(obj)]


class TestHookSpecs(GuardTestCase):
    """Every hook spec is documented and implemented by a test plug-in (datasette's habit)."""

    def test_there_are_hook_specs(self) -> None:
        """The scan below sees the seven specs (an empty scan would pass vacuously)."""
        self.assertEqual(len(_spec_names()), 7, _spec_names())

    def test_every_spec_documents_each_argument(self) -> None:
        """Each spec's docstring has a ``:param name:`` line for every argument."""
        for name in _spec_names():
            spec = getattr(hookspecs, name)
            doc = inspect.getdoc(spec) or ""
            with self.subTest(spec=name):
                self.assertTrue(doc, "no docstring")
                for arg in inspect.signature(spec).parameters:
                    self.assertIn(f":param {arg}:", doc)

    def test_every_spec_is_implemented_by_a_test(self) -> None:
        """Some test module defines a plug-in implementing each spec (a function or method
        of that name), so each hook is exercised through the real plug-in manager."""
        implemented: dict[str, list[str]] = {}
        for path in sorted(TESTS.rglob("test_*.py")):
            if path.name == Path(__file__).name:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef):
                    implemented.setdefault(node.name, []).append(path.name)
        for name in _spec_names():
            with self.subTest(spec=name):
                self.assertIn(name, implemented, "no test implements this hook")


if __name__ == "__main__":
    unittest.main()
