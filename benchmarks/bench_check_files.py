"""Ten prefill/decode pairs in one ``check -f`` run, against ten single ``check`` runs.

The ten pairs are DeepSeek-V4 args files (one directory per pair: ``prefill.args``,
``decode.args``), half of them broken (page size, transfer backend, KV dtype,
speculative settings). Measured: wall time of one ``sglang-dsv4-guard check -f DIR``
(one check process, one SGLang import, every pair), of one single ``check --prefill
--decode`` run, and of the ten single runs one after another; each a fresh interpreter,
``ROUNDS`` times, medians printed with the ratios. The target (issue 33): the ten pairs
in one run cost at most twice one single run.

Usage: ``python benchmarks/bench_check_files.py [ROUNDS]`` (default 1).
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DSV4 = os.path.abspath(os.path.join(HERE, os.pardir, "tests", "data", "deepseek_v4"))
EAGLE = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")
BASE = f"--model-path {DSV4} --trust-remote-code --tp-size 8 {EAGLE}"
# (prefill extra, decode extra, prefill backend, decode backend)
PAIRS = [("", "", "mooncake", "mooncake"), ("", "", "nixl", "nixl"),
         ("", "", "mooncake", "nixl"), ("--kv-cache-dtype fp8_e4m3", "", "mooncake", "mooncake"),
         ("--page-size 64", "", "mooncake", "mooncake"), ("", "--tp-size 16", "mooncake", "mooncake"),
         ("", "--speculative-num-draft-tokens 2 --speculative-num-steps 1", "nixl", "nixl"),
         ("--dp-size 8 --enable-dp-attention", "", "mooncake", "mooncake"),
         ("", "", "mori", "mori"), ("", "--pp-size 2", "mooncake", "mooncake")]


def _line(role: str, extra: str, backend: str) -> str:
    return (f"{BASE} --disaggregation-mode {role} --disaggregation-transfer-backend {backend} "
            f"{extra}").strip()


def _timed(argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{shlex.join(argv[:4])}... exited {done.returncode}: "
                         f"{done.stderr.strip()[-500:]}")
    return time.perf_counter() - start, done.returncode


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    cli = [sys.executable, "-c", "import sys; from sglang_dsv4_guard.cli import main; "
           "sys.exit(main())", "check"]
    lines = [(_line("prefill", p, pb), _line("decode", d, db)) for p, d, pb, db in PAIRS]
    with tempfile.TemporaryDirectory(prefix="bench-check-files-") as tmp:
        for i, (prefill, decode) in enumerate(lines):
            os.makedirs(os.path.join(tmp, f"pair{i:02d}"))
            for role, line in (("prefill", prefill), ("decode", decode)):
                with open(os.path.join(tmp, f"pair{i:02d}", f"{role}.args"), "w") as f:
                    f.write(line + "\n")
        many, single, ten = [], [], []
        for _ in range(rounds):
            many.append(_timed([*cli, "-f", tmp, "--quiet"])[0])
            runs = [_timed([*cli, f"--prefill={p}", f"--decode={d}"])[0] for p, d in lines]
            single.append(statistics.median(runs))
            ten.append(sum(runs))
    m, s, t = (statistics.median(x) for x in (many, single, ten))
    print(f"{len(lines)} pairs in one check -f run: {m:.1f} s; one single check run: {s:.1f} s "
          f"(median of {len(lines)}); {len(lines)} single runs: {t:.1f} s")
    print(f"one run of {len(lines)} pairs / one single run: {m / s:.2f}x (target <= 2x); "
          f"/ {len(lines)} single runs: {m / t:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
