"""Guard overhead as a ratio against the unwrapped SGLang function, in the same run.

Both pass paths are timed interleaved (best of several repeats) on SGLang's real
functions: setup_state_kv_args on a healthy DSV4 target+draft pair, and
MoriKVManager._send_swa_dsa_state with a trivial transfer plan (MORI stubbed).
"""

from __future__ import annotations

import logging
import os
import sys
import timeit
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import mori_stub  # noqa: E402

mori_stub.install_stub()
import sglang.srt.disaggregation.mori.conn as conn  # noqa: E402
import sglang.srt.disaggregation.utils as utils  # noqa: E402

import sglang_dsv4_guard  # noqa: E402
from sglang_dsv4_guard.testing import build_pair, new_kv_args  # noqa: E402


def best(fn, number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def measure(label: str, raw, wrapped, number: int, rounds: int = 5) -> None:
    raw_t, wrapped_t = [], []
    for _ in range(rounds):  # interleave so drift hits both alike
        raw_t.append(best(raw, number, 3))
        wrapped_t.append(best(wrapped, number, 3))
    r, w = min(raw_t), min(wrapped_t)
    print(f"{label}: unwrapped {r * 1e6:.2f} us, guarded {w * 1e6:.2f} us, ratio {w / r:.3f}")


def main() -> None:
    raw_setup = utils.setup_state_kv_args
    raw_send = vars(conn.MoriKVManager)["_send_swa_dsa_state"]
    target, draft = build_pair()
    kv = new_kv_args()
    mgr = mori_stub.manager(conn, attn_tp=8)
    args = mori_stub.send_args(conn, mori_stub.peer(conn, decode_tp=8), "swa")
    logging.getLogger("sglang_dsv4_guard").setLevel(logging.CRITICAL)
    sglang_dsv4_guard.install("on", load_entry_points=False)
    try:
        guarded_setup = utils.setup_state_kv_args
        guarded_send = vars(conn.MoriKVManager)["_send_swa_dsa_state"]
        measure("setup_state_kv_args pass path", lambda: raw_setup(kv, target, draft),
                lambda: guarded_setup(kv, target, draft), number=2000)
        measure("_send_swa_dsa_state pass path", lambda: raw_send(mgr, *args),
                lambda: guarded_send(mgr, *args), number=20000)
    finally:
        sglang_dsv4_guard.uninstall()


if __name__ == "__main__":
    main()
