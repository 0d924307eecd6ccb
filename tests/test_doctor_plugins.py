"""``doctor`` reads ``SGLANG_PLUGINS`` as SGLang's loader does, and names the release's
scheduler entry points that never call ``load_plugins()``.

SGLang runs the guard only through ``load_plugins()``, which skips every entry point
``SGLANG_PLUGINS`` does not name. Doctor must fail (exit 1, with the fix) exactly when a
fresh interpreter's ``load_plugins()`` would not run the guard that the environment asks
for; each case below runs both in one fresh interpreter and compares them.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

from helpers import GuardTestCase, fresh_python
from host_trees import disguised_tree, real_package
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.cli import main
from sglang_dsv4_guard.host.loader import SchedulerEntry, scheduler_entry_points

register_cpu_ci(est_time=157, suite="stage-a-test-cpu")

# load_plugins() as SGLang's launcher runs it, whether it ran the guard, then doctor.
PROBE_THEN_DOCTOR = r"""
import json
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang_dsv4_guard
print(json.dumps({"installed": sglang_dsv4_guard.is_installed()}), flush=True)
from sglang_dsv4_guard.cli import main
raise SystemExit(main(["doctor"]))
"""
RAY = "srt/ray/scheduler_actor.py SchedulerActor.__init__"
FORKED = "srt/managers/scheduler.py run_scheduler_process"


def guard_entry_point() -> str:
    """The guard's entry point name, from its distribution's metadata."""
    dist = importlib.metadata.distribution("sglang-dsv4-guard")
    return next(ep.name for ep in dist.entry_points if ep.group == "sglang.srt.plugins")


class Run:
    """One fresh interpreter: what load_plugins() did and what doctor said."""

    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        first, _, self.doctor = done.stdout.partition("\n")
        self.installed = bool(json.loads(first)["installed"])
        self.code = done.returncode
        self.stderr = done.stderr

    def __repr__(self) -> str:
        return f"installed={self.installed} exit={self.code}\n{self.doctor}{self.stderr[-2000:]}"


_RUNS: dict[tuple[str, str], Run] = {}


def run(plugins: str, mode: str = "1") -> Run:
    """``SGLANG_PLUGINS=plugins`` and ``SGLANG_DSV4_GUARD=mode`` in a fresh interpreter
    (one per pair, shared by the tests)."""
    if (plugins, mode) not in _RUNS:
        env = {"SGLANG_PLUGINS": plugins, **({"SGLANG_DSV4_GUARD": mode} if mode else {})}
        _RUNS[plugins, mode] = Run(fresh_python(PROBE_THEN_DOCTOR, env=env))
    return _RUNS[plugins, mode]


class TestDoctorReadsSglangPlugins(GuardTestCase):
    """SGLANG_PLUGINS as SGLang's load_plugins() reads it, the guard asked for."""

    def test_other_plugin_only_fails_with_the_fix(self) -> None:
        """``SGLANG_PLUGINS=acme``: doctor exits 1, says load_plugins() will not run the
        guard, and the fix adds the entry point's name to the list."""
        name = guard_entry_point()
        result = run("acme")
        self.assertEqual(result.code, 1, result)
        self.assertIn(f"problem: SGLang's load_plugins() will not run {name}: "
                      f"SGLANG_PLUGINS='acme' does not name {name}", result.doctor)
        self.assertIn(f"fix: SGLANG_PLUGINS=acme,{name}\n", result.doctor)
        self.assertEqual(result.doctor.splitlines()[-1], "doctor: problems found", result)

    def test_misspelling_names_the_closest(self) -> None:
        """``SGLANG_PLUGINS=dsv4-guard``: exit 1; the misspelt name is called the closest
        and the fix replaces it."""
        name = guard_entry_point()
        result = run("dsv4-guard")
        self.assertEqual(result.code, 1, result)
        self.assertIn("'dsv4-guard' is the closest: a misspelling?", result.doctor)
        self.assertIn(f"fix: SGLANG_PLUGINS={name}\n", result.doctor)

    def test_separators_only_load_nothing(self) -> None:
        """``SGLANG_PLUGINS=,`` is set but names nothing: SGLang loads no plug-in; exit 1."""
        result = run(",")
        self.assertEqual(result.code, 1, result)
        self.assertIn(f"fix: SGLANG_PLUGINS={guard_entry_point()}\n", result.doctor)

    def test_empty_runs_every_plugin(self) -> None:
        """``SGLANG_PLUGINS=`` (empty) restricts nothing: OK, and said so."""
        result = run("")
        self.assertEqual(result.code, 0, result)
        self.assertIn(f"SGLang's load_plugins() runs {guard_entry_point()} (SGLANG_PLUGINS "
                      f"unset: every plug-in)", result.doctor)
        self.assertEqual(result.doctor.splitlines()[-1], "doctor: OK", result)

    def test_list_naming_the_guard_is_ok(self) -> None:
        """``SGLANG_PLUGINS=acme, dsv4_guard``: OK."""
        result = run(f"acme, {guard_entry_point()}")
        self.assertEqual(result.code, 0, result)
        self.assertEqual(result.doctor.splitlines()[-1], "doctor: OK", result)

    def test_guard_off_is_a_note(self) -> None:
        """The guard not asked for (SGLANG_DSV4_GUARD unset), SGLANG_PLUGINS=acme: nothing
        is lost, so a note, not a problem; exit 0."""
        result = run("acme", mode="")
        self.assertEqual(result.code, 0, result)
        self.assertIn("note: SGLang's load_plugins() will not run", result.doctor)

    def test_guard_under_another_entry_point_name_is_ok(self) -> None:
        """Another distribution declares ``acme_guard = sglang_dsv4_guard.entry:activate``
        and ``SGLANG_PLUGINS=acme_guard``: load_plugins() runs the guard, doctor exits 0
        and does not call the guard's own hook another plug-in's."""
        root = Path(tempfile.mkdtemp(prefix="dsv4-doctor-ep-"))
        self.addCleanup(shutil.rmtree, root, True)
        info = root / "acme_bundle-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-bundle\n"
                                       "Version: 1.0\n")
        (info / "entry_points.txt").write_text(
            "[sglang.srt.plugins]\nacme_guard = sglang_dsv4_guard.entry:activate\n")
        result = Run(fresh_python(PROBE_THEN_DOCTOR, path_first=str(root), env={
            "SGLANG_PLUGINS": "acme_guard", "SGLANG_DSV4_GUARD": "1"}))
        self.assertTrue(result.installed, result)
        self.assertEqual(result.code, 0, result)
        self.assertIn("SGLang's load_plugins() runs acme_guard", result.doctor)
        self.assertNotIn("other plug-in hook", result.doctor)

    def test_name_differing_in_case_is_said(self) -> None:
        """``SGLANG_PLUGINS`` naming the guard in capitals: exit 1, and doctor says the name
        differs only in case (SGLang compares exactly), with the fix."""
        name = guard_entry_point()
        result = run(name.upper())
        self.assertEqual(result.code, 1, result)
        self.assertIn(f"{name.upper()!r}, which differs from {name} only in case",
                      result.doctor)
        self.assertIn(f"fix: SGLANG_PLUGINS={name}\n", result.doctor)

    def test_doctor_agrees_with_load_plugins(self) -> None:
        """With the guard asked for, doctor exits 0 exactly when load_plugins() in the same
        fresh interpreter ran the guard."""
        for plugins in ("acme", "dsv4-guard", ",", "", f"acme, {guard_entry_point()}"):
            with self.subTest(plugins=plugins):
                result = run(plugins)
                self.assertEqual(result.code == 0, result.installed, result)


def entries_after(edits: dict[str, tuple[str, str]]) -> list[SchedulerEntry]:
    """The scheduler entry points of a copy of the release with ``edits`` applied."""
    with tempfile.TemporaryDirectory() as tmp:
        return scheduler_entry_points(disguised_tree(Path(tmp), edits=edits) / "sglang")


class TestSchedulerEntryPoints(GuardTestCase):
    """Which functions of the release construct the Scheduler without load_plugins()."""

    def test_ray_actor_is_named(self) -> None:
        """Read from the release: the forked scheduler process loads the plug-ins first,
        the Ray scheduler actor never does; doctor names the actor in a note."""
        entries = scheduler_entry_points(real_package())
        self.assertIn(SchedulerEntry(FORKED, True), entries)
        self.assertIn(SchedulerEntry(RAY, False), entries)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["doctor"])
        self.assertIn(f"note: {RAY} constructs SGLang's Scheduler without calling "
                      f"load_plugins() first", out.getvalue())
        self.assertIn(f"scheduler entry points calling load_plugins() first: {FORKED}",
                      out.getvalue())

    def test_removed_call_is_seen(self) -> None:
        """A release whose scheduler process no longer calls load_plugins(): named."""
        edit = {"srt/managers/scheduler.py": ("\n    load_plugins()\n", "\n    pass\n")}
        self.assertIn(SchedulerEntry(FORKED, False), entries_after(edit))

    def test_added_call_is_seen(self) -> None:
        """A release whose Ray actor calls load_plugins() before building the Scheduler:
        no longer named."""
        edit = {"srt/ray/scheduler_actor.py": (
            "        self.scheduler = Scheduler(",
            "        from sglang.srt.plugins import load_plugins\n        load_plugins()\n"
            "        self.scheduler = Scheduler(")}
        self.assertIn(SchedulerEntry(RAY, True), entries_after(edit))

    def test_call_after_the_scheduler_does_not_count(self) -> None:
        """load_plugins() moved after the Scheduler is built is too late: named."""
        edit = {"srt/ray/scheduler_actor.py": (
            "        self._tp_rank = tp_rank\n",
            "        from sglang.srt.plugins import load_plugins\n        load_plugins()\n"
            "        self._tp_rank = tp_rank\n")}
        self.assertIn(SchedulerEntry(RAY, False), entries_after(edit))


if __name__ == "__main__":
    unittest.main()
