"""The GPU models a pair is judged on, and the first-contact page size on each.

A server named to run on a GPU (``check --gpu``) has that GPU; one not named may have
each GPU model SGLang's probes tell apart for its ``--device``
(:func:`~sglang_dsv4_guard.check.offline.probes.devices_for`). :func:`device_pairs` gives
the (prefill GPU, decode GPU) pairs a per-GPU judgement runs on: with no GPU named, the
same model on both servers, each model in turn; with one named, that GPU against each
model the other server may have.

A page size that is not typed is the attention backend's, and SGLang chooses the backend,
and rewrites page sizes to ones it supports, by the GPU model: on SM100 an MHA model's
default ``trtllm_mha`` sets an untyped page size to 64, on SM90 ``fa3`` keeps 1
(``arg_groups/model_override_base.py``, ``arg_groups/overrides.py``, 0.5.23). So when
the first-contact row finds the page sizes different and a server's GPU is not named
(this machine's resolution need not be its GPU's), both lines are resolved again by SGLang
as each pair of GPUs: the pair is judged per GPU model (:func:`page_size_by_gpu`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sglang_dsv4_guard.check.offline.parse import LaunchArgs, resolve_as
from sglang_dsv4_guard.check.offline.probes import Device
from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.findings import Finding, Phase, Severity, When
from sglang_dsv4_guard.pd.first_contact import PAGE_CODE

__all__ = ["DevicePair", "device_pairs", "page_size_by_gpu", "page_sizes"]


@dataclass(frozen=True)
class DevicePair:
    """The GPUs of the two servers in one row of a per-GPU judgement, and its label (the
    model's name when both have the same one)."""

    label: str
    prefill: Device
    decode: Device


def device_pairs(prefill: LaunchArgs, decode: LaunchArgs) -> tuple[DevicePair, ...]:
    """The (prefill GPU, decode GPU) pairs a per-GPU judgement of the two servers runs on
    (see the module docstring); none when their ``--device`` has no GPU models."""
    if prefill.gpu is None and decode.gpu is None:
        return tuple(DevicePair(d.name, d, d) for d in prefill.devices if d in decode.devices)
    return tuple(DevicePair(a.name if a == b else f"prefill {a.name} with decode {b.name}", a, b)
                 for a in prefill.devices for b in decode.devices)


def page_sizes(side: DerivedServer, devices: tuple[Device, ...] | None = None
               ) -> dict[Device, int | None]:
    """The page size SGLang's resolution gives ``side`` as each of ``devices`` (its own,
    :attr:`~.parse.LaunchArgs.devices`, by default; ``None`` where the release refuses
    the flags on that GPU: that server would not start there)."""
    return {device: getattr(resolve_as(side.args, device), "page_size", None)  # None: refused
            for device in (side.args.devices if devices is None else devices)}


def page_size_by_gpu(finding: Finding, prefill: DerivedServer, decode: DerivedServer) -> Finding:
    """``finding`` (the first-contact row's page size) judged on each pair of GPUs:
    agreeing on some, a warning naming per pair both page sizes and what SGLang does;
    refused on every one, the error, with the per-GPU page sizes in its details where
    they vary. Both servers named to run on a GPU: ``finding`` as it is (their
    resolutions ran as those GPUs)."""
    if finding.code != PAGE_CODE or not (prefill.args.resolved and decode.args.resolved):
        return finding
    if prefill.args.gpu is not None and decode.args.gpu is not None:
        return finding
    pairs = device_pairs(prefill.args, decode.args)
    p = page_sizes(prefill, tuple(dict.fromkeys(pair.prefill for pair in pairs)))
    d = page_sizes(decode, tuple(dict.fromkeys(pair.decode for pair in pairs)))
    rows = [(pair.label, p[pair.prefill], d[pair.decode]) for pair in pairs
            if p[pair.prefill] is not None and d[pair.decode] is not None]
    if not rows:
        return finding
    refused = [name for name, a, b in rows if a != b]
    accepted = [name for name, a, b in rows if a == b]
    if not accepted and len({(a, b) for _, a, b in rows}) == 1:
        return finding  # the same page sizes, and the same refusal, on every GPU model
    lines = tuple(f"  as {name}: prefill page size {a}, decode page size {b}: "
                  + ("SGLang accepts the pair" if a == b else
                     "SGLang refuses the pair at first contact") for name, a, b in rows)
    header = ("the page sizes depend on the GPU model (the attention backend SGLang "
              "chooses for it, and that backend's page sizes); SGLang's resolution of both "
              "lines as each GPU model:")
    details = (*finding.details, header, *lines)
    if not accepted:
        return replace(finding, details=details)
    effect = (f"on {', '.join(refused)} only: {finding.when and finding.when.effect}" if refused
              else "on no GPU model: the page sizes differ only in this machine's resolution")
    return replace(finding, severity=Severity.WARNING if refused else Severity.INFO,
                   details=details, when=When(Phase.FIRST_CONTACT, effect))
