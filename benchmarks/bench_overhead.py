"""Guard overhead as a ratio against the unwrapped SGLang function, in the same run.

Both pass paths are timed interleaved (best of several repeats) on SGLang's real
functions: setup_state_kv_args on a healthy DSV4 target+draft pair, and
MoriKVManager._send_swa_dsa_state with a trivial transfer plan (MORI stubbed);
CommonKVManager.try_ensure_parallel_info (decode's first contact) on its two pass paths: the
prefill's info cached (what every later call does) and a successful fetch, the bootstrap
server's answer handed back in-process (a real HTTP round trip would hide the wrapper's
cost in its own noise), on a bare decode manager of equal values. Then the
cost the registration check adds per decode peer on SGLang's real NIXL
``_add_remote_peer`` (CPU time per peer, engine stubbed: a pair SGLang accepts and one it
refuses per request). Last, Mooncake's per-request path on the prefill that reads the peer
table: SGLang's real ``MooncakeKVManager._prefetch_staging_reqs`` (the prefill scheduler
calls it for every request of every batch, 0.5.16 - 0.5.23; with staging on it reads
``decode_kv_args_table`` twice per decode peer of the request), on a request paired with 8
decode peers registered by the release's own message code, with SGLang's plain dict
against the manager as the guard leaves it at ``start_prefill_thread``, in on mode (SGLang's
dict: the guard checks at the registration's parse, before 0.5.22, or its publishing
method, 0.5.22+) and in strict mode (before 0.5.22: the guard's ``WatchedTable``).

The guard runs with its metrics on (``install(metrics="on")``, a multiprocess directory of
this run's own set before anything imports ``prometheus_client``), as on a server launched
with ``--enable-metrics``: what it counts is said at the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
import timeit
import warnings
from types import SimpleNamespace
from unittest import mock

warnings.filterwarnings("ignore")
# Before SGLang's Mooncake module imports prometheus_client: its mode is fixed at import.
_METRICS_DIR = tempfile.TemporaryDirectory(prefix="bench-metrics-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _METRICS_DIR.name
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import mori_stub  # noqa: E402
import pd_real  # noqa: E402

mori_stub.install_stub()
import peers_real  # noqa: E402
import sglang.srt.disaggregation.mori.conn as conn  # noqa: E402
import sglang.srt.disaggregation.nixl.conn as nixl  # noqa: E402
import sglang.srt.disaggregation.utils as utils  # noqa: E402
from sglang.srt.disaggregation.common import conn as common  # noqa: E402

import sglang_dsv4_guard  # noqa: E402
from sglang_dsv4_guard.testing import build_pair, new_kv_args  # noqa: E402


def best(fn, number: int, repeat: int) -> float:
    """Seconds of this process' CPU time per call (other jobs on a shared machine take
    wall time, not this process' CPU time), best of ``repeat``."""
    return min(timeit.repeat(fn, number=number, repeat=repeat,
                             timer=time.process_time)) / number


def measure(label: str, raw, wrapped, number: int, rounds: int = 5) -> None:
    raw_t, wrapped_t = [], []
    for _ in range(rounds):  # interleave so drift hits both alike
        raw_t.append(best(raw, number, 3))
        wrapped_t.append(best(wrapped, number, 3))
    r, w = min(raw_t), min(wrapped_t)
    print(f"{label}: unwrapped {r * 1e6:.2f} us, guarded {w * 1e6:.2f} us, ratio {w / r:.3f}")


_PAIR = dict(attn_tp_size=1, attn_cp_size=1, pp_size=1, page_size=64, kv_cache_dtype_str="auto",
             enable_kv_cache_sharding=False, dcp_size=1, is_mla_backend=True)


def contact_paths() -> tuple[object, object, object]:
    """A cached call, a fetching call (the answer in-process) and the restore of requests."""
    body = pd_real.route_answer(_PAIR)
    response = type("Response", (), {"status_code": 200, "text": "",
                                      "json": staticmethod(lambda: dict(body))})()
    saved = common.requests
    common.requests = type("Requests", (), {"get": staticmethod(lambda url, timeout=None:
                                                                response)})()
    cached, fresh = pd_real.decode_manager(_PAIR), pd_real.decode_manager(_PAIR)
    cached.prefill_info_table["prefill:8998"] = object()

    def fetch(fn):
        def call():
            fresh.prefill_info_table = {}
            return fn(fresh, "prefill:8998")
        return call

    def restore() -> None:
        common.requests = saved
    return cached, fetch, restore


def main() -> None:
    raw_setup = utils.setup_state_kv_args
    raw_send = vars(conn.MoriKVManager)["_send_swa_dsa_state"]
    raw_contact = vars(common.CommonKVManager)["try_ensure_parallel_info"]
    target, draft = build_pair()
    kv = new_kv_args()
    mgr = mori_stub.manager(conn, attn_tp=8)
    args = mori_stub.send_args(conn, mori_stub.peer(conn, decode_tp=8), "swa")
    logging.getLogger("sglang_dsv4_guard").setLevel(logging.CRITICAL)
    sglang_dsv4_guard.install("on", load_entry_points=False, metrics="on")
    try:
        guarded_setup = utils.setup_state_kv_args
        guarded_send = vars(conn.MoriKVManager)["_send_swa_dsa_state"]
        measure("setup_state_kv_args pass path", lambda: raw_setup(kv, target, draft),
                lambda: guarded_setup(kv, target, draft), number=2000)
        measure("_send_swa_dsa_state pass path", lambda: raw_send(mgr, *args),
                lambda: guarded_send(mgr, *args), number=20000)
        guarded_contact = vars(common.CommonKVManager)["try_ensure_parallel_info"]
        cached, fetch, restore = contact_paths()
        try:
            measure("try_ensure_parallel_info cached", lambda: raw_contact(cached, "prefill:8998"),
                    lambda: guarded_contact(cached, "prefill:8998"), number=200000, rounds=15)
            measure("try_ensure_parallel_info fetch", fetch(raw_contact),
                    fetch(guarded_contact), number=5000, rounds=15)
        finally:
            restore()
        raw_register = vars(nixl.NixlKVManager)["_add_remote_peer"]
        for label, tp in (("accepted", 1), ("refused per request", 2)):
            per_peer(label, raw_register, nixl.NixlKVManager._add_remote_peer, tp)
        mooncake_per_peer()
        for mode in ("on", "strict"):
            sglang_dsv4_guard.install(mode, load_entry_points=False, metrics="on")
            plain, watched = mooncake_prefetch()
            measure(f"Mooncake _prefetch_staging_reqs (8 decode peers), as the guard in "
                    f"{mode} mode leaves the manager", plain, watched, number=50000, rounds=9)
    finally:
        sglang_dsv4_guard.uninstall()
    counted()


def counted() -> None:
    """What the guard counted during the run, as SGLang's /metrics collector reads it."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=_METRICS_DIR.name)
    totals: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.startswith("sglang:dsv4_guard_") and "info" not in sample.name:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    print("metrics on: " + (", ".join(f"{k} {v:g}" for k, v in sorted(totals.items()))
                            or "nothing counted"))


def mooncake_prefetch(peers: int = 8) -> tuple[object, object]:
    """SGLang's ``_prefetch_staging_reqs`` for one request paired with ``peers`` decode
    ranks of the prefill's TP (no staging needed: it returns after reading the table),
    on a prefill manager as SGLang builds it, and on one the installed guard watches as
    its ``start_prefill_thread`` does on this release and in its mode (0.5.22+: SGLang's
    own dict and an instance hook on the publishing method; before, in on mode: SGLang's
    own dict, in strict mode: the guard's WatchedTable)."""
    import sglang.srt.disaggregation.mooncake.conn as mooncake

    from sglang_dsv4_guard.lifecycle import installation
    from sglang_dsv4_guard.peers import mooncake as mooncake_peers

    current = installation()
    assert current is not None, "the guard is installed by main()"
    sessions = [f"decode-{i}" for i in range(peers)]
    registrations = {name: peers_real.registration(mooncake, "mooncake", tp=2, name=name)[1]
                     for name in sessions}
    infos = {name: type("TransferInfo", (), {"is_dummy": False,
                                             "mooncake_session_id": name})()
             for name in sessions}
    fn = vars(mooncake.MooncakeKVManager)["_prefetch_staging_reqs"]
    calls = []
    for watched in (False, True):
        mgr = peers_real.prefill(mooncake, "mooncake", tp=2)
        mgr.enable_staging, mgr.kv_buffer_tensors = True, object()
        mgr.transfer_infos = {7: dict(infos)}
        mgr.decode_kv_args_table = dict(registrations)
        if watched:
            mooncake_peers._watch(current.peers, mgr)
        fn(mgr, 7)  # returns after the reads: every peer has the prefill's TP
        calls.append(lambda mgr=mgr: fn(mgr, 7))
    return calls[0], calls[1]


def per_peer(label: str, raw, guarded, decode_tp: int, peers: int = 40) -> None:
    """CPU time per new decode peer, unwrapped then guarded, each peer registered once."""
    swa = nixl.StateType("swa")
    times = {0: [], 1: []}
    for round_ in range(4):  # round 0 warms both up; then interleaved, best kept
        for which, fn in enumerate((raw, guarded)):
            pairs = [(peers_real.prefill(nixl, "nixl", tp=1, state_types=(swa,)),
                      peers_real.registration(nixl, "nixl", tp=decode_tp,
                                              name=f"{label}{round_}{which}{i}")[1])
                     for i in range(peers)]
            start = time.process_time()
            for mgr, info in pairs:
                # past SGLang's checks it raises where the half-built manager ends
                with contextlib.suppress(Exception):
                    fn(mgr, info)
            if round_:
                times[which].append((time.process_time() - start) / peers)
    times = {k: min(v) for k, v in times.items()}
    print(f"NIXL _add_remote_peer, {label}: unwrapped {times[0] * 1e3:.3f} ms, guarded "
          f"{times[1] * 1e3:.3f} ms, added {(times[1] - times[0]) * 1e3:.3f} ms per peer")



def mooncake_per_peer(peers: int = 40) -> None:
    """CPU time per decode peer registering through SGLang's real Mooncake bootstrap
    thread (the process' CPU time, the thread's included), SGLang's own start and parse
    against the installed guard's (before 0.5.22 the parse hook, after it the publishing
    hook): peers with the prefill's TP and with another (one report, then counted)."""
    import sglang.srt.disaggregation.mooncake.conn as mooncake

    swa = mooncake.StateType("swa")
    cls, info = mooncake.MooncakeKVManager, mooncake.KVArgsRegisterInfo
    # the server configs 0.5.22+'s registration reads, published as a server without
    # speculative decoding or unified memory would
    with contextlib.ExitStack() as stack:
        for name, config in (("get_spec", SimpleNamespace(speculative_algorithm=None)),
                             ("get_memory", SimpleNamespace(enable_unified_memory=False))):
            if hasattr(mooncake, name):
                stack.enter_context(mock.patch.object(mooncake, name,
                                                      lambda config=config: config))
        _mooncake_rounds(mooncake, swa, cls, info, peers)


def _mooncake_rounds(mooncake, swa, cls, info, peers: int) -> None:
    import threading

    ours = {"start": vars(cls)["start_prefill_thread"], "parse": vars(info)["from_zmq"]}
    raw = {k: getattr(v, "__sglang_dsv4_guard_original__", v) for k, v in ours.items()}
    for label, tp in (("accepted", 1), ("another TP", 2)):
        times: dict[int, list[float]] = {0: [], 1: []}
        for round_ in range(4):  # round 0 warms both up; then interleaved, best kept
            for which, fns in enumerate((raw, ours)):
                frames = [peers_real.registration(mooncake, "mooncake", tp=tp, port=7000 + i,
                                                  name=f"{label}{round_}{which}{i}")[0]
                          for i in range(peers)]
                mgr = peers_real.prefill(mooncake, "mooncake", tp=1, state_types=(swa,))
                mgr.server_socket = peers_real.Socket(frames)
                info.from_zmq = fns["parse"]
                start = time.process_time()
                with contextlib.suppress(SystemExit):
                    fns["start"](mgr)
                    for t in threading.enumerate():
                        if t is not threading.current_thread() and t.name != "MainThread":
                            t.join(30)
                if round_:
                    times[which].append((time.process_time() - start) / peers)
                info.from_zmq = ours["parse"]
        best_ = {k: min(v) for k, v in times.items()}
        print(f"Mooncake registration, {label}: unwrapped {best_[0] * 1e3:.3f} ms, guarded "
              f"{best_[1] * 1e3:.3f} ms, added {(best_[1] - best_[0]) * 1e3:.3f} ms per peer")


if __name__ == "__main__":
    main()
