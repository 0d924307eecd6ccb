"""``check -f --fix`` carries the proven corrected lines back into the deployment files as
one unified diff: each flag changed where it stands, in the file's own shape; the diff
applies with ``git apply`` and the patched files pass ``check -f``; what cannot be
edited in place is said, never guessed. ``--keep`` names the server the fix leaves alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

from check_helpers import DSV3, DSV4, run_cli, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from test_check_files import MODEL

from sglang_dsv4_guard.check.file_fixes import patched, token_edits
from sglang_dsv4_guard.check.inputs import read_inputs
from sglang_dsv4_guard.host.flags import accepts

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
MAP = ("--model-path-map", f"{MODEL}={DSV4}")


def edit(text: str, name: str, role: str, change: dict[int, str | None],
         insert: list[str] | None = None) -> str:
    """``text`` (a file ``name``) with the ``role`` server's argument ``i`` replaced by
    ``change[i]`` (``None``: removed) and ``insert`` appended, through token_edits."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        Path(path).write_text(text)
        pair = read_inputs([path]).pairs[0]
    inv = pair.prefill if role == "prefill" else pair.decode
    sent = list(inv.argv)
    fixed = [change.get(i, t) for i, t in enumerate(sent)]
    fixed = [t for t in fixed if t is not None] + (insert or [])
    edits, problems = token_edits(path, text, [t.span for t in inv.tokens], sent, fixed)
    assert not problems, problems
    out = patched(text, edits)
    assert out is not None
    return out


YAML_ITEMS = """\
services:
  prefill:
    image: lmsysorg/sglang:latest
    command:
      - python3
      - -m
      - sglang.launch_server
      - --model-path=/m
      - --disaggregation-mode=prefill
      - "--page-size=64"
      - --port=1
  decode:
    image: lmsysorg/sglang:latest
    command: ["python3", "-m", "sglang.launch_server", "--model-path=/m",
              "--disaggregation-mode=decode", "--page-size=32"]
"""

SCRIPT = """\
#!/bin/sh
python -m sglang.launch_server --model-path /m \\
  --disaggregation-mode prefill \\
  --page-size 64 \\
  --port 1 &
python -m sglang.launch_server --model-path /m --disaggregation-mode decode --port 2
"""


class TestEditsInPlace(GuardTestCase):
    def test_yaml_items_keep_their_form(self) -> None:
        """A ``--k=v`` item's value changes in its item, quotes kept; a removed item
        takes its line; an added flag is a new item after the last, quoted alike."""
        changed = edit(YAML_ITEMS, "compose.yaml", "prefill", {2: "--page-size=256"})
        self.assertIn('      - "--page-size=256"\n', changed)
        removed = edit(YAML_ITEMS, "compose.yaml", "prefill", {2: None})
        self.assertNotIn("page-size", removed.split("  decode:")[0])
        self.assertEqual(len(removed.splitlines()), len(YAML_ITEMS.splitlines()) - 1)
        added = edit(YAML_ITEMS, "compose.yaml", "prefill", {}, ["--kv-cache-dtype=auto"])
        self.assertIn("      - --port=1\n      - --kv-cache-dtype=auto\n", added)

    def test_flow_list(self) -> None:
        """In ``["a", "b"]`` an item is replaced, removed with its comma, or added after."""
        changed = edit(YAML_ITEMS, "compose.yaml", "decode", {2: "--page-size=64"})
        self.assertIn('"--disaggregation-mode=decode", "--page-size=64"]', changed)
        removed = edit(YAML_ITEMS, "compose.yaml", "decode", {2: None})
        self.assertIn('"--model-path=/m",\n              "--disaggregation-mode=decode"]\n', removed)
        added = edit(YAML_ITEMS, "compose.yaml", "decode", {}, ["--port=2"])
        self.assertIn('"--page-size=32", "--port=2"]', added)

    def test_shell_continuations(self) -> None:
        """A flag removed from a continued line takes the line, no lone backslash left;
        a value changes in place; an added flag follows the last argument."""
        removed = edit(SCRIPT, "run.sh", "prefill", {4: None, 5: None})
        self.assertNotIn("page-size", removed)
        self.assertNotRegex(removed, r"\n\s*\\\n")
        self.assertIn("  --disaggregation-mode prefill \\\n  --port 1 &\n", removed)
        changed = edit(SCRIPT, "run.sh", "prefill", {5: "256"})
        self.assertIn("  --page-size 256 \\\n", changed)
        added = edit(SCRIPT, "run.sh", "decode", {}, ["--page-size", "64"])
        self.assertIn("--port 2 --page-size 64\n", added)

    def test_a_variable_is_not_guessed(self) -> None:
        """An argument written through a variable is never rewritten: the change is a
        problem naming it, and the file gets no edit from that server."""
        text = "M=/m\nP=64\npython -m sglang.launch_server --model-path $M --page-size $P\n"
        inv_text = "run.sh"
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, inv_text)
            Path(path).write_text(text)
            inv = read_inputs([path]).invocations[0]
        spans = [t.span if t.typed == t.text else None for t in inv.tokens]
        sent = list(inv.argv)
        edits, problems = token_edits(path, text, spans, sent, [*sent[:-1], "256"],
                                      [t.typed for t in inv.tokens])
        self.assertEqual(edits, [])
        self.assertEqual(len(problems), 1)
        self.assertIn("'$P'", problems[0])


class TestPatchedFilesPass(GuardTestCase):
    def test_patch_applies_and_the_patched_files_pass(self) -> None:
        """``--format patch`` on the broken script and OME manifest (a folded ``sh -c``
        script on a leader and a worker): ``git apply`` takes it, and ``check -f`` on the
        patched files exits 0."""
        if shutil.which("git") is None:
            self.fail("git is needed to apply the patch")
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("launch-pd.sh", "ome-runtime.yaml"):
                shutil.copy(ROOT / "examples/deployments" / name, tmp)
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                status, diff, err = run_cli("check", "-f", "launch-pd.sh", "ome-runtime.yaml",
                                            *MAP, "--format", "patch")
                self.assertEqual(status, 1, err)
                self.assertEqual(err, "")
                self.assertIn("-  --disaggregation-transfer-backend nixl \\", diff)
                self.assertEqual(diff.count("-            --kv-cache-dtype bf16"), 2)  # leader, worker
                Path("fix.patch").write_text(diff)
                subprocess.run(["git", "init", "-q", "."], check=True)
                done = subprocess.run(["git", "apply", "fix.patch"], capture_output=True,
                                      text=True)
                self.assertEqual(done.returncode, 0, done.stderr)
                status, out, err = run_cli("check", "-f", "launch-pd.sh", "ome-runtime.yaml",
                                           *MAP, "--quiet")
                self.assertEqual(status, 0, out + err)
                self.assertEqual([line.split()[0] for line in out.splitlines()], ["OK", "OK"])
            finally:
                os.chdir(cwd)

    def test_text_and_json_carry_the_patch(self) -> None:
        """``--fix`` in text ends with the patch; in JSON it is ``patch.diff``, with what it
        leaves out in ``patch.not_in_patch`` (the compose decode's draft tokens are a
        variable: said, not edited)."""
        status, out, err = run_cli("check", "-f", "examples/deployments/docker-compose.yaml",
                                   *MAP, "--fix", "--format", "json")
        self.assertEqual(status, 0, err)
        patch = json.loads(out)["patch"]
        self.assertEqual(patch["diff"], "")
        self.assertTrue(any("$DRAFT_TOKENS" in note for note in patch["not_in_patch"]))
        status, out, _ = run_cli("check", "-f", "examples/deployments/launch-pd.sh", *MAP,
                                 "--fix")
        self.assertEqual(status, 1)
        self.assertIn("check --fix: the files, patched", out)
        self.assertIn("+  --disaggregation-transfer-backend mooncake \\", out)


class TestKeep(GuardTestCase):
    def test_keep_names_the_side_left_as_typed(self) -> None:
        """A DCP pair (the prefill with DCP 2, the decode without): ``--keep prefill``
        gives the decode the prefill's DCP size; ``--keep decode`` removes the prefill's;
        0.5.16 has no DCP row: nothing to fix either way."""
        prefill = server("prefill", DSV3, "--tp-size 2 --dcp-size 2", "mooncake")
        decode = server("decode", DSV3, "", "mooncake")
        results = {}
        for keep in ("prefill", "decode"):
            status, out, err = run_cli("check", "--prefill", prefill, "--decode", decode,
                                       "--fix", "--keep", keep, "--format", "json")
            self.assertIn(status, (0, 1), err)
            results[keep] = json.loads(out)
        if not accepts("--dcp-size") or results["prefill"]["fix_status"] == "nothing_to_fix":
            self.assertTrue(all(r["fix_status"] == "nothing_to_fix" for r in results.values()))
            self.assertFalse(accepts("--dcp-size") and results["prefill"]["findings"])
            return
        for keep, doc in results.items():
            self.assertEqual((doc["fix_status"], doc["fix_keep"]), ("corrected", keep))
            self.assertEqual(doc["fixed"][keep], (prefill if keep == "prefill" else decode))
        self.assertIn("--dcp-size 2", results["prefill"]["fixed"]["decode"])
        self.assertNotIn("--dcp-size", results["decode"]["fixed"]["prefill"])

    def test_keep_needs_fix(self) -> None:
        """``--keep`` without ``--fix``: exit 2 naming it."""
        status, out, err = run_cli("check", "--prefill", "x", "--decode", "y", "--keep",
                                   "decode")
        self.assertEqual((status, out), (2, ""))
        self.assertIn("--keep decode", err)


if __name__ == "__main__":
    unittest.main()
