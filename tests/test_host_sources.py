"""SGLang's sources are read as Python reads them, and a file that truly cannot be read
is named as such, never reported as changed checks.

Python imports a module from its bytes: a UTF-8 byte-order mark and a PEP 263 coding
declaration are honoured. The guard fingerprints the same files, so a file Python
imports must give the release's fingerprints; one Python could not import either (bytes
it cannot decode, a syntax error) or that cannot be read at all gets a verdict that says
which file and why.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import unittest
from collections.abc import Iterator
from pathlib import Path

from helpers import GuardTestCase, fresh_python, sglang_release
from host_trees import disguised_tree, real_package
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host.digests import UTILS
from sglang_dsv4_guard.host.judgement import HostJudgement, judge

register_cpu_ci(est_time=74, suite="stage-a-test-cpu")

NO_BYTECODE = {"PYTHONDONTWRITEBYTECODE": "1"}
# Installs through SGLang's loader, then says what happened.
PROBE = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang_dsv4_guard
print(json.dumps({"installed": sglang_dsv4_guard.is_installed()}))
"""


def utils_bytes() -> bytes:
    """The imported release's ``disaggregation/utils.py``, as stored."""
    return (real_package() / UTILS).read_bytes()


def with_bom() -> bytes:
    return b"\xef\xbb\xbf" + utils_bytes()


def latin1_with_cookie() -> bytes:
    """The same code declared and encoded latin-1, with a latin-1 byte (é) in a comment
    that is not UTF-8. The release's few arrows (→, in comments and docstrings of
    functions the guard does not fingerprint) have no latin-1 byte: written ``->``."""
    text = utils_bytes().decode("utf-8").replace("\u2192", "->")
    return ("# -*- coding: latin-1 -*-\n# café\n" + text).encode("latin-1")


def undecodable() -> bytes:
    """A string literal holding a byte that is not UTF-8, with no declaration: Python
    refuses to import it."""
    return utils_bytes() + b'\n_GUARD_TEST = "\xff"\n'


def unparsable() -> bytes:
    return utils_bytes() + b"\ndef (\n"


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    """Root's effective user set to ``nobody`` for the block (no-op for other users)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def judged(tmp: str, files: dict[str, bytes]) -> HostJudgement:
    package = disguised_tree(Path(tmp), str(sglang_release()), files=files) / "sglang"
    return judge(package, sglang_release())


class TestSourcesReadAsPythonDoes(GuardTestCase):
    """A file Python imports is fingerprinted as the release it is."""

    def test_byte_order_mark_is_the_release(self) -> None:
        """utils.py with a UTF-8 byte-order mark: judged as the imported release, quietly."""
        with tempfile.TemporaryDirectory() as tmp:
            verdict = judged(tmp, {UTILS: with_bom()})
        self.assertEqual((verdict.behaves_as, verdict.message, verdict.unreadable),
                         (sglang_release(), "", ""))

    def test_latin1_coding_declaration_is_the_release(self) -> None:
        """utils.py declared ``coding: latin-1`` with a latin-1 byte: judged as the release."""
        with tempfile.TemporaryDirectory() as tmp:
            verdict = judged(tmp, {UTILS: latin1_with_cookie()})
        self.assertEqual((verdict.behaves_as, verdict.message, verdict.unreadable),
                         (sglang_release(), "", ""))


class TestUnreadableSourceNamed(GuardTestCase):
    """A file that cannot be read or parsed: no profile, the file and the reason named,
    nothing called changed or not found."""

    def assert_named(self, verdict: HostJudgement, reason: str) -> None:
        unreadable, message = verdict.unreadable, verdict.message
        self.assertTrue(unreadable.startswith(f"{UTILS} "), unreadable)
        self.assertIn(reason, unreadable)
        self.assertIn(unreadable, message)
        for wrong in ("differs from every release", "not found", "changed"):
            self.assertNotIn(wrong, message)

    def test_undecodable_bytes_are_named(self) -> None:
        """A byte that is not UTF-8 in a string literal, no declaration: the file and
        Python's decoding error named."""
        with tempfile.TemporaryDirectory() as tmp:
            verdict = judged(tmp, {UTILS: undecodable()})
        self.assertIsNone(verdict.behaves_as)
        self.assert_named(verdict, "'utf-8' codec can't decode byte 0xff")

    def test_syntax_error_is_named(self) -> None:
        """A syntax error: the file, Python's message and the line named."""
        with tempfile.TemporaryDirectory() as tmp:
            verdict = judged(tmp, {UTILS: unparsable()})
        lines = unparsable().count(b"\n")
        self.assertIsNone(verdict.behaves_as)
        self.assert_named(verdict, f"invalid syntax (line {lines})")

    def test_directory_in_place_of_the_file_is_named(self) -> None:
        """utils.py is a directory: the file and the read error named."""
        with tempfile.TemporaryDirectory() as tmp:
            package = disguised_tree(Path(tmp), str(sglang_release()),
                                     files={UTILS: b""}) / "sglang"
            (package / UTILS).unlink()
            (package / UTILS).mkdir()
            verdict = judge(package, sglang_release())
        self.assertIsNone(verdict.behaves_as)
        self.assert_named(verdict, "IsADirectoryError")

    def test_permission_denied_is_named(self) -> None:
        """utils.py unreadable to the process (mode 000; judged with the effective user
        ``nobody`` when the test runs as root, who may read anything): the file and
        PermissionError named."""
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)  # nobody must reach the tree
            package = disguised_tree(Path(tmp), str(sglang_release()),
                                     files={UTILS: utils_bytes()}) / "sglang"
            os.chmod(package / UTILS, 0)
            with as_nobody():
                verdict = judge(package, sglang_release())
        self.assertIsNone(verdict.behaves_as)
        self.assert_named(verdict, "PermissionError")


class TestUnreadableSourceInAFreshProcess(GuardTestCase):
    """Through SGLang's plug-in loader, in fresh interpreters, mode on and strict."""

    def probe(self, files: dict[str, bytes], mode: str) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory() as tmp:
            disguised_tree(Path(tmp), files=files)
            return fresh_python(PROBE, env={"SGLANG_DSV4_GUARD": mode, **NO_BYTECODE},
                                path_first=tmp)

    def test_byte_order_mark_installs(self) -> None:
        """A BOM'd utils.py: the guard installs in mode on and in strict, with no warning."""
        for mode in ("1", "strict"):
            with self.subTest(mode=mode):
                done = self.probe({UTILS: with_bom()}, mode)
                self.assertEqual(done.returncode, 0, done.stderr[-3000:])
                self.assertTrue(json.loads(done.stdout.splitlines()[-1])["installed"])
                self.assertNotIn("WARNING:sglang_dsv4_guard", done.stderr)

    def test_syntax_error_named_in_mode_on(self) -> None:
        """A utils.py that cannot be parsed, mode on: inert, one warning naming the file."""
        done = self.probe({UTILS: unparsable()}, "1")
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertFalse(json.loads(done.stdout.splitlines()[-1])["installed"])
        self.assertEqual(done.stderr.count(f"stays inert: SGLang {sglang_release()}"), 1,
                         done.stderr[-3000:])
        self.assertIn(f"{UTILS} cannot be parsed by Python", done.stderr)
        self.assertNotIn("differs from every release", done.stderr)

    def test_syntax_error_named_in_strict(self) -> None:
        """Strict: SGLang's loader gets the refusal, naming the file and the reason."""
        done = self.probe({UTILS: unparsable()}, "strict")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("sglang-dsv4-guard (strict mode) refused to start", done.stderr)
        self.assertIn(f"{UTILS} cannot be parsed by Python", done.stderr)
        self.assertNotIn("differs from every release", done.stderr)
        self.assertNotIn('"installed"', done.stdout)


if __name__ == "__main__":
    unittest.main()
