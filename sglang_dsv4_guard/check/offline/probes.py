"""SGLang's device probes during ``check``'s resolution: recorded, and answered as a GPU model.

``check`` resolves a server's flags on a machine that need not have the server's GPU, so
what SGLang reads from the device (``is_sm100_supported()``, ``get_platform().is_sm90``,
``torch.cuda.get_device_capability()``, ``torch.backends.mps.is_available()``, ...) is
this machine's answer, not the server's. :func:`probed` replaces every such probe for one
block (in ``sglang.srt.utils``, where ``get_platform()`` reads them, in every loaded SGLang
module that bound one by name, and in ``torch``) by a stand-in that records that it was
read and answers as this machine does, or as one :class:`Device`; :func:`as_devices`
retries a refusal made after a probe was read as each device the server may have.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["Device", "as_devices", "cuda_present", "devices_for", "probed"]


@dataclass(frozen=True)
class Device:
    """A device a server may run on: its name, and its CUDA compute capability (or MPS)."""

    name: str
    major: int = 0
    minor: int = 0
    mps: bool = False

    def answers(self) -> dict[str, Any]:
        """What each probe of SGLang's answers on this device."""
        if self.mps:
            return {"is_mps": True, "torch.backends.mps.is_available": True,
                    "torch.mps.is_available": True}
        major, cap = self.major, (self.major, self.minor)
        return {
            "is_sm80_supported": major == 8,
            "is_sm90_supported": major == 9, "is_hopper_with_cuda_12_3": major == 9,
            "is_sm100_supported": major == 10, "is_sm100_or_sm110_supported": major in (10, 11),
            "is_sm110_supported": major == 11, "is_sm120_supported": major == 12,
            "is_sm120": cap == (12, 0), "is_sm121": cap == (12, 1),
            "is_blackwell_supported": major in (10, 11, 12), "is_blackwell": major in (10, 11, 12),
            "get_device_sm": major * 10 + self.minor, "get_device_capability": cap,
            "torch.cuda.get_device_capability": cap,
        }


_CUDA = (Device("SM80 (A100)", 8, 0), Device("SM90 (H100/H200)", 9, 0),
         Device("SM100 (B200)", 10, 0), Device("SM103 (B300)", 10, 3),
         Device("SM120 (RTX PRO 6000)", 12, 0))
_MPS = (Device("an Apple GPU (MPS)", mps=True),)
# The probes in sglang.srt.utils(.common); absent ones in a release are skipped.
_SGLANG_PROBES = (*(name for name in _CUDA[0].answers() if "." not in name), "is_mps")
_held = threading.RLock()  # probed() blocks: one thread's at a time (nesting is its own)
_TORCH_PROBES = ("torch.cuda.get_device_capability", "torch.backends.mps.is_available",
                 "torch.mps.is_available")


def devices_for(device: str) -> tuple[Device, ...]:
    """The devices a server of ``--device device`` may have (none known for others)."""
    return _CUDA if device == "cuda" else _MPS if device == "mps" else ()


def _utils() -> Any:
    try:
        from sglang.srt.utils import common
    except ImportError:  # a release whose utils is one module
        from sglang.srt import utils as common
    return common


def _torch_owner(name: str) -> tuple[Any, str] | None:
    import torch

    owner: Any = torch
    *path, attr = name.split(".")[1:]
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    return (owner, attr) if callable(getattr(owner, attr, None)) else None


def _stand_in(name: str, original: Callable[..., Any], read: list[str],
              device: Device | None) -> Callable[..., Any]:
    answer = device.answers().get(name) if device is not None else None

    def probe(*args: Any, **kwargs: Any) -> Any:
        if name not in read:
            read.append(name)
        if device is None or answer is None:
            return original(*args, **kwargs)
        return answer

    probe.cache_clear = lambda: None  # type: ignore[attr-defined]  # lru_cache'd originals
    return probe


def _sglang_modules() -> dict[str, Any]:
    loaded = sys.modules.copy()  # one C-level copy: a thread may import meanwhile
    return {key: loaded[key] for key in loaded
            if key.startswith("sglang") and loaded[key] is not None}


@contextmanager
def probed(device: Device | None = None) -> Iterator[list[str]]:
    """For the block, SGLang's device probes answer as ``device`` (as this machine when
    ``None``); yields the names of the probes read, in order.

    A module's binding is replaced where it is the probe under the probe's own name
    (``from ... import is_sm100_supported``); only those names are looked up in each
    loaded module (each resolution enters this block several times, and SGLang has
    thousands of modules). Afterwards every binding of a stand-in is given back its
    original: under the probe's names in the modules loaded before the block, under any
    name in those imported during it."""
    read: list[str] = []
    with _held:  # one block at a time: a second thread's would take ours for originals
        common = _utils()
        originals = {name: getattr(common, name) for name in _SGLANG_PROBES
                     if callable(getattr(common, name, None))}
        stand_ins = {name: _stand_in(name, fn, read, device) for name, fn in originals.items()}
        names = originals.keys()
        patched: list[tuple[Any, str, Any]] = []
        before = _sglang_modules()
        try:
            for module in before.values():
                namespace = getattr(module, "__dict__", None)
                if not isinstance(namespace, dict):
                    continue
                for attr in names & namespace.keys():
                    if namespace[attr] is originals[attr]:
                        patched.append((module, attr, originals[attr]))
                        setattr(module, attr, stand_ins[attr])
            for name in _TORCH_PROBES:
                owner = _torch_owner(name)
                if owner is not None:
                    original = getattr(*owner)
                    patched.append((owner[0], owner[1], original))
                    setattr(owner[0], owner[1], _stand_in(name, original, read, device))
            yield read
        finally:
            for owner, attr, original in patched:
                setattr(owner, attr, original)
            ours = {id(fn): originals[name] for name, fn in stand_ins.items()}
            for key, module in _sglang_modules().items():
                namespace = getattr(module, "__dict__", None)
                if not isinstance(namespace, dict):
                    continue
                attrs = list(namespace) if before.get(key) is not module \
                    else names & namespace.keys()
                for attr in attrs:
                    if id(namespace.get(attr)) in ours:
                        setattr(module, attr, ours[id(namespace[attr])])


@contextmanager
def cuda_present(device: Device) -> Iterator[list[str]]:
    """:func:`probed` as ``device``, and for the block ``torch.cuda.is_available()`` true
    and ``torch.version.cuda`` set (a CUDA build with that GPU present): for a function
    that asks torch whether a GPU is there before it reads its capability (SGLang's
    ``select_dsv4_kv_layout``); never for a resolution, which would then read the GPU's
    memory."""
    import torch

    available, cuda = torch.cuda.is_available, torch.version.cuda
    with probed(device) as read:
        torch.cuda.is_available = lambda: True
        torch.version.cuda = cuda or "12.8"
        try:
            yield read
        finally:
            torch.cuda.is_available, torch.version.cuda = available, cuda


def as_devices(device: str, refusal: str,
               resolve: Callable[[Device], tuple[Any, str | None, str | None]]
               ) -> tuple[str | None, str]:
    """After SGLang read a device probe and refused (``refusal``): ``resolve`` (the
    resolution, as one device: its ServerArgs, refusal, machine cause) as each device a
    ``--device device`` server may have. Accepted as one (or failing there only on this
    machine): the refusal is this machine's, and its cause is returned. Refused as every
    one: the flags', and the refusal also says what each device gets."""
    accepted: list[str] = []
    refused: dict[str, list[str]] = {}
    for candidate in devices_for(device):
        server_args, other, cause = resolve(candidate)
        if server_args is not None or cause is not None:
            accepted.append(candidate.name)
        else:
            refused.setdefault(str(other), []).append(candidate.name)
    if accepted:
        return (f"it depends on the GPU model/device, not known on this machine (SGLang "
                f"accepts these flags as {', '.join(accepted)})"), refusal
    if set(refused) - {refusal}:
        refusal += "; as each GPU model: " + "; ".join(
            f"{text} ({', '.join(names)})" for text, names in refused.items())
    return None, refusal
