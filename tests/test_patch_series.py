"""The SGLang patch series in patches/: well-formed, complete, current, shipped, and judged
read-only by ``sglang-dsv4-guard patches``.

What the patches *do* is tested on a patched copy of each release, by
``tests/patched_tree/`` (``make test`` runs it through ``tools/patched_tree.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import unittest.mock
from pathlib import Path

import tomllib
from helpers import GuardTestCase, fresh_python, sglang_release
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import cli
from sglang_dsv4_guard.host import patchset
from sglang_dsv4_guard.host.releases import SUPPORTED_MAX, SUPPORTED_MIN

register_cpu_ci(est_time=46, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import make_patches  # noqa: E402 - tools/ is not a package
import patched_tree  # noqa: E402

SERIES = patchset.all_series(ROOT / "patches")
INSTALLED = patchset.series_for(str(sglang_release()), ROOT / "patches")


def _digests(site: Path, files: list[str]) -> dict[str, str]:
    return {f: hashlib.sha256((site / f).read_bytes()).hexdigest() for f in files}


class TestSeriesFiles(GuardTestCase):
    """Every series is a git format-patch series in SGLang's upstream layout."""

    def test_every_supported_release_has_exactly_one_series(self) -> None:
        """0.5.16 to 0.5.23: each release is named by one series' releases line."""
        listed = [v for s in SERIES for v in s.releases]
        supported = [f"0.5.{n}" for n in range(SUPPORTED_MIN.micro, SUPPORTED_MAX.micro + 1)]
        self.assertEqual(sorted(listed, key=Version), supported)

    def test_patches_are_format_patch_files_with_upstream_paths(self) -> None:
        """From/Subject/a commit message; every path is a/python/sglang/... or b/python/..."""
        for series in SERIES:
            self.assertEqual(len(series.patches), 3, series.name)
            for number, patch in enumerate(series.patches, 1):
                text = patch.read_text()
                self.assertRegex(text, r"^From 0{40} ")
                self.assertIn(f"Subject: [PATCH {number}/3] ", text)
                self.assertIn("\nWhat stays the same", text)
                paths = re.findall(r"^(?:---|\+\+\+) (\S+)", text, re.MULTILINE)
                self.assertTrue(paths)
                for path in paths:
                    self.assertRegex(path, r"^[ab]/python/sglang/srt/disaggregation/")

    def test_series_are_what_the_generator_writes(self) -> None:
        """Regenerating the installed release's series from its released tree gives the
        committed files byte for byte (when that release is the one it was generated from)."""
        assert INSTALLED is not None
        header = (INSTALLED.directory / "series").read_text()
        source = re.search(r"from the sglang (\S+) wheel .*\(--context (\d+)\)", header)
        assert source is not None, header
        if source.group(1) != str(sglang_release()):
            self.assertIn(str(sglang_release()), INSTALLED.releases)  # covered, not the source
            return
        site = patchset.sglang_site()
        assert site is not None
        with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
            fresh = make_patches.generate(site, source.group(1), list(INSTALLED.releases),
                                          Path(out), int(source.group(2)))
            made = {p.name: p.read_bytes() for p in fresh.iterdir()}
        committed = {p.name: p.read_bytes() for p in INSTALLED.directory.iterdir()}
        self.assertEqual(made, committed)


class TestCheckSeries(GuardTestCase):
    """``check_series``: carried, applies, conflicts, always read-only."""

    def setUp(self) -> None:
        super().setUp()
        assert INSTALLED is not None, f"no series for SGLang {sglang_release()}"
        site = patchset.sglang_site()
        assert site is not None
        self.site = site
        self.files = sorted({f for p in INSTALLED.patches for f in patchset.touched_files(p)})

    def _copy(self, tmp: str) -> Path:
        copy = Path(tmp)
        for rel in self.files:
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.site / rel, copy / rel)
        return copy

    def test_installed_release_takes_every_patch_and_is_not_written(self) -> None:
        """On the released tree every patch would apply; the tree is byte for byte unchanged."""
        before = _digests(self.site, self.files)
        statuses = patchset.check_series(INSTALLED, self.site)
        self.assertEqual([s.state for s in statuses], ["applies"] * 3)
        self.assertEqual(_digests(self.site, self.files), before)

    def test_patched_tree_carries_every_patch(self) -> None:
        """After ``patch -p2`` of the series, each patch is reported as already carried."""
        with tempfile.TemporaryDirectory() as tmp:
            copy = self._copy(tmp)
            for patch in INSTALLED.patches:
                subprocess.run(["patch", "-p2", "--batch", "-s", "-d", str(copy), "-i",
                                str(patch)], check=True)
            self.assertEqual([s.state for s in patchset.check_series(INSTALLED, copy)],
                             ["carried"] * 3)

    def test_changed_code_conflicts_with_the_reason(self) -> None:
        """A tree whose DSV4 block was edited: the state patches conflict, naming the hunk;
        the MORI patch still applies."""
        with tempfile.TemporaryDirectory() as tmp:
            copy = self._copy(tmp)
            utils = copy / make_patches.UTILS
            utils.write_text(utils.read_text().replace(
                "DSV4 draft state transfer expects SWA-only NextN layers", "edited locally"))
            statuses = patchset.check_series(INSTALLED, copy)
        self.assertEqual([s.state for s in statuses], ["conflicts", "applies", "conflicts"])
        self.assertIn("FAILED", statuses[0].reason)
        self.assertEqual(statuses[2].reason, f"needs {statuses[0].patch}")

    def test_apply_lines_list_only_what_is_not_carried(self) -> None:
        """A tree carrying patch 1 only: the apply lines name patches 2 and 3, with
        ``--forward``, and ``git am --keep-non-patch`` for a checkout."""
        assert INSTALLED is not None
        with tempfile.TemporaryDirectory() as tmp:
            copy = self._copy(tmp)
            subprocess.run(["patch", "-p2", "--batch", "-s", "-d", str(copy), "-i",
                            str(INSTALLED.patches[0])], check=True)
            statuses = patchset.check_series(INSTALLED, copy)
            lines = patchset.apply_lines(INSTALLED, copy, statuses)
        self.assertEqual([s.state for s in statuses], ["carried", "applies", "applies"])
        rest = INSTALLED.patches[1:]
        self.assertEqual(lines[1:3], [f"  patch -p2 --forward -d {copy} -i {p}" for p in rest])
        self.assertEqual(lines[3], "in an SGLang checkout: git am --keep-non-patch "
                         + " ".join(map(str, rest)))
        self.assertNotIn(INSTALLED.patches[0].name, "\n".join(lines))


class TestNeedsGnuPatch(GuardTestCase):
    """A ``patch`` that is not GNU patch leaves the series "not checked", not "would not
    apply"."""

    def test_bsd_patch_is_not_used(self) -> None:
        """With a ``patch`` first on PATH that answers ``--version`` as BSD patch does and
        rejects GNU options, every patch is "unknown", the reason saying GNU patch is needed."""
        assert INSTALLED is not None
        site = patchset.sglang_site()
        assert site is not None
        with tempfile.TemporaryDirectory() as tmp:
            fake = Path(tmp) / "patch"
            fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'patch 2.0-12u11-FreeBSD'"
                            " && exit 0\necho \"patch: unknown option -- $1\" >&2; exit 2\n")
            fake.chmod(0o755)
            path = os.pathsep.join([tmp, os.environ.get("PATH", "")])
            with unittest.mock.patch.dict(os.environ, {"PATH": path}):
                statuses = patchset.check_series(INSTALLED, site)
        self.assertEqual([s.state for s in statuses], ["unknown"] * len(INSTALLED.patches))
        for status in statuses:
            self.assertIn("needs GNU patch", status.reason)
            self.assertIn("FreeBSD", status.reason)


class TestPatchedCopyIsRebuilt(GuardTestCase):
    """``tools/patched_tree.py`` rebuilds its patched copy when the released files change."""

    def test_digest_follows_the_released_files(self) -> None:
        """Same site path, same series: a touched file rewritten at the same size and
        mtime, or another file of the tree rewritten, changes the digest."""
        assert INSTALLED is not None
        site = patchset.sglang_site()
        assert site is not None
        files = sorted({f for p in INSTALLED.patches for f in patchset.touched_files(p)})
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp)
            for rel in [*files, "sglang/version.py"]:
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(site / rel, copy / rel)
            first = patched_tree._digest(INSTALLED, copy)
            self.assertEqual(patched_tree._digest(INSTALLED, copy), first)
            touched = copy / files[0]
            stat = touched.stat()
            text = touched.read_bytes()
            touched.write_bytes(text[:-1] + (b" " if text.endswith(b"\n") else b"\n"))
            os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            second = patched_tree._digest(INSTALLED, copy)
            self.assertNotEqual(second, first)
            other = copy / "sglang/version.py"
            other.write_bytes(other.read_bytes() + b"\n")
            self.assertNotEqual(patched_tree._digest(INSTALLED, copy), second)


class TestPatchesCommand(GuardTestCase):
    """``sglang-dsv4-guard patches`` and the ``doctor`` line."""

    def test_lists_the_series_and_each_state(self) -> None:
        """The command names the release's series, each patch, its state and how to apply."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["patches"])
        text = out.getvalue()
        self.assertEqual(code, 0, text)
        assert INSTALLED is not None
        self.assertIn(f"series {INSTALLED.name}", text)
        for patch in INSTALLED.patches:
            self.assertIn(f"{patch.name}: would apply", text)
        self.assertIn("patch -p2 --forward -d", text)
        self.assertIn("git am --keep-non-patch", text)



class TestDoctorPatchesLine(GuardTestCase):
    """``doctor``'s line about the series, as operators run it."""

    def test_doctor_has_one_patches_line(self) -> None:
        """``doctor`` (in a fresh interpreter, as operators run it) prints exactly one line
        about the series."""
        done = fresh_python("from sglang_dsv4_guard.cli import main; raise SystemExit(main(['doctor']))")
        lines = [line for line in done.stdout.splitlines() if line.startswith("patches:")]
        assert INSTALLED is not None
        self.assertEqual(lines, [f"patches: series {INSTALLED.name}, 3 patches: 3 would apply "
                                 "(sglang-dsv4-guard patches)"])


class TestJudgesTheImportedTree(GuardTestCase):
    """The release judged is the imported tree's own, not the first metadata on sys.path."""

    def test_tree_without_metadata_over_another_release(self) -> None:
        """An SGLang tree of another release, first on PYTHONPATH and without dist-info, over
        the venv's SGLang: ``patches`` names the tree's release and series, and says that the
        metadata disagrees."""
        other = next(s for s in SERIES if str(sglang_release()) not in s.releases)
        release = other.releases[-1]
        site = patchset.sglang_site()
        assert site is not None
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "sglang"
            tree.mkdir()
            (tree / "__init__.py").write_text("")
            (tree / "_version.py").write_text(f"__version__ = version = '{release}'\n")
            done = fresh_python("from sglang_dsv4_guard.cli import main; "
                                "raise SystemExit(main(['patches']))", path_first=tmp)
        lines = done.stdout.splitlines()
        self.assertEqual(lines[0], f"SGLang {release} at {tree}", done.stdout + done.stderr)
        self.assertEqual(lines[1], f"note: the SGLang tree imported from {Path(tmp)} is "
                         f"{release}, but the first SGLang metadata on sys.path says "
                         f"{sglang_release()}; judging the tree ({release})")
        self.assertTrue(lines[2].startswith(f"series {other.name} "), lines[2])

    def test_tree_version_reads_the_tree(self) -> None:
        """``tree_version`` of the installed site is the installed release."""
        site = patchset.sglang_site()
        assert site is not None
        self.assertEqual(patchset.tree_version(site), str(sglang_release()))


class TestShippedInTheWheel(GuardTestCase):
    """The series ship inside the package, found without the source checkout."""

    def test_package_list_names_every_subpackage(self) -> None:
        """pyproject's explicit package list (needed to map patches/ in) misses none."""
        config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
        found = {".".join(p.parent.relative_to(ROOT).parts)
                 for p in (ROOT / "sglang_dsv4_guard").rglob("__init__.py")}
        self.assertEqual(set(config["packages"]) - {"sglang_dsv4_guard.patches"}, found)
        self.assertEqual(config["package-dir"], {"sglang_dsv4_guard.patches": "patches"})

    def test_non_editable_install_finds_the_series(self) -> None:
        """``pip install . --no-deps --target`` from a copy of the sources: the installed
        package lists every series, read from inside the installed package."""
        with tempfile.TemporaryDirectory() as tmp:
            src, target = Path(tmp) / "src", Path(tmp) / "target"
            src.mkdir()
            for name in ("pyproject.toml", "README.md"):
                shutil.copy(ROOT / name, src / name)
            for name in ("sglang_dsv4_guard", "patches"):
                shutil.copytree(ROOT / name, src / name,
                                ignore=shutil.ignore_patterns("__pycache__"))
            subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                            "--disable-pip-version-check", "--no-deps", "--no-build-isolation",
                            "--target", str(target), str(src)], check=True,
                           capture_output=True, cwd=tmp)
            done = fresh_python(
                "import sglang_dsv4_guard.host.patchset as p; print(p.__file__); "
                "print(p.patches_root()); print(' '.join(s.name for s in p.all_series()))",
                path_first=str(target), env={"PYTHONSAFEPATH": "1"})
        self.assertEqual(done.returncode, 0, done.stderr)
        module, root, names = done.stdout.splitlines()
        self.assertTrue(module.startswith(str(target)), module)
        self.assertEqual(root, str(target / "sglang_dsv4_guard" / "patches"))
        self.assertEqual(names.split(), [s.name for s in SERIES])


if __name__ == "__main__":
    unittest.main()
