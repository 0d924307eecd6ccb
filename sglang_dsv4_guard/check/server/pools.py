"""Miniature real DeepSeek-V4 pools for one server, and SGLang's real check on them.

The target and draft pools are built with the installed release's
``DeepSeekV4TokenToKVPool.__init__`` (keyword arguments filtered by its signature, the
server's resolved ``ServerArgs`` published in the runtime context and its environment
applied for the duration, ``online_mtp_max_draft_tokens`` as the release's KV-cache
configurator passes it, FP8 KV dtype, tiny sizes, on torch's ``meta`` device: every
tensor has its shape and dtype but no storage, so memory does not grow with the layer
count, issue 32) from the values the server's flags and configs imply; the draft's
layers get the ratio the release's
``KVCacheConfigurator`` gives a draft worker (``COMPRESS_RATIO_NEXTN_LAYER``). Then the
release's ``setup_state_kv_args`` runs on them, wrapped by the guard's own state wrapper
(not installed globally), and the guard's report is returned, with the state types
SGLang registered (read by :mod:`.state_types` through :func:`last_run`).

Paged mode only: the unified-KV pool is ROCm-only (``is_hip()``) and cannot be built here.
Both pools get the same ``full_to_swa_index_mapping`` tensor, as a correct deployment
does; whether the real draft gets the target's object cannot be known from flags.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from sglang_dsv4_guard.assembly import standalone_runtime
from sglang_dsv4_guard.check.offline.parse import offline_env
from sglang_dsv4_guard.check.server.derive import DerivedServer, kwargs_for
from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Finding, Report
from sglang_dsv4_guard.log import LOGGER_NAME, silenced
from sglang_dsv4_guard.reporter import Recorder
from sglang_dsv4_guard.samples import new_kv_args
from sglang_dsv4_guard.state.wrapper import make_state_wrapper

__all__ = ["PoolRun", "draft_ratio", "last_run", "max_draft_tokens",
           "published_server_args", "run_state_check", "state_type_names"]

log = logging.getLogger(LOGGER_NAME)
_POOL_ROWS = 1024  # SWA slots of a miniature pool; page sizes must divide it
# Shapes without storage: a CPU pool of 2,000 layers took ~3.5 MB a layer (issue 32).
# SGLang's check reads the buffers' sizes and addresses (0 on meta), never their bytes.
_POOL_DEVICE = "meta"


@dataclass(frozen=True)
class PoolRun:
    """What SGLang's real ``setup_state_kv_args`` did on one server's miniature pools."""

    role: str
    target_ratios: tuple[int, ...]
    draft_ratios: tuple[int, ...]
    host_error: str | None
    findings: tuple[Finding, ...]
    build_error: str | None = None
    online_mtp_max_draft_tokens: int = 0
    # What the call wrote into kv_args.state_types; None when it did not complete.
    state_types: tuple[str, ...] | None = None


# The run made for each live DerivedServer object, so the contract rows read its state types.
_RUNS: dict[int, tuple[weakref.ref[DerivedServer], PoolRun]] = {}


def last_run(side: DerivedServer) -> PoolRun | None:
    """The run :func:`run_state_check` made for this very ``side`` object, if any."""
    entry = _RUNS.get(id(side))
    return entry[1] if entry is not None and entry[0]() is side else None


def state_type_names(kv_args: Any) -> tuple[str, ...]:
    """The names of the state types ``setup_state_kv_args`` wrote into ``kv_args``."""
    return tuple(str(getattr(t, "value", t)) for t in getattr(kv_args, "state_types", ()))


def _remember(side: DerivedServer, run: PoolRun) -> PoolRun:
    key = id(side)
    _RUNS[key] = (weakref.ref(side, lambda _ref: _RUNS.pop(key, None)), run)
    return run


def draft_ratio() -> tuple[int, str]:
    """The ratio the installed release gives every DeepSeek-V4 draft layer, and its source."""
    try:
        from sglang.srt.models.deepseek_v4_nextn import COMPRESS_RATIO_NEXTN_LAYER
    except Exception as exc:  # the model module pulls GPU kernels on some releases
        log.debug("sglang.srt.models.deepseek_v4_nextn did not import (%s); using 0", exc)
        return 0, "COMPRESS_RATIO_NEXTN_LAYER (0; its module did not import here)"
    return int(COMPRESS_RATIO_NEXTN_LAYER), "sglang.srt.models.deepseek_v4_nextn.COMPRESS_RATIO_NEXTN_LAYER"


@contextmanager
def published_server_args(server_args: Any) -> Iterator[None]:
    """The server's resolved ``ServerArgs`` published in the runtime context for the block
    (the release's test override saves and restores the previous context); a dummy one
    when resolution did not complete."""
    from sglang.srt.runtime_context import get_context

    context = get_context()
    override = context.override_server_args()
    override.install()
    try:
        if server_args is not None:
            context.set_server_args(server_args)
        yield
    finally:
        override.restore()


def max_draft_tokens(server_args: Any) -> int:
    """What the release's KV-cache configurator passes as ``online_mtp_max_draft_tokens``:
    ``runtime_context.max_speculative_num_draft_tokens()`` (0.5.20+), the published
    ``ServerArgs.max_speculative_num_draft_tokens`` before; 0 when there is none."""
    try:
        from sglang.srt.runtime_context import max_speculative_num_draft_tokens
    except ImportError:
        value = getattr(server_args, "max_speculative_num_draft_tokens", None)
    else:
        value = max_speculative_num_draft_tokens()
    return int(value or 0)


def _pool(ratios: Sequence[int], window: int, page: int, draft: bool, mtp: int) -> Any:
    import torch
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

    wanted = dict(
        max_num_reqs=4, swa_size=_POOL_ROWS, c4_size=_POOL_ROWS, c128_size=256,
        c4_state_pool_size=8, c128_state_pool_size=8, page_size=page, swa_page_size=page,
        dtype=torch.float8_e4m3fn, c4_state_dtype=torch.float32,
        c128_state_dtype=torch.float32, qk_nope_head_dim=448, qk_rope_head_dim=64,
        indexer_head_dim=128, layer_num=len(ratios), device=_POOL_DEVICE,
        enable_memory_saver=False, compression_ratios=list(ratios), sliding_window=window,
        is_draft_worker=draft, online_mtp_max_draft_tokens=mtp,
    )
    return DeepSeekV4TokenToKVPool(**kwargs_for(DeepSeekV4TokenToKVPool.__init__, wanted))


def _for_side(role: str, finding: Finding) -> Finding:
    """``finding`` of ``role``'s pool run, its "this server" edits (a state check's, a
    plug-in's) made edits of ``role``, so that ``check --fix`` applies them."""
    fixes = tuple(replace(fix, edits=tuple(
        replace(e, server=role) if e.server == "this server" else e for e in fix.edits))
        for fix in finding.fixes)
    return replace(finding, subject=f"{role} server: {finding.subject}", fixes=fixes,
                   details=(*finding.details,
                            f"predicted on miniature real pools of the {role} server"))


def run_state_check(side: DerivedServer) -> PoolRun | None:
    """Build the server's target and draft pools and run SGLang's check under the guard.

    ``None`` when SGLang's DeepSeek-V4 block would not run: no DSV4 target, no draft,
    a draft that is not DeepSeek-V4, or unified-KV mode (not buildable on this machine).
    """
    # deferred: SGLang and torch are loaded when a pool check runs
    import torch
    from sglang.srt.disaggregation import utils

    if side.draft is None or not (side.model.is_dsv4 and side.draft.is_dsv4) \
            or side.unified_kv or side.page_size is None:
        return None
    target_ratios = tuple(side.model.compress_ratios[:side.model.num_layers]) or (0,)
    ratio, _ = draft_ratio()
    draft_ratios = (ratio,) * max(side.draft.nextn_layers, 1)
    recorder = Recorder()
    # Third-party state checks run here too, as they would in the servers.
    runtime = standalone_runtime((recorder,), load_entry_points=True)
    guarded = make_state_wrapper(runtime)(utils.setup_state_kv_args)
    host_error: str | None = None
    report: Report | None = None
    # The report is returned and rendered by ``check``; the guard's log would repeat it.
    with offline_env(side.args.env), published_server_args(side.args.server_args), silenced():
        mtp = max_draft_tokens(side.args.server_args)
        try:
            target = _pool(target_ratios, side.model.sliding_window or 128, side.page_size,
                           False, mtp)
            draft = _pool(draft_ratios, side.draft.sliding_window or 128, side.page_size, True,
                          mtp)
        except Exception as exc:  # the release's constructor refuses these values
            return PoolRun(side.role, target_ratios, draft_ratios, None, (),
                           f"{type(exc).__name__}: {exc}", mtp)
        mapping = torch.arange(_POOL_ROWS + 1, dtype=torch.int64)
        target.register_mapping(mapping)
        draft.register_mapping(mapping)
        kv_args = new_kv_args()
        try:
            guarded(kv_args, target, draft)
        except DSV4GuardError as exc:
            host_error, report = exc.report.host_error or str(exc).splitlines()[0], exc.report
        except (RuntimeError, AttributeError) as exc:  # SGLang's own verdict, passed through
            host_error = f"{type(exc).__name__}: {exc}"
    if report is None and recorder.reports:
        report = recorder.reports[-1]
    findings = tuple(_for_side(side.role, f) for f in (report.findings if report else ()))
    types = None if host_error else state_type_names(kv_args)
    return _remember(side, PoolRun(side.role, target_ratios, draft_ratios, host_error,
                                   findings, None, mtp, types))
