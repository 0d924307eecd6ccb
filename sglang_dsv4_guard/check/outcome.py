"""What one checked pair came to, for every output format (pure: no SGLang, no I/O).

A :class:`Checked` is one pair's answer from the check process (the child's reply: the
JSON document and its text, or one error line) with where its two servers are written
(the :class:`~sglang_dsv4_guard.check.inputs.Invocation` of each, when the pair was read
from a file). :func:`exit_status` is the command's contract (docs/check.md, "Exit status"),
and :func:`where` points a finding at the file and line of the flag it is about.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang_dsv4_guard.check.inputs import Invocation

__all__ = ["FAIL_ON", "Checked", "Location", "exit_status", "failing", "where"]

# What makes a pair fail, by --fail-on: the severities that count.
FAIL_ON = {"error": ("error",), "warning": ("error", "warning")}
ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class Location:
    """A file and a 1-based line."""

    file: str
    line: int


@dataclass(frozen=True)
class Checked:
    """One pair's answer: ``reply`` as the check process gave it, its name, and the
    invocations it was read from (``None`` for a pair typed as ``--prefill``/``--decode``),
    with the reader's notes about it (what it could not resolve)."""

    name: str
    reply: Mapping[str, Any]
    prefill: Invocation | None = None
    decode: Invocation | None = None
    notes: tuple[str, ...] = ()

    @property
    def error(self) -> str | None:
        """The one line the check process gave instead of a document (exit 2), if any."""
        error = self.reply.get("error")
        return None if error is None else str(error)

    @property
    def findings(self) -> list[Mapping[str, Any]]:
        """The pair's findings as JSON dictionaries (none when it could not be checked)."""
        document = self.reply.get("document") or {}
        return list(document.get("findings") or ())

    def count(self, severity: str) -> int:
        """How many of its findings have ``severity``."""
        return sum(1 for f in self.findings if f.get("severity") == severity)

    def invocation(self, role: str) -> Invocation | None:
        """The invocation of the ``role`` server, when read from a file."""
        return self.prefill if role == "prefill" else self.decode if role == "decode" else None


def failing(checked: Checked, fail_on: str) -> bool:
    """Whether the pair fails the run: it could not be checked, or it has a finding of a
    severity ``fail_on`` counts."""
    if checked.error is not None:
        return True
    counted = FAIL_ON[fail_on]
    return any(f.get("severity") in counted for f in checked.findings)


def exit_status(checked: Iterable[Checked], fail_on: str, unreadable: bool = False) -> int:
    """The command's exit status: 2 when an input or a pair could not be read or checked
    (``unreadable``, or a pair's answer is an error line), else 1 when a pair has a
    finding of a severity ``fail_on`` counts, else 0."""
    pairs = list(checked)
    if unreadable or any(c.error is not None for c in pairs):
        return 2
    return 1 if any(failing(c, fail_on) for c in pairs) else 0


_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")


def _flags(finding: Mapping[str, Any], role: str) -> list[str]:
    """The flags a finding is about on the ``role`` server, most specific first: those its
    fixes edit there, then those its observations of that server name or come from."""
    flags: list[str] = []
    for fix in finding.get("fixes") or ():
        for edit in fix.get("edits") or ():
            if edit.get("server") == role and not edit.get("env"):
                flags.append(str(edit.get("name")))
    for obs in finding.get("observations") or ():
        if obs.get("role") != role:
            continue
        flags.extend(_FLAG.findall(str(obs.get("source") or "")))
        name = str(obs.get("name") or "")
        if re.fullmatch(r"[a-z0-9_]+", name):
            flags.append("--" + name.replace("_", "-"))
    return list(dict.fromkeys(flags))


def _roles(finding: Mapping[str, Any]) -> list[str]:
    """The servers a finding is about: those its observations and fixes name, in order."""
    named = [str(o.get("role")) for o in finding.get("observations") or ()]
    named += [str(e.get("server")) for fix in finding.get("fixes") or ()
              for e in fix.get("edits") or ()]
    found = [role for role in dict.fromkeys(named) if role in ROLES]
    return found or list(ROLES)


def where(checked: Checked, finding: Mapping[str, Any]) -> Location | None:
    """The file and line a finding points at: the line of the first flag it is about that
    its server typed, else the line where that server is launched; ``None`` for a pair not
    read from a file."""
    fallback = None
    for role in _roles(finding):
        invocation = checked.invocation(role)
        if invocation is None:
            continue
        typed = set(_typed_flags(invocation.argv))
        for flag in _flags(finding, role):
            if flag in typed:
                return Location(invocation.file, invocation.line_of(flag))
        fallback = fallback or Location(invocation.file, invocation.line)
    return fallback


def _typed_flags(argv: Sequence[str]) -> Iterable[str]:
    for token in argv:
        if token.startswith("--"):
            yield token.split("=", 1)[0]
