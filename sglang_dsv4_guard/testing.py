"""What a plug-in author needs to test a guard plug-in, on SGLang's real classes.

- Pools: :func:`build_pair` makes a target and a draft pool of SGLang's own
  ``DeepSeekV4TokenToKVPool`` class, built with ``object.__new__`` plus the attributes
  ``setup_state_kv_args`` reads, as SGLang's CPU tests build theirs (no GPU, no model);
  :class:`PoolSpec` says how each differs from a healthy paged pool.
- Hooks: :func:`check_pools` and :func:`check_transfer` run the built-ins and your
  plug-ins through the guard's real plug-in manager (the same isolation, ordering and
  ``DSV4G090`` handling as in a server) and return the :class:`Report`;
  :class:`Recorder` is a reporter that keeps every report it is handed.
- The installed guard: :func:`record` and :func:`register` add a recorder or a plug-in
  to the guard ``install()`` put in place.

The demo and the project's own tests use this module too. Imports sglang and torch only
when a function that needs them is called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sglang_dsv4_guard.findings import Report
from sglang_dsv4_guard.hookspecs import hookimpl
from sglang_dsv4_guard.host.targets import MORI_SEND

if TYPE_CHECKING:
    from sglang_dsv4_guard.mori.snapshot import SendSnapshot

__all__ = [
    "PoolSpec",
    "Recorder",
    "build_pair",
    "check_pools",
    "check_transfer",
    "new_kv_args",
    "record",
    "register",
]

# How the draft's mapping relates to the target's.
MAPPING_KINDS = ("shared", "view", "clone", "different", "none", "missing")


@dataclass(frozen=True)
class PoolSpec:
    """The values one pool is built with. Defaults describe a healthy paged pool."""

    compression_ratios: tuple[int, ...] = (0,)
    unified: bool = False
    page_size: int = 256
    sliding_window: int = 128
    ring: tuple[int, int, int] = (128, 130, 2)  # unified: window, ring size, ring pages
    request_capacity: int | None = None  # target: encoder-replay request window
    swa_req_ring_size: int | None = None  # draft: DSpark SWA ring
    swa_size: int = 64
    layers: int = 1
    extra: dict[str, Any] = field(default_factory=dict, hash=False)


class _Buffers:
    """Stands in for an SGLang sub-pool: only the attributes the buf-info getters read."""

    def __init__(self, page_size: int, rows: int, layers: int, swa_pages: int = 0) -> None:
        import torch

        self.page_size = page_size
        self.swa_pages = swa_pages
        self.kv_buffer = [torch.zeros(rows, 8, dtype=torch.uint8) for _ in range(layers)]


class _RequestWindow:
    def __init__(self, capacity: int, page_size: int, layers: int) -> None:
        self.capacity = capacity
        self.state = _Buffers(page_size, 4, layers)


def _pool(spec: PoolSpec) -> Any:
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

    pool = object.__new__(DeepSeekV4TokenToKVPool)
    values: dict[str, Any] = {
        "compression_ratios": list(spec.compression_ratios),
        "_unified_kv": spec.unified,
        "_unified_kv_fp8": False,
        "page_size": spec.page_size,
        "swa_page_size": spec.page_size,
        "sliding_window": spec.sliding_window,
        "swa_size": spec.swa_size,
        "layer_num": spec.layers,
        "start_layer": 0,
        "end_layer": spec.layers,
        "compress_state_pools": [],
        "indexer_compress_state_pools": [],
        "swa_valid_from": None,
        "swa_req_ring_size": spec.swa_req_ring_size,
        "request_window": None,
        "swa_kv_pool": None if spec.unified else _Buffers(spec.page_size, 4, spec.layers),
        "unified_kv_pool": None,
        "kpool_use_compress": False,
    }
    if spec.request_capacity is not None:
        values["request_window"] = _RequestWindow(spec.request_capacity, spec.page_size,
                                                  spec.layers)
    if spec.unified:
        window, ring_size, pages = spec.ring
        values.update(unified_swa_window=window, unified_swa_ring_size=ring_size,
                      unified_swa_pages=pages,
                      unified_kv_pool=_Buffers(spec.page_size, 4, spec.layers, pages))
    values.update(spec.extra)
    for name, value in values.items():
        setattr(pool, name, value)
    return pool


def _draft_mapping(kind: str, target_mapping: Any) -> Any:
    if kind == "shared":
        return target_mapping
    if kind == "view":
        return target_mapping.view(target_mapping.shape)
    if kind == "clone":
        return target_mapping.clone()
    if kind == "different":
        other = target_mapping.clone()
        other[3] = -7
        return other
    return None


def build_pair(target: PoolSpec | None = None, draft: PoolSpec | None = None,
               mapping: str = "shared", target_mapping: str = "tensor",
               mapping_size: int = 16) -> tuple[Any, Any]:
    """A target and a draft pool. ``mapping`` is how the draft's mapping relates to the
    target's (:data:`MAPPING_KINDS`); ``target_mapping`` is ``"tensor"``, ``"none"`` or
    ``"missing"``. Unified pools get no mapping unless asked for one."""
    import torch

    if mapping not in MAPPING_KINDS:
        raise ValueError(f"mapping must be one of {', '.join(MAPPING_KINDS)} (got {mapping!r})")
    if target_mapping not in ("tensor", "none", "missing"):
        raise ValueError("target_mapping must be one of tensor, none, missing "
                         f"(got {target_mapping!r})")
    target_pool = _pool(target or PoolSpec())
    draft_pool = _pool(draft or PoolSpec())
    if target_mapping == "tensor":
        tensor = torch.arange(mapping_size, dtype=torch.int64)
        target_pool.register_mapping(tensor)
    elif target_mapping == "none":
        target_pool.register_mapping(None)
    if mapping != "missing":
        tensor = getattr(target_pool, "full_to_swa_index_mapping", None)
        if tensor is None and mapping in ("view", "clone", "different"):
            tensor = torch.arange(mapping_size, dtype=torch.int64)
        draft_pool.register_mapping(_draft_mapping(mapping, tensor))
    return target_pool, draft_pool


def three_mismatch_pair() -> tuple[Any, Any]:
    """The demo's pair: a compressed draft layer (DSV4G001), a draft mapping that differs
    (DSV4G004) and another page size and window (DSV4G005). SGLang reports only the first."""
    return build_pair(PoolSpec(compression_ratios=(4, 128, 0)),
                      PoolSpec(compression_ratios=(0, 4), page_size=64, sliding_window=64),
                      mapping="different")


def new_kv_args() -> Any:
    """An empty ``KVArgs``, as the bootstrap queues start with."""
    from sglang.srt.disaggregation.base.conn import KVArgs

    return KVArgs()


class Recorder:
    """A reporter plug-in that keeps every report it is handed."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    @hookimpl
    def sglang_dsv4_guard_report(self, report: Report) -> None:
        """Keep ``report``."""
        self.reports.append(report)

    @property
    def codes(self) -> list[str]:
        """Every code of every report received, in order."""
        return [code for r in self.reports for code in r.codes]


def check_pools(target_pool: object, draft_pool: object, *plugins: object, mode: str = "on",
                autoshare: bool = False) -> Report:
    """Run the remediation and check hooks on a pool pair, as the wrapper does.

    ``plugins`` are registered after the built-ins exactly as a server registers entry
    points (a refused one raises ``ValueError`` with its ``DSV4G090`` details). The
    pools are snapshotted as in a server, remediation plug-ins may act (auto-share only
    when ``autoshare``), then every ``check_state`` implementation runs; the report
    goes to every reporter (a :class:`Recorder` among ``plugins`` receives it) and is
    returned. ``mode`` (``"on"`` or ``"strict"``) is what ``context.mode`` says.
    SGLang's own function is not called: for the full path, ``install()`` the guard
    and call ``setup_state_kv_args``.

    Raises ``ValueError`` when SGLang's DeepSeek-V4 draft block would not run for these
    pools (not both ``DeepSeekV4TokenToKVPool``, or an NPU release that skips it), so a
    test never passes for want of anything checked.
    """
    from sglang_dsv4_guard.runtime import standalone_runtime
    from sglang_dsv4_guard.state.wrapper import check_pair, prepare_pair

    rt = standalone_runtime(plugins, mode, autoshare)
    prep = prepare_pair(rt, target_pool, draft_pool, "sglang_dsv4_guard.testing")
    if prep is None:
        raise ValueError(
            "SGLang's DeepSeek-V4 draft check does not run for these pools (target "
            f"{type(target_pool).__qualname__}, draft {type(draft_pool).__qualname__}): both "
            "must be DeepSeekV4TokenToKVPool (build them with build_pair)")
    report = Report.of(check_pair(rt, prep), prep.context.describe())
    rt.publish(report)
    return report


def check_transfer(transfer: SendSnapshot, *plugins: object, phase: str = "send") -> Report:
    """Run every ``check_send`` implementation on one MORI transfer snapshot.

    ``phase`` is ``"send"`` (a transfer) or ``"register"`` (a decode peer registering).
    ``plugins`` are registered as in :func:`check_pools`. The report goes to every
    reporter and is returned.
    """
    from sglang_dsv4_guard.mori.snapshot import SendContext

    if phase not in ("send", "register"):
        raise ValueError(f"phase must be 'send' or 'register' (got {phase!r})")
    from sglang_dsv4_guard.runtime import standalone_runtime

    rt = standalone_runtime(plugins)
    context = SendContext(rt.profile, "on", phase)
    findings = rt.plugins.collect("sglang_dsv4_guard_check_send",
                                  {"transfer": transfer, "context": context})
    report = Report.of(findings, {"function": MORI_SEND.qualname,
                                  "peer": transfer.engine_key or "?",
                                  "sglang": rt.profile.name, "mode": context.mode})
    rt.publish(report)
    return report


def register(*plugins: object) -> Callable[[], None]:
    """Register ``plugins`` on the guard ``install()`` put in place; return the undo.

    Registered as a server registers entry points, all or nothing: a refused plug-in
    raises ``ValueError`` with its ``DSV4G090`` details and none is left registered.
    The undo unregisters them (harmless after ``uninstall()``).
    """
    from sglang_dsv4_guard.lifecycle import installation

    current = installation()
    if current is None:
        raise RuntimeError("the guard is not installed: call sglang_dsv4_guard.install() first")
    from sglang_dsv4_guard.plugins import add_all

    manager = current.runtime.plugins
    added = add_all(manager, plugins)

    def undo() -> None:
        for plugin in added:
            if manager.pm.is_registered(plugin):
                manager.pm.unregister(plugin)

    return undo


def record() -> Recorder:
    """A :class:`Recorder` registered on the installed guard (until ``uninstall()``)."""
    recorder = Recorder()
    register(recorder)
    return recorder
