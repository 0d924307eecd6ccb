"""A server launch whose scheduler ranks all fail in SGLang's real ``run_scheduler_process``.

Run as a script (``python scheduler_race_child.py DIR RANKS``) it is a launcher: it runs
SGLang's own ``load_plugins()`` as SGLang's engine does, installs SGLang's launch-phase
SIGQUIT behaviour (``kill_process_tree`` of itself, SGLang's own helper), starts ``RANKS``
``spawn`` processes and releases them together. Each rank runs ``load_plugins()`` and
SGLang's real ``run_scheduler_process``; its scheduler class is one whose construction
makes SGLang's bootstrap-queue call to ``setup_state_kv_args`` from the prefill queue's
module (as in tests/test_scheduler_handler.py). SGLang's handler logs the traceback, then
SIGQUITs the launcher, and with ``SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION=1`` SIGKILLs the
process group: ranks die wherever they are. Each rank logs to ``DIR/rank<i>.log``.
"""

from __future__ import annotations

import glob
import inspect
import multiprocessing
import os
import signal
import sys
import time
import types
from typing import Any

import scheduler_child
from sglang.test.ci.ci_register import register_cpu_ci

# SGLang's run_suite.py collects every *.py next to the tests and requires a registry in
# each; a disabled one marks a helper module (listed as skipped, never run).
register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")


class _QueueStartingScheduler:
    # Constructing SGLang's Scheduler starts its bootstrap queue, which calls
    # setup_state_kv_args; this one makes that call from the prefill queue's module.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import sglang.srt.disaggregation.prefill as prefill

        from sglang_dsv4_guard.testing import new_kv_args, three_mismatch_pair

        call = compile("setup_state_kv_args(kv, *pools)", prefill.__file__, "exec")
        exec(call, vars(prefill), {"kv": new_kv_args(), "pools": three_mismatch_pair()})


def failing_scheduler() -> dict[str, Any]:
    """Make SGLang's scheduler module construct :class:`_QueueStartingScheduler`, with the
    process set-up before its ``try`` (it needs a real server) as no-ops; the arguments
    for its ``run_scheduler_process``."""
    import sglang.srt.managers.scheduler as scheduler

    scheduler.Scheduler = _QueueStartingScheduler  # type: ignore[misc,assignment]
    for name in ("load_plugins", "configure_scheduler_process", "publish",
                 "resolve_spawn_dp_rank", "spawn_world_rank", "SpawnRanks"):
        if hasattr(scheduler, name):
            setattr(scheduler, name, lambda *a, **k: None)
    if hasattr(scheduler, "get_observability"):
        scheduler.get_observability = lambda: types.SimpleNamespace(enable_trace=False)
    params = inspect.signature(scheduler.run_scheduler_process).parameters
    kwargs: dict[str, Any] = {n: None for n, p in params.items()
                              if p.default is inspect.Parameter.empty}
    kwargs["server_args"] = types.SimpleNamespace(enable_trace=False)
    return kwargs


def rank(out: str, go: Any) -> None:
    """One scheduler rank: log to ``out``, wait for ``go``, run run_scheduler_process."""
    scheduler_child.log_to(out, "%(name)s %(levelname)s %(message)s")
    from sglang.srt.plugins import load_plugins

    load_plugins()
    import sglang.srt.managers.scheduler as scheduler

    kwargs = failing_scheduler()
    with open(out + ".ready", "w", encoding="utf-8"):
        pass
    go.wait(300)
    scheduler.run_scheduler_process(**kwargs)


def launcher(directory: str, ranks: int) -> None:
    from sglang.srt.plugins import load_plugins
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    signal.signal(signal.SIGQUIT, lambda *_: kill_process_tree(os.getpid()))
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs = [ctx.Process(target=rank, args=(os.path.join(directory, f"rank{i}.log"), go))
             for i in range(ranks)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + 300
    while len(glob.glob(os.path.join(directory, "*.ready"))) < ranks \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    go.set()
    for proc in procs:
        proc.join(120)


if __name__ == "__main__":
    launcher(sys.argv[1], int(sys.argv[2]))
