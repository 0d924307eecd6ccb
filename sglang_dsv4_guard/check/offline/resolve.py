"""One server's parsed flags resolved by the installed release, on this machine.

:func:`resolve_on` runs the release's own resolution (``ServerArgs.from_cli_args``, which
resolves up to 0.5.21, then ``resolve_once`` from 0.5.22) as one device, with the server's
environment applied and the process environment restored afterwards, and with what SGLang
reads of the machine answered for the server's host:

- the GPU model's probes (:mod:`.probes`): this machine's answers, or one GPU model's;
- the host's files, InfiniBand devices and packages the flags name (:mod:`.standins`):
  present;
- the platform (:mod:`.cuda_platform`): this machine's answers; after a refusal that read
  it, on a ``--device cuda`` server, once more as an NVIDIA CUDA host. Resolving as a CUDA
  GPU model is resolving on a CUDA host too.

A refusal is the flags' unless this machine caused it (``cause``): :func:`~.causes.
machine_cause` (a package missing, the network, a write, a GPU probe), a fact nothing here
can answer (:func:`~.machine.said_fact`), or the GPU model (:func:`~.probes.as_devices`).
Each fact answered is a :class:`~.machine.FactRead` of the :class:`Resolution`.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sglang_dsv4_guard.check.offline.causes import failing_source, machine_cause
from sglang_dsv4_guard.check.offline.cuda_platform import platform_probed
from sglang_dsv4_guard.check.offline.machine import FactRead, fact, said_cause, said_fact
from sglang_dsv4_guard.check.offline.probes import Device, as_devices, probed
from sglang_dsv4_guard.check.offline.standins import CUDA_PACKAGES, Answers, host_answers

__all__ = ["Resolution", "offline_env", "resolve_on", "resolving_view"]


@dataclass(frozen=True)
class Resolution:
    """The resolved ``ServerArgs`` (``None`` when refused), the refusal, its machine cause
    (``None`` when the flags'), and the facts of this machine answered for it."""

    server_args: Any
    refusal: str | None = None
    cause: str | None = None
    reads: tuple[FactRead, ...] = ()

    def triple(self) -> tuple[Any, str | None, str | None]:
        """``(server_args, refusal, cause)``, as :func:`~.probes.as_devices` takes it."""
        return self.server_args, self.refusal, self.cause


@contextmanager
def offline_env(env: Mapping[str, str] | None = None) -> Iterator[None]:
    """``HF_HUB_OFFLINE=1`` and ``env`` for the block; the process environment restored after
    (SGLang's resolution writes environment variables)."""
    saved = dict(os.environ)
    os.environ.update(env or {})
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def resolving_view(server_args: Any) -> Any:
    """``server_args`` as the release's resolving view shows them (from 0.5.22, where a
    model override's value lives), else themselves."""
    try:
        from sglang.srt.arg_groups.model_override_base import resolving_view as view
    except ImportError:
        return server_args
    return view(server_args)


@dataclass(frozen=True)
class _Attempt:
    server_args: Any
    refusal: str | None
    cause: str | None
    probes: tuple[str, ...]  # the GPU model's probes read
    platform: bool  # whether the platform was read
    reads: tuple[FactRead, ...]


def _attempt(namespace: argparse.Namespace, env: Mapping[str, str], device: str,
             as_device: Device | None, cuda: bool) -> _Attempt:
    from sglang.srt.server_args import ServerArgs

    ns = copy.copy(namespace)
    ns.device = device
    answers = Answers()
    read: list[str] = []
    try:
        with offline_env(env), probed(as_device) as read, host_answers(
                ns, env, answers, CUDA_PACKAGES if cuda else None), \
                platform_probed(answers, cuda):
            server_args = ServerArgs.from_cli_args(ns)  # resolves here up to 0.5.21
            resolve = getattr(server_args, "resolve_once", None)
            if resolve is not None:
                resolve()
    except (Exception, SystemExit) as exc:  # SGLang's verdict on the flags: a refusal
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        cause = machine_cause(exc, device) if isinstance(exc, Exception) else None
        refusal = f"{type(exc).__name__}: {first}"
        if not first and failing_source(exc):  # a bare assert: its condition says what
            refusal += f"(SGLang's check failed: {failing_source(exc)})"
        said = said_fact(str(exc), device) if cause is None else None
        if said is not None:
            cause = said_cause(said, _named(first, namespace, said.key))
        return _Attempt(None, refusal, cause, tuple(read), answers.platform,
                        tuple(answers.reads))
    return _Attempt(server_args, None, None, tuple(read), answers.platform,
                    tuple(answers.reads))


_OPTION = re.compile(r"--[a-z][a-z0-9-]*")


def _named(refusal: str, namespace: argparse.Namespace, key: str) -> tuple[str, ...]:
    """The line's flags a refusal names (with their values); else the flags of the fact
    ``key``'s row of the table that the line sets as the row says."""
    def shown(option: str) -> str | None:
        value = getattr(namespace, option[2:].replace("-", "_"), None)
        if value is None or value is False or value == [] or value == "":
            return None
        return option if value is True else f"{option} {value}"

    named = [found for option in dict.fromkeys(_OPTION.findall(refusal))
             if (found := shown(option)) is not None]
    if not named:
        for flag in fact(key).flags:
            option, _, value = flag.partition(" ")
            found = shown(option)
            if found is not None and found == (f"{option} {value}" if value else option):
                named.append(found)
    return tuple(dict.fromkeys(named))


def resolve_on(namespace: argparse.Namespace, env: Mapping[str, str], device: str,
               as_device: Device | None = None) -> Resolution:
    """``namespace`` resolved by the release as ``device`` (as the GPU model ``as_device``
    when given), as the module docstring says."""
    cuda = as_device is not None and not as_device.mps
    outcome = _attempt(namespace, env, device, as_device, cuda)
    reads = outcome.reads
    if outcome.refusal is not None and outcome.cause is None and not cuda \
            and device == "cuda" and outcome.platform:
        again = _attempt(namespace, env, device, as_device, True)
        reads = again.reads
        if again.refusal != outcome.refusal:  # this machine's platform made the refusal
            reads = (FactRead("cuda_platform", _named(outcome.refusal, namespace, "cuda_platform"),
                              "this machine has no NVIDIA CUDA GPU, and SGLang refused the "
                              f"flags for it ({outcome.refusal})"), *reads)
        outcome = again  # refused alike: as a CUDA host it may read the GPU model's probes
    if outcome.refusal is None:
        return Resolution(outcome.server_args, reads=reads)
    refusal, cause = outcome.refusal, outcome.cause
    if cause is None and outcome.probes and as_device is None:
        cause, refusal = as_devices(device, refusal, lambda candidate: resolve_on(
            namespace, env, device, candidate).triple())
    return Resolution(None, refusal, cause, reads)
