"""Layers point down: no import cycle in the package or in tools/, and no import that
points up a layer of ``tools/imports.py``'s ``LAYERS``, counting deferred and type-only
imports too (a deferred import never hides a cycle)."""

from __future__ import annotations

import ast
import re
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=38, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import imports  # noqa: E402 - tools/ is not a package


def _tree(files: dict[str, str]) -> tempfile.TemporaryDirectory[str]:
    """A throw-away package ``sglang_dsv4_guard`` made of ``files`` (path -> source)."""
    tmp = tempfile.TemporaryDirectory()
    for rel, text in files.items():
        path = Path(tmp.name, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp


class TestPackageLayers(GuardTestCase):
    """The package as it is keeps the rules."""

    def test_every_module_is_in_a_layer(self) -> None:
        """Each module of the package belongs to a layer of ``LAYERS``."""
        loose = [m for m in imports.package_modules() if imports.layer_of(m) is None]
        self.assertEqual(loose, [])

    def test_no_module_cycle(self) -> None:
        """No cycle between modules, with deferred and type-only imports counted."""
        self.assertEqual(imports.cycles(imports.package_graph()), [])

    def test_no_cycle_between_folders(self) -> None:
        """Folders (each sub-package, and each top-level module) import each other one
        way only, type-only imports counted."""
        self.assertEqual(imports.cycles(imports.package_graph(), collapse=True), [])

    def test_wrapped_places_do_not_reach_the_hook_specs(self) -> None:
        """The hook specs name the wrapped places' snapshot types; those packages import
        the markers (hookmarkers) and the runtime's ``Hooks`` protocol, never the specs
        or the plug-in manager, so the folder graph has no way back."""
        edges = imports.package_graph()
        places = ("state", "mori", "peers", "contact", "pd", "autoshare")
        reached = {(e.source, e.target) for e in edges
                   if e.source.split(".")[0] in places and e.target in ("hookspecs", "plugins")}
        self.assertEqual(reached, set())
        self.assertIn(("hookspecs", "state.snapshot"), {(e.source, e.target) for e in edges})

    def test_no_module_imports_another_modules_private_name(self) -> None:
        """``from sglang_dsv4_guard.x import _name`` is a fault: a name another module
        needs is that module's public surface (in its ``__all__``)."""
        found = []
        for module, path in imports.package_modules().items():
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                        "sglang_dsv4_guard"):
                    found += [f"{module} imports {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
        self.assertEqual(found, [])

    def test_one_name_per_module_and_class(self) -> None:
        """No two modules share a basename, but the snapshot/checks/wrapper trio of each
        wrapped place; no two classes share a name (two ``Recorder``s and two
        ``Registration``s once meant different things)."""
        trio = {"snapshot", "checks", "wrapper", "__init__"}
        basenames: dict[str, list[str]] = {}
        classes: dict[str, list[str]] = {}
        for module, path in imports.package_modules().items():
            basenames.setdefault(path.stem, []).append(module)
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, []).append(module)
        self.assertEqual({k: v for k, v in basenames.items() if len(v) > 1 and k not in trio},
                         {})
        self.assertEqual({k: v for k, v in classes.items() if len(v) > 1}, {})

    def test_no_import_points_up(self) -> None:
        """Every import points down a layer or stays within its own."""
        self.assertEqual([e.describe() for e in imports.upward(imports.package_graph())], [])

    def test_the_graph_sees_the_imports(self) -> None:
        """The scan finds the composition root's imports of each kind (so the tests above
        would see a fault): lifecycle imports the wrappers at import time, the CLI imports
        its commands in functions, the package root names its exports for type checkers."""
        kinds = {(e.source, e.target, e.kind) for e in imports.package_graph()}
        self.assertIn(("lifecycle", "state.wrapper", "top"), kinds)
        self.assertIn(("cli", "launch.child", "deferred"), kinds)
        self.assertIn(("(package)", "lifecycle", "typing"), kinds)

    def test_no_tools_cycle(self) -> None:
        """``tools/`` scripts do not import their importers (a script run as ``__main__``
        that is imported back is loaded twice)."""
        self.assertEqual(imports.cycles(imports.tools_graph()), [])

    def test_every_import_is_readable_and_every_deferral_explained(self) -> None:
        """No ``__import__`` or computed ``import_module`` without an ``# unscanned:``
        comment, and no deferred import of our own modules without a ``# deferred:``
        comment saying why, in the package or in ``tools/``."""
        faults = imports.package_faults() + imports.tools_faults()
        self.assertEqual([f.describe() for f in faults], [])

    def test_tool_exits_zero(self) -> None:
        """``python tools/imports.py`` reports no fault and exits 0."""
        self.assertEqual(imports.main([]), 0)


# Each code's literal belongs in at most two package modules: the catalogue and the
# condition that raises it (a pointer elsewhere names the module, not the code). The
# codes not there yet, each with the number of modules that still spell it: the count
# may only fall, and a code that reaches two leaves the list (issue 31).
CODE_MODULES_LEFT = {
    "DSV4G001": 6, "DSV4G002": 4, "DSV4G003": 4, "DSV4G004": 9, "DSV4G005": 6,
    "DSV4G006": 9, "DSV4G007": 3, "DSV4G010": 4, "DSV4G020": 5, "DSV4G021": 3,
    "DSV4G022": 5, "DSV4G023": 4, "DSV4G024": 3, "DSV4G025": 3, "DSV4G026": 7,
    "DSV4G030": 3, "DSV4G031": 3, "DSV4G032": 3, "DSV4G034": 3, "DSV4G035": 3,
    "DSV4G037": 3, "DSV4G041": 4, "DSV4G044": 3, "DSV4G046": 4, "DSV4G047": 3,
    "DSV4G048": 3, "DSV4G049": 4, "DSV4G090": 9, "DSV4G099": 4,
}


def code_modules() -> dict[str, list[str]]:
    """Each code literal (``DSV4Gnnn``) of the package, and the modules that spell it."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "sglang_dsv4_guard").rglob("*.py")):
        for code in sorted(set(re.findall(r"DSV4G\d{3}", path.read_text(encoding="utf-8")))):
            found.setdefault(code, []).append(path.relative_to(ROOT).as_posix())
    return found


class TestCodesSpelledOnce(GuardTestCase):
    """A code's literal is in the catalogue and its condition's module only."""

    def test_each_code_in_two_modules_or_fewer_than_before(self) -> None:
        over = {code: modules for code, modules in code_modules().items()
                if len(modules) > CODE_MODULES_LEFT.get(code, 2)}
        self.assertEqual(over, {})

    def test_the_list_of_codes_left_is_current(self) -> None:
        """A code listed whose count fell is listed at its new count (or not at all once
        at two): the list never allows more than the package has."""
        counts = {code: len(modules) for code, modules in code_modules().items()}
        self.assertEqual({c: counts.get(c, 0) for c in CODE_MODULES_LEFT},
                         {c: n for c, n in CODE_MODULES_LEFT.items() if n > 2})


class TestRulesCatchFaults(GuardTestCase):
    """The rules fail on the faults they exist for, on a throw-away package."""

    def test_a_deferred_import_back_is_a_cycle(self) -> None:
        """``reporter`` importing ``lifecycle`` inside a function, while ``lifecycle``
        imports ``reporter`` at the top, is a cycle and an upward import."""
        with _tree({"__init__.py": "",
                    "lifecycle.py": "from sglang_dsv4_guard.reporter import X\n",
                    "reporter.py": """\
                        def summary():
                            from sglang_dsv4_guard.lifecycle import installation
                        """}) as tmp:
            edges = imports.package_graph(Path(tmp))
        self.assertEqual(imports.cycles(edges), [["lifecycle", "reporter"]])
        self.assertEqual([(e.source, e.target, e.kind) for e in imports.upward(edges)],
                         [("reporter", "lifecycle", "deferred")])

    def test_a_type_only_import_back_is_a_cycle(self) -> None:
        """An import under ``if TYPE_CHECKING:`` counts too."""
        with _tree({"__init__.py": "",
                    "plugins.py": "import sglang_dsv4_guard.reporter\n",
                    "reporter.py": """\
                        from typing import TYPE_CHECKING
                        if TYPE_CHECKING:
                            from sglang_dsv4_guard import plugins
                        """}) as tmp:
            edges = imports.package_graph(Path(tmp))
        self.assertEqual(imports.cycles(edges), [["plugins", "reporter"]])

    def test_sub_packages_importing_each_other_is_a_cycle(self) -> None:
        """``state.checks`` -> ``autoshare.rule`` -> ``state.snapshot``: no module is on a
        cycle, but the two sub-packages import each other."""
        with _tree({"__init__.py": "", "state/__init__.py": "", "autoshare/__init__.py": "",
                    "state/snapshot.py": "",
                    "state/checks.py": "from sglang_dsv4_guard.autoshare.rule import decide\n",
                    "autoshare/rule.py": "from sglang_dsv4_guard.state.snapshot import P\n",
                    }) as tmp:
            edges = imports.package_graph(Path(tmp))
        self.assertEqual(imports.cycles(edges), [])
        self.assertEqual(imports.cycles(edges, collapse=True), [["autoshare", "state"]])

    def test_a_top_level_module_between_folders_is_a_cycle(self) -> None:
        """``state.wrapper`` -> ``plugins`` -> ``state.checks``: a top-level module is a
        folder of its own, so the wrapper reaching its own checks through the manager is
        a cycle (the one the package had before assembly.py)."""
        with _tree({"__init__.py": "", "state/__init__.py": "",
                    "state/checks.py": "",
                    "state/wrapper.py": "from sglang_dsv4_guard import plugins\n",
                    "plugins.py": "from sglang_dsv4_guard.state import checks\n",
                    }) as tmp:
            edges = imports.package_graph(Path(tmp))
        self.assertEqual(imports.cycles(edges), [])
        self.assertEqual(imports.cycles(edges, collapse=True), [["plugins", "state"]])

    def test_a_relative_import_of_a_sibling_module_is_seen(self) -> None:
        """``from . import lifecycle`` in a top-level module (and ``from .. import
        lifecycle`` in a sub-package's module) is an import of ``lifecycle``: with
        ``lifecycle`` importing them back, both are cycles."""
        with _tree({"__init__.py": "", "state/__init__.py": "",
                    "lifecycle.py": "from sglang_dsv4_guard import reporter\n"
                                    "from sglang_dsv4_guard.state import wrapper\n",
                    "reporter.py": "from . import lifecycle\n",
                    "state/wrapper.py": "from .. import lifecycle\n"}) as tmp:
            edges = imports.package_graph(Path(tmp))
        self.assertEqual(imports.cycles(edges),
                         [["lifecycle", "reporter", "state.wrapper"]])

    def test_an_import_the_scan_cannot_read_is_a_fault(self) -> None:
        """``__import__``, ``import_module`` of a computed name and of a relative name hide
        what they import: each is a fault, unless an ``# unscanned:`` comment on its line
        says why."""
        with _tree({"__init__.py": "", "reporter.py": """\
                        import importlib
                        name = "sglang_dsv4_guard.lifecycle"
                        __import__(name)
                        importlib.import_module(name)
                        importlib.import_module(".lifecycle", "sglang_dsv4_guard")
                        importlib.import_module(name)  # unscanned: a test of the comment
                        importlib.import_module("sglang_dsv4_guard.codes")
                        """, "lifecycle.py": "", "codes.py": ""}) as tmp:
            faults = imports.package_faults(Path(tmp))
            edges = imports.package_graph(Path(tmp))
        self.assertEqual([(f.module, f.line, f.what) for f in faults],
                         [("reporter", line, "unscannable") for line in (3, 4, 5)])
        self.assertIn(imports.Edge("reporter", "codes", "dynamic", 7), edges)

    def test_a_deferred_import_without_a_reason_is_a_fault(self) -> None:
        """A deferred import of one of our modules needs a ``# deferred:`` comment on its
        line or in the comment lines right above its run of imports; SGLang's need none."""
        with _tree({"__init__.py": "", "codes.py": "", "errors.py": "", "reporter.py": """\
                        def bare():
                            import json
                            from sglang_dsv4_guard import codes
                        def explained():
                            # deferred: a test of the comment above a run
                            # (its second line)
                            from sglang_dsv4_guard import codes
                            from sglang_dsv4_guard.errors import E
                        def on_its_line():
                            from sglang_dsv4_guard import errors  # deferred: a test
                        """}) as tmp:
            faults = imports.package_faults(Path(tmp))
        self.assertEqual([(f.module, f.line, f.what) for f in faults],
                         [("reporter", 3, "deferred without a reason")])


if __name__ == "__main__":
    unittest.main()
