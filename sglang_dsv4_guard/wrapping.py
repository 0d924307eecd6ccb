"""The rules every wrapper of an SGLang function follows, each in one place.

Every wrapped place (``setup_state_kv_args``, the MORI connector, the decode peers'
registration, decode's first contact) reuses these instead of restating them: which of
SGLang's errors the guard may upgrade (:func:`upgrades`), what a failure of ours does
(:func:`our_failure`), how a report is published before anything rises and what the raised
exception carries (:func:`publish`, :func:`carried_text`, :func:`deliver`), and who called
the wrapped function (:func:`calling_frame`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType

from sglang_dsv4_guard.codes import docs_url
from sglang_dsv4_guard.dedup.mismatch import Mismatch, sparse
from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Finding, Phase, Report, Severity, When
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.targets import REGISTRY_MODULE, SCHEDULER_MODULE
from sglang_dsv4_guard.render import render_report
from sglang_dsv4_guard.reporter import Delivery, delivering, headline, pointer, prints_in_full
from sglang_dsv4_guard.runtime import Runtime, add_note

__all__ = [
    "HANDLER",
    "HOOK_LAYERS",
    "calling_frame",
    "carried_text",
    "deliver",
    "handler_prints_traceback",
    "note_carrier",
    "note_on",
    "our_failure",
    "publish",
    "publish_registration",
    "replacing",
    "self_check",
    "upgrades",
]

#: Modules whose frames are hook machinery, never a caller: ours and SGLang's registry.
HOOK_LAYERS = ("sglang_dsv4_guard.", REGISTRY_MODULE)
#: SGLang's scheduler entry point, whose ``except Exception`` logs the traceback
#: ("Scheduler hit an exception: ...") before it signals the parent.
_SCHEDULER_HANDLER = (SCHEDULER_MODULE, "run_scheduler_process")
#: That handler as a report names it, when it prints the traceback of what rises.
HANDLER = f"SGLang's scheduler ({SCHEDULER_MODULE}.run_scheduler_process)"


def upgrades(error: BaseException) -> bool:
    """Whether ``error`` is SGLang's own verdict the guard may upgrade: exactly a
    ``RuntimeError`` (``except NotImplementedError`` must keep matching a subclass)."""
    return type(error) is RuntimeError


def our_failure(rt: Runtime, stage: str, exc: Exception) -> DSV4GuardError | None:
    """Log a failure of ours; in strict mode return the error to raise, which the wrapper
    raises only once SGLang's verdict is in (after SGLang's own error, as a note)."""
    try:
        rt.internal_error(stage, exc)
    except DSV4GuardError as strict_error:
        return strict_error
    return None


def note_on(host_error: BaseException, ours: DSV4GuardError) -> None:
    """Strict mode, SGLang raised: SGLang's message leads, our failure is a note under it."""
    add_note(host_error, str(ours))


def replacing(rt: Runtime, host_error: BaseException, stage: str,
              build: Callable[[], BaseException | None]) -> BaseException | None:
    """After SGLang raised ``host_error``: ``build()``'s replacement for it (``None``: let
    SGLang's own rise). A failure of ours while building is logged and, in strict mode,
    rides as a note on SGLang's error, which then rises."""
    try:
        return build()
    except Exception as exc:
        ours = our_failure(rt, stage, exc)
        if ours is not None:
            note_on(host_error, ours)
        return None


def note_carrier(host_error: BaseException) -> str:
    """How a report that rides as a PEP 678 note on SGLang's own exception is named."""
    return (f"a note on SGLang's {type(host_error).__name__}"
            + ("" if sys.version_info >= (3, 11) else " (Python < 3.11 does not print notes)"))


def publish(rt: Runtime, report: Report, delivery: Delivery) -> Delivery:
    """Send ``report`` to every reporter, saying how it travels; return ``delivery`` as the
    log reporter filled it in (its fingerprint, and where the report was printed before)."""
    with delivering(delivery):
        rt.publish(report, delivery)
    return delivery


def publish_registration(rt: Runtime, report: Report, m: Mismatch, peers: int, quiet: bool,
                         extra: dict[str, object]) -> bool:
    """A registering decode peer's report (MORI, NIXL, Mooncake): in full, with a note on
    how later peers are counted, for the first peer of its mismatch (``quiet`` false, as
    :meth:`Mismatch.claim` said); quietly after. Returns whether the running count of
    ``peers`` is due in the log (at 10, 100, ...)."""
    note = None if quiet else (
        f"this mismatch covers {peers} decode peer(s) so far; later peers with the same "
        "mismatch are counted, not reported again (count logged at 10, 100, ... peers; "
        "exact counts: sglang_dsv4_guard.summary() and at uninstall)")
    d = publish(rt, report, Delivery(quiet=quiet, note=note, extra=extra,
                                     phase=Phase.REGISTRATION, role="prefill"))
    if not quiet:
        m.place(d.seen)
        return False
    return sparse(peers)


def carried_text(report: Report, delivery: Delivery) -> str | None:
    """What the raised exception (or note) carries once ``delivery`` was published: one
    line pointing at the log when SGLang's handler prints the traceback and the full
    report was logged here already; else the full report where it is printed first, or
    one line pointing at where it was printed."""
    fp = delivery.fingerprint
    if fp is not None and delivery.printed_by and delivery.logged_full:
        return (f"{headline(report)}: the full report is logged above by this process "
                f"(logger sglang_dsv4_guard, fingerprint {fp})")
    if prints_in_full(delivery.seen) or fp is None:
        return render_report(report)
    return pointer(report, fp, delivery.seen)


def deliver(rt: Runtime, report: Report, host_error: Exception, mirrored: bool,
            in_scheduler: bool, phase: Phase, role: str) -> DSV4GuardError | None:
    """Deliver ``report`` on SGLang's ``host_error``: when ``mirrored`` (SGLang's own
    verdict, :func:`upgrades`), the :class:`DSV4GuardError` to raise in its place (first
    line SGLang's, chained to it); else ``None``, the report attached to ``host_error`` as
    a PEP 678 note and as ``dsv4_guard_report``. ``in_scheduler``: SGLang's scheduler
    handler is on the stack and logs the traceback of what rises. ``phase`` and ``role``:
    where the report is made and by which server (the metrics' labels)."""
    # A note is printed with the traceback from Python 3.11; the message on any Python.
    shown = in_scheduler and (mirrored or sys.version_info >= (3, 11))
    carrier = "the DSV4GuardError raised to SGLang" if mirrored else note_carrier(host_error)
    delivery = publish(rt, report, Delivery(raised=True, carrier=carrier,
                                            printed_by=HANDLER if shown else None,
                                            phase=phase, role=role))
    text = carried_text(report, delivery)
    if mirrored:
        return DSV4GuardError(str(host_error), report, text, host_error)
    add_note(host_error, text or "")
    host_error.dsv4_guard_report = report  # type: ignore[attr-defined]
    return None


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", "?"))


def calling_frame(frame: FrameType | None) -> FrameType | None:
    """The frame that called the wrapped function, by SGLang's own frames.

    Walking outwards from ``frame``: the first frame inside the ``sglang.`` package that
    is not SGLang's hook registry. Without one (a script or a test calling directly), the
    first frame that is neither ours, nor the registry, nor a plug-in's hook (a function
    the registry's wrapper called: an ``AROUND`` hook of any plug-in). ``None``: nothing.
    """
    fallback: FrameType | None = None
    while frame is not None:
        name = _module(frame)
        if not name.startswith(HOOK_LAYERS):
            if name.startswith("sglang."):
                return frame
            hook = frame.f_back is not None and _module(frame.f_back) == REGISTRY_MODULE
            if fallback is None and not hook:
                fallback = frame
        frame = frame.f_back
    return fallback


def handler_prints_traceback(frame: FrameType | None) -> bool:
    """Whether SGLang's scheduler handler is on the stack above ``frame``: an exception
    rising out of here is logged there with its traceback (its message, and its notes
    from Python 3.11)."""
    while frame is not None:
        if (_module(frame), frame.f_code.co_name) == _SCHEDULER_HANDLER:
            return True
        frame = frame.f_back
    return False


def self_check(predicted: str | None, actual: str | None, role: str, snapshot: str,
               accepted: str = "accepted") -> Finding:
    """DSV4G099: the built-in checks predicted ``predicted`` (``None``: acceptance) where
    SGLang said ``actual`` (``None``: it accepted). SGLang's verdict stands; the fixes
    ask for the JSON report (what differs, for a bug report) or the guard off on that
    server. ``snapshot``: what the guard read before SGLang's call."""
    server = role if role in ("prefill", "decode") else "this server"
    return Finding(
        code="DSV4G099", severity=Severity.WARNING,
        summary="the guard's prediction differs from SGLang's verdict; SGLang's stands",
        subject="guard self-check", when=When(Phase.GUARD, "in the guard only: SGLang's "
                                              "verdict stands"),
        details=(f"SGLang: {actual or accepted}", f"guard predicted: {predicted or 'acceptance'}"),
        fixes=(Fix(FixKind.FLAGS, "report it with the JSON report: SGLang's verdict and the "
                   "guard's prediction above are what differs", field="guard self-check",
                   inputs=(snapshot,),
                   edits=(Edit(server, "SGLANG_DSV4_GUARD_LOG_FORMAT", "json", env=True),)),
               Fix(FixKind.FLAGS, "turn the guard off for this server; SGLang's verdict "
                   "does not change", field="guard self-check",
                   edits=(Edit(server, "SGLANG_DSV4_GUARD", "0", env=True),))),
        docs=docs_url("DSV4G099"))
