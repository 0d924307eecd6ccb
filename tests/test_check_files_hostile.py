"""``check -f`` on hostile and odd input (found by an outside review): variables that
expand into each other, devices and FIFOs, non-UTF-8 stdin, a broken file in a walked
directory, files without a pair, names that would inject workflow commands, diffs of
files without a final newline, YAML numbers, the last argument of a continued command,
and a failure of ours, which is exit 2 (never 1, which means findings)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from check_helpers import run_cli
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.file_fixes import patched, token_edits, unified_diff
from sglang_dsv4_guard.check.formats import render_github
from sglang_dsv4_guard.check.inputs import InputError, read_inputs
from sglang_dsv4_guard.check.outcome import Checked
from sglang_dsv4_guard.cli import main

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

LAUNCH = "python -m sglang.launch_server --model-path /m --disaggregation-mode"


class TestHostileInput(GuardTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)

    def write(self, name: str, text: str | bytes) -> str:
        path = os.path.join(self.tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    def test_variables_that_expand_into_each_other(self) -> None:
        """An 800-byte script whose variables quadruple each line is refused, naming the
        file and the limit, before it takes the memory."""
        lines = ['V0="--xxxxxxxxxxxxxxxx"'] + [
            f'V{i}="${{V{i - 1}}}${{V{i - 1}}}${{V{i - 1}}}${{V{i - 1}}}"' for i in range(1, 30)]
        path = self.write("bomb.sh", "\n".join(lines) + f"\n{LAUNCH} prefill $V29\n")
        with self.assertRaises(InputError) as raised:
            read_inputs([path])
        self.assertIn(path, str(raised.exception))
        self.assertIn("65,536", str(raised.exception))

    def test_devices_and_fifos_are_not_read(self) -> None:
        """A device or a FIFO named (or linked in a walked directory) is refused or skipped,
        never read: no hang, no memory."""
        with self.assertRaises(InputError) as raised:
            read_inputs(["/dev/zero"])
        self.assertIn("not a regular file", str(raised.exception))
        fifo = os.path.join(self.tmp, "pipe.sh")
        os.mkfifo(fifo)
        with self.assertRaises(InputError):
            read_inputs([fifo])

    def test_non_utf8_stdin(self) -> None:
        """Standard input that is not UTF-8: one error naming ``-``."""
        stdin = io.TextIOWrapper(io.BytesIO(b"--model-path \xff\xfe\n"), encoding="utf-8")
        with self.assertRaises(InputError) as raised:
            read_inputs(["-"], stdin)
        self.assertIn("not UTF-8", str(raised.exception))

    def test_a_broken_file_in_a_walk_is_a_note(self) -> None:
        """In a directory walk, a file that cannot be read is a note and the rest is read;
        named on its own it is an error."""
        self.write("d/a.sh", f"{LAUNCH} prefill\n{LAUNCH} decode\n")
        broken = self.write("d/values.yaml", "a: [1, 2\nb: {\n")
        inputs = read_inputs([os.path.join(self.tmp, "d")])
        self.assertEqual(len(inputs.pairs), 1)
        self.assertTrue(any(broken in note and "skipped" in note for note in inputs.notes))
        with self.assertRaises(InputError):
            read_inputs([broken])

    def test_no_pair_is_no_failure(self) -> None:
        """Files without a prefill/decode pair (a workflow, a prefill alone): exit 0, said."""
        path = self.write("ci.yaml", "on: push\njobs: {}\n")
        status, out, err = run_cli("check", "-f", path)
        self.assertEqual(status, 0, err)
        self.assertIn("nothing checked", out)

    def test_a_failure_of_ours_is_exit_2(self) -> None:
        """A bug of the guard's during check: one line, exit 2, no traceback."""
        path = self.write("a.sh", f"{LAUNCH} prefill\n{LAUNCH} decode\n")
        out_, err_ = io.StringIO(), io.StringIO()
        with mock.patch("sglang_dsv4_guard.check.command.run_command",
                        side_effect=RuntimeError("boom")), \
                contextlib.redirect_stdout(out_), contextlib.redirect_stderr(err_):
            status = main(["check", "-f", path])
        out, err = out_.getvalue(), err_.getvalue()
        self.assertEqual((status, out), (2, ""))
        self.assertIn("RuntimeError", err)
        self.assertNotIn("Traceback", err)
        self.assertEqual(len(err.strip().splitlines()), 1)


class TestOutputsStayWellFormed(GuardTestCase):
    def test_github_names_cannot_start_commands(self) -> None:
        """A pair name holding a newline stays on its summary line (escaped)."""
        checked = Checked("x.yaml\n::warning::injected", {"document": {"findings": []}})
        out = render_github([checked], "error")
        self.assertFalse(any(line.startswith("::warning::injected") for line in
                             out.splitlines()))

    def edited(self, text: str, name: str, change: dict[int, str | None],
               insert: list[str] | None = None) -> tuple[str, str]:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, name)
            Path(path).write_text(text)
            inv = read_inputs([path]).invocations[0]
        sent = list(inv.argv)
        fixed = [t for t in (change.get(i, t) for i, t in enumerate(sent)) if t is not None]
        edits, problems = token_edits(path, text, [t.span for t in inv.tokens], sent,
                                      fixed + (insert or []))
        self.assertEqual(problems, [])
        after = patched(text, edits)
        assert after is not None
        return after, unified_diff({name: (text, after)})

    def test_no_final_newline_diff_applies(self) -> None:
        """A change to the last line of a file without a final newline: git apply takes it."""
        text = ("services:\n  p:\n    image: lmsysorg/sglang\n    command:\n      - python\n"
                "      - -m\n      - sglang.launch_server\n      - --tp-size\n      - \"16\"")
        after, diff = self.edited(text, "c.yaml", {1: "8"})
        self.assertTrue(after.endswith('- "8"'))
        self.assertIn("\\ No newline at end of file", diff)
        if shutil.which("git") is None:
            self.fail("git is needed to apply the patch")
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "c.yaml").write_text(text)
            Path(tmp, "p.diff").write_text(diff)
            done = subprocess.run(["git", "apply", "p.diff"], cwd=tmp, capture_output=True,
                                  text=True)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertEqual(Path(tmp, "c.yaml").read_text(), after)

    def test_yaml_numbers_stay_strings(self) -> None:
        """An added YAML list item that YAML would read as a number is quoted."""
        text = ("services:\n  p:\n    image: lmsysorg/sglang\n    command:\n      - python\n"
                "      - -m\n      - sglang.launch_server\n      - --port=1\n")
        after, _ = self.edited(text, "c.yaml", {}, ["--tp-size", "16"])
        self.assertIn('      - --tp-size\n      - "16"\n', after)

    def test_last_argument_of_a_continued_command(self) -> None:
        """Removing the last argument of a continued command leaves no dangling backslash
        joining the next command."""
        text = (f"{LAUNCH} prefill \\\n  --tp-size 2 \\\n  --page-size 64\n"
                "echo started\n")
        after, _ = self.edited(text, "run.sh", {6: None, 7: None})
        self.assertIn("--tp-size 2\necho started\n", after)


if __name__ == "__main__":
    unittest.main()
