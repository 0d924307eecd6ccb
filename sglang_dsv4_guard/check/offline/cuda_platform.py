"""SGLang's platform probes during one resolution: recorded, or answered as an NVIDIA CUDA host.

``check`` resolves a ``--device cuda`` server on a machine without a CUDA GPU, where
SGLang's ``is_cuda()`` (and ``get_platform().is_cuda``, which calls it) is false, and with
it ``is_cuda_alike()``, ``is_flashinfer_available()`` and the GPU memory
(``get_device_memory_capacity()``, None). Some refusals test them (``--mm-feature-transport
cuda_ipc requires NVIDIA CUDA``): this machine's, not the flags'. :func:`platform_probed`
replaces these probes for one block (in ``sglang.srt.utils.common``, or ``sglang.srt.utils``
where it is one module, and in every loaded SGLang module that bound one by name) by a
stand-in that records that it was read, and answers as this machine, or, with
``cuda=True``, as a CUDA host: true, true, true, :data:`~.machine.CUDA_MEMORY_GIB` GiB. Called
from the body of a module imported during the block, a stand-in answers as this machine
(:func:`~.standins.module_bodies`), so no module keeps a constant computed from it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sglang_dsv4_guard.check.offline.machine import CUDA_MEMORY_GIB
from sglang_dsv4_guard.check.offline.standins import Answers, module_bodies

__all__ = ["PLATFORM_PROBES", "platform_probed"]

# Each probe of the platform, and its answer on a CUDA host.
PLATFORM_PROBES: dict[str, Any] = {
    "is_cuda": True, "is_cuda_alike": True, "is_flashinfer_available": True,
    "get_device_memory_capacity": float(CUDA_MEMORY_GIB * 1024),  # MiB, as SGLang's
}
_held = threading.RLock()


def _utils() -> Any:
    try:
        from sglang.srt.utils import common
    except ImportError:  # a release whose utils is one module
        from sglang.srt import utils as common
    return common


def _stand_in(name: str, original: Callable[..., Any], answers: Answers,
              cuda: bool, bodies: int) -> Callable[..., Any]:
    def probe(*args: Any, **kwargs: Any) -> Any:
        if module_bodies() > bodies:  # in an import started in the block
            return original(*args, **kwargs)
        answers.platform = True
        return PLATFORM_PROBES[name] if cuda else original(*args, **kwargs)

    probe.cache_clear = lambda: None  # type: ignore[attr-defined]  # lru_cache'd originals
    return probe


def _namespaces() -> dict[str, dict[str, Any]]:
    loaded = sys.modules.copy()  # one C-level copy: a thread may import meanwhile
    return {key: vars(module) for key, module in loaded.items()
            if key.startswith("sglang") and isinstance(getattr(module, "__dict__", None), dict)}


@contextmanager
def platform_probed(answers: Answers, cuda: bool = False) -> Iterator[None]:
    """For the block, SGLang's platform probes record in ``answers`` that they were read,
    and answer as a CUDA host with ``cuda`` (as this machine without). Afterwards every
    binding of a stand-in, in the modules loaded before the block and those imported
    during it, is given back its original."""
    with _held:
        common = _utils()
        originals = {name: getattr(common, name) for name in PLATFORM_PROBES
                     if callable(getattr(common, name, None))}
        bodies = module_bodies()
        stand_ins = {name: _stand_in(name, fn, answers, cuda, bodies)
                     for name, fn in originals.items()}
        before = _namespaces()
        try:
            for namespace in before.values():
                for name in originals.keys() & namespace.keys():
                    if namespace[name] is originals[name]:
                        namespace[name] = stand_ins[name]
            yield
        finally:
            ours = {id(fn): originals[name] for name, fn in stand_ins.items()}
            for key, namespace in _namespaces().items():
                names = originals.keys() & namespace.keys() if key in before \
                    else list(namespace)
                for name in names:
                    if id(namespace.get(name)) in ours:
                        namespace[name] = ours[id(namespace[name])]
