"""One word, one meaning; one place for each name of SGLang's.

"Fingerprint" means only a report's identity (the deduplication key); what the guard
computes of SGLang's code is its "code digests". And the modules, functions and
attributes of SGLang the guard reads are spelled in ``host/targets.py`` only.
"""

from __future__ import annotations

import re
import unittest
from pathlib import Path

from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sglang_dsv4_guard"

# Where "fingerprint" means a report's identity, each with why.
FINGERPRINT_MEANS_A_REPORT = {
    "sglang_dsv4_guard/dedup": "the deduplication key itself",
    "sglang_dsv4_guard/reporter.py": "prints a report's fingerprint in its pointer",
    "sglang_dsv4_guard/wrapping.py": "the fingerprint a wrapper's error carries",
    "sglang_dsv4_guard/mori/wrapper.py": "the G006 summary names its report's fingerprint",
    "sglang_dsv4_guard/state/snapshot.py": "the role keeps two sides' fingerprints apart",
    "tools/matrix.py": "names test_report_once's TestFingerprintAndMarkers",
}


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


if __name__ == "__main__":
    unittest.main()
