"""Host facts the auto-share rule needs beyond the pools: whether CUDA graphs are off.

Sharing an equal *copy* of the target's mapping is safe only if no captured CUDA graph
holds the draft's old tensor's pointer. SGLang itself answers "no CUDA graph anywhere"
with ``sglang.srt.model_executor.cuda_graph_config.cuda_graph_fully_disabled()`` (every
phase's resolved ``cuda_graph_config`` backend is ``disabled``; present in 0.5.16 -
0.5.23). The legacy ``disable_cuda_graph`` is the deprecated, lowest-precedence input:
``--cuda-graph-backend-*`` / ``--cuda-graph-config`` can re-enable graphs over it, so it
is read only on a release without SGLang's function:

- 0.5.20 - 0.5.23: ``sglang.srt.runtime_context.get_exec().graph.disable_cuda_graph``;
- 0.5.16 - 0.5.19: ``sglang.srt.runtime_context.get_server_args().disable_cuda_graph``.

Anything unreadable is "unknown", which the rule treats as "graphs may be captured".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from sglang_dsv4_guard.findings import failure_text
from sglang_dsv4_guard.host.targets import CUDA_GRAPH_CONFIG, RUNTIME_CONTEXT

__all__ = ["CudaGraphs", "read_cuda_graphs"]


@dataclass(frozen=True)
class CudaGraphs:
    """``disabled``: True when SGLang captures no CUDA graph, None when unknown; ``source``
    says where that was read (or why it could not be)."""

    disabled: bool | None
    source: str


def read_cuda_graphs() -> CudaGraphs:
    """Whether SGLang captures no CUDA graph, by SGLang's own rule where the release has it."""
    try:
        config = importlib.import_module(CUDA_GRAPH_CONFIG)  # unscanned: SGLang's (host/targets)
    except ImportError as exc:  # an older layout: fall back to the legacy setting below
        fallback = f"{CUDA_GRAPH_CONFIG} not importable ({type(exc).__name__})"
    else:
        fully_disabled = getattr(config, "cuda_graph_fully_disabled", None)
        if callable(fully_disabled):
            return _ask_sglang(fully_disabled)
        fallback = f"{CUDA_GRAPH_CONFIG}.cuda_graph_fully_disabled absent"
    return _legacy_setting(fallback)


def _ask_sglang(fully_disabled: Callable[[], object]) -> CudaGraphs:
    where = "SGLang's cuda_graph_fully_disabled()"
    try:
        value = fully_disabled()
    except Exception as exc:  # reported as the reason the value is unknown
        return CudaGraphs(None, f"{where} failed: {failure_text(exc)}")
    if value is True:
        return CudaGraphs(True, f"{where} is True: every phase's CUDA-graph backend is disabled")
    if value is False:
        return CudaGraphs(False, f"{where} is False: a phase's CUDA-graph backend is not "
                                 "disabled, or no cuda_graph_config is published yet")
    return CudaGraphs(None, f"{where} returned {value!r}, not a bool")


def _legacy_setting(why: str) -> CudaGraphs:
    try:
        context = importlib.import_module(RUNTIME_CONTEXT)  # unscanned: SGLang's (host/targets)
    except Exception as exc:  # reported as the reason the value is unknown
        return CudaGraphs(None, f"{why}; {RUNTIME_CONTEXT} not importable ({type(exc).__name__})")
    failures: list[str] = [why]
    readers: tuple[tuple[str, Callable[[], object]], ...] = (
        ("runtime_context.get_exec().graph.disable_cuda_graph",
         lambda: context.get_exec().graph.disable_cuda_graph),
        ("runtime_context.get_server_args().disable_cuda_graph",
         lambda: context.get_server_args().disable_cuda_graph),
    )
    for where, read in readers:
        try:
            value = read()
        except Exception as exc:  # not this release's accessor, or nothing published yet
            failures.append(f"{where}: {failure_text(exc)}")
            continue
        if isinstance(value, bool):
            return CudaGraphs(value, f"server args disable_cuda_graph={value} ({where}; {why})")
        failures.append(f"{where}: {value!r} is not a bool")
    return CudaGraphs(None, "SGLang's disable_cuda_graph is unreadable: " + "; ".join(failures))
