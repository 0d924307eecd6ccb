"""``check --prefill-bootstrap``: a decode launch line against a running prefill, as the
decode's first contact meets it.

The prefill's bootstrap server answers decode's first GET of ``/route`` with its
``PrefillServerInfo`` (attention TP/CP/DP, PP, page size, KV cache dtype string, the
DeepSeek-V4 KV and DSpark layouts, the layer split, KV cache sharding, the decode
allocation policy), as the prefill's ranks registered them. The command fetched that
answer (:mod:`.live`); here the release's own ``PrefillServerInfo`` reads it, as the
decode does, and its fields become the prefill's endpoint. The decode is derived from its
launch line as ``check`` derives any server, and the two go to the release's real first
contact (:mod:`..pd.first_contact`) and its receiver's allocation policy
(:mod:`..pd.allocation`). What the answer does not carry (the prefill's model, transfer
backend, pool kind, state types, DCP size, environment) is not compared, and the
``unknowns`` say so.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sglang_dsv4_guard.check.offline.chatter import Output, capturing, recording, section
from sglang_dsv4_guard.check.offline.parse import (
    CheckInputError,
    parse_launch,
    without_shell_settings,
)
from sglang_dsv4_guard.check.rows.contact import NOTES
from sglang_dsv4_guard.check.rows.contract import ROWS
from sglang_dsv4_guard.check.server.derive import DerivedServer, derive_server
from sglang_dsv4_guard.check.server.endpoint_values import endpoint_of
from sglang_dsv4_guard.check.server.gpu_models import named_gpus
from sglang_dsv4_guard.findings import Report, Severity
from sglang_dsv4_guard.host.judgement import imported_package_dir, judge_imported
from sglang_dsv4_guard.host.releases import SUPPORTED_MAX, SUPPORTED_MIN
from sglang_dsv4_guard.host.targets import CONTACT_INFO_FIELDS, PD_COMMON_MODULE, PD_SERVER_INFO
from sglang_dsv4_guard.pd.allocation import CODE as ALLOCATION_CODE
from sglang_dsv4_guard.pd.allocation import allocation_findings
from sglang_dsv4_guard.pd.endpoint import Endpoint, Value
from sglang_dsv4_guard.pd.first_contact import contact_findings
from sglang_dsv4_guard.render import render_finding

__all__ = ["BootstrapResult", "render_bootstrap", "route_endpoint", "run_bootstrap_check"]

# What the /route answer carries, said in the unknowns (the endpoint names of
# CONTACT_INFO_FIELDS, as people read them).
_CARRIED = ("attention TP, CP and DP sizes, PP size, page size, KV cache dtype string, "
            "DeepSeek-V4 KV layout, DSpark layout, DSA cache layer split, KV cache sharding, "
            "decode allocation policy")


@dataclass(frozen=True)
class BootstrapResult:
    """The decode as derived, the prefill's ``/route`` answer, every finding, and what the
    answer cannot tell."""

    release: str
    address: str
    route: Mapping[str, Any]
    decode: DerivedServer
    report: Report
    unknowns: tuple[str, ...]
    sglang_output: Output = field(default_factory=Output)

    @property
    def exit_status(self) -> int:
        """0 without error findings, 1 with."""
        return 1 if self.report.by_severity(Severity.ERROR) else 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON document ``check --format json`` prints."""
        return {"sglang": self.release, "exit_status": self.exit_status,
                "findings": [f.to_dict() for f in self.report.findings],
                "derived": {"decode": self.decode.to_dict()},
                "prefill_bootstrap": {"address": self.address, "route": dict(self.route)},
                "unknowns": list(self.unknowns),
                "sglang_output": self.sglang_output.to_dict()}


def route_endpoint(address: str, route: Mapping[str, Any]) -> tuple[Endpoint, list[str]]:
    """The prefill's endpoint as the release's decode reads ``route`` (the bootstrap
    server's ``/route`` answer at ``address``): its ``PrefillServerInfo`` built from it,
    each field the decode compares a value of the endpoint; and the ``unknowns`` lines
    (an answer the release's class does not take fails every decode of this release)."""
    info_cls = getattr(importlib.import_module(PD_COMMON_MODULE),  # unscanned: SGLang
                       PD_SERVER_INFO)
    names = {f.name for f in dataclasses.fields(info_cls)}
    notes: list[str] = []
    foreign = sorted(set(route) - names)
    taken = {k: v for k, v in route.items() if k in names}
    try:
        info = info_cls(**dict(route))
    except (TypeError, ValueError) as exc:
        notes.append(f"prefill: the installed release's {PD_SERVER_INFO} does not take the "
                     f"/route answer of {address} ({type(exc).__name__}: {exc}): a decode "
                     "of this release logs 'Error fetching prefill server info from "
                     "bootstrap' and never completes its first contact with this prefill"
                     + (f" (fields it does not have: {', '.join(foreign)})" if foreign
                        else ""))
        try:
            info = info_cls(**taken)
        except (TypeError, ValueError) as again:
            raise CheckInputError("--prefill-bootstrap", f"{address}: the /route answer is not "
                                  f"the prefill's {PD_SERVER_INFO} ({type(again).__name__}: "
                                  f"{again})") from None
    source = f"the prefill's bootstrap server {address} (/route answer: {PD_SERVER_INFO}.{{}})"
    values = {name: Value(getattr(info, attr), source.format(attr))
              for name, attr in CONTACT_INFO_FIELDS if attr in names}
    return Endpoint("prefill", values, env=None), notes


def _not_compared(address: str, release: str) -> list[str]:
    """What the ``/route`` answer cannot tell, as ``unknowns`` lines."""
    compared = ("decode's first contact", f"the decode allocation policy ({ALLOCATION_CODE})")
    rows = [name for name in ROWS if name not in ("first contact", "receiver.allocation_policy")]
    return [
        f"prefill: read from its bootstrap server's /route answer at {address} ({release}'s "
        f"{PD_SERVER_INFO}): {_CARRIED}; only {' and '.join(compared)} are compared",
        "prefill: its model path, transfer backend, pool kind (MLA or not), state types, DCP "
        "size, speculative decoding and environment are not in the /route answer: the "
        f"model paths, the contract rows {', '.join(rows)}, the DCP relayout, the pair "
        "conditions and the prefill's own state check are not judged (--prefill-server-info "
        "gives the prefill's resolved arguments, and they are)",
        "the fixes are derived from the values, not proven by re-running the check: the "
        "prefill's launch line is not known"]


def run_bootstrap_check(address: str, route: Mapping[str, Any], decode_args: str,
                        decode_env: Mapping[str, str] | None = None,
                        refusals: Callable[[], tuple[str, ...]] = tuple,
                        gpus: Mapping[str, str | None] | None = None,
                        gpu_sources: Mapping[str, str] | None = None) -> BootstrapResult:
    """The decode's launch line against the prefill's ``/route`` answer ``route`` (from
    its bootstrap server at ``address``). Raises :class:`CheckInputError` on bad input."""
    named = named_gpus({"decode": (gpus or {}).get("decode")}, gpu_sources)
    with without_shell_settings() as shell, capturing(), recording() as said:
        host = judge_imported()
        if host.behaves_as is None:
            raise CheckInputError("sglang", f"the imported SGLang ({host.version or 'absent'}) "
                                            f"has checks this guard does not know "
                                            f"({host.message}); check supports {SUPPORTED_MIN} "
                                            f"to {SUPPORTED_MAX} and releases with the same checks")
        release = host.name
        gpu = named["decode"]
        with section("decode"):
            args = parse_launch("decode", decode_args, decode_env or {},
                                None if gpu is None else gpu.device)
            decode = derive_server(args, gpu)
            decode_end = endpoint_of(decode)
        prefill_end, unknowns = route_endpoint(address, route)
        findings, more = contact_findings(prefill_end, decode_end, release)
        unknowns += more
        found, more = allocation_findings(prefill_end, decode_end, release,
                                          imported_package_dir())
        read = (f"the prefill's values are the /route answer of its running bootstrap "
                f"server {address}, the decode's from its launch line")
        findings = [replace(f, details=(*f.details, read)) for f in findings + found]
        unknowns += more + list(decode_end.notes) + list(decode_end.get(NOTES, ()))
        if args.machine_refusal is not None:
            unknowns.append(f"decode: SGLang's resolution of these flags failed on this "
                            f"machine ({args.machine_refusal}); the flags are used as parsed")
        if args.resolution_error is not None:
            unknowns.append(f"decode: SGLang's resolution refuses the decode's flags "
                            f"({args.resolution_error}): the decode would not start; its "
                            "values are compared as parsed")
        unknowns += _not_compared(address, release)
        refused = refusals()
        if refused:
            unknowns.append(f"this check refused what SGLang tried while it ran "
                            f"({'; '.join(refused[:8])}): check makes no network call but "
                            "the one GET of the /route answer, made by the command")
        if shell:
            unknowns.append(f"this shell's {', '.join(shell[:10])} applies to the decode "
                            "server only through --decode-env")
        report = Report.of(findings, {"function": "sglang-dsv4-guard check",
                                      "sglang": release})
    return BootstrapResult(release, address, dict(route), decode, report,
                           tuple(dict.fromkeys(unknowns)), said.output())


def render_bootstrap(result: BootstrapResult) -> str:
    """The decode as derived, the prefill's answer, every finding, what it cannot tell."""
    d = result.decode
    route = ", ".join(f"{k} {v!r}" for k, v in result.route.items() if v is not None)
    parts = [f"sglang-dsv4-guard check (SGLang {result.release}): decode against the running "
             f"prefill at {result.address}",
             f"prefill: bootstrap server {result.address}, /route answer: {route}",
             f"decode: {d.model.path} ({d.model.architecture})\n"
             f"    attention TP {d.attn_tp_size}, attention DP {d.attn_dp_size}, page size "
             f"{d.page_size} ({d.page_size_source}); transfer backend {d.transfer_backend}",
             *(render_finding(f) for f in result.report.findings)]
    if result.unknowns:
        parts.append("not knowable from the flags and the /route answer:\n"
                     + "\n".join(f"    - {u}" for u in result.unknowns))
    errors = len(result.report.by_severity(Severity.ERROR))
    warnings = len(result.report.by_severity(Severity.WARNING))
    parts.append(f"check: {errors} error(s), {warnings} warning(s)" if errors or warnings
                 else "check: OK (no findings)")
    return "\n\n".join(parts)
