"""A server launch with SGLang's metrics, as SGLang's launcher does it, for test_metrics.

Run as a script (``python metrics_launch.py OUT_DIR``) it is a launcher that starts the
servers of :data:`SERVERS` one after the other, as SGLang's launcher does: before each, its
own ``set_prometheus_multiproc_dir()`` (as ``launch_server`` does with
``--enable-metrics``), once its own ``load_plugins()``; then one ``spawn`` process per
scheduler (:func:`scheduler`), together. Once they ended, SGLang's
``add_prometheus_middleware`` on a FastAPI app, served by uvicorn on 127.0.0.1, is scraped
once: ``OUT_DIR/<server>.metrics``, and the directory's file names ``<server>.files``.

Each scheduler loads plug-ins (the guard installs from ``SGLANG_DSV4_GUARD``), then
publishes its ``ServerArgs`` as SGLang's scheduler does, in that order (SGLang's parser,
``from_cli_args``, its publish shim; ``--enable-metrics`` as :data:`SERVERS` says), and
meets a start-up failure (``setup_state_kv_args`` on the three-mismatch pair; rank 1 after
rank 0 printed it). Then
rank 0, through SGLang's real functions:

- of the prefill: a NIXL decode peer registering with another TP
  (``NixlKVManager._add_remote_peer``);
- of a decode: a guard plug-in that raises, and a first-contact mismatch twice
  (``CommonKVManager.try_ensure_parallel_info`` against a bootstrap server on 127.0.0.1
  answering another page size).

Its log goes to ``OUT_DIR/<server>-<rank>.log``; its last line says whether
``prometheus_client`` was imported in the process.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import hookimpl

# SGLang's run_suite.py collects every *.py next to the tests and requires a registry in
# each; a disabled one marks a helper module (listed as skipped, never run).
register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")

DSV4 = Path(__file__).parent / "data" / "deepseek_v4"
#: The servers launched, one after the other: name, role, --enable-metrics, TP ranks.
SERVERS = (("prefill", "prefill", True, 2), ("decode", "decode", True, 1),
           ("decode-off", "decode", False, 1))
# The decode's first contact: the prefill answers page size 64, the decode runs 128.
PREFILL = dict(attn_tp_size=4, attn_cp_size=1, pp_size=2, page_size=64,
               kv_cache_dtype_str="bf16", enable_kv_cache_sharding=False)
DECODE = dict(attn_tp_size=4, attn_cp_size=1, pp_size=2, page_size=128,
              kv_cache_dtype_str="bf16", dcp_size=1, is_mla_backend=True)
IMPORTED = "prometheus_client imported:"


def _publish(role: str, metrics: bool) -> None:
    """Publish this scheduler's ServerArgs as SGLang's scheduler does."""
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = ["--model-path", str(DSV4), "--device", "cpu", "--disaggregation-mode", role]
    args = parser.parse_args(argv + (["--enable-metrics"] if metrics else []))
    set_global_server_args_for_scheduler(ServerArgs.from_cli_args(args))


def _prefill() -> None:
    import peers_real
    from sglang.srt.disaggregation.nixl import conn as nixl

    swa = nixl.StateType("swa")
    _, info = peers_real.registration(nixl, "nixl", tp=2)
    manager = peers_real.prefill(nixl, "nixl", tp=1, state_types=(swa,))
    # AttributeError: past the registration, in what a half-built manager lacks
    with contextlib.suppress(AttributeError):
        nixl.NixlKVManager._add_remote_peer(manager, info)


class _Hostile:
    """A guard plug-in whose first-contact check raises (DSV4G090)."""

    @hookimpl
    def sglang_dsv4_guard_check_first_contact(self, contact: Any, context: Any) -> list[Any]:
        raise RuntimeError("hostile plug-in")


def _decode() -> None:
    import pd_real
    from sglang.srt.disaggregation.common import conn

    import sglang_dsv4_guard.lifecycle as lifecycle

    current = lifecycle.installation()
    assert current is not None, "the guard did not install from SGLANG_DSV4_GUARD"
    current.plugins.pm.register(_Hostile(), "hostile")
    with pd_real.bootstrap_server(pd_real.route_answer(PREFILL)) as server:
        for _ in range(2):
            # SGLang's refusal, with the guard's report: in the log
            with contextlib.suppress(Exception):
                conn.CommonKVManager.try_ensure_parallel_info(
                    pd_real.decode_manager(DECODE), server.addr)


def _wait(path: str) -> None:
    deadline = time.monotonic() + 600
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited 600 s for {path}")
        time.sleep(0.02)


def scheduler(role: str, rank: int, metrics: bool, log_path: str, flag: str) -> None:
    """One scheduler process (TP rank ``rank`` of its server): publish, load plug-ins,
    meet the reports, say what it imported. Rank 1 meets the start-up failure once rank 0
    printed it (``flag``), as a scheduler of the same launch that meets it later."""
    import logging

    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("LOG %(levelname)s %(name)s %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    from sglang.srt.plugins import load_plugins

    load_plugins()  # SGLang's scheduler loads the plug-ins, then publishes its arguments
    _publish(role, metrics)
    import sglang.srt.disaggregation.utils as utils

    from sglang_dsv4_guard.testing import new_kv_args, three_mismatch_pair

    if rank:
        _wait(flag)
    with contextlib.suppress(Exception):  # SGLang's refusal with the guard's report: logged
        utils.setup_state_kv_args(new_kv_args(), *three_mismatch_pair())
    if not rank:
        Path(flag).touch()
        _prefill() if role == "prefill" else _decode()
    with open(log_path, "a", encoding="utf-8") as out:
        out.write(f"{IMPORTED} {'prometheus_client' in sys.modules}\n")


def scrape() -> str:
    """SGLang's /metrics on a FastAPI app, served by uvicorn on 127.0.0.1, asked once."""
    import uvicorn
    from fastapi import FastAPI
    from sglang.srt.utils.common import add_prometheus_middleware

    app = FastAPI()
    add_prometheus_middleware(app)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (server.started and server.servers):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
            return str(answer.read().decode())
    finally:
        server.should_exit = True
        thread.join(30)


def main(out_dir: str) -> int:
    from sglang.srt.plugins import load_plugins
    from sglang.srt.utils import common

    load_plugins()  # as SGLang's launcher does: the launch identity the schedulers inherit
    ctx = multiprocessing.get_context("spawn")
    for server, role, metrics, ranks in SERVERS:
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        common.set_prometheus_multiproc_dir()
        directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
        flag = os.path.join(out_dir, f"{server}.printed")
        procs = [ctx.Process(target=scheduler, args=(
            role, rank, metrics, os.path.join(out_dir, f"{server}-{rank}.log"), flag))
            for rank in range(ranks)]
        for proc in procs:
            proc.start()
        for rank, proc in enumerate(procs):
            proc.join(900)
            if proc.exitcode != 0:
                print(f"scheduler {server}-{rank} exited with {proc.exitcode}")
                for other in procs:
                    other.kill()
                return 1
        Path(out_dir, f"{server}.metrics").write_text(scrape(), encoding="utf-8")
        Path(out_dir, f"{server}.files").write_text(
            "\n".join(sorted(os.listdir(directory))), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main(sys.argv[1]))
