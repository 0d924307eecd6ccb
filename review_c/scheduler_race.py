"""Real SGLang run_scheduler_process in N spawn ranks under a launcher that ran load_plugins()
and installed SGLang's launch-phase SIGQUIT behaviour (kill_process_tree of itself)."""
import json, logging, multiprocessing, os, signal, sys, time, types, inspect

def rank(i, out, go, stop_claimant):
    h = logging.FileHandler(out); h.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    logging.getLogger().addHandler(h); logging.getLogger().setLevel(logging.INFO)
    from sglang.srt.plugins import load_plugins
    load_plugins()                       # activates the guard as SGLang's scheduler does
    import sglang.srt.disaggregation.prefill as prefill
    import sglang.srt.managers.scheduler as scheduler
    from sglang_dsv4_guard.testing import new_kv_args, three_mismatch_pair
    pools = three_mismatch_pair()
    class QueueStartingScheduler:
        def __init__(self, *a, **k):
            call = compile("setup_state_kv_args(kv, *pools)", prefill.__file__, "exec")
            exec(call, vars(prefill), {"kv": new_kv_args(), "pools": pools})
    scheduler.Scheduler = QueueStartingScheduler
    for name in ("load_plugins", "configure_scheduler_process", "publish",
                 "resolve_spawn_dp_rank", "spawn_world_rank", "SpawnRanks"):
        if hasattr(scheduler, name):
            setattr(scheduler, name, lambda *a, **k: None)
    if hasattr(scheduler, "get_observability"):
        scheduler.get_observability = lambda: types.SimpleNamespace(enable_trace=False)
    params = inspect.signature(scheduler.run_scheduler_process).parameters
    kw = {n: None for n, p in params.items() if p.default is inspect.Parameter.empty}
    kw["server_args"] = types.SimpleNamespace(enable_trace=False)
    open(out + '.ready', 'w').close()
    go.wait()
    scheduler.run_scheduler_process(**kw)

def launcher(d, n, stop_claimant):
    from sglang.srt.plugins import load_plugins
    from sglang.srt.utils import kill_process_tree
    load_plugins()
    # SGLang's launch_phase_sigquit_handler: log, then kill the whole process tree
    signal.signal(signal.SIGQUIT, lambda s, f: kill_process_tree(os.getpid()))
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs = [ctx.Process(target=rank, args=(i, f"{d}/rank{i}.log", go, stop_claimant)) for i in range(n)]
    for p in procs: p.start()
    import glob
    while len(glob.glob(d + "/*.ready")) < n: time.sleep(0.05)
    time.sleep(0.5)
    go.set()
    for p in procs: p.join(60)

if __name__ == "__main__":
    launcher(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1")
