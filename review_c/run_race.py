import subprocess, os, tempfile, glob, sys
env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_DSV4_GUARD", "SGLANG_PLUGINS"))}
env.update(SGLANG_DSV4_GUARD="1", SGLANG_PLUGINS="dsv4_guard", PYTHONPATH=os.getcwd()+":"+os.getcwd()+"/review_c")
env.update(dict(a.split("=",1) for a in sys.argv[3:]))
zero = 0
for trial in range(int(sys.argv[2])):
    d = tempfile.mkdtemp(prefix="race")
    p = subprocess.run(["setsid", ".venv/bin/python", "review_c/scheduler_race.py", d, sys.argv[1], "0"], env=env, capture_output=True, text=True, timeout=300)
    full = 0; lines = []
    for f in sorted(glob.glob(d + "/*.log")):
        t = open(f).read()
        full += t.count("[DSV4G001] error:")
        lines.append((os.path.basename(f), "claimant-pointer" if "whose traceback" in t else ("elsewhere-pointer" if "by another process" in t else "-"), "handler" if "Scheduler hit" in t else "-"))
    print("trial", trial, "full copies:", full, lines, flush=True)
    zero += full == 0
    if full == 0:
        for f in sorted(glob.glob(d + "/*.log")): print("==", f); print(open(f).read()[:1200])
print("trials with ZERO full reports:", zero)
