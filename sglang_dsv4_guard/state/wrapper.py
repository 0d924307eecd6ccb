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
from sglang_dsv4_guard.dedup import Seen
from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Finding, Report, Severity, first_host_message
from sglang_dsv4_guard.plugins import is_builtin, plugin_failure
from sglang_dsv4_guard.render import render_report
from sglang_dsv4_guard.reporter import Delivery, delivering, pointer
from sglang_dsv4_guard.runtime import Runtime, add_note
from sglang_dsv4_guard.state.snapshot import (
    MISSING,
    POOL_ATTRS,
    StateContext,
    StatePair,
    Unreadable,
    snapshot_pair,
)
from sglang_dsv4_guard.state.snapshot import _read as read_attr
from sglang_dsv4_guard.state.tensors import _attempt

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


def _short_hash(value: tuple[object, ...] | list[object]) -> int | None:
    if not isinstance(value, tuple):  # hash() of a tuple runs in C: no Python-level walk
        return None
    try:
        return hash(value)
    except Exception:  # an unhashable item: identity and length stand alone
        return None


def _fingerprint(pool: object) -> tuple[object, ...]:
    """A cheap token of what SGLang reads from ``pool``; it changes when a read would.

    Scalars by value, sequences by identity and length (short tuples also by hash),
    other objects by identity; the mapping
    tensor by identity, data pointer and torch's in-place version counter. No
    tensor data is read.
    """
    parts: list[object] = [id(pool), type(pool)]
    for name in POOL_ATTRS:
        value = read_attr(pool, name)
        if isinstance(value, tuple | list):
            # Never walked in Python: a million-layer ratio list costs nothing.
            # A hashable tuple by value alone: a property may build a fresh one on
            # every read (0.5.16), whose id() then differs although nothing changed.
            digest = _short_hash(value)
            parts.append((len(value), digest) if digest is not None else (id(value), len(value)))
        elif value is None or isinstance(value, bool | int | float | str | Unreadable):
            parts.append(value)
        else:
            parts.append(id(value))
    mapping = getattr(pool, "full_to_swa_index_mapping", MISSING)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(mapping, torch.Tensor):
        # Sparse, meta and nested tensors refuse data_ptr() or _version: such a read is
        # recorded as its failure text, which is stable, so the token still compares.
        failures: list[str] = []
        parts.append((id(mapping), _attempt("data_ptr", lambda: int(mapping.data_ptr()), failures),
                      _attempt("_version", lambda: int(mapping._version), failures),
                      tuple(failures)))
    else:
        parts.append(id(mapping))
    return tuple(parts)


def _changed_silently(name: str, found: list[Finding]) -> Finding:
    failed = any(f.code == "DSV4G090" for f in found)
    return plugin_failure(
        name, "sglang_dsv4_guard_remediate_state",
        "changed what SGLang reads from the pools and then failed" if failed else
        "changed what SGLang reads from the pools without returning a finding that says so",
        "changed")


def prepare_pair(rt: Runtime, target: object, draft: object, caller: str) -> Prepared | None:
    """Snapshot a pair, let remediation plug-ins act, and snapshot again if they did.

    After each remediation plug-in a cheap fingerprint of what SGLang reads is
    compared with the one before: when it changed, the pair is snapshotted again, and
    a plug-in that changed it without a finding saying so (it returned nothing, or
    raised) is named in a ``DSV4G090`` finding.

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
    remediation: list[Finding] = []
    before = (_fingerprint(target), _fingerprint(draft))
    changed = False
    for name, found in rt.plugins.collect_each(
        "sglang_dsv4_guard_remediate_state",
        {"target_pool": target, "draft_pool": draft, "pair": pair, "context": context},
    ):
        remediation.extend(found)
        after = (_fingerprint(target), _fingerprint(draft))
        if after != before:
            changed, before = True, after
            if not any(f.code != "DSV4G090" for f in found):
                remediation.append(_changed_silently(name, found))
    if changed:
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
        findings.append(_discrepancy(predicted, host_line))
    return Report.of(findings, prep.context.describe(), host_error=host_line), mirrored


def _publish(rt: Runtime, report: Report, raised: bool,
             carrier: str = "the DSV4GuardError raised to SGLang") -> str | None:
    """Publish ``report``; when it is ``raised``, return the text the exception carries.

    The first occurrence in the server is logged in full here even when raised (the
    traceback may never print) and the exception carries it too; when another process
    of this server (or this one) printed the same report already, the log and the
    exception carry a one-line pointer.
    """
    with delivering(Delivery(raised=raised, carrier=carrier)) as delivery:
        rt.publish(report)
    if delivery.seen in (None, Seen.FIRST) or delivery.fingerprint is None:
        return render_report(report)
    return pointer(report, delivery.fingerprint, delivery.seen)


def _on_host_error(rt: Runtime, prep: Prepared, host_error: Exception) -> Exception | None:
    text = str(host_error)
    host_line = text.splitlines()[0] if text else type(host_error).__name__
    # Only SGLang's own, exact RuntimeError is upgraded: `except NotImplementedError` (a
    # RuntimeError subclass) must keep matching what the caller raised.
    report, mirrored = _findings(rt, prep, host_line, type(host_error) is RuntimeError)
    if not report.findings:
        return None
    rendered = _publish(rt, report, raised=True, carrier=(
        "the DSV4GuardError raised to SGLang" if mirrored else
        f"a note on SGLang's {type(host_error).__name__}"
        + ("" if sys.version_info >= (3, 11) else " (Python < 3.11 does not print notes)")))
    if mirrored:
        return DSV4GuardError(text, report, rendered, host_error)
    add_note(host_error, rendered or "")
    host_error.dsv4_guard_report = report  # type: ignore[attr-defined]
    return None


def _on_host_success(rt: Runtime, prep: Prepared) -> None:
    report, _ = _findings(rt, prep, None)
    # Strict mode blocks on what the checks found, never on a plug-in's failure
    # (DSV4G090) nor on what remediation did; identity, since values may be tensors.
    escalate = [f for f in report.findings
                if f.severity is not Severity.INFO and f.code != "DSV4G090"
                and not any(f is done for done in prep.remediation)]
    rendered = _publish(rt, report, raised=rt.strict and bool(escalate))
    if rt.strict and escalate:
        first = escalate[0]
        raise DSV4GuardError(f"sglang-dsv4-guard (strict mode): [{first.code}] {first.summary}",
                             report, rendered)


def _internal(rt: Runtime, stage: str, exc: Exception) -> DSV4GuardError | None:
    """Log a failure of ours; in strict mode return the error to raise, which the wrapper
    raises only once SGLang's verdict is in (after SGLang's own error, as a note)."""
    try:
        rt.internal_error(stage, exc)
    except DSV4GuardError as strict_error:
        return strict_error
    return None


_HOOK_LAYERS = ("sglang_dsv4_guard.host.registry", "sglang.srt.plugins.hook_registry")


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
            ours: DSV4GuardError | None = None  # strict: our failure, raised after SGLang's verdict
            try:
                prep = _prepare(rt, sig, caller, args, kwargs)
            except Exception as exc:
                ours = _internal(rt, "checking the pools before setup_state_kv_args", exc)
            try:
                result = original(*args, **kwargs)
            except Exception as host_error:
                replacement = None
                if prep is not None:
                    try:
                        replacement = _on_host_error(rt, prep, host_error)
                    except Exception as exc:
                        ours = _internal(rt, "reporting setup_state_kv_args' error", exc)
                if replacement is not None:
                    raise replacement from host_error
                if ours is not None:  # SGLang's message first; ours is a note under it
                    add_note(host_error, str(ours))
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
