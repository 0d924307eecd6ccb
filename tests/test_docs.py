"""The README and docs/ say only what the repository holds and the code does.

Every command (``make`` targets, ``sglang-dsv4-guard`` subcommands and flags, the scripts
in tools/ and their flags) and every repository path the pages name exists; every page
is reachable from the README; the README stays short; the tables that mirror the code
(codes, environment variables, supported releases) agree with it; and what the pages say
about the tests (their base class, the modules to copy into an SGLang checkout) is what
tests/ does.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
import unittest
from pathlib import Path

import sglang
from check_helpers import DSV4
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.offline.parse import parse_launch
from sglang_dsv4_guard.check.server.gpu_models import GPU_MODELS
from sglang_dsv4_guard.cli import main
from sglang_dsv4_guard.codes import CODES
from sglang_dsv4_guard.host.releases import SUPPORTED_MAX, SUPPORTED_MIN
from sglang_dsv4_guard.settings import (
    ENV_AUTOSHARE,
    ENV_LOG_FORMAT,
    ENV_METRICS,
    ENV_MODE,
    settings_from_env,
)

register_cpu_ci(est_time=32, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MATRIX = [line.split()[0] for line in (ROOT / "matrix.txt").read_text().splitlines()
          if line.strip() and not line.startswith("#")]
BASE = next(line.split()[0] for line in (ROOT / "matrix.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#") and line.split()[1] == "-")


def text(page: Path) -> str:
    return page.read_text()


def fences(page: Path) -> list[tuple[str, str]]:
    """Each fenced block of ``page``: its language and its body."""
    return FENCE.findall(text(page))


def spans(page: Path) -> list[str]:
    """Each inline code span of ``page`` (outside fenced blocks), whitespace collapsed."""
    prose = FENCE.sub("", text(page))
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose)]


def commands(page: Path) -> list[str]:
    """The command lines of ``page``: inline spans, ``sh`` blocks, ``$`` lines of ``console``."""
    found = list(spans(page))
    for lang, body in fences(page):
        lines = body.replace("\\\n", " ").splitlines()
        if lang == "sh":
            found += [line.split(" #", 1)[0] for line in lines]
        elif lang == "console":
            found += [line[2:] for line in lines if line.startswith("$ ")]
    return [" ".join(c.split()) for c in found]


def words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote in a span: plain words will do
        return command.split()


def flags(tokens: list[str]) -> list[str]:
    """The ``--flag`` tokens a command passes itself (quoted server arguments left out)."""
    bare = [t.strip("[]") for t in tokens if " " not in t]
    return [t.split("=", 1)[0] for t in bare if t.startswith("--") and len(t) > 2]


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def cli_help(*argv: str) -> str:
    """What ``sglang-dsv4-guard argv... --help`` prints (argparse exits after it)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    return out.getvalue()


def tool_flags(script: Path) -> set[str]:
    """The option strings a tools/ script's argparse declares."""
    found = {"--help"}
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            found |= {a.value for a in node.args if isinstance(a, ast.Constant)
                      and isinstance(a.value, str) and a.value.startswith("--")}
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    body = FENCE.sub("", text(page))
    return {slug(h) for h in re.findall(r"^#+ (.*)$", body, re.M)}


def table(page: Path, first: str) -> list[list[str]]:
    """The rows of ``page``'s tables whose first cell matches the regex ``first``."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text(page).splitlines() if line.startswith("|")]
    return [r for r in rows if re.fullmatch(first, r[0])]


def section(page: Path, heading: str) -> str:
    """The text under ``heading`` up to the next heading of any level."""
    match = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#+ |\Z)", text(page), re.S | re.M)
    assert match, f"{page.name} has no heading {heading!r}"
    return match.group(1)


class TestReadme(GuardTestCase):
    """The README is what an operator reads in five minutes."""

    def test_short(self) -> None:
        """The README stays under 250 lines."""
        self.assertLess(len(text(README).splitlines()), 250)

    def test_quick_start_is_two_commands(self) -> None:
        """The Quick start's commands are exactly ``make demo`` and ``make test``."""
        blocks = [body for lang, body in FENCE.findall(section(README, "Quick start"))]
        self.assertEqual([line for b in blocks for line in b.splitlines()],
                         ["make demo", "make test"])

    def test_opening_names_the_speculative_algorithms_the_release_accepts(self) -> None:
        """The README's opening names the base release and, as `--speculative-algorithm X`,
        exactly the algorithms that release's own resolution (``parse_launch``: ServerArgs and
        its DeepSeek-V4 hook) accepts for DeepSeek-V4: each algorithm SGLang knows (its enum
        and reserved aliases), tried alone, with EAGLE's top-k 1 and with a draft model.
        On another release of the matrix only the release named is checked."""
        opening = text(README).split("\n\n")[1]
        release = re.search(r"SGLang (\d+\.\d+\.\d+)", opening)
        self.assertIsNotNone(release, opening)
        assert release is not None
        self.assertEqual(release.group(1), BASE)
        if sglang.__version__ != BASE:
            return
        # here, not at the top: the names are the base release's (older ones lack them)
        from sglang.srt.speculative.spec_info import _RESERVED_ALIASES, SpeculativeAlgorithm

        named = set(re.findall(r"`--speculative-algorithm (\w+)`", " ".join(opening.split())))
        known = [a.name for a in SpeculativeAlgorithm if a is not SpeculativeAlgorithm.NONE]
        known += sorted(_RESERVED_ALIASES)
        model = f"--model-path {DSV4} --disaggregation-mode decode"
        extras = ("", "--speculative-eagle-topk 1 --speculative-num-steps 3 "
                      "--speculative-num-draft-tokens 4", f"--speculative-draft-model-path {DSV4}")
        accepted = {a for a in known if any(parse_launch(
            "decode", f"{model} --speculative-algorithm {a} {extra}", {}).resolution_error
            is None for extra in extras)}
        self.assertEqual(named, accepted)

    def test_every_page_reachable(self) -> None:
        """Every page under docs/ is reached by links from the README."""
        seen, todo = {README}, [README]
        while todo:
            page = todo.pop()
            for target in LINK.findall(text(page)):
                path = (page.parent / target.split("#")[0]).resolve()
                if path.suffix == ".md" and path not in seen and path.is_file():
                    seen.add(path)
                    todo.append(path)
        self.assertEqual(sorted(p.name for p in set(PAGES) - seen), [])


class TestNamedThingsExist(GuardTestCase):
    """Every link, path and command the pages name is there."""

    def test_links_resolve(self) -> None:
        """Every relative link names an existing file, and its anchor a heading there."""
        broken = []
        for page in PAGES:
            for target in LINK.findall(text(page)):
                if re.match(r"\w+:", target):
                    continue
                name, _, anchor = target.partition("#")
                path = (page.parent / name).resolve() if name else page
                if not path.exists() or (anchor and anchor not in anchors(path)):
                    broken.append(f"{page.name}: {target}")
        self.assertEqual(broken, [])

    def test_repository_paths_exist(self) -> None:
        """Every path a code span or shell block names under a top-level entry exists."""
        top = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")
               and p.name not in ("build", "dist") and not p.name.endswith(".egg-info")}
        top.add(".ci")
        missing, checked = [], 0
        for page in PAGES:
            for command in commands(page):
                for token in re.split(r"[\s,;()'\"=]+", command):
                    path = token.split("::")[0].rstrip(":.")
                    if path.split("/")[0] not in top or "<" in path or "..." in path:
                        continue
                    checked += 1
                    if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                        missing.append(f"{page.name}: {path}")
        self.assertEqual(missing, [])
        self.assertGreater(checked, 0)

    def test_make_targets_exist(self) -> None:
        """Every ``make X`` the pages name is a target of the Makefile, and every target
        is named."""
        named = set()
        for page in PAGES:
            for command in commands(page):
                tokens = words(command)
                if tokens[:1] == ["make"]:
                    named |= {t for t in tokens[1:] if "=" not in t}
        self.assertEqual(named, make_targets())

    def test_cli_commands_exist(self) -> None:
        """Every ``sglang-dsv4-guard ...`` the pages name is a subcommand the CLI parses,
        with flags that subcommand (or the top-level parser) accepts."""
        top = cli_help()
        subcommands = set(re.search(r"\{([\w,]+)\}", top).group(1).split(","))  # type: ignore[union-attr]
        unknown, named = [], set()
        for page in PAGES:
            for command in commands(page):
                tokens = words(command)
                if tokens[:1] != ["sglang-dsv4-guard"] or len(tokens) < 2:
                    continue
                sub = tokens[1] if not tokens[1].startswith("-") else None
                named.add(sub)
                if sub is not None and sub not in subcommands:
                    unknown.append(f"{page.name}: {command}")
                    continue
                accepted = set(re.findall(r"--[\w-]+", cli_help(sub) if sub else top))
                unknown += [f"{page.name}: {command}: {f}" for f in flags(tokens[1:])
                            if f not in accepted]
        self.assertEqual(unknown, [])
        self.assertEqual(subcommands - named, set(), "undocumented")

    def test_tool_flags_exist(self) -> None:
        """Every flag given to a tools/ script (before a bare ``--``) is one it declares."""
        unknown, checked = [], 0
        for page in PAGES:
            for command in commands(page):
                tokens = words(command)
                for i, token in enumerate(tokens):
                    if not re.fullmatch(r"tools/\w+\.py", token):
                        continue
                    mine = tokens[i + 1:]
                    mine = mine[:mine.index("--")] if "--" in mine else mine
                    declared = tool_flags(ROOT / token)
                    checked += len(flags(mine))
                    unknown += [f"{page.name}: {token} {f}" for f in flags(mine)
                                if f not in declared]
        self.assertEqual(unknown, [])
        self.assertGreater(checked, 0)


class TestTablesMirrorTheCode(GuardTestCase):
    """The tables of codes, settings and releases agree with the modules they mirror."""

    def test_code_table_is_the_catalogue(self) -> None:
        """docs/codes.md has one row per catalogued code, in order, with its title, its
        severity (``(or lower)`` where the catalogue says when it is milder) and SGLang's
        line word for word."""
        page = ROOT / "docs" / "codes.md"
        rows = table(page, r"`DSV4G\d+`")
        shown = {r[0].strip("`"): (r[1], r[2], r[3].strip("`")) for r in rows}
        catalogue = {c: (i.title, i.severity.value + (" (or lower)" if i.milder else ""),
                         i.sglang_message or "—") for c, i in CODES.items()}
        differences = [f"{code}: docs {shown.get(code)} / codes.py {catalogue.get(code)}"
                       for code in sorted(shown.keys() | catalogue.keys())
                       if shown.get(code) != catalogue.get(code)]
        self.assertEqual(differences, [])
        self.assertEqual([r[0].strip("`") for r in rows], list(CODES), "one row each, in order")

    def test_machine_table_is_the_facts(self) -> None:
        """docs/check.md's "What this machine cannot tell" has one row per fact of
        ``MACHINE_FACTS``, in order, with what SGLang reads, the flags, the releases,
        the refusal and ``check``'s answer as the table in the code says them."""
        from sglang_dsv4_guard.check.offline.machine import MACHINE_FACTS

        page = ROOT / "docs" / "check.md"
        self.assertIn("| fact |", section(page, "What this machine cannot tell"))
        rows = table(page, r"`[a-z_]+`")
        shown = [r for r in rows if r[0].strip("`") in {f.key for f in MACHINE_FACTS}]
        expected = [[f"`{f.key}`", f"{f.reads} ({f.probe}; {f.where})",
                     ", ".join(f"`{flag}`" for flag in f.flags), f.releases, f.refusal,
                     f"{f.answer.value}: {f.answered}"] for f in MACHINE_FACTS]
        self.assertEqual(shown, expected)

    def test_environment_table_is_the_settings(self) -> None:
        """The README's environment variables are the settings' variables, each with
        exactly the values it accepts and its default."""
        from sglang_dsv4_guard.check.child import DEFAULT_TIMEOUT, MAX_TIMEOUT, TIMEOUT_VARIABLE

        rows = {r[0].strip("`"): r for r in table(README, r"`SGLANG_DSV4_GUARD\w*`")}
        self.assertEqual(set(rows), {ENV_MODE, ENV_AUTOSHARE, ENV_LOG_FORMAT, ENV_METRICS,
                                     TIMEOUT_VARIABLE})
        timeout = rows.pop(TIMEOUT_VARIABLE)  # check's, read by check.child.check_timeout
        self.assertIn(f"at most {MAX_TIMEOUT:,.0f}", timeout[1])
        self.assertEqual(timeout[2], f"`{DEFAULT_TIMEOUT:g}`")
        defaults, _ = settings_from_env({})
        default_of = {ENV_MODE: defaults.mode.value.value,
                      ENV_AUTOSHARE: "on" if defaults.autoshare.value else "off",
                      ENV_LOG_FORMAT: defaults.log_format.value,
                      ENV_METRICS: defaults.metrics.value}
        for variable, row in rows.items():
            with self.subTest(variable=variable):
                _, problems = settings_from_env({variable: "not-a-value"})
                accepted = set(problems[0].accepted)
                shown = set(re.findall(r"`([^`]+)`", row[1]))
                shown |= {"unset"} if "unset" in row[1] else set()
                self.assertEqual(shown, accepted)
                self.assertEqual(row[2], f"`{default_of[variable]}`")

    def test_gpu_table_is_the_gpu_models(self) -> None:
        """docs/check.md "Naming the GPU" has one row per model ``check --gpu`` reads, in
        order: its name, platform, architecture, compute capability and other names."""
        rows = table(ROOT / "docs" / "check.md", r"`[^`]+`")
        gpus = [r for r in rows if r[1] in ("cuda", "rocm")]
        self.assertIn("| `H100` |", section(ROOT / "docs" / "check.md", "Naming the GPU"))
        expected = [[f"`{m.name}`", m.platform, m.arch,
                     "—" if m.capability is None else f"{m.capability[0]}.{m.capability[1]}",
                     ", ".join(f"`{a}`" for a in m.aliases + m.labels)] for m in GPU_MODELS]
        self.assertEqual(gpus, expected)

    def test_supported_range_is_declared_and_tested(self) -> None:
        """The README and docs/releases.md state SUPPORTED_MIN to SUPPORTED_MAX, which
        are the first and last releases of matrix.txt."""
        self.assertEqual((str(SUPPORTED_MIN), str(SUPPORTED_MAX)), (MATRIX[0], MATRIX[-1]))
        line = f"Supported SGLang releases: **{SUPPORTED_MIN} to {SUPPORTED_MAX}**"
        for page in (README, ROOT / "docs" / "releases.md"):
            self.assertIn(line, text(page), page.name)

    def test_release_table_covers_the_matrix(self) -> None:
        """The columns of the releases table name every release of matrix.txt once."""
        header = next(r for r in table(ROOT / "docs" / "releases.md", "")
                      if "0.5" in "".join(r))
        named = []
        for cell in header[1:]:
            for part in cell.split(","):
                first, _, last = part.strip().partition(" to ")
                named += MATRIX[MATRIX.index(first):MATRIX.index(last or first) + 1]
        self.assertEqual(named, MATRIX)

    def test_matrix_block_is_matrix_txt(self) -> None:
        """The test matrix shown in docs/releases.md is matrix.txt's lines."""
        block = FENCE.findall(section(ROOT / "docs" / "releases.md", "The test matrix"))
        lines = [line for line in (ROOT / "matrix.txt").read_text().splitlines()
                 if line.strip() and not line.startswith("#")]
        self.assertEqual(block[0][1].splitlines(), lines)


def _tests_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((ROOT / "tests").glob("*.py"))}


def _named(paragraph: str) -> set[str]:
    return set(re.findall(r"`tests/([\w/]+\.py)`", paragraph))


class TestWhatThePagesSayOfTheTests(GuardTestCase):
    """docs/contributing.md describes tests/ as it is."""

    page = ROOT / "docs" / "contributing.md"

    def test_base_class_exceptions(self) -> None:
        """The files named as not subclassing GuardTestCase are exactly those with a test
        class on another base."""
        other = set()
        for path in [*(ROOT / "tests").glob("test_*.py"), *(ROOT / "tests").glob("*/test_*.py")]:
            for node in ast.parse(path.read_text()).body:
                bases = [ast.unparse(b) for b in getattr(node, "bases", [])]
                if any(b.endswith("TestCase") for b in bases) and bases != ["GuardTestCase"]:
                    other.add(str(path.relative_to(ROOT / "tests")))
        said = text(self.page).split("subclass `CustomTestCase` directly:", 1)[1]
        self.assertEqual(_named(said.split(". ", 1)[0]), other)

    def test_copy_steps_name_the_imported_helpers(self) -> None:
        """The copy steps list every helper module the tests import, and no other."""
        sources = _tests_sources()
        helpers = {n[:-3] for n in sources if not n.startswith("test_") and n != "conftest.py"}
        imported, todo = set(), [n for n in sources if n.startswith("test_")]
        while todo:
            for node in ast.walk(ast.parse(sources[todo.pop()])):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                for name in set(names) & helpers - imported:
                    imported.add(name)
                    todo.append(f"{name}.py")
        bullet = next(p for p in section(self.page, "The tests in SGLang's CI").split("\n   -")
                      if "helper modules they import" in p)
        self.assertEqual(_named(bullet), {f"{n}.py" for n in imported})

    def test_copy_steps_leave_out_the_repository_tests(self) -> None:
        """The test files the copy steps leave out are those that read the repository
        outside tests/ (they find it as their file's ``parent.parent``)."""
        readers = {n for n, s in _tests_sources().items()
                   if n.startswith("test_") and ".parent.parent" in s}
        bullet = next(p for p in section(self.page, "The tests in SGLang's CI").split("\n   -")
                      if "the test files" in p)
        self.assertEqual(_named(bullet), readers)


if __name__ == "__main__":
    unittest.main()
