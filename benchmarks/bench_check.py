"""CPU time of ``sglang-dsv4-guard check`` against SGLang's own resolution of the same lines.

Each measurement is a fresh interpreter (user + system CPU time of it and of every
process it starts, from ``getrusage(RUSAGE_CHILDREN)``), repeated ``ROUNDS`` times; the
medians are printed with their ratio. The baseline is what SGLang itself does with the two
launch lines: its parser (``ServerArgs.add_cli_args``) and its whole resolution
(``ServerArgs.from_cli_args`` and, from 0.5.22, ``resolve_once``) as ``--device cuda``,
both servers in one interpreter. ``check`` does that and more (``ModelConfig``, the
miniature pools of a DeepSeek-V4 pair with a draft, the MORI and asymmetry checks, the
prefill/decode contract rows), in its parent process and the one child it starts for both
servers. Both of the README's pairs are measured (:data:`PAIRS`).

Usage: ``python benchmarks/bench_check.py [ROUNDS]`` (default 3).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DSV4 = os.path.join(HERE, os.pardir, "tests", "data", "deepseek_v4")
NEXTN = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")
GPT_OSS = os.path.join(HERE, os.pardir, "tests", "data", "gpt_oss")
# The README's pairs: DeepSeek-V4 with NextN on MORI (the pools and MORI's check), and
# gpt-oss P TP1 / D TP4 on Mooncake (the PD contract rows: first contact, the transfer
# conditions, the state types of a miniature SWA pool, the metadata buffers).
PAIRS = {
    "DeepSeek-V4 + NextN, MORI, TP 8": {
        role: f"--model-path {DSV4} --disaggregation-mode {role} "
              f"--disaggregation-transfer-backend mori --tp-size 8 {NEXTN}"
        for role in ("prefill", "decode")},
    "gpt-oss, Mooncake, P TP1 / D TP4": {
        role: f"--model-path {GPT_OSS} --disaggregation-mode {role} "
              f"--disaggregation-transfer-backend mooncake --tp-size {tp}"
        for role, tp in (("prefill", 1), ("decode", 4))},
}

RESOLVE = r"""
import argparse, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
for line in sys.argv[1:]:
    namespace = parser.parse_args(line.split())
    namespace.device = "cuda"
    server_args = ServerArgs.from_cli_args(namespace)
    getattr(server_args, "resolve_once", lambda: None)()
"""
CHECK = "import sys; from sglang_dsv4_guard.cli import main; sys.exit(main(sys.argv[1:]))"


def cpu_seconds(argv: list[str]) -> float:
    """User + system CPU seconds of ``argv`` and its descendants."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv[:3]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(name: str, lines: dict[str, str], rounds: int) -> None:
    """Print the median CPU seconds of each for one pair and the ratio."""
    resolve, check = [], []
    for _ in range(rounds):
        resolve.append(cpu_seconds([sys.executable, "-c", RESOLVE, *lines.values()]))
        check.append(cpu_seconds([sys.executable, "-c", CHECK, "check", "--prefill",
                                  lines["prefill"], "--decode", lines["decode"]]))
    base, ours = statistics.median(resolve), statistics.median(check)
    print(f"{name}:")
    print(f"  SGLang's resolution of both lines: {base:.2f} s CPU (median of {rounds}: "
          f"{', '.join(f'{t:.2f}' for t in resolve)})")
    print(f"  sglang-dsv4-guard check:           {ours:.2f} s CPU (median of {rounds}: "
          f"{', '.join(f'{t:.2f}' for t in check)})")
    print(f"  ratio: {ours / base:.2f}x")


def main() -> int:
    """Measure every pair of :data:`PAIRS`."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for name, lines in PAIRS.items():
        measure(name, lines, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
