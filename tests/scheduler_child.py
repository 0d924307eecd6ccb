"""What one SGLang scheduler process does, for tests that start several with ``spawn``.

``run`` is the target of a ``multiprocessing`` spawn-context process, as SGLang's
``run_scheduler_process`` is: it runs SGLang's own ``load_plugins()`` (which activates
the guard from ``SGLANG_DSV4_GUARD``), then SGLang's real ``setup_state_kv_args`` on a
named pool pair, and writes what the process would print (its log, and the traceback
SGLang prints for the error) to ``out_path``.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from sglang.test.ci.ci_register import register_cpu_ci

# SGLang's run_suite.py collects every *.py next to the tests and requires a registry in
# each; a disabled one marks a helper module (listed as skipped, never run).
register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")


def _pair(name: str) -> tuple[Any, Any]:
    from sglang_dsv4_guard.testing import PoolSpec, build_pair, three_mismatch_pair

    if name == "three":  # DSV4G001 + DSV4G004 + DSV4G005
        return three_mismatch_pair()
    if name == "unified":  # DSV4G002
        return build_pair(target=PoolSpec(unified=True))
    raise ValueError(f"pair must be 'three' or 'unified' (got {name!r})")


def log_to(out_path: str, fmt: str = "LOG %(levelname)s %(message)s") -> None:
    """Send this process' log records (INFO and above) to ``out_path``."""
    handler = logging.FileHandler(out_path)
    handler.setFormatter(logging.Formatter(fmt))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)


def run(pair: str, out_path: str) -> None:
    """Load plug-ins as a scheduler does, run the real function, record the output."""
    log_to(out_path)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    import sglang.srt.disaggregation.utils as utils

    from sglang_dsv4_guard.testing import new_kv_args

    try:
        utils.setup_state_kv_args(new_kv_args(), *_pair(pair))
    except Exception:
        with open(out_path, "a", encoding="utf-8") as out:
            out.write("TRACEBACK " + traceback.format_exc())
