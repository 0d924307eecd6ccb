"""The releases of ``matrix.txt`` and the environments that make each the imported SGLang.

One environment serves every release: the venv holds the base release (installed by
``make setup``); each other release is its wheel unzipped into ``.matrix/<release>/site``
plus an overlay of the libraries it pins (``.matrix/overlays/<hash>``, shared by releases
with the same pins), both put first on ``PYTHONPATH`` by :func:`release_env`. Also what
one run of a release produced (:class:`Result`) and how many examples each property test
drew. ``tools/matrix.py`` (the whole suite) and ``tools/patched_tree.py`` (the patch
series) both build on this module; neither imports the other's importer, so running
either as a script loads every module once, with one set of locks.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MATRIX_FILE", "PROFILE_EXAMPLES", "ROOT", "WORK", "Release", "Result",
           "base_version", "examples_drawn", "examples_exhausted", "is_base", "prepare",
           "read_matrix", "release_env", "say", "sglang_package"]

ROOT = Path(__file__).resolve().parent.parent
MATRIX_FILE = ROOT / "matrix.txt"
WORK = ROOT / ".matrix"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
# The hypothesis profiles of tests/conftest.py and the examples each asks for.
PROFILE_EXAMPLES = {"dev": 200, "ci": 2000}
_print_lock = threading.Lock()


@dataclass(frozen=True)
class Release:
    """One line of matrix.txt."""

    version: str
    overlay: tuple[str, ...]
    line: str

    @property
    def home(self) -> Path:
        return WORK / self.version


@dataclass
class Result:
    """What one release's pytest run produced."""

    release: Release
    tests: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    examples: dict[str, int] = field(default_factory=dict)
    codes_missing: list[str] | None = None  # None: not checked (a partial run)
    problems: list[str] = field(default_factory=list)
    label: str = ""  # the row's name when it is not the release alone
    covered: dict[str, str] = field(default_factory=dict)  # left-out test -> where it ran
    profile: str = ""  # the hypothesis profile the run drew its examples with
    codes_files: list[Path] = field(default_factory=list)  # the codes its runs recorded

    @property
    def ok(self) -> bool:
        return not self.problems

    def merge(self, other: Result) -> None:
        """Add ``other`` (another run of the same release) to this one."""
        self.tests += other.tests
        self.failed += other.failed
        self.skipped += other.skipped
        self.seconds += other.seconds  # what the release's runs took, each in its job
        self.examples.update(other.examples)
        self.problems += other.problems
        self.codes_files += other.codes_files


def read_matrix(path: Path = MATRIX_FILE) -> list[Release]:
    """The releases of ``path``; a malformed line stops the run and names the line."""
    releases = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        version, *overlay = line.split()
        if not re.fullmatch(r"\d+(\.\d+)+(\.post\d+)?", version):
            sys.exit(f"{path.name}:{number}: {version!r} is not a release number like 0.5.23")
        if overlay == ["-"]:
            overlay = []
        elif "-" in overlay:
            sys.exit(f"{path.name}:{number}: '-' (no overlay) cannot be mixed with requirements")
        releases.append(Release(version, tuple(overlay), line))
    if not releases:
        sys.exit(f"{path.name}: no releases listed")
    return releases


def base_version() -> str | None:
    """The SGLang release installed in this interpreter's own environment."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def is_base(release: Release) -> bool:
    return not release.overlay and release.version == base_version()


_download_lock = threading.Lock()
_overlay_locks: dict[str, threading.Lock] = {}


def say(release: Release, line: str) -> None:
    """Print ``line`` prefixed with the release, whole, whatever the other jobs print."""
    with _print_lock:
        sys.stdout.write(f"[{release.version}] {line.rstrip()}\n")
        sys.stdout.flush()


def prepare(release: Release) -> list[str]:
    """The ``PYTHONPATH`` entries that make ``release`` the imported SGLang (built once):
    its overlay of pins, then its unzipped wheel."""
    if is_base(release):
        return []
    if not release.overlay and release.version != base_version():
        sys.exit(f"matrix.txt: {release.version} has no overlay ('-') but the venv holds "
                 f"sglang {base_version()}; give it an overlay line or make it the base release")
    return [str(_overlay(release)), str(_site(release))]


def _site(release: Release) -> Path:
    """``.matrix/<release>/site``: the release's wheel, unzipped."""
    stamp = release.home / ".ready"
    digest = hashlib.sha256(release.line.encode()).hexdigest()
    site = release.home / "site"
    if not (stamp.exists() and stamp.read_text() == digest):
        say(release, f"preparing SGLang {release.version} in {release.home}")
        if release.home.is_symlink():  # never write through a link into another checkout
            release.home.unlink()
        shutil.rmtree(release.home, ignore_errors=True)
        wheels = WORK / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        with _download_lock:
            if not sorted(wheels.glob(f"sglang-{release.version}-*.whl")):
                subprocess.run([*PIP, "download", "--no-deps", "--only-binary=:all:",
                                f"sglang=={release.version}", "-d", str(wheels)], check=True)
        [wheel] = sorted(wheels.glob(f"sglang-{release.version}-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
        stamp.write_text(digest)
    return site


def _overlay(release: Release) -> Path:
    """``.matrix/overlays/<hash of the pins>``: shared by every release with the same pins
    (0.5.16 to 0.5.20 share one), installed once."""
    pins = " ".join(release.overlay)
    home = WORK / "overlays" / hashlib.sha256(pins.encode()).hexdigest()[:12]
    with _overlay_locks.setdefault(home.name, threading.Lock()):
        if not (home / ".ready").exists():
            say(release, f"installing {pins} into {home}")
            shutil.rmtree(home, ignore_errors=True)
            subprocess.run([*PIP, "install", "--no-deps", "--target", str(home),
                            *release.overlay], check=True)
            (home / ".ready").write_text(pins + "\n")
    return home


def sglang_package(release: Release) -> Path:
    """The directory of ``release``'s ``sglang`` package (prepared, never imported)."""
    if is_base(release):
        from sglang_dsv4_guard.host.judgement import imported_package_dir

        package = imported_package_dir()
        if package is None:
            sys.exit("matrix: sglang is not installed in this interpreter")
        return package
    prepare(release)
    return _site(release) / "sglang"


def release_env(release: Release, **extra: str) -> dict[str, str]:
    """This process's environment, with ``release`` first on ``PYTHONPATH``."""
    paths = prepare(release)
    env = dict(os.environ, DSV4_GUARD_MATRIX_RELEASE=release.version, **extra)
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _statistics(log: str) -> Iterator[tuple[str, str | None]]:
    """``--hypothesis-show-statistics`` output as (test, line): ``(test, None)`` at each
    test's heading, then its lines. Tests are ``module::Class::test`` (same-named tests in
    two classes stay apart)."""
    test = None
    for line in log.splitlines():
        if line.startswith("tests/") and line.rstrip().endswith(":"):
            parts = line.strip()[:-1].split("::")  # tests/test_mori.py::Class::test_x
            test = "::".join([Path(parts[0]).stem, *parts[1:]])
            yield test, None
        elif test is not None:
            yield test, line


def examples_drawn(log: str) -> dict[str, int]:
    """Passing examples per property test, from ``--hypothesis-show-statistics`` output."""
    counts: dict[str, int] = {}
    for test, line in _statistics(log):
        counts.setdefault(test, 0)
        if line is not None and (m := re.search(r"- (\d+) passing", line)):
            counts[test] += int(m.group(1))
    return counts


def examples_exhausted(log: str) -> set[str]:
    """The property tests whose statistics say hypothesis drew every example there is
    ("Stopped because nothing left to do"): fewer than the profile asks is their whole
    space, not a short run."""
    return {test for test, line in _statistics(log)
            if line is not None and "Stopped because nothing left to do" in line}
