"""The wrapper around ``CommonKVManager.try_ensure_parallel_info`` (decode's first contact).

SGLang's decode scheduler calls it for every pending request: where SGLang's first
statement is proven its own (:mod:`~sglang_dsv4_guard.contact.cached`) the wrapper runs it
itself (:func:`_answers_cached_first`); otherwise it is one ``try`` around SGLang's call.

When SGLang raised (its first mismatch: the decode server is about to exit), the report
is built from SGLang's own values (:mod:`~sglang_dsv4_guard.contact.snapshot`) and every
``check_first_contact`` hook, published once per server
(:func:`~sglang_dsv4_guard.wrapping.publish`), then:

- SGLang's exact ``RuntimeError``: a :class:`DSV4GuardError` (first line SGLang's,
  chained to it) carrying the report, or a pointer to where it was printed;
- SGLang's ``AssertionError`` (``_resolve_rank_mapping``): that very exception rises,
  the report attached as a PEP 678 note and as ``exc.dsv4_guard_report``;
- anything else is not a first-contact verdict: it rises untouched.

Any failure of ours is logged and SGLang's exception rises unchanged. Strict mode changes
nothing here (SGLang already refuses), except that our own failure becomes a note on
SGLang's error. A built-in prediction that differs from SGLang's first message is a
self-check finding (:func:`~sglang_dsv4_guard.wrapping.self_check`) and changes nothing.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import sys
import threading
import types
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sglang_dsv4_guard.boundary import is_builtin
from sglang_dsv4_guard.contact.cached import answers_cached
from sglang_dsv4_guard.contact.snapshot import ContactContext, snapshot_contact
from sglang_dsv4_guard.errors import DSV4GuardError
from sglang_dsv4_guard.findings import Phase, Report, Severity
from sglang_dsv4_guard.host import server
from sglang_dsv4_guard.host.targets import PD_FIRST_CONTACT
from sglang_dsv4_guard.patching import AppliedPatch, apply_all
from sglang_dsv4_guard.runtime import Runtime
from sglang_dsv4_guard.wrapping import (
    deliver,
    handler_prints_traceback,
    replacing,
    self_check,
    upgrades,
)

__all__ = ["CONTACT_MODULE", "ContactGuard", "contact_patcher", "make_contact_wrapper"]

#: The module defining decode's first contact (imported by SGLang, never by the guard).
CONTACT_MODULE = PD_FIRST_CONTACT.module


def _backend(manager: object) -> str:
    chosen = server.server_value("disaggregation_transfer_backend")
    if chosen is not None:
        return str(chosen)
    return type(manager).__name__.lower().removesuffix("kvmanager")


class ContactGuard:
    """Builds and delivers the first-contact report; stateless between calls."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        # Set while this thread builds a report: a check that calls the wrapped function
        # again (a plug-in, another plug-in's wrapper around ours) passes straight through.
        self.busy = threading.local()

    def report(self, manager: object, bootstrap_addr: str, error: BaseException) -> Report:
        """The report of every mismatch SGLang's raising call stood on."""
        contact = snapshot_contact(manager, bootstrap_addr, error)
        context = ContactContext(self.rt.profile, self.rt.settings.mode.value.value,
                                 _backend(manager))
        findings = self.rt.plugins.collect("sglang_dsv4_guard_check_first_contact",
                                           {"contact": contact, "context": context})
        ours = [f.host_message for f in findings
                if is_builtin(f.origin) and f.severity is Severity.ERROR and f.host_message]
        if ours[:1] != [contact.message]:
            findings.append(self_check(ours[0] if ours else None, contact.message, "decode",
                                           "the prefill's answer at first contact"))
        first = contact.message.splitlines()[0]
        return Report.of(findings, context.describe(contact.bootstrap_addr), host_error=first)

    def on_error(self, manager: object, addr: object,
                 error: Exception) -> DSV4GuardError | None:
        """The DSV4GuardError replacing SGLang's ``RuntimeError``; ``None`` after a note
        was put on SGLang's ``AssertionError`` (or for any other error)."""
        mirrored = upgrades(error)
        if not (mirrored or type(error) is AssertionError):
            return None
        self.busy.active = True
        try:
            report = self.report(manager, str(addr), error)
        finally:
            self.busy.active = False
        if not report.findings:
            return None
        return deliver(self.rt, report, error, mirrored,
                       handler_prints_traceback(sys._getframe(2)), Phase.FIRST_CONTACT, "decode")


def _raise_for(guard: ContactGuard, manager: object, addr: object, error: Exception) -> None:
    """After SGLang raised ``error``: raise the replacement, or return to let it rise."""
    if guard.rt.active and not getattr(guard.busy, "active", False):
        replacement = replacing(guard.rt, error, "reporting decode's first contact",
                                lambda: guard.on_error(manager, addr, error))
        if replacement is not None:
            raise replacement from error


def _answers_cached_first(self: Any, bootstrap_addr: Any) -> Any:
    """SGLang's first statement, then SGLang's call (on a miss SGLang runs its statement
    again: a membership test, no effect; docs/operating.md, First contact). ``_SGLANG``,
    ``_RAISE_FOR`` and ``_GUARD``: the globals :func:`make_contact_wrapper` gives each copy."""
    if bootstrap_addr in self.prefill_info_table:
        return True
    try:
        return _SGLANG(self, bootstrap_addr)  # type: ignore[name-defined]  # noqa: F821
    except Exception as error:
        _RAISE_FOR(_GUARD, self, bootstrap_addr, error)  # type: ignore[name-defined]  # noqa: F821
        raise


def make_contact_wrapper(guard: ContactGuard
                         ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A factory for :func:`sglang_dsv4_guard.patching.apply`. SGLang's signature in
    every supported release is ``(self, bootstrap_addr)``: the wrapper takes exactly that
    (no packing on the pass path); another signature gets a ``*args`` wrapper."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        if list(inspect.signature(original).parameters) != ["self", "bootstrap_addr"]:
            @functools.wraps(original)
            def any_signature(*args: Any, **kwargs: Any) -> Any:
                try:
                    return original(*args, **kwargs)
                except Exception as error:
                    _raise_for(guard, args[0] if args else kwargs.get("self"),
                               args[1] if len(args) > 1 else kwargs.get("bootstrap_addr"),
                               error)
                    raise

            return any_signature

        if not answers_cached(original):
            @functools.wraps(original)
            def try_ensure_parallel_info(self: Any, bootstrap_addr: Any) -> Any:
                # The pass path (cached, fetched, not ready): one frame and a try, which
                # is free until something raises.
                try:
                    return original(self, bootstrap_addr)
                except Exception as error:
                    _raise_for(guard, self, bootstrap_addr, error)
                    raise

            return try_ensure_parallel_info

        # The cached call runs the very bytecode SGLang's does, with no closure to set up.
        fast = types.FunctionType(_answers_cached_first.__code__, {
            "__builtins__": builtins, "_SGLANG": original, "_RAISE_FOR": _raise_for,
            "_GUARD": guard}, original.__name__)
        return functools.wraps(original)(fast)

    return make


def contact_patcher(rt: Runtime) -> Callable[[ModuleType], list[AppliedPatch]]:
    """What the composition root calls with SGLang's imported common connector module:
    wrap ``try_ensure_parallel_info`` where it is defined."""
    targets = [(PD_FIRST_CONTACT, make_contact_wrapper(ContactGuard(rt)))]
    return functools.partial(apply_all, targets=targets)
