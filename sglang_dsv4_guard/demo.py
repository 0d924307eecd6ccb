"""``make demo``: SGLang's real check on a built-in scenario, unguarded, then guarded."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import sglang_dsv4_guard
from sglang_dsv4_guard.host.targets import STATE
from sglang_dsv4_guard.log import silenced
from sglang_dsv4_guard.samples import build_pair, new_kv_args, three_mismatch_pair

__all__ = ["run_demo"]


def run_demo() -> int:
    """Print SGLang's one line, then the guard's full report, then a passing pair. Exit 0."""
    with silenced():  # the error shows the report
        warnings.filterwarnings("ignore")  # SGLang warns about missing GPU kernels on import
        # Only the demo imports SGLang, after silencing its warnings.
        utils = importlib.import_module(STATE.module)  # unscanned: SGLang's (host/targets)

        def setup_state_kv_args(*args: Any) -> Any:  # SGLang's, or the guard's once installed
            return getattr(utils, STATE.qualname)(*args)

        print("== 1. SGLang alone: a DeepSeek-V4 draft pool with three problems ==\n")
        try:
            setup_state_kv_args(new_kv_args(), *three_mismatch_pair())
        except RuntimeError as exc:
            print(f"RuntimeError: {exc}\n")
        print("== 2. The same pools with the guard (SGLANG_DSV4_GUARD=1) ==\n")
        sglang_dsv4_guard.install("on", load_entry_points=False)
        try:
            try:
                setup_state_kv_args(new_kv_args(), *three_mismatch_pair())
            except sglang_dsv4_guard.DSV4GuardError as exc:
                print(f"DSV4GuardError: {exc}\n")
                print(f"codes: {', '.join(f.code for f in exc.findings)}\n")
            print("== 3. A healthy pair, guarded: SGLang accepts it, the guard stays quiet ==\n")
            kv_args = new_kv_args()
            setup_state_kv_args(kv_args, *build_pair())
            names = [str(getattr(s, "value", s)) for s in kv_args.state_types]
            print(f"ok: state components registered: {names}")
        finally:
            sglang_dsv4_guard.uninstall()
        return 0
