"""Compute the guard's code digests of an SGLang release and store them as data.

Usage: ``python tools/digests.py PATH [--release 0.5.24] [--write] [--patched]``

PATH is a wheel (``sglang-0.5.24-*.whl``), a site directory holding ``sglang/``, or the
``sglang`` package directory itself. The release defaults to the one the code names in
``sglang/_version.py``. Without ``--write`` the code digests are printed as JSON; with
it they are added to ``sglang_dsv4_guard/host/digests.json``, only when they equal a
known release's, or with ``--new-profile`` (a release whose checks changed). Adding a release to the
guard is that, plus a line in ``matrix.txt`` (and a profile in ``host/releases.py`` only
when its checks changed). With ``--patched`` the release's series from ``patches/`` is
applied to a scratch copy first and the result is stored under ``"patched"``: the guard
then recognises (and guards as that release) a tree that carries its own patches. Nothing
is imported from the release.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglang_dsv4_guard.host.digests import (  # noqa: E402
    MORI,
    POOL,
    UTILS,
    code_version,
    digest_tree,
)
from sglang_dsv4_guard.host.judgement import DIGESTS_FILE, load_known  # noqa: E402
from sglang_dsv4_guard.host.patchset import apply_series, series_for  # noqa: E402


def package_dir(path: Path, scratch: Path) -> Path:
    """The ``sglang`` package directory of a wheel, site directory or package."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            members = [n for n in wheel.namelist() if n.startswith("sglang/")
                       and (n.endswith(".py"))]
            wheel.extractall(scratch, members)
        return scratch / "sglang"
    if (path / "sglang" / "srt").is_dir():
        return path / "sglang"
    if (path / "srt").is_dir():
        return path
    sys.exit(f"{path}: not a wheel, a site directory holding sglang/, or the sglang package")


def package_and_release(parser: argparse.ArgumentParser, path: Path, release: str | None,
                        scratch: Path) -> tuple[Path, str]:
    """The ``sglang`` package of ``path`` (unzipped into ``scratch`` for a wheel) and its
    release: ``release`` when given, else the one its ``_version.py`` names."""
    package = package_dir(path, scratch)
    found = release or code_version(package)
    if found is None:
        parser.error(f"{path}: no sglang/_version.py; name the release with --release")
    return package, found


def patched_package(package: Path, release: str, scratch: Path) -> Path:
    """A copy of what the code digests read from ``package``, with ``release``'s series
    from ``patches/`` applied."""
    series = series_for(release, ROOT / "patches")
    if series is None:
        sys.exit(f"--patched: patches/ has no series for SGLang {release}")
    site = scratch / "patched"
    for rel in (UTILS, MORI, POOL, "_version.py"):
        if (package / rel).is_file():
            (site / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(package / rel, site / "sglang" / rel)
    try:
        apply_series(series, site)
    except RuntimeError as error:
        sys.exit(f"--patched: {error}")
    return site / "sglang"


def _stored(section: str) -> dict[str, dict[str, list[str]]]:
    return {str(v): {k: [p.digest, p.what] for k, p in stored.items()}
            for v, stored in load_known(DIGESTS_FILE, section).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--release", help="the release to store it as (default: from the code)")
    parser.add_argument("--write", action="store_true", help=f"add it to {DIGESTS_FILE.name}")
    parser.add_argument("--new-profile", action="store_true",
                        help="store it although its checks match no known release (then "
                             "host/releases.py needs a profile for it)")
    parser.add_argument("--patched", action="store_true",
                        help="digest the release with its series from patches/ applied")
    args = parser.parse_args(argv)
    if not args.path.exists():
        parser.error(f"{args.path}: no such wheel or directory")
    if args.release is not None:
        try:
            Version(args.release)
        except InvalidVersion:
            parser.error(f"--release: {args.release!r} is not a release number like 0.5.24")
    with tempfile.TemporaryDirectory() as scratch:
        package, release = package_and_release(parser, args.path, args.release, Path(scratch))
        if args.patched:
            package = patched_package(package, release, Path(scratch))
        parts = {key: [p.digest, p.what] for key, p in digest_tree(package).items()}
    if not args.write:
        print(json.dumps({release: parts}, indent=1))
        return 0
    data = {"releases": _stored("releases"), "patched": _stored("patched")}
    if args.patched:
        if release not in data["releases"]:
            print(f"refused: SGLang {release} is not a known release; store its own "
                  "code digests first", file=sys.stderr)
            return 1
        data["patched"][release] = parts
        data["patched"] = dict(sorted(data["patched"].items(), key=lambda i: Version(i[0])))
        DIGESTS_FILE.write_text(json.dumps(data, indent=1) + "\n")
        print(f"{DIGESTS_FILE.name}: stored {len(parts)} parts for SGLang {release} "
              "with its patch series")
        return 0
    twins = [v for v, stored in data["releases"].items() if stored == parts and v != release]
    if not twins and not args.new_profile:
        print(f"refused: SGLang {release}'s checks match no known release's; the guard "
              "would run it with checks it does not have. Write a profile for it in "
              "sglang_dsv4_guard/host/releases.py and rerun with --new-profile", file=sys.stderr)
        return 1
    data["releases"][release] = parts
    data["releases"] = dict(sorted(data["releases"].items(), key=lambda item: Version(item[0])))
    DIGESTS_FILE.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"{DIGESTS_FILE.name}: stored {len(parts)} parts for SGLang {release}"
          + (f" (same checks as {', '.join(map(str, twins))})" if twins else
             "; host/releases.py needs a profile for it (profile_for)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
