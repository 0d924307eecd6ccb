"""The wrapper around ``setup_state_kv_args``.

The verdict is always SGLang's: the wrapper calls SGLang's function exactly once
with the caller's arguments. Around that call it snapshots the pools, lets
remediation plug-ins act (auto-share), runs every check, and then:

- SGLang raised a DSV4 ``RuntimeError``: raise :class:`DSV4GuardError` (first line
  SGLang's message, then the report), chained to SGLang's error;
- SGLang raised anything else: re-raise that very exception, the report attached
  as a PEP 678 note and as ``exc.dsv4_guard_report``;
- SGLang accepted: log any warnings; in strict mode raise on errors and warnings.

The checks' first error is cross-checked against SGLang's message; a mismatch is a
self-check finding (:func:`~sglang_dsv4_guard.wrapping.self_check`: our bug) and never
changes the outcome.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from sglang_dsv4_guard.boundary import CODE as PLUGIN_FAILED
from sglang_dsv4_guard.boundary import is_builtin, plugin_failure
from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Finding, Phase, Report, Severity, first_host_message
from sglang_dsv4_guard.host.targets import CALLERS, FLASHMLA_ENV
from sglang_dsv4_guard.reporter import Delivery
from sglang_dsv4_guard.runtime import Runtime
from sglang_dsv4_guard.state.snapshot import (
    StateContext,
    StatePair,
    change_token,
    snapshot_pair,
)
from sglang_dsv4_guard.wrapping import (
    HANDLER,
    HOOK_LAYERS,
    calling_frame,
    carried_text,
    deliver,
    handler_prints_traceback,
    note_on,
    our_failure,
    publish,
    self_check,
    upgrades,
)

__all__ = ["CallSite", "Prepared", "check_pair", "make_state_wrapper", "prepare_pair"]

@dataclass(frozen=True)
class CallSite:
    """Who called ``setup_state_kv_args``: the module (SGLang's own frame when there is
    one) and whether SGLang's scheduler handler will log the traceback of what rises."""

    module: str
    in_scheduler: bool = False
    location: str = ""  # "file:line" of the call, when seen


@dataclass(frozen=True)
class Prepared:
    """A pair ready for the checks: its snapshot, context and what remediation did."""

    pair: StatePair
    context: StateContext
    remediation: tuple[Finding, ...]
    in_scheduler: bool = False


def _changed_silently(name: str, found: list[Finding]) -> Finding:
    failed = any(f.code == PLUGIN_FAILED for f in found)
    return plugin_failure(
        name, "sglang_dsv4_guard_remediate_state",
        "changed what SGLang reads from the pools and then failed" if failed else
        "changed what SGLang reads from the pools without returning a finding that says so",
        "changed")


def prepare_pair(rt: Runtime, target: object, draft: object,
                 caller: str | CallSite) -> Prepared | None:
    """Snapshot a pair, let remediation plug-ins act, and snapshot again if they did.

    ``caller`` is the calling module (or a :class:`CallSite`); SGLang's prefill and decode
    queues give the report's role. After each remediation plug-in a cheap change token
    (:func:`~sglang_dsv4_guard.state.snapshot.change_token`) of what SGLang reads is
    compared with the one before: when it changed, the pair is snapshotted again, and
    a plug-in that changed it without a finding saying so (it returned nothing, or
    raised) is named in a plug-in failure finding.

    ``None`` when SGLang's DeepSeek-V4 draft block does not run for these pools.
    """
    who = caller if isinstance(caller, CallSite) else CallSite(caller)
    known = CALLERS.get(who.module)
    context = StateContext(
        profile=rt.profile,
        caller=known.describe if known else who.module,
        role=known.role if known else "unknown",
        mode=rt.settings.mode.value.value,
        autoshare=rt.settings.autoshare.value,
        environ={k: os.environ[k] for k in (FLASHMLA_ENV,) if k in os.environ},
        location=who.location,
    )
    pair = snapshot_pair(target, draft, rt.profile.npu_gate)
    if not pair.block_runs:
        return None
    remediation: list[Finding] = []
    before = (change_token(target), change_token(draft))
    changed = False
    for name, found in rt.plugins.collect_each(
        "sglang_dsv4_guard_remediate_state",
        {"target_pool": target, "draft_pool": draft, "pair": pair, "context": context},
    ):
        remediation.extend(found)
        after = (change_token(target), change_token(draft))
        if after != before:
            changed, before = True, after
            if not any(f.code != PLUGIN_FAILED for f in found):
                remediation.append(_changed_silently(name, found))
    if changed:
        pair = snapshot_pair(target, draft, rt.profile.npu_gate)
    return Prepared(pair, context, tuple(remediation), who.in_scheduler)


def check_pair(rt: Runtime, prep: Prepared) -> list[Finding]:
    """The remediation findings plus every ``check_state`` implementation's findings."""
    return [*prep.remediation, *rt.plugins.collect(
        "sglang_dsv4_guard_check_state", {"pair": prep.pair, "context": prep.context})]


def _prepare(rt: Runtime, sig: inspect.Signature, caller: CallSite,
             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Prepared | None:
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return None  # SGLang raises its own TypeError for these arguments
    draft = bound.arguments.get("draft_token_to_kv_pool")
    if draft is None:
        return None  # no draft pool: SGLang's DSV4 draft block does not run
    return prepare_pair(rt, bound.arguments.get("token_to_kv_pool"), draft, caller)


def _findings(rt: Runtime, prep: Prepared, host_line: str | None,
              sglang_own: bool = True) -> tuple[Report, bool]:
    """``sglang_own``: the host error is SGLang's own exact ``RuntimeError`` (a subclass such
    as ``NotImplementedError("DSV4 ...")`` is somebody else's and is never mirrored)."""
    findings = check_pair(rt, prep)
    # The guard's prediction of SGLang's verdict is the built-in checks' alone: a
    # plug-in's ERROR finding (even one carrying a host_message) is its own finding.
    predicted = first_host_message([f for f in findings[len(prep.remediation):]
                                    if is_builtin(f.origin)])
    mirrored = sglang_own and host_line is not None and host_line.startswith("DSV4 ")
    if (mirrored or host_line is None) and predicted != host_line and prep.pair.predictable:
        findings.append(self_check(predicted, host_line, prep.context.role, "the guard's "
                                   "snapshot of the pools, before SGLang's call", "accepted the pools"))
    return Report.of(findings, prep.context.describe(), host_error=host_line), mirrored


def _on_host_error(rt: Runtime, prep: Prepared, host_error: Exception) -> Exception | None:
    text = str(host_error)
    host_line = text.splitlines()[0] if text else type(host_error).__name__
    report, mirrored = _findings(rt, prep, host_line, upgrades(host_error))
    if not report.findings:
        return None
    return deliver(rt, report, host_error, mirrored, prep.in_scheduler, Phase.START_UP,
                   prep.context.role)


def _on_host_success(rt: Runtime, prep: Prepared) -> None:
    report, _ = _findings(rt, prep, None)
    # Strict mode blocks on what the checks found, never on a plug-in's failure
    # (PLUGIN_FAILED) nor on what remediation did; identity, since values may be tensors.
    escalate = [f for f in report.findings
                if f.severity is not Severity.INFO and f.code != PLUGIN_FAILED
                and not any(f is done for done in prep.remediation)]
    raised = rt.strict and bool(escalate)
    delivery = publish(rt, report, Delivery(raised=raised, printed_by=(
        HANDLER if raised and prep.in_scheduler else None), phase=Phase.START_UP,
        role=prep.context.role))
    if raised:
        first = escalate[0]
        raise DSV4GuardError(f"sglang-dsv4-guard (strict mode): [{first.code}] {first.summary}",
                             report, carried_text(report, delivery))


def _caller(frame: FrameType | None) -> CallSite:
    """The :class:`CallSite` above ``frame``, by :func:`~sglang_dsv4_guard.wrapping.calling_frame`."""
    found = calling_frame(frame)
    if found is None:
        return CallSite("?")
    direct = frame  # the line that made the call: the first frame past the hook layers
    while direct is not None and str(direct.f_globals.get("__name__", "")).startswith(
            HOOK_LAYERS):
        direct = direct.f_back
    at = direct or found
    return CallSite(str(found.f_globals.get("__name__", "?")), handler_prints_traceback(found),
                    f"{at.f_code.co_filename}:{at.f_lineno}")


def make_state_wrapper(rt: Runtime) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A factory for :func:`sglang_dsv4_guard.patching.apply`."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(original)

        @functools.wraps(original)
        def setup_state_kv_args(*args: Any, **kwargs: Any) -> Any:
            if not rt.active:
                return original(*args, **kwargs)
            rt.metrics.ready(at_report=False)  # start-up: the info series (never raises)
            caller = _caller(sys._getframe(1))
            prep = None
            ours: DSV4GuardError | None = None  # strict: our failure, raised after SGLang's verdict
            try:
                prep = _prepare(rt, sig, caller, args, kwargs)
            except Exception as exc:
                ours = our_failure(rt, "checking the pools before setup_state_kv_args", exc)
            try:
                result = original(*args, **kwargs)
            except Exception as host_error:
                replacement = None
                if prep is not None:
                    try:
                        replacement = _on_host_error(rt, prep, host_error)
                    except Exception as exc:
                        ours = our_failure(rt, "reporting setup_state_kv_args' error", exc)
                if replacement is not None:
                    raise replacement from host_error
                if ours is not None:
                    note_on(host_error, ours)
                raise
            if ours is not None:
                raise ours
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
