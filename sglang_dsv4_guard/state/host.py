"""Host facts the auto-share rule needs beyond the pools: whether CUDA graphs are off.

Sharing an equal *copy* of the target's mapping is safe only if no captured CUDA graph
holds the draft's old tensor's pointer. SGLang decides that with one server setting,
readable when ``setup_state_kv_args`` runs (the scheduler published its server args
before building the pools):

- 0.5.20 - 0.5.23: ``sglang.srt.runtime_context.get_exec().graph.disable_cuda_graph``
  (``get_global_server_args()`` is retired there and raises);
- 0.5.16 - 0.5.19: ``sglang.srt.runtime_context.get_server_args().disable_cuda_graph``
  (what ``sglang.srt.server_args.get_global_server_args()`` returns).

Anything unreadable is "unknown", which the rule treats as "graphs may be captured".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CudaGraphs", "read_cuda_graphs"]

_RUNTIME_CONTEXT = "sglang.srt.runtime_context"


@dataclass(frozen=True)
class CudaGraphs:
    """``disabled``: True when SGLang captures no CUDA graph, None when unknown; ``source``
    says where that was read (or why it could not be)."""

    disabled: bool | None
    source: str


def read_cuda_graphs() -> CudaGraphs:
    """SGLang's ``disable_cuda_graph`` as the installed release exposes it."""
    try:
        context = importlib.import_module(_RUNTIME_CONTEXT)
    except Exception as exc:  # reported as the reason the value is unknown
        return CudaGraphs(None, f"{_RUNTIME_CONTEXT} not importable ({type(exc).__name__})")
    failures: list[str] = []
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
            failures.append(f"{where}: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        if isinstance(value, bool):
            return CudaGraphs(value, f"server args disable_cuda_graph={value} ({where})")
        failures.append(f"{where}: {value!r} is not a bool")
    return CudaGraphs(None, "SGLang's disable_cuda_graph is unreadable: " + "; ".join(failures))
