"""The server host's files, devices and packages, answered for one resolution (:mod:`.machine`).

SGLang's resolution checks some things on the host it runs on: the InfiniBand devices an IB
flag names (``/sys/class/infiniband``), the files the SSL flags and an expert-pack loader
config name, packages a flag needs (``granian`` for ``--enable-http2``). ``check`` runs on
another machine, so :func:`host_answers` makes each answer as on a host that has it, for
one block (the resolution, in ``check``'s sandboxed child): ``os.path.isdir`` /
``isfile`` / ``exists``, ``os.listdir`` and ``pathlib.Path.is_file`` for exactly those
paths, and an import stand-in (an empty module) for those packages when they are not
installed here. Every answer given is recorded as a :class:`~.machine.FactRead`, which
``check`` says in ``unknowns``. Only the paths and packages the line's flags name are
answered, so a line without such flags resolves as before.

Files whose content SGLang reads (a watermark config, a decrypted model config, a JSON file
of IB devices) cannot be answered: :func:`without_host_files` leaves such a flag out of the
resolution when its file is not on this machine, and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.abc
import importlib.machinery
import json
import os
import pathlib
import posixpath
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from sglang_dsv4_guard.check.offline.machine import FactRead

__all__ = ["CUDA_PACKAGES", "IB_ROOT", "Answers", "host_answers", "module_bodies",
           "without_host_files"]

IB_ROOT = "/sys/class/infiniband"
_IB_FLAGS = (("disaggregation_ib_device", "--disaggregation-ib-device"),
             ("mooncake_ib_device", "--mooncake-ib-device"))
_SSL_FLAGS = (("ssl_keyfile", "--ssl-keyfile"), ("ssl_certfile", "--ssl-certfile"),
              ("ssl_ca_certs", "--ssl-ca-certs"))
_PACK_KEYS = ("pack_path", "manifest_path", "source_path")
_DEVICE = re.compile(r"[A-Za-z0-9_.:-]+")
# Packages a flag needs, answered by an empty module when not installed here (fact key,
# the flag); flashinfer only with the CUDA platform (.cuda_platform), where SGLang asks.
_PACKAGES = {"granian": ("granian", "--enable-http2")}
CUDA_PACKAGES = {"flashinfer": ("flashinfer", "--mamba-backend flashinfer")}
_held = threading.RLock()  # one block at a time: the patches are process-wide


class Answers:
    """What one resolution read of this machine's facts, as answered (in order, once each);
    ``platform``: whether it read the platform (:mod:`.cuda_platform`)."""

    def __init__(self) -> None:
        self.reads: list[FactRead] = []
        self.platform = False

    def add(self, read: FactRead) -> None:
        """Record ``read`` (a repeat is kept once)."""
        if read not in self.reads:
            self.reads.append(read)


def _norm(path: Any) -> str | None:
    if isinstance(path, pathlib.PurePath):
        path = str(path)
    if not isinstance(path, str) or not path:
        return None
    return posixpath.normpath(posixpath.expanduser(path))


def _present(path: str) -> bool:
    return os.path.lexists(path)


def _loader_config(namespace: argparse.Namespace) -> dict[str, Any]:
    value = getattr(namespace, "model_loader_extra_config", None)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def _host_files(namespace: argparse.Namespace, env: Mapping[str, str]
                ) -> dict[str, FactRead]:
    """The files the line names that are not on this machine, each with its read."""
    files: dict[str, FactRead] = {}
    for field, option in _SSL_FLAGS:
        path = _norm(getattr(namespace, field, None))
        if path is not None and not _present(path):
            files[path] = FactRead("ssl_files", (f"{option} {getattr(namespace, field)}",),
                                   f"this machine has no {path}")
    if getattr(namespace, "load_format", None) == "expert_pack":
        config = _loader_config(namespace)
        named = [(key, config.get(key)) for key in _PACK_KEYS]
        named.append(("SGLANG_EXPERT_PACK_PATH", env.get("SGLANG_EXPERT_PACK_PATH")))
        pack = config.get("pack_path") or env.get("SGLANG_EXPERT_PACK_PATH")
        if isinstance(pack, str) and pack:
            named.append(("manifest_path", pack + ".manifest.json"))  # SGLang's default name
        for key, value in named:
            path = _norm(value)
            if path is not None and not _present(path):
                files[path] = FactRead("expert_pack_files", (
                    "--load-format expert_pack", f"{key} {value}"), f"this machine has no {path}")
    return files


def _ib_devices(namespace: argparse.Namespace) -> tuple[set[str], tuple[str, ...]]:
    """The device names the IB flags give (in a list or a JSON mapping), and the flags."""
    names: set[str] = set()
    flags = []
    for field, option in _IB_FLAGS:
        value = getattr(namespace, field, None)
        if not isinstance(value, str) or not value.strip():
            continue
        flags.append(f"{option} {value}")
        text = value
        if value.strip().endswith(".json"):
            try:
                with open(value.strip(), encoding="utf-8") as handle:
                    text = handle.read(1 << 20)
            except OSError:
                continue
        names.update(_DEVICE.findall(text))
    return names, tuple(flags)


def module_bodies() -> int:
    """How many module bodies run on the caller's stack: more inside a block than at its
    start means an import started in the block is running. A stand-in answers there as
    this machine, so that no module keeps a value computed from a stand-in (``_is_cuda =
    is_cuda()``, ``import flashinfer`` at the top of a module) after the block."""
    count, frame = 0, sys._getframe(1)
    while frame is not None:
        count += frame.f_code.co_name == "<module>"
        frame = frame.f_back  # type: ignore[assignment]
    return count


class _EmptyModule(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__doc__ = "sglang-dsv4-guard check: a stand-in of the server host's package"


class _Finder(importlib.abc.MetaPathFinder):
    """Empty modules for the packages in ``packages`` that are not installed here."""

    def __init__(self, packages: Mapping[str, tuple[str, str]], answers: Answers) -> None:
        self.packages = {name: read for name, read in packages.items()
                         if importlib.machinery.PathFinder.find_spec(name) is None}
        self.answers = answers
        self.made: list[str] = []
        self.bodies = module_bodies()

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        read = self.packages.get(fullname.partition(".")[0])
        if read is None or module_bodies() > self.bodies:
            return None
        self.answers.add(FactRead(read[0], (read[1],), f"this machine has no {read[0]} package"))
        self.made.append(fullname)
        return importlib.machinery.ModuleSpec(fullname, _EmptyModule(), is_package=True)


@contextmanager
def _patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def host_answers(namespace: argparse.Namespace, env: Mapping[str, str], answers: Answers,
                 packages: Mapping[str, tuple[str, str]] | None = None) -> Iterator[None]:
    """For the block, the paths and packages the line's flags name answer as on the server's
    host (module docstring), each answer recorded in ``answers``. ``packages`` adds
    packages to answer (the CUDA platform's)."""
    files = _host_files(namespace, env)
    devices, ib_flags = _ib_devices(namespace)
    ib_detail = ("this machine's InfiniBand devices are not the server's"
                 if os.path.isdir(IB_ROOT) else f"this machine has no {IB_ROOT}")

    def asked(path: Any, kinds: str = "dir file") -> FactRead | None:
        key = _norm(path)
        if key is None:
            return None
        if key == IB_ROOT and devices and "dir" in kinds:
            return FactRead("infiniband", ib_flags, ib_detail)
        return files.get(key) if "file" in kinds else None

    def present(kinds: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def stand_in(path: Any, *args: Any, **kwargs: Any) -> Any:
                read = asked(path, kinds)
                if read is None:
                    return original(path, *args, **kwargs)
                answers.add(read)
                return True
            return stand_in
        return make

    def listing(original: Callable[..., Any]) -> Callable[..., Any]:
        def stand_in(path: Any = ".") -> Any:
            read = asked(path, "dir")
            if read is None:
                return original(path)
            answers.add(read)
            try:
                found = set(original(path))
            except OSError:
                found = set()
            return sorted(found | devices)
        return stand_in

    def is_file(original: Callable[..., Any]) -> Callable[..., Any]:
        def stand_in(self: pathlib.Path) -> Any:
            read = asked(self, "file")
            if read is None:
                return original(self)
            answers.add(read)
            return True
        return stand_in

    finder = _Finder({**_PACKAGES, **(packages or {})}, answers)
    with _held, contextlib.ExitStack() as stack:
        if files or devices:  # nothing to answer: this machine's own functions
            for owner, name, make in ((posixpath, "isdir", present("dir")),
                                      (posixpath, "isfile", present("file")),
                                      (posixpath, "exists", present("dir file")),
                                      (os, "listdir", listing), (pathlib.Path, "is_file", is_file)):
                stack.enter_context(_patched(owner, name, make))
        sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)
            for name in finder.made:
                sys.modules.pop(name, None)


def without_host_files(namespace: argparse.Namespace
                       ) -> tuple[argparse.Namespace, tuple[FactRead, ...]]:
    """``namespace`` without the flags whose file SGLang reads and that is not on this
    machine (a watermark config, a decrypted model config, a JSON file of IB devices), and
    a read for each."""
    left: list[tuple[str, FactRead]] = []
    value = getattr(namespace, "watermark_config", None)
    if isinstance(value, str) and not value.lstrip().startswith("{") \
            and not os.path.isfile(value):
        left.append(("watermark_config", FactRead(
            "watermark_file", (f"--watermark-config {value}",), f"this machine has no {value}")))
    value = getattr(namespace, "decrypted_config_file", None)
    if isinstance(value, str) and value and not os.path.isfile(value):
        left.append(("decrypted_config_file", FactRead(
            "decrypted_config", (f"--decrypted-config-file {value}",),
            f"this machine has no {value}")))
    for field, option in _IB_FLAGS:
        value = getattr(namespace, field, None)
        if isinstance(value, str) and value.strip().endswith(".json") \
                and not os.path.isfile(value.strip()):
            left.append((field, FactRead("ib_device_file", (f"{option} {value}",),
                                         f"this machine has no {value.strip()}")))
    if not left:
        return namespace, ()
    namespace = copy.copy(namespace)
    for field, _ in left:
        setattr(namespace, field, None)
    return namespace, tuple(read for _, read in left)
