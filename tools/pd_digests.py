"""Store the digests of SGLang's transfer-time PD checks of a release (``host/pd_digests.json``).

Usage: ``python tools/pd_digests.py PATH [--release 0.5.24] [--write]``

PATH is a wheel, a site directory holding ``sglang/`` or the ``sglang`` package (as for
``tools/digests.py``, whose reading of PATH this reuses). Without ``--write`` the digests
are printed as JSON; with it they are stored for the release. A stored release makes
``check`` judge its transfer-time rows (``pd/send_extra.py``) by evaluating its own
conditions: store one only after reading that release's checks, which the rows' tests then
cover. Nothing is imported from the release.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from digests import package_and_release  # noqa: E402

from sglang_dsv4_guard.host.pd_digests import PD_DIGESTS_FILE, digest_pd_tree  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--release", help="the release to store it as (default: from the code)")
    parser.add_argument("--write", action="store_true",
                        help=f"store it in {PD_DIGESTS_FILE.name}")
    args = parser.parse_args(argv)
    if not args.path.exists():
        parser.error(f"{args.path}: no such wheel or directory")
    with tempfile.TemporaryDirectory() as scratch:
        package, release = package_and_release(parser, args.path, args.release, Path(scratch))
        found = digest_pd_tree(package)
    if not args.write:
        print(json.dumps({release: found}, indent=1))
        return 0
    data = json.loads(PD_DIGESTS_FILE.read_text()) if PD_DIGESTS_FILE.exists() else {}
    releases = dict(data.get("releases", {}))
    releases[release] = found
    data["releases"] = dict(sorted(releases.items(), key=lambda item: Version(item[0])))
    PD_DIGESTS_FILE.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{PD_DIGESTS_FILE.name}: stored {len(found)} sites for SGLang {release}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
