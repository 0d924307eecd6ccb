"""The imported SGLang is judged by its code, not by the label on it (issue 14).

Disguised trees (``host_trees``) are the imported release's own files behind symbolic
links, with a bumped ``_version.py``, a changed check, or another release's metadata.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from unittest import mock

from helpers import fresh_python, sglang_release
from host_trees import disguised_tree, real_package
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

import sglang_dsv4_guard
from sglang_dsv4_guard.cli import main
from sglang_dsv4_guard.host import judgement as host
from sglang_dsv4_guard.host.digests import MORI, digest_tree
from sglang_dsv4_guard.host.judgement import judge, load_known
from sglang_dsv4_guard.host.releases import SUPPORTED_MAX, SUPPORTED_MIN, profile_for

register_cpu_ci(est_time=94, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
# Present, unchanged, in every release 0.5.16 - 0.5.23 (see the code digests).
STATE_EDIT = {"srt/disaggregation/utils.py": (
    "token_to_kv_pool._unified_kv != draft_token_to_kv_pool._unified_kv",
    "bool(token_to_kv_pool._unified_kv) != bool(draft_token_to_kv_pool._unified_kv)")}
STATE_CHANGE = ("setup_state_kv_args DSV4 check 2 ('DSV4 target and draft pools must use the "
                "same unified-KV mode'): changed")
# The same check under a new enclosing condition (its own test and raise unchanged).
WRAP_EDIT = {"srt/disaggregation/utils.py": (
    "\n        if token_to_kv_pool._unified_kv != draft_token_to_kv_pool._unified_kv:",
    "\n        if draft_token_to_kv_pool.page_size > 1:"
    "\n         if token_to_kv_pool._unified_kv != draft_token_to_kv_pool._unified_kv:")}
# The unified and paged branches swapped: every check in them now runs in the other mode.
BRANCH_EDIT = {"srt/disaggregation/utils.py": (
    "\n        if token_to_kv_pool._unified_kv:",
    "\n        if not token_to_kv_pool._unified_kv:")}
MORI_EDIT = {"srt/disaggregation/mori/conn.py": (
    "peer_info.decode_tp_size != self.attn_tp_size",
    "peer_info.decode_tp_size > self.attn_tp_size")}
PROBE = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from sglang.srt.plugins import load_plugins
load_plugins()
load_plugins()
import sglang, sglang_dsv4_guard
from sglang_dsv4_guard.lifecycle import installation
current = installation()
print(json.dumps({"installed": sglang_dsv4_guard.is_installed(), "file": sglang.__file__,
                  "profile": current.runtime.profile.name if current else None,
                  "checks_of": str(current.runtime.profile.version) if current else None}))
"""
DOCTOR = "from sglang_dsv4_guard.cli import main\nraise SystemExit(main(['doctor']))\n"
CLI = "import sys\nfrom sglang_dsv4_guard.cli import main\nraise SystemExit(main(sys.argv[1:]))\n"
NO_BYTECODE = {"PYTHONDONTWRITEBYTECODE": "1"}


def twins() -> list[Version]:
    """Known releases whose stored code digests equal this release's."""
    known = load_known()
    mine = known[sglang_release()]
    return [v for v, parts in known.items() if parts == mine]


def other_release() -> Version:
    """A known release whose checks differ from the imported one's."""
    return next(v for v in load_known() if v not in twins())


class TestJudgedByCode(CustomTestCase):
    """judge(): metadata, the code's own version and its code digests, cross-checked."""

    def test_stored_code_digests_are_this_release(self) -> None:
        """digests.json holds exactly what the imported release's code gives."""
        self.assertEqual(digest_tree(real_package()), load_known()[sglang_release()])

    def test_tool_computes_the_stored_code_digests(self) -> None:
        """tools/digests.py on the release's files prints the stored parts."""
        done = subprocess.run([sys.executable, str(ROOT / "tools/digests.py"),
                               str(real_package())], capture_output=True, text=True,
                              timeout=120, check=True)
        printed = json.loads(done.stdout)[str(sglang_release())]
        stored = load_known()[sglang_release()]
        self.assertEqual(printed, {k: [p.digest, p.what] for k, p in stored.items()})

    def test_tool_refuses_changed_checks_without_new_profile(self) -> None:
        """``--write`` of a release whose checks match no known release is refused (the
        data file untouched) unless ``--new-profile``; releases sort as versions, so
        0.5.24rc1 lands before 0.5.24."""
        tool = digests_tool()
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "digests.json"
            data.write_text(host.DIGESTS_FILE.read_text())
            changed = disguised_tree(Path(tmp) / "changed", "0.5.24", edits=WRAP_EDIT)
            same = disguised_tree(Path(tmp) / "same", "0.5.24rc1")
            with mock.patch.object(tool, "DIGESTS_FILE", data), \
                    contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()) as err:
                refused = tool.main([str(changed), "--write"])
                untouched = data.read_text() == host.DIGESTS_FILE.read_text()
                forced = tool.main([str(changed), "--write", "--new-profile"])
                twin = tool.main([str(same), "--write"])
            self.assertEqual((refused, untouched, forced, twin), (1, True, 0, 0))
            self.assertIn("match no known release", err.getvalue())
            stored = list(json.loads(data.read_text())["releases"])
        self.assertEqual(stored[-2:], ["0.5.24rc1", "0.5.24"])

    def test_same_code_digests_same_profile(self) -> None:
        """Releases the code digests cannot tell apart, released or with the patch series,
        have one profile (bar the version), so guarding one as its twin predicts the same
        judgements."""
        for section in ("releases", "patched"):
            known = load_known(section=section)
            self.assertTrue(known, section)
            for a in known:
                for b in known:
                    if known[a] == known[b]:
                        self.assertEqual(profile_for(a), dataclasses.replace(profile_for(b),
                                                                             version=a))

    def test_own_release_is_quiet(self) -> None:
        """Metadata, code and code digests agree: this release's profile, nothing logged."""
        judgement = judge(real_package(), sglang_release())
        self.assertEqual((judgement.behaves_as, judgement.message), (sglang_release(), ""))

    def test_metadata_of_another_release_loses_to_the_code(self) -> None:
        """A source tree over another installed wheel: a warning names both; the code's
        release's profile is used."""
        other = other_release()
        judgement = judge(real_package(), other)
        self.assertEqual(judgement.behaves_as, sglang_release())
        self.assertEqual(judgement.level, logging.WARNING)
        self.assertIn(f"installed metadata says SGLang {other}, the imported code", judgement.message)
        self.assertIn(f"says {sglang_release()}; using the code's release", judgement.message)

    def test_unknown_release_with_known_checks_runs(self) -> None:
        """A 0.5.24 whose checks equal a known release's: guarded as that release (INFO)."""
        with tempfile.TemporaryDirectory() as tmp:
            judgement = judge(disguised_tree(Path(tmp), "0.5.24") / "sglang", None)
        self.assertIn(judgement.behaves_as, twins())
        self.assertEqual(judgement.level, logging.INFO)
        self.assertIn(f"SGLang 0.5.24 ({tmp}/sglang) has the same checks as known release "
                      f"{judgement.behaves_as}", judgement.message)

    def test_garbage_version_file_names_the_code_match(self) -> None:
        """``_version.py`` unreadable and metadata of a release with other checks: reports
        name the code's match with the label beside it, never the label alone; the
        profile's version is the matched release."""
        other = other_release()
        with tempfile.TemporaryDirectory() as tmp:
            judgement = judge(disguised_tree(Path(tmp), "not a version") / "sglang", other)
        mine = judgement.behaves_as
        self.assertIn(mine, twins())  # 0.5.16's code matches 0.5.17's too
        self.assertEqual(judgement.name, f"code matching {mine} (labelled {other})")
        profile = judgement.profile()
        self.assertEqual((profile.version, profile.name), (mine, judgement.name))

    def test_changed_state_check_is_named(self) -> None:
        """One changed condition in the DSV4 block: no profile; the check and range named."""
        with tempfile.TemporaryDirectory() as tmp:
            judgement = judge(disguised_tree(Path(tmp), "0.5.24", edits=STATE_EDIT) / "sglang",
                            None)
        self.assertIsNone(judgement.behaves_as)
        self.assertEqual(judgement.changed, (STATE_CHANGE,))
        self.assertIn(f"differs from every release the guard knows ({SUPPORTED_MIN} to "
                      f"{SUPPORTED_MAX})", judgement.message)

    def test_check_wrapped_in_a_new_condition_is_changed(self) -> None:
        """A check whose own test and raise stay but that now sits under an added ``if``
        runs less often: judged changed, the check named."""
        with tempfile.TemporaryDirectory() as tmp:
            judgement = judge(disguised_tree(Path(tmp), "0.5.24", edits=WRAP_EDIT) / "sglang",
                            None)
        self.assertIsNone(judgement.behaves_as)
        self.assertEqual(judgement.changed, (STATE_CHANGE,))

    def test_swapped_branch_is_changed(self) -> None:
        """Negating the unified/paged branch condition moves the geometry checks to the
        other mode: no profile, and the checks under that branch are named."""
        with tempfile.TemporaryDirectory() as tmp:
            judgement = judge(disguised_tree(Path(tmp), "0.5.24", edits=BRANCH_EDIT) / "sglang",
                            None)
        self.assertIsNone(judgement.behaves_as)
        self.assertGreaterEqual(len(judgement.changed), 2, judgement.changed)
        self.assertTrue(all(c.startswith("setup_state_kv_args DSV4 check ")
                            for c in judgement.changed), judgement.changed)

    def test_changed_mori_check_is_named(self) -> None:
        """A changed MORI TP check: no profile; the function and its check named."""
        with tempfile.TemporaryDirectory() as tmp:
            judgement = judge(disguised_tree(Path(tmp), "0.5.24", edits=MORI_EDIT) / "sglang",
                            None)
        self.assertIsNone(judgement.behaves_as)
        self.assertTrue(judgement.changed, judgement.message)
        self.assertTrue(all(c.startswith("MoriKVManager._send_swa_dsa_state check ")
                            for c in judgement.changed), judgement.changed)
        self.assertIn("peer_info.decode_tp_size > self.attn_tp_size", judgement.changed[0])
        self.assertIn("): changed (was ", judgement.changed[0])
        self.assertIn("peer_info.decode_tp_size != self.attn_tp_size", judgement.changed[0])

    def test_judge_imported_is_memoised_until_a_file_changes(self) -> None:
        """Judged once per process for the same files; a changed file's new mtime makes
        it judged again."""
        with tempfile.TemporaryDirectory() as tmp:
            package = disguised_tree(Path(tmp), "0.5.24") / "sglang"
            host.forget_judgements()
            with mock.patch.object(host, "imported_package_dir", return_value=package), \
                    mock.patch.object(host, "judge", wraps=host.judge) as judged:
                first, second = host.judge_imported(), host.judge_imported()
                self.assertIs(first, second)
                self.assertEqual(judged.call_count, 1)
                (package / "_version.py").write_text("__version__ = version = '0.5.25'\n")
                os.utime(package / "_version.py", ns=(1, 1))
                self.assertEqual(host.judge_imported().code, Version("0.5.25"))
                self.assertEqual(judged.call_count, 2)
        host.forget_judgements()

    def test_unreadable_code_digests_leave_sglang_alone(self) -> None:
        """A broken digests.json: install warns and stays inert, no traceback of ours."""
        broken = json.JSONDecodeError("Expecting value", "", 0)
        host.forget_judgements()  # judge afresh, with the broken data
        with mock.patch.object(host, "load_known", side_effect=broken), \
                self.assertLogs("sglang_dsv4_guard", "WARNING") as logs:
            sglang_dsv4_guard.install("on", load_entry_points=False)
        self.assertFalse(sglang_dsv4_guard.is_installed())
        self.assertIn("digests.json is unreadable (JSONDecodeError: Expecting value",
                      "\n".join(logs.output))


def digests_tool() -> ModuleType:
    """``tools/digests.py`` as a module (``tools/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("digests_tool",
                                                  ROOT / "tools/digests.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def patched_tree(root: Path, mori_edit: bool = False) -> Path:
    """The files the code digests read, from the imported release, with its series from
    ``patches/`` applied by the tool that stores them (and ``MORI_EDIT`` on top)."""
    package: Path = digests_tool().patched_package(real_package(),
                                                       str(sglang_release()), root)
    if mori_edit:
        old, new = MORI_EDIT[MORI]
        conn = package / MORI
        conn.write_text(conn.read_text().replace(old, new))
    return package


class TestPatchedTreeJudged(CustomTestCase):
    """A release carrying the guard's own patch series is recognised as that release."""

    def test_patched_release_is_guarded_as_itself(self) -> None:
        """The patched checks report every mismatch; the guard still knows them: the
        release's profile, an INFO naming the series."""
        with tempfile.TemporaryDirectory() as tmp:
            package = patched_tree(Path(tmp))
            judgement = judge(package, sglang_release())
        self.assertEqual((judgement.behaves_as, judgement.level), (sglang_release(), logging.INFO))
        self.assertIn(f"carries sglang-dsv4-guard's patch series for {sglang_release()}",
                      judgement.message)

    def test_patched_release_changed_elsewhere_stays_inert(self) -> None:
        """The series plus any other change to what the guard depends on: no profile."""
        with tempfile.TemporaryDirectory() as tmp:
            judgement = judge(patched_tree(Path(tmp), mori_edit=True), sglang_release())
        self.assertIsNone(judgement.behaves_as)
        self.assertEqual(judgement.level, logging.WARNING)

    def test_patched_release_changed_elsewhere_names_only_that_change(self) -> None:
        """The series plus one MORI edit: the warning names that one change, against the
        release with its series, not the series' own rewrite of setup_state_kv_args as if
        SGLang had changed it (an operator would then 'upgrade sglang-dsv4-guard')."""
        with tempfile.TemporaryDirectory() as tmp:
            judgement = judge(patched_tree(Path(tmp), mori_edit=True), sglang_release())
        # The edit changes every MORI check that compares the TP sizes (one or two,
        # by release), and nothing else.
        self.assertTrue(judgement.changed, judgement.message)
        self.assertIn("MoriKVManager._send_swa_dsa_state check 1", judgement.changed[0])
        for change in judgement.changed:
            self.assertTrue(change.startswith("MoriKVManager._send_swa_dsa_state check "),
                            change)
        self.assertNotIn("setup_state_kv_args", judgement.message)
        self.assertIn(f"closest, {sglang_release()} with sglang-dsv4-guard's patch series",
                      judgement.message)

    def test_tool_computes_the_stored_patched_code_digests(self) -> None:
        """tools/digests.py --patched on the release prints the stored parts."""
        done = subprocess.run([sys.executable, str(ROOT / "tools/digests.py"),
                               str(real_package()), "--patched"], capture_output=True,
                              text=True, timeout=120, check=True)
        printed = json.loads(done.stdout)[str(sglang_release())]
        stored = load_known(section="patched")[sglang_release()]
        self.assertEqual(printed, {k: [p.digest, p.what] for k, p in stored.items()})
        self.assertNotEqual(stored, load_known()[sglang_release()])


class TestHostInAFreshProcess(CustomTestCase):
    """Through SGLang's plug-in loader and the CLI, in fresh interpreters."""

    def test_source_tree_over_another_wheel(self) -> None:
        """This release's code under another release's metadata: installed with the code's
        profile and one warning naming both."""
        other = other_release()
        with tempfile.TemporaryDirectory() as tmp:
            disguised_tree(Path(tmp), metadata=str(other))
            done = fresh_python(PROBE, env={"SGLANG_DSV4_GUARD": "1", **NO_BYTECODE},
                                path_first=tmp)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        result = json.loads(done.stdout.splitlines()[-1])
        self.assertTrue(result["file"].startswith(tmp), result)
        self.assertEqual((result["installed"], result["profile"]), (True, str(sglang_release())))
        self.assertEqual(done.stderr.count(f"installed metadata says SGLang {other}"), 1,
                         done.stderr[-3000:])

    def test_unknown_release_with_known_checks_is_guarded(self) -> None:
        """A fake 0.5.24 (metadata and code) matching a known release: installed, INFO."""
        with tempfile.TemporaryDirectory() as tmp:
            disguised_tree(Path(tmp), "0.5.24", metadata="0.5.24")
            done = fresh_python(PROBE, env={"SGLANG_DSV4_GUARD": "1", **NO_BYTECODE},
                                path_first=tmp)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        result = json.loads(done.stdout.splitlines()[-1])
        self.assertTrue(result["installed"], result)
        self.assertEqual(result["profile"], "0.5.24")
        self.assertIn(Version(result["checks_of"]), twins())
        self.assertIn("INFO:sglang_dsv4_guard:sglang-dsv4-guard: SGLang 0.5.24", done.stderr)
        self.assertIn("has the same checks as known release", done.stderr)

    def test_check_and_patches_judge_the_code(self) -> None:
        """A fake 0.5.24 with unchanged checks: ``check`` predicts with its twin's checks
        (exit 0, not a refusal of the label) and ``patches`` picks its twin's series."""
        llama = str(ROOT / "tests/data/llama")
        args = ("--model-path", llama, "--disaggregation-transfer-backend", "mori")
        with tempfile.TemporaryDirectory() as tmp:
            disguised_tree(Path(tmp), "0.5.24", metadata="0.5.24")
            check = fresh_python(CLI, "check", "--prefill",
                                 " ".join([*args, "--disaggregation-mode", "prefill"]),
                                 "--decode", " ".join([*args, "--disaggregation-mode", "decode"]),
                                 env=NO_BYTECODE, path_first=tmp)
            patches = fresh_python(CLI, "patches", env=NO_BYTECODE, path_first=tmp)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr[-3000:])
        self.assertNotIn("check supports", check.stderr)
        first = patches.stdout.splitlines()[0]
        self.assertTrue(any(first.startswith(f"SGLang {twin} at ") for twin in twins()),
                        patches.stdout + patches.stderr[-3000:])
        self.assertIn("has the same checks as known release", patches.stdout)

    def test_changed_check_warns_once_and_stays_inert(self) -> None:
        """A fake 0.5.24 with a changed check: SGLang untouched, one warning naming it;
        ``doctor`` in the same process says NOT supported, names the change, exits 1."""
        with tempfile.TemporaryDirectory() as tmp:
            disguised_tree(Path(tmp), "0.5.24", metadata="0.5.24", edits=STATE_EDIT)
            done = fresh_python(PROBE + DOCTOR, env={"SGLANG_DSV4_GUARD": "1", **NO_BYTECODE},
                                path_first=tmp)
        self.assertEqual(done.returncode, 1, done.stderr[-3000:])
        probe, doctor = done.stdout.split("\n", 1)
        self.assertFalse(json.loads(probe)["installed"])
        self.assertEqual(done.stderr.count("stays inert: SGLang 0.5.24"), 1, done.stderr[-3000:])
        self.assertIn(STATE_CHANGE, done.stderr)
        self.assertIn("SGLang: 0.5.24 (NOT supported: SGLang 0.5.24", doctor)
        self.assertIn(STATE_CHANGE, doctor)

    def test_changed_check_strict_refuses_to_start(self) -> None:
        """Strict mode: SGLang's loader gets DSV4GuardStartupRefused naming the change."""
        with tempfile.TemporaryDirectory() as tmp:
            disguised_tree(Path(tmp), "0.5.24", metadata="0.5.24", edits=STATE_EDIT)
            done = fresh_python(PROBE, env={"SGLANG_DSV4_GUARD": "strict", **NO_BYTECODE},
                                path_first=tmp)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("sglang-dsv4-guard (strict mode) refused to start: SGLang 0.5.24", done.stderr)
        self.assertIn(STATE_CHANGE, done.stderr)
        self.assertNotIn('"installed"', done.stdout)

    def test_doctor_says_supported(self) -> None:
        """doctor on the imported release: supported, exit 0 (in-process)."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["doctor"])
        self.assertIn(f"SGLang: {sglang_release()} (supported; range {SUPPORTED_MIN} to "
                      f"{SUPPORTED_MAX})", out.getvalue())
        self.assertEqual(code, 0, out.getvalue())


if __name__ == "__main__":
    import unittest

    unittest.main()
