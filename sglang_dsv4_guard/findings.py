"""Findings and reports: plain, frozen data that checks return and reporters consume.

Nothing here touches sglang or torch. A finding says what is wrong (``code``,
``summary``), what was observed on each side (``observations``, by role, each with
the place its value comes from), and what to do (``fixes``). Rendering lives in
:mod:`sglang_dsv4_guard.render`.
"""

from __future__ import annotations

import enum
import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_dsv4_guard.fixes import Fix

__all__ = ["LINE_CAP", "LIST_CAP", "STOPS_AT_START", "STRING_CAP", "Finding",
           "Observation", "Phase", "PlacedContext", "Report", "Severity", "When", "capped_lines",
           "capped_repr", "cut_text", "failure_text", "one_line", "short_repr",
           "to_jsonable"]

# The guard's text caps, all of them. Every rendered list (text or JSON) shows its first
# LIST_CAP items and a count: a pool with a million layers must not make a megabyte message.
LIST_CAP = 16
_TEXT_CAP = 2000  # characters of any one rendered value
STRING_CAP = 4096  # characters of any one string field of a finding (summary, detail, fix, ...)
LINE_CAP = 120  # characters of a one-line note inside a value: a failure, a short repr


def _cut(text: str, cap: int) -> str:
    return text if len(text) <= cap else f"{text[:cap]}... ({len(text)} characters)"


def _cut_short(text: str) -> str:
    return text if len(text) <= LINE_CAP else f"{text[:LINE_CAP - 3]}..."


def one_line(text: str) -> str:
    """The first line of ``text``, cut to :data:`LINE_CAP` characters (``...`` marks a cut)."""
    return _cut_short(text.splitlines()[0] if text else "")


def short_repr(value: object) -> str:
    """``repr(value)`` (or what its failure was), cut to :data:`LINE_CAP` characters."""
    return _cut_short(_repr_text(value))


def failure_text(exc: BaseException) -> str:
    """``TypeName: first line of the message``, cut as :func:`one_line` cuts."""
    return one_line(f"{type(exc).__name__}: {exc}")


class Severity(str, enum.Enum):
    """How bad a finding is. ``error`` findings mirror a check SGLang enforces."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Phase(enum.Enum):
    """When in a pair's life SGLang makes the comparison (``SILENT``: never, so nothing
    names the problem; ``GUARD``: the guard's own event, SGLang's behaviour unchanged)."""

    START_UP = "start-up"
    FIRST_CONTACT = "first contact"
    FIRST_REQUEST = "first request"
    REGISTRATION = "registration"
    PER_REQUEST = "per request"
    RECEIVER = "per request, at the decode's receiver"
    SILENT = "silent"
    GUARD = "guard"


class PlacedContext:
    """A hook context that says where it runs (``place``). ``phase``, the contexts' old
    name for it, still reads, with a DeprecationWarning: a finding's phase is its ``when``."""

    place: str

    @property
    def phase(self) -> str:
        """The old name of :attr:`place`, kept for plug-ins written against it."""
        warnings.warn(f"{type(self).__name__}.phase is now {type(self).__name__}.place",
                      DeprecationWarning, stacklevel=2)
        return self.place


@dataclass(frozen=True)
class When:
    """A finding's ``when:``: the ``phase`` SGLang finds it in; the ``effect``, what ``when:`` prints."""

    phase: Phase
    effect: str


STOPS_AT_START = When(Phase.START_UP, "at start-up: the server stops with SGLang's error")


@dataclass(frozen=True)
class Observation:
    """One observed value on one side of a comparison.

    ``role`` names the side ("target pool", "draft pool", "prefill", "decode"),
    ``name`` the attribute or setting, and ``source`` where its value is decided
    (a server flag, an environment variable, a model-config key, a pool attribute).
    """

    role: str
    name: str
    value: object
    source: str


@dataclass(frozen=True)
class Finding:
    """One problem (or one action taken), as data.

    ``host_message`` is the exact first line SGLang raises for this check, when
    SGLang enforces it; the guard uses it to cross-check its verdict against
    SGLang's. ``origin`` names the plug-in that produced the finding. ``fixes`` are
    :class:`~sglang_dsv4_guard.fixes.Fix` values; a plain string given there is kept as
    an ``ADVICE`` fix (``Fix.advice``).
    """

    code: str
    severity: Severity
    summary: str
    subject: str
    observations: tuple[Observation, ...] = ()
    details: tuple[str, ...] = ()
    fixes: tuple[Fix, ...] = ()
    docs: str = ""
    host_message: str | None = None
    origin: str = "builtin"
    when: When | None = None  # every built-in finding sets it

    def __post_init__(self) -> None:
        # A plain string becomes an ADVICE fix, copied as an exact str (a str subclass's
        # own methods never run); anything else is left for the plug-in boundary to name.
        fixes: Any = self.fixes
        if isinstance(fixes, tuple | list) and any(isinstance(f, str) for f in fixes):
            object.__setattr__(self, "fixes", tuple(
                Fix.advice(str.__str__(f)) if isinstance(f, str) else f for f in fixes))

    def value(self, role: str, name: str | None = None) -> object:
        """The first observed value for ``role`` (and ``name`` when given).

        Raises ``KeyError`` naming what was asked for when nothing matches.
        """
        for obs in self.observations:
            if obs.role == role and (name is None or obs.name == name):
                return obs.value
        raise KeyError(f"finding {self.code} has no observation for {role!r}/{name!r}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary of every field."""
        return {
            "code": self.code,
            "severity": self.severity.value,
            "summary": self.summary,
            "subject": self.subject,
            "observations": [{"role": o.role, "name": o.name, "value": to_jsonable(o.value),
                              "source": o.source} for o in self.observations],
            "details": list(self.details),
            "fixes": [fix.to_dict() for fix in self.fixes],
            "docs": self.docs,
            "host_message": self.host_message,
            "origin": self.origin,
            "phase": self.when and self.when.phase.value,
            "when": self.when.effect if self.when else "",
        }


def _more(n: int) -> str:
    return f"... +{n - LIST_CAP} more ({n} in all)"


def cut_text(text: str) -> str:
    """``text`` cut to :data:`STRING_CAP` characters, saying how long it was."""
    return _cut(text, STRING_CAP)


def capped_lines(lines: tuple[str, ...]) -> tuple[str, ...]:
    """The first :data:`LIST_CAP` lines, each cut, and a count of the rest."""
    shown = tuple(cut_text(line) for line in lines[:LIST_CAP])
    return (*shown, _more(len(lines))) if len(lines) > LIST_CAP else shown


def _repr_text(value: object) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a value whose repr raises still renders
        return f"<{type(value).__name__} object; repr raised {type(exc).__name__}>"


def _safe_repr(value: object) -> str:
    return _cut(_repr_text(value), _TEXT_CAP)


def _capped(value: object) -> str:
    if isinstance(value, tuple | list):
        items = [_capped(v) for v in value[:LIST_CAP]]
        if len(value) > LIST_CAP:
            items.append(_more(len(value)))
        inner = ", ".join(items)
        if isinstance(value, list):
            return f"[{inner}]"
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return _safe_repr(value)


def capped_repr(value: object) -> str:
    """``repr(value)`` (a string as it is) with every list or tuple cut to its first
    :data:`LIST_CAP` items and a count, and any one value cut to a few thousand
    characters. Fast for huge sequences."""
    if isinstance(value, str):
        return _cut(value, _TEXT_CAP)
    return _capped(value)


def to_jsonable(value: object) -> Any:
    """Turn an observed value into something ``json`` can write. Lists longer than
    :data:`LIST_CAP` keep their first items and end with a ``"... +N more (M in all)"``
    string; other objects become their (capped) ``repr``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        items = [to_jsonable(v) for v in value[:LIST_CAP]]
        return [*items, _more(len(value))] if len(value) > LIST_CAP else items
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return _safe_repr(value)


@dataclass(frozen=True)
class Report:
    """Everything one guarded call found, with the context it ran in.

    ``context`` holds plain strings: the function, the calling server role, the
    SGLang release and the guard mode. ``host_error`` is the first line of the
    error SGLang raised, or ``None`` when SGLang accepted the configuration.
    """

    findings: tuple[Finding, ...]
    context: Mapping[str, str] = field(default_factory=dict)
    host_error: str | None = None

    @classmethod
    def of(cls, findings: Iterable[Finding], context: Mapping[str, str],
           host_error: str | None = None) -> Report:
        """Build a report, errors first, keeping the order checks produced within a severity."""
        rank = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
        ordered = sorted(findings, key=lambda f: rank[f.severity])
        return cls(tuple(ordered), dict(context), host_error)

    def by_severity(self, *severities: Severity) -> tuple[Finding, ...]:
        """The findings of the given severities, in report order."""
        return tuple(f for f in self.findings if f.severity in severities)

    @property
    def codes(self) -> tuple[str, ...]:
        """The codes of all findings, in report order."""
        return tuple(f.code for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary of the whole report."""
        return {
            "context": dict(self.context),
            "host_error": self.host_error,
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_json(self, indent: int | None = None) -> str:
        """The report as one JSON document."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


def first_host_message(findings: Sequence[Finding]) -> str | None:
    """The SGLang message of the first error finding that mirrors an SGLang check."""
    for f in findings:
        if f.severity is Severity.ERROR and f.host_message is not None:
            return f.host_message
    return None
