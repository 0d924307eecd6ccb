"""The wrapper around ``setup_state_kv_args``.

The verdict is always SGLang's: the wrapper calls SGLang's function exactly once
with the caller's arguments. Around that call it snapshots the pools, lets
remediation plug-ins act (auto-share), runs every check, and then:

- SGLang raised a DSV4 ``RuntimeError``: raise :class:`DSV4GuardError` (first line
  SGLang's message, then the report), chained to SGLang's error;
- SGLang raised anything else: re-raise that very exception, the report attached
  as a PEP 678 note and as ``exc.dsv4_guard_report``;
- SGLang accepted: log any warnings; in strict mode raise on errors and warnings.

The checks' first error is cross-checked against SGLang's message; a mismatch is
reported as ``DSV4G099`` (our bug) and never changes the outcome.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang_dsv4_guard.codes import docs_url
from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Finding, Report, Severity, first_host_message
from sglang_dsv4_guard.render import render_report
from sglang_dsv4_guard.runtime import Runtime, add_note
from sglang_dsv4_guard.state.snapshot import StateContext, StatePair, snapshot_pair

__all__ = ["Prepared", "check_pair", "make_state_wrapper", "prepare_pair"]

_CALLERS = {
    "sglang.srt.disaggregation.prefill": "prefill server (PrefillBootstrapQueue)",
    "sglang.srt.disaggregation.decode": "decode server (DecodePreallocQueue)",
}
_ENV_KEYS = ("SGLANG_HACK_FLASHMLA_BACKEND",)


@dataclass(frozen=True)
class Prepared:
    """A pair ready for the checks: its snapshot, context and what remediation did."""

    pair: StatePair
    context: StateContext
    remediation: tuple[Finding, ...]


def prepare_pair(rt: Runtime, target: object, draft: object, caller: str) -> Prepared | None:
    """Snapshot a pair, let remediation plug-ins act, and snapshot again if they did.

    ``None`` when SGLang's DeepSeek-V4 draft block does not run for these pools.
    """
    context = StateContext(
        profile=rt.profile,
        caller=_CALLERS.get(caller, caller),
        mode=rt.settings.mode.value.value,
        autoshare=rt.settings.autoshare.value,
        environ={k: os.environ[k] for k in _ENV_KEYS if k in os.environ},
    )
    pair = snapshot_pair(target, draft, rt.profile.npu_gate)
    if not pair.block_runs:
        return None
    remediation = rt.plugins.collect(
        "sglang_dsv4_guard_remediate_state",
        {"target_pool": target, "draft_pool": draft, "pair": pair, "context": context},
    )
    if remediation:  # something may have changed the pools: look again
        pair = snapshot_pair(target, draft, rt.profile.npu_gate)
    return Prepared(pair, context, tuple(remediation))


def check_pair(rt: Runtime, prep: Prepared) -> list[Finding]:
    """The remediation findings plus every ``check_state`` implementation's findings."""
    return [*prep.remediation, *rt.plugins.collect(
        "sglang_dsv4_guard_check_state", {"pair": prep.pair, "context": prep.context})]


def _prepare(rt: Runtime, sig: inspect.Signature, caller: str,
             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Prepared | None:
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return None  # SGLang raises its own TypeError for these arguments
    draft = bound.arguments.get("draft_token_to_kv_pool")
    if draft is None:
        return None  # no draft pool: SGLang's DSV4 draft block does not run
    return prepare_pair(rt, bound.arguments.get("token_to_kv_pool"), draft, caller)


def _discrepancy(predicted: str | None, actual: str | None) -> Finding:
    return Finding(
        code="DSV4G099", severity=Severity.WARNING,
        summary="the guard's prediction differs from SGLang's verdict; SGLang's stands",
        subject="guard self-check",
        details=(f"SGLang: {actual or 'accepted the pools'}",
                 f"guard predicted: {predicted or 'acceptance'}"),
        fixes=("please report this with the JSON report (SGLANG_DSV4_GUARD_LOG_FORMAT=json)",),
        docs=docs_url("DSV4G099"),
    )


def _findings(rt: Runtime, prep: Prepared, host_line: str | None) -> tuple[Report, bool]:
    findings = check_pair(rt, prep)
    predicted = first_host_message(findings[len(prep.remediation):])
    mirrored = host_line is not None and host_line.startswith("DSV4 ")
    if (mirrored or host_line is None) and predicted != host_line:
        findings.append(_discrepancy(predicted, host_line))
    report = Report.of(findings, prep.context.describe(), host_error=host_line)
    rt.publish(report)
    return report, mirrored


def _on_host_error(rt: Runtime, prep: Prepared, host_error: Exception) -> Exception | None:
    text = str(host_error)
    host_line = text.splitlines()[0] if text else type(host_error).__name__
    report, mirrored = _findings(rt, prep, host_line)
    if not report.findings:
        return None
    rendered = render_report(report)
    if mirrored and isinstance(host_error, RuntimeError):
        return DSV4GuardError(text, report, rendered, host_error)
    add_note(host_error, rendered or "")
    host_error.dsv4_guard_report = report  # type: ignore[attr-defined]
    return None


def _on_host_success(rt: Runtime, prep: Prepared) -> None:
    report, _ = _findings(rt, prep, None)
    escalate = [f for f in report.findings
                if f.severity is not Severity.INFO and f not in prep.remediation]
    if rt.strict and escalate:
        first = escalate[0]
        raise DSV4GuardError(f"sglang-dsv4-guard (strict mode): [{first.code}] {first.summary}",
                             report, render_report(report))


_HOOK_LAYERS = ("sglang_dsv4_guard.host_hooks", "sglang.srt.plugins.hook_registry")


def _caller(frame: Any) -> str:
    """The module that called ``setup_state_kv_args``, past SGLang's hook wrappers and ours."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", "?"))
        if not name.startswith(_HOOK_LAYERS):
            return name
        frame = frame.f_back
    return "?"


def make_state_wrapper(rt: Runtime) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A factory for :func:`sglang_dsv4_guard.patching.apply`."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(original)

        @functools.wraps(original)
        def setup_state_kv_args(*args: Any, **kwargs: Any) -> Any:
            if not rt.active:
                return original(*args, **kwargs)
            caller = _caller(sys._getframe(1))
            prep = None
            try:
                prep = _prepare(rt, sig, caller, args, kwargs)
            except Exception as exc:
                rt.internal_error("checking the pools before setup_state_kv_args", exc)
            try:
                result = original(*args, **kwargs)
            except Exception as host_error:
                replacement = None
                if prep is not None:
                    try:
                        replacement = _on_host_error(rt, prep, host_error)
                    except Exception as exc:
                        rt.internal_error("reporting setup_state_kv_args' error", exc)
                if replacement is not None:
                    raise replacement from host_error
                raise
            if prep is not None:
                try:
                    _on_host_success(rt, prep)
                except DSV4GuardError:
                    raise
                except Exception as exc:
                    rt.internal_error("checking the pools after setup_state_kv_args", exc)
            return result

        return setup_state_kv_args

    return make
