"""Built-in check of decode's first contact: every mismatch, with ``check``'s codes.

The two servers' values go to the runner ``check`` uses
(:func:`sglang_dsv4_guard.pd.first_contact.contact_findings`), so a finding met at run time
has the code and the fixes (:mod:`..pd.contact_fixes`) ``check`` gives the same values; the
other server's launch line is unknown here, so the report says the fixes are unproven and
how to prove them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.contact.snapshot import ContactContext, ContactSnapshot, Seen
from sglang_dsv4_guard.findings import Finding, Observation, Phase, Severity
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.hookmarkers import hookimpl
from sglang_dsv4_guard.host.targets import PD_FIRST_CONTACT
from sglang_dsv4_guard.pd.endpoint import Endpoint, Value
from sglang_dsv4_guard.pd.first_contact import contact_findings, rule_for
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["contact_endpoints", "sglang_dsv4_guard_check_first_contact"]

_PROVE = ("prove it on both launch lines with `sglang-dsv4-guard check --prefill ARGS "
          "--decode ARGS --fix` (at run time the other server's launch line is unknown)")
_UNKNOWN_PREFILL = ("not readable: SGLang's frame held no PrefillServerInfo in this "
                    "release; the prefill's values are unknown here")
def _endpoint(role: str, seen: Seen, extra: Mapping[str, Value] | None = None,
              env: Mapping[str, str] | None = None) -> Endpoint:
    """``role``'s endpoint; ``env``: its environment where it is this process's (the
    decode's), else not known (the prefill's)."""
    values = {name: Value(value, source) for name, (value, source) in seen.items()}
    return Endpoint(role, {**values, **(extra or {})}, env=env)


def contact_endpoints(contact: ContactSnapshot, context: ContactContext
                      ) -> tuple[Endpoint, Endpoint] | None:
    """The prefill and decode :class:`~sglang_dsv4_guard.pd.endpoint.Endpoint` of the
    snapshot (``None`` without the prefill's values)."""
    if contact.prefill is None:
        return None
    backend = {"transfer_backend": Value(context.transfer_backend, "this decode server")}
    return (_endpoint("prefill", contact.prefill),
            _endpoint("decode", contact.decode, backend, dict(os.environ)))


def _runtime_details(finding: Finding) -> tuple[str, ...]:
    return (*finding.details[:1],
            f"SGLang's own {PD_FIRST_CONTACT.qualname} raised this on both servers' values "
            "as this decode server met them (its own, and the prefill's /route answer); run "
            "again on copies, each mismatch neutralised, to find every one",
            f"the fixes are derived from those values, unproven: {_PROVE}")


def _unread(contact: ContactSnapshot, context: ContactContext) -> Finding:
    """SGLang's mismatch alone, when the prefill's values are not readable."""
    code, names = rule_for(contact.message)
    info = CODES.get(code)
    observations = tuple(
        o for name in names for o in (
            Observation("prefill", name, None, _UNKNOWN_PREFILL),
            Observation("decode", name, *contact.decode.get(name, (None, "not read")))))
    return Finding(
        code=code, severity=Severity.ERROR, summary=info.title if info else contact.message,
        subject="decode's first contact with the prefill", observations=observations,
        details=("only SGLang's first mismatch is known: the prefill's values were not "
                 "readable from SGLang's frame in this release",),
        fixes=(Fix(FixKind.ADVICE, _PROVE, field=code),), docs=docs_url(code),
        host_message=contact.message,
        when=when_of(Phase.FIRST_CONTACT, context.transfer_backend))


@hookimpl(tryfirst=True)
def sglang_dsv4_guard_check_first_contact(contact: ContactSnapshot,
                                          context: ContactContext) -> list[Finding]:
    """Every mismatch between the decode and the prefill at first contact."""
    ends = contact_endpoints(contact, context)
    if ends is None:
        return [_unread(contact, context)]
    prefill, decode = ends
    found, unknowns = contact_findings(prefill, decode, context.profile.name)
    unknown = tuple(f"unknown: {u}" for u in unknowns)  # said once, on the first finding
    return [dataclasses.replace(f, details=_runtime_details(f) + (unknown if i == 0 else ()))
            for i, f in enumerate(found)]
