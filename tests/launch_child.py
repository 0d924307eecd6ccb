"""A server launch as SGLang does it, for the cross-process deduplication tests.

Run as a script (``python launch_child.py SPEC``, SPEC a JSON file holding a list of
launches, each a list of scheduler specs; :func:`start_launcher` writes it) it is a
launcher: it runs SGLang's own ``load_plugins()`` in this process, as SGLang's engine
and ``launch_server`` do before they start schedulers, then, launch after launch, starts
one ``spawn`` process per spec and waits for all. :func:`scheduler` is what each
scheduler does; a spec is a dict with

- ``pair`` and ``out``: what :func:`scheduler_child.run` runs and where it writes;
- ``wait_for``: files to wait for before meeting the report; ``done``: a file created after;
- ``base`` and ``counts``: a marker base directory used instead of the real one, and a file
  receiving how many marker directories the process removed, and how many of those
  while a deduplicator's lock was held.

:func:`pool_initializer` and :func:`pool_task` run the same specs in a worker pool;
:func:`launch_through_a_bystander` starts a grandchild through a process with no guard.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import secrets
import subprocess
import sys
import time
from typing import Any
from unittest import mock

import scheduler_child
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.dedup.identity import Launch

# SGLang's run_suite.py collects every *.py next to the tests and requires a registry in
# each; a disabled one marks a helper module (listed as skipped, never run).
register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")

_WAIT_SECONDS = 300.0


def _wait(paths: list[str]) -> None:
    deadline = time.monotonic() + _WAIT_SECONDS
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {_WAIT_SECONDS:.0f} s for {paths}")
        time.sleep(0.02)


def _counted_run(spec: dict[str, Any]) -> None:
    """Run the scheduler with the marker base at ``spec['base']``, counting removals."""
    from sglang_dsv4_guard.dedup import markers as dedup

    instances: list[Any] = []
    counts = {"removed": 0, "removed_under_lock": 0}
    init, remove = dedup.ServerDedup.__init__, dedup._remove_private

    def record(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        instances.append(self)

    def count(path: Any, *args: Any, **kwargs: Any) -> bool:
        counts["removed"] += 1
        counts["removed_under_lock"] += any(d._lock.locked() for d in instances)
        return bool(remove(path, *args, **kwargs))

    with mock.patch.object(dedup, "_base_dir", return_value=spec["base"]), \
            mock.patch.object(dedup.ServerDedup, "__init__", record), \
            mock.patch.object(dedup, "_remove_private", count):
        scheduler_child.run(spec["pair"], spec["out"])
    with open(spec["counts"], "w", encoding="utf-8") as out:
        json.dump(counts, out)


def scheduler(spec: dict[str, Any]) -> None:
    """One scheduler: wait as told, meet the report, say it is done."""
    _wait(spec.get("wait_for", []))
    if "base" in spec:
        _counted_run(spec)
    else:
        scheduler_child.run(spec["pair"], spec["out"])
    if "done" in spec:
        with open(spec["done"], "w", encoding="utf-8"):
            pass


def launch_of(pid: int, start: int | None, namespace: int | None = None) -> Launch:
    """A launch identity minted by ``pid`` (started at ``start``), in our PID namespace."""
    ns = namespace if namespace is not None else os.stat("/proc/self/ns/pid").st_ino
    return Launch(secrets.token_hex(16), ns, pid, start if start is not None else -1)


_barrier: Any = None


def pool_initializer(barrier: Any) -> None:
    """Keep the pool's barrier: every task waits on it, so no worker runs two tasks."""
    global _barrier
    _barrier = barrier


def pool_task(spec: dict[str, Any]) -> int:
    """A scheduler run by a pre-started pool worker; returns the worker's PID."""
    scheduler(spec)
    _barrier.wait(_WAIT_SECONDS)
    return os.getpid()


def launch(launches: list[list[dict[str, Any]]]) -> int:
    """Load plug-ins as SGLang's launcher does, then, one launch after the other, start
    each launch's schedulers and wait for them. Returns the worst exit code."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    ctx = multiprocessing.get_context("spawn")
    worst = 0
    for specs in launches:
        procs = [ctx.Process(target=scheduler, args=(spec,)) for spec in specs]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(_WAIT_SECONDS * 2)
            worst = max(worst, 1 if proc.exitcode is None else abs(proc.exitcode))
    return worst


def _print_joined() -> None:
    from sglang_dsv4_guard.dedup import identity as launch_identity

    joined = launch_identity.joined_launch()
    print("JOINED", joined.name if joined else None, flush=True)


def _bystander() -> None:
    """Runs no guard, starts a process: the launch in its environment stays its parent's."""
    proc = multiprocessing.get_context("spawn").Process(target=_print_joined)
    proc.start()
    proc.join()
    sys.exit(proc.exitcode)


def launch_through_a_bystander() -> int:
    """Open a launch (printing ``MINTED <name>``) and start a child that runs no guard and
    starts a grandchild, which prints ``JOINED <name>`` of the launch it joined."""
    from sglang_dsv4_guard.dedup import identity as launch_identity

    launch_identity.open_launch()
    minted = launch_identity.minted_launch()
    print("MINTED", minted.name if minted else None, flush=True)
    proc = multiprocessing.get_context("spawn").Process(target=_bystander)
    proc.start()
    proc.join()
    return proc.exitcode or 0


GUARD_ON = {"SGLANG_DSV4_GUARD": "1", "SGLANG_PLUGINS": "dsv4_guard"}


def start_launcher(launches: list[list[dict[str, Any]]], directory: str, name: str,
                   prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """Start this file as a launcher (under ``prefix``, e.g. ``unshare``, if given) in
    this environment without the guard's and plug-in variables, with the guard on."""
    spec_path = os.path.join(directory, f"{name}.json")
    with open(spec_path, "w", encoding="utf-8") as out:
        json.dump(launches, out)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SGLANG_DSV4_GUARD", "SGLANG_PLUGINS"))}
    return subprocess.Popen([*prefix, sys.executable, os.path.abspath(__file__), spec_path],
                            env={**env, **GUARD_ON}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str]) -> str:
    """Wait for a launcher; its output, or ``AssertionError`` if it failed."""
    output, _ = proc.communicate(timeout=_WAIT_SECONDS * 3)
    assert proc.returncode == 0, f"launcher exited with {proc.returncode}:\n{output}"
    return output


def read(path: str) -> str:
    with open(path, encoding="utf-8") as given:
        return given.read()


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as given:
        sys.exit(launch(json.load(given)))
