"""Test the SGLang patch series (``patches/``) on a patched copy of each release.

For a release of ``matrix.txt``: copy its tree (the unpacked wheel of
``.matrix/<release>/site``, or for the venv's own release the installed package) into
``.matrix/patched/<release>/``, apply its series with ``patch -p2``, and run
``tests/patched_tree/`` with that copy first on ``PYTHONPATH``. The tests find the
patched copy in ``DSV4_GUARD_PATCHED_TREE`` and the released tree in
``DSV4_GUARD_RELEASED_TREE`` (they load the released ``utils.py`` and ``mori/conn.py``
from it to compare). The copy is rebuilt when the series or the release changes.

``tools/matrix.py`` calls :func:`run_series` for every release (``make matrix`` after
the release's suite; ``make test`` as a job of its own), so both cover the patches. Alone, for a quick loop:
``python tools/patched_tree.py --release 0.5.23 [-- PYTEST ARGS]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import release_env

ROOT = release_env.ROOT
TESTS = "tests/patched_tree"
PATCHED = release_env.WORK / "patched"

sys.path.insert(0, str(ROOT))
from sglang_dsv4_guard.host.patchset import (  # noqa: E402
    Series,
    series_for,
    sglang_site,
    touched_files,
)


def released_site(release: release_env.Release) -> Path:
    """The directory holding ``release``'s unpatched ``sglang`` package."""
    if release_env.is_base(release):
        site = sglang_site()
        if site is None:
            sys.exit("patched_tree: sglang is not installed in this interpreter")
        return site
    release_env.prepare(release)
    return release.home / "site"


def _digest(series: Series, site: Path) -> str:
    """What the patched copy was built from: the site, the patches, the released files.

    Every released file counts by path, size and mtime (a reinstall of the same version
    at the same place rewrites them), the files the series touches by their content.
    """
    digest = hashlib.sha256(str(site).encode())
    for patch in series.patches:
        digest.update(patch.read_bytes())
    for rel in sorted({f for p in series.patches for f in touched_files(p)}):
        digest.update(rel.encode() + b"\0" + (site / rel).read_bytes())
    for root, dirs, files in os.walk(site / "sglang"):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            info = (Path(root) / name).stat()
            digest.update(f"{Path(root, name).relative_to(site)}\0{info.st_size}\0"
                          f"{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def prepare_patched(release: release_env.Release) -> tuple[Path, Path]:
    """The patched copy of ``release`` (built once per series) and the released tree."""
    site = released_site(release)
    series = series_for(release.version, ROOT / "patches")
    if series is None:
        sys.exit(f"patched_tree: patches/ has no series for SGLang {release.version}")
    home = PATCHED / release.version
    stamp, digest = home / ".ready", _digest(series, site)
    if stamp.exists() and stamp.read_text() == digest:
        return home, site
    print(f"patched_tree: copying SGLang {release.version} from {site} and applying "
          f"{series.name}", flush=True)
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    shutil.copytree(site / "sglang", home / "sglang",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for info in site.glob(f"sglang-{release.version}.dist-info"):
        shutil.copytree(info, home / info.name)
    for patch in series.patches:
        done = subprocess.run(["patch", "-p2", "--batch", "--forward", "-d", str(home),
                               "-i", str(patch)], capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"patched_tree: {patch.name} does not apply to SGLang {release.version}:\n"
                     f"{done.stdout}{done.stderr}")
    stamp.write_text(digest)
    return home, site


def patched_env(release: release_env.Release, **extra: str) -> dict[str, str]:
    """``release``'s matrix environment with its patched copy first on ``PYTHONPATH``."""
    patched, site = prepare_patched(release)
    env = release_env.release_env(release, DSV4_GUARD_PATCHED_TREE=str(patched),
                             DSV4_GUARD_RELEASED_TREE=str(site), **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(patched), env["PYTHONPATH"]])
    return env


def run_series(result: release_env.Result, profile: str, pytest_args: list[str] | None = None) -> None:
    """Run ``tests/patched_tree`` on ``result``'s release, patched; fold the outcome in."""
    release = result.release
    out = release_env.WORK / "reports"
    out.mkdir(parents=True, exist_ok=True)
    junit = out / f"{release.version}-patched.xml"
    junit.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", f"--junitxml={junit}",
               "--hypothesis-show-statistics", *(pytest_args or [TESTS])]
    print(f"\n===== SGLang {release.version}, patched: {' '.join(command[2:])}", flush=True)
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=patched_env(release, HYPOTHESIS_PROFILE=profile),
                          capture_output=True, text=True, check=False)
    result.seconds += time.monotonic() - start
    log = done.stdout + done.stderr
    sys.stdout.write(log)
    (out / f"{release.version}-patched.log").write_text(log)
    if done.returncode:
        result.problems.append(f"patched tree: pytest exited with {done.returncode}")
    if not junit.exists():
        result.problems.append("patched tree: no JUnit report written")
        return
    cases = list(ET.parse(junit).iter("testcase"))
    skipped = sum(any(c.tag == "skipped" for c in case) for case in cases)
    result.tests += len(cases)
    result.failed += sum(any(c.tag in ("failure", "error") for c in case) for case in cases)
    result.skipped += skipped
    if not cases:
        result.problems.append("patched tree: no tests ran")
    if skipped:
        result.problems.append(f"patched tree: {skipped} test(s) skipped")
    wanted = release_env.PROFILE_EXAMPLES.get(profile)
    whole_space = release_env.examples_exhausted(log)
    for test, count in release_env.examples_drawn(log).items():
        result.examples[f"patched {test}"] = count
        if wanted is not None and count < wanted and test not in whole_space:
            result.problems.append(f"patched {test} drew {count} examples, profile {profile} "
                                   f"asks {wanted}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True, help="a release of matrix.txt")
    parser.add_argument("--prepare-only", action="store_true",
                        help="build the patched copy and print its directory")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    releases = {r.version: r for r in release_env.read_matrix()}
    if args.release not in releases:
        parser.error(f"--release: {args.release} not in matrix.txt "
                     f"(listed: {', '.join(releases)})")
    release = releases[args.release]
    if args.prepare_only:
        print(prepare_patched(release)[0])
        return 0
    result = release_env.Result(release)
    run_series(result, os.environ.get("HYPOTHESIS_PROFILE", "dev"), args.pytest_args or None)
    print(f"\npatched SGLang {release.version}: {result.tests} tests, {result.failed} failed, "
          f"{result.skipped} skipped; " + ("; ".join(result.problems) or "ok"))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
