"""The first-contact page-size verdict on each GPU model a server may have.

A page size that is not typed is the attention backend's, and SGLang chooses the backend,
and rewrites page sizes to ones it supports, by the GPU model: on SM100 an MHA model's
default ``trtllm_mha`` sets an untyped page size to 64, on SM90 ``fa3`` keeps 1
(``arg_groups/model_override_base.py``, ``arg_groups/overrides.py``, 0.5.23). So when
the first-contact row finds the page sizes different on this machine's resolution (which
need not have the servers' GPU), both lines are resolved again by SGLang as each GPU model
its probes tell apart (:func:`~sglang_dsv4_guard.check.offline.probes.devices_for`): the
pair is judged per GPU model (:func:`page_size_by_gpu`).
"""

from __future__ import annotations

from dataclasses import replace

from sglang_dsv4_guard.check.offline.parse import resolve_as
from sglang_dsv4_guard.check.offline.probes import devices_for
from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.findings import Finding, Phase, Severity, When
from sglang_dsv4_guard.pd.first_contact import PAGE_CODE

__all__ = ["page_size_by_gpu", "page_sizes"]


def page_sizes(side: DerivedServer) -> dict[str, int | None]:
    """The page size SGLang's resolution gives ``side`` as each GPU model (``None`` where
    the release refuses the flags on that model: that server would not start there)."""
    return {device.name: getattr(resolve_as(side.args, device), "page_size", None)  # None: refused
            for device in devices_for(side.args.resolved_device)}


def page_size_by_gpu(finding: Finding, prefill: DerivedServer, decode: DerivedServer) -> Finding:
    """``finding`` (the first-contact row's page size) judged on each GPU model: agreeing
    on some, a warning naming per GPU model both page sizes and what SGLang does; refused
    on every one, the error, with the per-GPU page sizes in its details where they vary."""
    if finding.code != PAGE_CODE or not (prefill.args.resolved and decode.args.resolved):
        return finding
    p, d = page_sizes(prefill), page_sizes(decode)
    rows = [(name, p[name], d[name]) for name in p
            if p[name] is not None and d.get(name) is not None]
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
