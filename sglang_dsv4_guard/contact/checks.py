"""Built-in check of decode's first contact: every mismatch, with ``check``'s codes.

The two servers' values go to the runner ``check`` uses
(:func:`sglang_dsv4_guard.pd.first_contact.contact_findings`: the release's own
``try_ensure_parallel_info`` on a bare manager, each mismatch neutralised and the function
called again), so a finding met at run time has the code ``check`` gives the same values.
The fixes are derived from what differs; the other server's launch line is unknown here,
so each says which server to change with which value, names a flag only if this
release's parser has it, and points to ``check --fix`` to prove it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.contact.snapshot import ContactContext, ContactSnapshot, Seen
from sglang_dsv4_guard.findings import Finding, Observation, Severity
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.hookmarkers import hookimpl
from sglang_dsv4_guard.host import flags
from sglang_dsv4_guard.host.targets import PD_FIRST_CONTACT
from sglang_dsv4_guard.pd.endpoint import Endpoint, Value
from sglang_dsv4_guard.pd.first_contact import contact_findings, rule_for
from sglang_dsv4_guard.pd.when import Phase, when_text

__all__ = ["contact_endpoints", "contact_fixes", "sglang_dsv4_guard_check_first_contact"]

_PROVE = ("prove it on both launch lines with `sglang-dsv4-guard check --prefill ARGS "
          "--decode ARGS --fix` (at run time the other server's launch line is unknown)")
_UNKNOWN_PREFILL = ("not readable: SGLang's frame held no PrefillServerInfo in this "
                    "release; the prefill's values are unknown here")
# Values a condition needs set to its neutral value on one server: (server, value).
_NEUTRAL = {("DSV4G034", "dcp_size"): ("decode", 1),
            ("DSV4G034", "attn_cp_size"): ("prefill", 1),
            ("DSV4G034", "enable_kv_cache_sharding"): ("prefill", False),
            ("DSV4G035", "attn_cp_size"): ("decode", 1),
            ("DSV4G035", "enable_kv_cache_sharding"): ("prefill", False)}
# ServerArgs fields behind the endpoint names a flag can set.
_FIELD = {"page_size": "page_size", "kv_cache_dtype_str": "kv_cache_dtype",
          "pp_size": "pp_size", "dcp_size": "dcp_size", "attn_cp_size": "attn_cp_size",
          "enable_kv_cache_sharding": "enable_kv_cache_sharding"}
_ADVICE = {"attn_tp_size": "the same attention TP size (--tp-size, divided by the "
                           "attention-DP width)",
           "kv_layout": "the same --dsv4-attn-backend and SGLANG_DSV4_KV_LAYOUT / "
                        "SGLANG_DSV4_COMPRESSED_KV_LAYOUT (the layouts differ)",
           "dsv41_spec_layout": "DSpark enabled the same way (speculative algorithm, block "
                                "size, target/draft KV layout) and the same release"}


def _endpoint(role: str, seen: Seen, extra: Mapping[str, Value] | None = None) -> Endpoint:
    values = {name: Value(value, source) for name, (value, source) in seen.items()}
    return Endpoint(role, {**values, **(extra or {})})


def contact_endpoints(contact: ContactSnapshot, context: ContactContext
                      ) -> tuple[Endpoint, Endpoint] | None:
    """The prefill and decode :class:`~sglang_dsv4_guard.pd.endpoint.Endpoint` of the
    snapshot (``None`` without the prefill's values)."""
    if contact.prefill is None:
        return None
    backend = {"transfer_backend": Value(context.transfer_backend, "this decode server")}
    return _endpoint("prefill", contact.prefill), _endpoint("decode", contact.decode, backend)


def _edit(server: str, name: str, value: Any) -> tuple[Edit, ...]:
    field = _FIELD.get(name)
    found = flags.flag_for_field(field) if field else None
    if found is None:
        return ()
    if value is False or (name in ("dcp_size", "attn_cp_size") and value == 1):
        edit = Edit(server, found.option, remove=True)  # back to the release's default
    elif value is True:
        edit = Edit(server, found.option)
    else:
        edit = Edit(server, found.option, str(value))
    return flags.vetted(edit)


def _inputs(name: str, prefill: Endpoint, decode: Endpoint) -> tuple[str, ...]:
    return tuple(f"{e.role}: {name} {e.get(name)!r} from {e.source(name)}"
                 for e in (prefill, decode))


def contact_fixes(code: str, names: tuple[str, ...], prefill: Endpoint,
                  decode: Endpoint) -> tuple[Fix, ...]:
    """Fixes for one first-contact finding: per value that decides it, the server to
    change and the value it needs (the other server's, or the neutral one)."""
    fixes: list[Fix] = []
    for name in dict.fromkeys(names):
        p, d = prefill.get(name), decode.get(name)
        inputs = _inputs(name, prefill, decode)
        neutral = _NEUTRAL.get((code, name))
        if neutral is not None:
            server, value = neutral
            own = (prefill if server == "prefill" else decode).get(name)
            if own != value:
                fixes.append(Fix(FixKind.FLAGS, f"launch the {server} server with {name} "
                                 f"{value!r} (it has {own!r}); {_PROVE}", field=name,
                                 edits=_edit(server, name, value), inputs=inputs))
            continue
        if name in _ADVICE:
            if p != d:
                fixes.append(Fix(FixKind.ADVICE, f"give both servers {_ADVICE[name]}: "
                                 f"prefill {p!r}, decode {d!r}; {_PROVE}", field=name,
                                 inputs=inputs))
            continue
        if name not in _FIELD or p == d:
            continue
        if name == "pp_size":
            fixes.append(Fix(FixKind.FLAGS, f"launch the decode server with the prefill's "
                             f"pipeline-parallel size {p} (or 1); {_PROVE}", field=name,
                             edits=_edit("decode", name, p), inputs=inputs))
            continue
        fixes.append(Fix(FixKind.FLAGS, f"launch the decode server with the prefill's "
                         f"{name} {p!r}; {_PROVE}", field=name,
                         edits=_edit("decode", name, p), inputs=inputs))
        fixes.append(Fix(FixKind.FLAGS, f"or launch the prefill server with the decode's "
                         f"{name} {d!r}; {_PROVE}", field=name,
                         edits=_edit("prefill", name, d), inputs=inputs))
    return tuple(fixes) or (Fix(FixKind.NO_FLAG_FIX, "no flag of either server sets what "
                                "differs here; " + _PROVE, field=code),)


def _runtime_details(finding: Finding) -> tuple[str, ...]:
    order = finding.details[:1]
    return (*order, f"SGLang's own {PD_FIRST_CONTACT.qualname} raised this on both "
                    "servers' values as this decode server met them (its own, and the "
                    "prefill's /route answer); run again on copies, each mismatch "
                    "neutralised, to find every one")


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
        when=when_text(Phase.FIRST_CONTACT, context.transfer_backend))


@hookimpl(tryfirst=True)
def sglang_dsv4_guard_check_first_contact(contact: ContactSnapshot,
                                          context: ContactContext) -> list[Finding]:
    """Every mismatch between the decode and the prefill at first contact."""
    ends = contact_endpoints(contact, context)
    if ends is None:
        return [_unread(contact, context)]
    prefill, decode = ends
    found, unknowns = contact_findings(prefill, decode, context.profile.name)
    out = []
    for i, finding in enumerate(found):
        names = tuple(o.name for o in finding.observations)
        details = _runtime_details(finding)
        if i == 0 and unknowns:
            details += tuple(f"unknown: {u}" for u in unknowns)
        out.append(dataclasses.replace(
            finding, details=details,
            fixes=contact_fixes(finding.code, names, prefill, decode)))
    return out
