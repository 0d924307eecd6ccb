"""The GPU models ``check`` can be told a server runs on (``--gpu``, ``--prefill-gpu``,
``--decode-gpu``), as data: each model's name, the other names operators type, its
platform and compute capability, and the Kubernetes product labels it is known by.

:func:`gpu_model` reads a name as an operator types it or as a node label carries it
(``nvidia.com/gpu.product``: ``NVIDIA-H100-80GB-HBM3``; GKE's ``nvidia-h100-80gb``;
AMD's ``AMD_Instinct_MI300X_OAM``), case-insensitively: the vendor words are dropped, the
model's name must come first, and what follows may only describe the board (memory,
form factor, a MIG profile). An NVIDIA model answers SGLang's device probes during
``check`` (:class:`~sglang_dsv4_guard.check.offline.probes.Device`); an AMD model does
not: SGLang tells ROCm apart by ``torch.version.hip``, read when its modules are
imported, so ``check`` cannot run SGLang's ROCm branches and says so (:attr:`GpuModel.settled`).
Nothing here imports SGLang: the command reads the names before it starts its child.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_dsv4_guard.check.offline.parse import CheckInputError
from sglang_dsv4_guard.check.offline.probes import Device

__all__ = ["GPU_MODELS", "GpuModel", "NamedGpu", "gpu_model", "named_gpus"]


@dataclass(frozen=True)
class GpuModel:
    """One GPU model: its name, platform (``cuda`` or ``rocm``), architecture (``SM90``,
    ``gfx942``), CUDA compute capability (``None`` on ROCm), the other names it is typed
    as, and product labels (Kubernetes node labels) it is known by."""

    name: str
    platform: str
    arch: str
    capability: tuple[int, int] | None = None
    aliases: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()

    @property
    def settled(self) -> bool:
        """Whether ``check`` answers SGLang's device probes as this model (CUDA only)."""
        return self.capability is not None

    @property
    def device(self) -> Device | None:
        """The device SGLang's probes answer as during ``check``, ``None`` on ROCm."""
        if self.capability is None:
            return None
        return Device(self.name, *self.capability)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name :func:`gpu_model` reads as this model on its own."""
        return (self.name, *self.aliases)


def _nvidia(name: str, major: int, minor: int, *labels: str, aliases: tuple[str, ...] = ()
            ) -> GpuModel:
    return GpuModel(name, "cuda", f"SM{major}{minor}", (major, minor), aliases, labels)


def _amd(name: str, arch: str, *labels: str) -> GpuModel:
    return GpuModel(name, "rocm", arch, None, (), labels)


# name, compute capability (NVIDIA) or gfx architecture (AMD), and product labels as the
# GPU feature discovery (nvidia.com/gpu.product), GKE (cloud.google.com/gke-accelerator)
# and AMD's node labeller (amd.com/gpu.product-name) spell them.
GPU_MODELS: tuple[GpuModel, ...] = (
    _nvidia("A100", 8, 0, "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB",
            "NVIDIA-A100-PCIE-40GB", "NVIDIA-A100-80GB-PCIe", "nvidia-tesla-a100",
            "nvidia-a100-80gb"),
    _nvidia("A800", 8, 0, "NVIDIA-A800-SXM4-80GB", "NVIDIA-A800-80GB-PCIe"),
    _nvidia("L4", 8, 9, "NVIDIA-L4", "nvidia-l4"),
    _nvidia("L40", 8, 9, "NVIDIA-L40"),
    _nvidia("L40S", 8, 9, "NVIDIA-L40S"),
    _nvidia("H100", 9, 0, "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL",
            "nvidia-h100-80gb", "nvidia-h100-mega-80gb"),
    _nvidia("H800", 9, 0, "NVIDIA-H800", "NVIDIA-H800-PCIe"),
    _nvidia("H20", 9, 0, "NVIDIA-H20"),
    _nvidia("H200", 9, 0, "NVIDIA-H200", "NVIDIA-H200-NVL", "nvidia-h200-141gb"),
    _nvidia("GH200", 9, 0, "NVIDIA-GH200-480GB", "NVIDIA-GH200-144G-HBM3e"),
    _nvidia("B200", 10, 0, "NVIDIA-B200", "nvidia-b200"),
    _nvidia("GB200", 10, 0, "NVIDIA-GB200", "nvidia-gb200"),
    _nvidia("B300", 10, 3, "NVIDIA-B300-SXM6-AC"),
    _nvidia("GB300", 10, 3, "NVIDIA-GB300"),
    _nvidia("RTX PRO 6000", 12, 0, "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
            "NVIDIA-RTX-PRO-6000-Blackwell-Workstation-Edition"),
    _nvidia("GB10", 12, 1, "NVIDIA-GB10", aliases=("DGX Spark",)),
    _amd("MI300X", "gfx942", "AMD_Instinct_MI300X_OAM"),
    _amd("MI308X", "gfx942", "AMD_Instinct_MI308X_OAM"),
    _amd("MI325X", "gfx942", "AMD_Instinct_MI325X_OAM"),
    _amd("MI350X", "gfx950", "AMD_Instinct_MI350X_OAM"),
    _amd("MI355X", "gfx950", "AMD_Instinct_MI355X_OAM"),
)

# Words a label puts before the model (dropped), and what may follow it: the board's
# memory, form factor and edition; after a MIG word, the MIG profile.
_VENDOR = frozenset({"NVIDIA", "TESLA", "AMD", "INSTINCT"})
_BOARD = re.compile(r"\d+(\.\d+)?(GB|G|TB)|SXM\d*|PCIE|NVL|HBM\d*E?|AC|OAM|MEGA|BLACKWELL|"
                    r"SERVER|WORKSTATION|EDITION|MAX|Q")
_SPLIT = re.compile(r"[\s_-]+")


def _words(text: str) -> tuple[str, ...]:
    return tuple(w for w in _SPLIT.split(text.strip().upper()) if w)


# Each name's words -> its model (the longest name that leads the text wins).
_BY_WORDS: dict[tuple[str, ...], GpuModel] = {
    _words(name): model for model in GPU_MODELS for name in model.names}


def _accepted() -> str:
    return (", ".join(m.name for m in GPU_MODELS) + " (any case; a product label such as "
            "NVIDIA-H100-80GB-HBM3, nvidia-h100-80gb or AMD_Instinct_MI300X_OAM too)")


def gpu_model(text: str, option: str = "--gpu") -> GpuModel:
    """The model ``text`` names (see the module docstring). A name it cannot read raises
    :class:`CheckInputError` naming ``option``, the value and the accepted names."""
    words = _words(text)
    while words and words[0] in _VENDOR:
        words = words[1:]
    for size in range(min(len(words), 3), 0, -1):
        model = _BY_WORDS.get(words[:size])
        if model is None:
            continue
        rest = words[size:]
        board = rest[:rest.index("MIG")] if "MIG" in rest else rest
        if all(_BOARD.fullmatch(word) for word in board):
            return model
    shown = text if len(text) <= 100 else text[:100] + "..."
    raise CheckInputError(option, f"not a GPU model this check knows (got {shown!r}); "
                                  f"accepted: {_accepted()}")


@dataclass(frozen=True)
class NamedGpu:
    """The GPU a server was named to run on: its model, the text given and where it came
    from (``--gpu``, ``--prefill-gpu``, a manifest's label...)."""

    model: GpuModel
    typed: str
    source: str

    @property
    def device(self) -> Device | None:
        """The device SGLang's probes answer as (``None``: ROCm, this machine's answers)."""
        return self.model.device

    def describe(self) -> str:
        """``H100 (SM90, from --gpu)``; an AMD GPU says its server was resolved as this
        machine answers."""
        if not self.model.settled:
            return (f"{self.model.name} ({self.model.arch}, ROCm, from {self.source}; "
                    "resolved as this machine answers: ROCm is not modelled)")
        return f"{self.model.name} ({self.model.arch}, from {self.source})"

    def to_dict(self) -> dict[str, Any]:
        """The JSON document's ``derived.<server>.gpu``."""
        capability = self.model.capability
        return {"name": self.model.name, "typed": self.typed, "source": self.source,
                "platform": self.model.platform, "arch": self.model.arch,
                "compute_capability": None if capability is None
                else f"{capability[0]}.{capability[1]}",
                "probes_answered_as_it": self.model.settled}


def named_gpus(gpus: Mapping[str, str | None] | None,
               sources: Mapping[str, str] | None = None) -> dict[str, NamedGpu | None]:
    """``{"prefill": ..., "decode": ...}``: the GPU each server is named to run on (``None``
    for a server with none), each read by :func:`gpu_model`; an error names the server's
    source (``sources``, else ``--<role>-gpu``). A key that is not a server's role raises."""
    given = dict(gpus or {})
    unknown = sorted(set(given) - {"prefill", "decode"})
    if unknown:
        raise CheckInputError("gpus", f"keys are the servers' roles, prefill and decode "
                              f"(got {', '.join(map(repr, unknown))})")
    named: dict[str, NamedGpu | None] = {}
    for role in ("prefill", "decode"):
        text = given.get(role)
        source = (sources or {}).get(role) or f"--{role}-gpu"
        named[role] = None if text is None else NamedGpu(gpu_model(text, source), text, source)
    return named
