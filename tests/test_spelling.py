"""One word, one meaning; one place for each name of SGLang's.

"Fingerprint" means only a report's identity (the deduplication key); what the guard
computes of SGLang's code is its "code digests". And the modules, functions and
attributes of SGLang the guard reads are spelled in ``host/targets.py`` only.
"""

from __future__ import annotations

import ast
import re
import tempfile
import unittest
from pathlib import Path

from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sglang_dsv4_guard"

# Where "fingerprint" means a report's identity, each with why.
FINGERPRINT_MEANS_A_REPORT = {
    "sglang_dsv4_guard/dedup": "the deduplication key itself",
    "sglang_dsv4_guard/reporter.py": "prints a report's fingerprint in its pointer",
    "sglang_dsv4_guard/wrapping.py": "the fingerprint a wrapper's error carries",
    "sglang_dsv4_guard/mori/wrapper.py": "the G006 summary names its report's fingerprint",
    "sglang_dsv4_guard/peers/guard.py": "its summary and count lines name the report's fingerprint",
    "sglang_dsv4_guard/state/snapshot.py": "the role keeps two sides' fingerprints apart",
}

# Where "remedy" (or "remediation", "remediate") is said: it means only the auto-share
# plug-in stage that changes SGLang's objects; a finding's fixes are "fixes".
REMEDY_MEANS_AUTOSHARE = {
    "sglang_dsv4_guard/autoshare": "the built-in remediation itself",
    "sglang_dsv4_guard/hookspecs.py": "the remediation hook's spec",
    "sglang_dsv4_guard/boundary.py": "a remediation plug-in's failure and its stage name",
    "sglang_dsv4_guard/state": "the state wrapper runs the remediation stage",
    "sglang_dsv4_guard/testing.py": "runs the remediation stage for a plug-in's tests",
    "sglang_dsv4_guard/codes.py": "DSV4G090 names the stage a plug-in failed in",
}

# Modules that name SGLang's modules themselves, each with why. Docstrings are prose and
# not counted; imports and string literals are.
SPELLS_SGLANG = {
    "sglang_dsv4_guard/host/targets.py": "the one place SGLang's names are declared",
    # check builds SGLang's own parser, config and pools, each in the module that needs it:
    "sglang_dsv4_guard/check/offline/parse.py": "ServerArgs, its flag table and resolution",
    "sglang_dsv4_guard/check/offline/resolve.py": "ServerArgs' resolution and its resolving view",
    "sglang_dsv4_guard/check/offline/probes.py": "the device probes answered as a GPU model",
    "sglang_dsv4_guard/check/offline/cuda_platform.py": "the platform probes answered as CUDA",
    "sglang_dsv4_guard/check/server/derive.py": "ModelConfig and the attention-TP function",
    "sglang_dsv4_guard/check/server/pools.py": "the DeepSeek-V4 pools and their context",
    "sglang_dsv4_guard/check/server/state_types.py": "the pool classes a server would build",
    "sglang_dsv4_guard/check/server/swa_layout.py": "setup_state_kv_args on those pools",
    "sglang_dsv4_guard/check/fixing/refusal.py": "ServerArgs and the speculative hook",
    "sglang_dsv4_guard/check/rows/contact.py": "ServerArgs, LoadConfig and the PD utils",
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def sglang_spellings(path: Path) -> list[str]:
    """``line: name`` of every import of an ``sglang.srt`` module and every string
    literal (not a docstring) naming one, in the module at ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docs:
            names = [node.value]
        hits += [f"{node.lineno}: {name}" for name in names
                 if name == "sglang.srt" or "sglang.srt." in name]
    return hits


def _sources(*tops: Path) -> list[Path]:
    """Every text file of the package and of ``tools/``."""
    return sorted(p for top in tops for p in top.rglob("*")
                  if p.is_file() and p.suffix in (".py", ".json", ".txt")
                  and "__pycache__" not in p.parts)


def _allowed(path: Path, allow: dict[str, str]) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel == name or rel.startswith(name + "/") for name in allow)


def _hits(word: str, allow: dict[str, str], *tops: Path) -> list[str]:
    """``file:line: text`` of every line naming ``word`` (any case) outside ``allow``."""
    pattern = re.compile(re.escape(word), re.IGNORECASE)
    return [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for path in _sources(*tops) if not _allowed(path, allow)
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if pattern.search(line)]


class TestOneMeaningOfFingerprint(GuardTestCase):
    """"Fingerprint" is a report's identity, never SGLang's code digests."""

    def test_fingerprint_only_where_it_means_a_report(self) -> None:
        """No module of the package or of ``tools/`` says "fingerprint" outside the
        places where it means a report's identity (the code's are "code digests")."""
        self.assertEqual(_hits("fingerprint", FINGERPRINT_MEANS_A_REPORT,
                               PACKAGE, ROOT / "tools"), [])

    def test_the_allow_list_names_real_uses(self) -> None:
        """Every allowed place exists and still says "fingerprint" (a stale entry would
        let the word back in unseen)."""
        for name in FINGERPRINT_MEANS_A_REPORT:
            path = ROOT / name
            files = [path] if path.is_file() else _sources(path)
            self.assertTrue(any("fingerprint" in f.read_text(encoding="utf-8").lower()
                                for f in files), name)


class TestOneMeaningOfRemedy(GuardTestCase):
    """"Remedy" is the auto-share stage that changes SGLang's objects, never a fix."""

    def test_remedy_only_where_it_means_the_remediation_stage(self) -> None:
        self.assertEqual(_hits("remed", REMEDY_MEANS_AUTOSHARE, PACKAGE, ROOT / "tools"), [])

    def test_the_allow_list_names_real_uses(self) -> None:
        for name in REMEDY_MEANS_AUTOSHARE:
            path = ROOT / name
            files = [path] if path.is_file() else _sources(path)
            self.assertTrue(any("remed" in f.read_text(encoding="utf-8").lower()
                                for f in files), name)


def _identifiers(path: Path) -> set[str]:
    """The names a module of the package defines or binds (:func:`_identifiers_of`)."""
    return _identifiers_of(path, PACKAGE)


def _identifiers_of(path: Path, top: Path) -> set[str]:
    """The names a module defines or binds: functions, classes, arguments, variables,
    attributes assigned, and its own file and folder names (below ``top``)."""
    names = {path.stem, *path.relative_to(top).parts[:-1]}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


class TestOneNameForOneServer(GuardTestCase):
    """The contract's one server type is ``Endpoint`` (``pd/endpoint.py``); ``check``'s
    derivation of a launch line is a ``DerivedServer`` built from ``LaunchArgs``. The
    retired names (``Side``, ``SideView``, ``SideArgs``) name no class or function."""

    RETIRED = frozenset({"Side", "SideView", "SideArgs", "parse_side", "derive_side"})

    def test_no_retired_server_name(self) -> None:
        found = sorted(f"{path.relative_to(ROOT)}: {name}" for path in PACKAGE.rglob("*.py")
                       for name in _identifiers(path) if name in self.RETIRED)
        self.assertEqual(found, [])

    def test_one_class_per_server_concept(self) -> None:
        classes = {name: str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                   for name in _identifiers(path) if name in {"Endpoint", "DerivedServer"}}
        self.assertEqual(classes, {"Endpoint": "pd/endpoint.py",
                                   "DerivedServer": "check/server/derive.py"})


class TestOneMeaningOfVerdictAndLaunch(GuardTestCase):
    """A *verdict* is SGLang's own outcome on a configuration (it accepts, or raises); the
    guard's view of the installed release is its *judgement* (``host/judgement.py``); one
    of SGLang's refusals of a pair is a *refusal* (``Refusal`` ...). *Launch* is a
    server's launch (its launch line; dedup's launch identity), never the ``check``
    command's package. Prose may say "SGLang's verdict"; no name the package binds says
    "verdict" or is a module or folder called "launch"."""

    def test_no_name_says_verdict(self) -> None:
        found = sorted(f"{path.relative_to(ROOT)}: {name}" for path in PACKAGE.rglob("*.py")
                       for name in _identifiers(path) if "verdict" in name.lower())
        self.assertEqual(found, [])

    def test_no_module_or_folder_is_called_launch(self) -> None:
        found = sorted(str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*")
                       if path.stem == "launch" and "__pycache__" not in path.parts)
        self.assertEqual(found, [])

    def test_the_scan_sees_a_name(self) -> None:
        with tempfile.TemporaryDirectory(dir=PACKAGE.parent) as tmp:
            path = Path(tmp) / "m.py"
            path.write_text("class HostVerdict:\n    def f(self, verdict):\n        self.v = 1\n")
            names = {n for n in _identifiers_of(path, Path(tmp))}
        self.assertTrue({"HostVerdict", "f", "verdict", "v", "m"} <= names, names)


class TestSGLangNamedInOnePlace(GuardTestCase):
    """SGLang's modules are named in ``host/targets.py``, not module by module."""

    def test_no_module_spells_an_sglang_module_itself(self) -> None:
        """No module of the package outside the allow-list imports an ``sglang.srt``
        module by name or spells one in a string: each reads ``host/targets``."""
        hits = [f"{path.relative_to(ROOT)}:{hit}" for path in sorted(PACKAGE.rglob("*.py"))
                if not _allowed(path, SPELLS_SGLANG) for hit in sglang_spellings(path)]
        self.assertEqual(hits, [])

    def test_the_scan_sees_each_spelling(self) -> None:
        """An import, a from-import and a string literal naming an ``sglang.srt`` module
        are seen; a docstring mentioning one is not."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "m.py")
            path.write_text('"""About sglang.srt.x."""\nimport sglang.srt.a\n'
                            'from sglang.srt.b import c\nNAME = "sglang.srt.d"\n')
            hits = sglang_spellings(path)
        self.assertEqual(sorted(hits), ["2: sglang.srt.a", "3: sglang.srt.b",
                                        "4: sglang.srt.d"])

    def test_the_allow_list_names_real_uses(self) -> None:
        """Every allowed place still spells an SGLang module (a stale entry would let a
        spelling back in unseen)."""
        for name in SPELLS_SGLANG:
            path = ROOT / name
            files = [path] if path.is_file() else sorted(path.rglob("*.py"))
            self.assertTrue(any(sglang_spellings(f) for f in files), name)


if __name__ == "__main__":
    unittest.main()
