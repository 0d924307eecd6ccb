"""The plug-in boundary: a third-party finding checked, made plain and capped, once.

Every finding a plug-in returns passes :func:`clean_finding` before the guard keeps it:
each field must have the accepted type (exact ``str`` for text, so a ``str`` subclass's
own methods never run at render time), an observed value that is not plain is kept as
its ``repr``, taken once here and capped, and lists are cut to the first
:data:`~sglang_dsv4_guard.findings.LIST_CAP` items plus a count. A fix's edits are never
cut (a fix is applied whole): more than ``LIST_CAP`` of them, or an Edit's ``remove`` /
``env`` that is not an exact ``bool``, an edit's name or value longer than
:data:`~sglang_dsv4_guard.findings.STRING_CAP`, or a server other than ``"prefill"``,
``"decode"`` or ``"this server"``, fails the finding. A plug-in's fix is never proven
(``proven`` is ``None``): only ``check --fix`` proves. A fix with an edit the installed
release's parser refuses (the built-in fixes' filter, :func:`~sglang_dsv4_guard.host.flags.vetted`:
an unknown flag, a refused value) is dropped, with a debug line; the finding is kept.
A finding that fails becomes the plug-in's failure (:func:`plugin_failure`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from sglang_dsv4_guard.codes import docs_url
from sglang_dsv4_guard.findings import (
    LIST_CAP,
    STRING_CAP,
    Finding,
    Observation,
    Phase,
    Severity,
    When,
    capped_lines,
    cut_text,
)
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host import flags

__all__ = ["BUILTIN_NAMES", "CODE", "LOG_REPORTER", "clean_finding", "is_builtin",
           "plugin_failure", "raised_text", "safe_text"]

CODE = "DSV4G090"  # a plug-in's failure (:func:`plugin_failure`)

# The names of the built-in hook implementations, in the order the plug-in manager
# registers them (first, as ordinary plug-ins: in pluggy's order they run after
# third-party ones), then the log reporter's. The modules are paired with them where the
# guard is assembled (assembly.BUILTIN_PLUGINS), above every wrapped place: the wrappers
# tell their own plug-ins from others' here, without reaching their checks.
BUILTIN_NAMES = ("builtin_autoshare", "builtin_state", "builtin_mori", "builtin_peers",
                 "builtin_pd_contract", "builtin_first_contact")
LOG_REPORTER = "builtin_log_reporter"
# and "builtin", the origin of a finding the guard builds itself (Finding.origin's default)
_BUILTIN_NAMES = frozenset(BUILTIN_NAMES) | {LOG_REPORTER, "builtin"}

_NEVER_BLOCKS = "a plug-in's failure never blocks, in strict mode either"
_UNAFFECTED = "SGLang's verdict is not affected; " + _NEVER_BLOCKS
_CONSEQUENCE = {
    **dict.fromkeys(("load", "register", "validate"),
                    "the guard runs without this plug-in; " + _UNAFFECTED),
    "finding": "this finding is left out, the plug-in's other findings are kept; "
               + _UNAFFECTED,
    "excess": "the findings past the cap are left out, the first ones are kept; "
              + _UNAFFECTED,
    "sglang_dsv4_guard_remediate_state":
        "the guard went on without its result; a remediation may have changed the pools "
        "before it failed (the guard re-reads them when they changed); " + _NEVER_BLOCKS,
    "changed": "the guard re-read the pools, so the checks see them as SGLang does; "
               + _NEVER_BLOCKS,
    "sglang_dsv4_guard_report": "the other reporters still received the report; "
                                + _UNAFFECTED,
}


def is_builtin(name: str) -> bool:
    """Whether ``name`` is one of the guard's own plug-ins."""
    return name in _BUILTIN_NAMES


def plugin_failure(name: str, stage: str, problem: str, effect: str | None = None) -> Finding:
    """The finding for a plug-in that could not load, raised, or returned garbage.

    ``effect`` picks the consequence line (default: the one for ``stage``).
    """
    excess = effect == "excess"  # past the findings cap: the first ones are kept, not "without"
    went = "the findings past the cap are left out" if excess else "it went on without the plug-in"
    return Finding(
        code=CODE,
        severity=Severity.WARNING,
        summary=f"guard plug-in {name!r} " + (
            problem if excess else f"failed ({stage}); the guard went on without it"),
        subject=f"plug-in {name}",
        when=When(Phase.GUARD, f"in the guard only: {went}; SGLang's verdict is unchanged"),
        details=(problem, _CONSEQUENCE.get(effect or stage, "its findings are missing from "
                                                             "this report; " + _UNAFFECTED)),
        fixes=(Fix(FixKind.CODE, f"fix or uninstall the plug-in {name!r} (entry-point group "
                   "sglang_dsv4_guard); " + ("its findings past the cap are left out" if excess
                                             else "the guard runs without it") + " until then",
                   field=f"plug-in {name}",
                   inputs=(f"the plug-in {name!r} (entry-point group sglang_dsv4_guard), at "
                           f"{stage}",)),),
        docs=docs_url(CODE),
        origin=name,
    )


def safe_text(show: Callable[[Any], Any], obj: object, limit: int = 300) -> str:
    """``show(obj)`` (``str`` or ``repr``) that cannot raise, cut at ``limit`` characters."""
    try:
        shown = show(obj)
        if not isinstance(shown, str):
            raise TypeError(f"returned {type(shown).__name__}, not str")
    except Exception as exc:
        shown = f"<unprintable: {type(exc).__name__}>"
    return shown if len(shown) <= limit else f"{shown[:limit]}..."


def raised_text(exc: BaseException) -> str:
    return f"raised {type(exc).__name__}: {safe_text(str, exc)}"




def _text(value: object, field: str) -> str:
    """``value`` as an exact ``str``: a ``str`` subclass's own ``__str__``/``__format__``
    /``__len__`` would otherwise run (and may raise) whenever the report is rendered."""
    text = str.__str__(value) if isinstance(value, str) else None
    if type(text) is not str:
        raise TypeError(f"{field} must be a str (got {type(value).__name__})")
    return text


def _strings(value: object, field: str) -> tuple[str, ...]:
    if not isinstance(value, tuple | list):
        raise TypeError(f"{field} must be a tuple of str (got {safe_text(repr, value)})")
    return tuple(_text(v, f"{field}[{i}]") for i, v in enumerate(value))


def _plain(value: object, depth: int = 0) -> bool:
    """A value kept as it is: ``None``, exact bool/int/float/str, or a tuple of them."""
    if value is None or type(value) in (bool, int, float, str):
        return True
    return (type(value) is tuple and depth < 4
            and all(_plain(v, depth + 1) for v in value))


def _shown(value: object, field: str) -> object:
    """A plain value as it is; anything else its ``repr``, taken once here and cut as
    findings cut any string (:func:`~sglang_dsv4_guard.findings.cut_text`), so rendering
    never runs the plug-in's code again."""
    if _plain(value):
        return value
    try:
        shown = repr(value)
    except Exception as exc:
        raise TypeError(f"{field} cannot be shown: repr {raised_text(exc)}") from exc
    if not isinstance(shown, str):
        raise TypeError(f"{field}'s repr returned {type(shown).__name__}, not str")
    return cut_text(_text(shown, f"{field}'s repr"))


def _observation(obs: object, index: int) -> Observation:
    if not isinstance(obs, Observation):
        raise TypeError(f"observations[{index}] must be an Observation "
                        f"(got {type(obs).__name__} {safe_text(repr, obs, 80)})")
    role, name, source = (cut_text(_text(getattr(obs, field), f"observations[{index}].{field}"))
                          for field in ("role", "name", "source"))
    return Observation(role, name, _shown(obs.value, f"observations[{index}].value"), source)


def _switch(value: object, field: str) -> bool:
    """An exact ``bool``: ``remove=1`` or a ``numpy.bool_`` would otherwise be read as the
    opposite edit (a set instead of a removal) or raise at render time."""
    if type(value) is not bool:
        raise TypeError(f"{field} must be True or False (got {type(value).__name__} "
                        f"{safe_text(repr, value, 80)})")
    return value


_SERVERS = ("prefill", "decode", "this server")


def _whole(value: object, field: str) -> str:
    """An edit's exact ``str``, whole: an edit is applied as written, so one longer than
    :data:`~sglang_dsv4_guard.findings.STRING_CAP` is refused, never cut into another."""
    text = _text(value, field)
    if len(text) > STRING_CAP:
        raise TypeError(f"{field} holds {len(text)} characters; an edit's may hold at most "
                        f"{STRING_CAP} (it is applied as written, so it is never cut)")
    return text


def _server(value: object, field: str) -> str:
    server = _text(value, field)
    if server not in _SERVERS:
        raise TypeError(f"{field} must be one of {', '.join(map(repr, _SERVERS))} "
                        f"(got {safe_text(repr, server, 80)})")
    return server


def _edit(edit: object, field: str) -> Edit:
    if type(edit) is not Edit:
        raise TypeError(f"{field} must be a sglang_dsv4_guard.Edit (got {type(edit).__name__})")
    value = edit.value
    return Edit(server=_server(edit.server, f"{field}.server"),
                name=_whole(edit.name, f"{field}.name"),
                value=None if value is None else _whole(value, f"{field}.value"),
                remove=_switch(edit.remove, f"{field}.remove"),
                env=_switch(edit.env, f"{field}.env"))


def _edits(edits: tuple[Any, ...] | list[Any], field: str) -> tuple[Edit, ...] | None:
    """A fix's edits, whole, or ``None`` when the release's parser refuses one of them
    (the same filter as the built-in fixes', :func:`~sglang_dsv4_guard.host.flags.vetted`):
    a fix is applied whole, so it is dropped rather than kept in part."""
    if len(edits) > LIST_CAP:
        raise TypeError(f"{field} holds {len(edits)} edits; a fix may hold at most "
                        f"{LIST_CAP} (it is applied whole, so it is never cut)")
    cleaned = tuple(_edit(e, f"{field}[{i}]") for i, e in enumerate(edits))
    kept = flags.vetted(*cleaned, origin="plug-in fix")
    return cleaned if len(kept) == len(cleaned) else None


def _fix(fix: object, field: str) -> Fix | None:
    """A plain string becomes an ADVICE fix; a :class:`Fix` is rebuilt field by field,
    unproven whatever it claims (only the guard's ``check --fix`` proves a fix)."""
    if isinstance(fix, str):
        return Fix.advice(cut_text(_text(fix, field)))
    if type(fix) is not Fix:
        raise TypeError(f"{field} must be a str or a sglang_dsv4_guard.Fix "
                        f"(got {type(fix).__name__} {safe_text(repr, fix, 80)})")
    if not isinstance(fix.kind, FixKind):
        raise TypeError(f"{field}.kind must be a sglang_dsv4_guard.FixKind "
                        f"(got {safe_text(repr, fix.kind, 80)})")
    edits, inputs = fix.edits, fix.inputs
    if not isinstance(edits, tuple | list) or not isinstance(inputs, tuple | list):
        raise TypeError(f"{field}.edits and .inputs must be tuples")
    text = cut_text(_text(fix.text, f"{field}.text"))
    kept = _edits(edits, f"{field}.edits")
    if kept is None:
        return None
    return Fix(kind=fix.kind, text=text,
               field=cut_text(_text(fix.field, f"{field}.field")),
               edits=kept,
               inputs=capped_lines(_strings(inputs, f"{field}.inputs")),
               release=cut_text(_text(fix.release, f"{field}.release")), proven=None,
               need=cut_text(_text(fix.need, f"{field}.need")))


def _fixes(value: object) -> tuple[Fix, ...]:
    if not isinstance(value, tuple | list):
        raise TypeError(f"fixes must be a tuple of Fix or str (got {safe_text(repr, value)})")
    fixes = tuple(f for f in (_fix(v, f"fixes[{i}]") for i, v in enumerate(value[:LIST_CAP]))
                  if f is not None)
    if len(value) > LIST_CAP:
        fixes += (Fix.advice(f"... +{len(value) - LIST_CAP} more ({len(value)} in all)"),)
    return fixes


def clean_finding(finding: object, origin: str) -> Finding:
    """A plain :class:`Finding` with every field checked, ``origin`` set to the plug-in.

    Raises ``TypeError`` saying which field is wrong, what it holds and what is accepted.
    """
    if not isinstance(finding, Finding):
        raise TypeError(f"must be a sglang_dsv4_guard.Finding (got {type(finding).__name__})")
    try:
        fields = {f.name: getattr(finding, f.name) for f in dataclasses.fields(Finding)}
    except Exception as exc:
        raise TypeError(f"reading its fields {raised_text(exc)}") from exc
    for name in ("code", "summary", "subject", "docs"):
        fields[name] = _text(fields[name], name)
    if not isinstance(fields["severity"], Severity):
        raise TypeError(f"severity must be a sglang_dsv4_guard.Severity (got "
                        f"{type(fields['severity']).__name__} "
                        f"{safe_text(repr, fields['severity'], 80)})")
    when = fields["when"]
    if when is not None:  # each part read once: a property cannot pass the check and then
        try:              # change, nor a falsy subclass slip through as itself
            phase, effect = when.phase, when.effect
        except Exception as exc:
            raise TypeError(f"when must be a sglang_dsv4_guard.When or None (reading it "
                            f"{raised_text(exc)})") from exc
        if not isinstance(phase, Phase):
            raise TypeError(f"when must be a sglang_dsv4_guard.When or None (got "
                            f"{safe_text(repr, when, 80)})")
        when = When(phase, cut_text(_text(effect, "when.effect")))
    if fields["host_message"] is not None:
        fields["host_message"] = _text(fields["host_message"], "host_message (or None)")
    observations = fields["observations"]
    if not isinstance(observations, tuple | list):
        raise TypeError(f"observations must be a tuple of Observation "
                        f"(got {type(observations).__name__})")
    # A plug-in's finding is capped here, once: LIST_CAP observations, details and fixes
    # (plus a count of the rest), every string cut to STRING_CAP characters.
    details = capped_lines(_strings(fields["details"], "details"))
    if len(observations) > LIST_CAP:
        details = (f"... +{len(observations) - LIST_CAP} more observations "
                   f"({len(observations)} in all) not kept by the guard", *details)
    host_message = fields["host_message"]
    return Finding(
        code=cut_text(fields["code"]), severity=fields["severity"],
        summary=cut_text(fields["summary"]), subject=cut_text(fields["subject"]),
        observations=tuple(_observation(o, i) for i, o in enumerate(observations[:LIST_CAP])),
        details=details, fixes=_fixes(fields["fixes"]), docs=cut_text(fields["docs"]),
        host_message=None if host_message is None else cut_text(host_message), origin=origin,
        when=when,
    )
