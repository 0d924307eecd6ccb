"""Fixes as data: what to change, where, what decides the value, and whether it was proven.

A finding's fixes are derived from what differs, never taken from a table: each
:class:`Fix` says which compared field it addresses (``field``), what decides that
field in the installed release (``inputs``), and one of

- ``FLAGS``: launch-line or environment edits (:class:`Edit`), per server;
- ``CODE``: the value is not set by any flag; the code path that builds it (swapped
  pools, a custom draft runner, a plug-in that builds pools) is what to change;
- ``RELEASE``: another SGLang release behaves otherwise (``release`` names it);
- ``NO_FLAG_FIX``: no flag change fixes this, and why;
- ``ADVICE``: free text, what a third-party plug-in gives as a plain string.

A finding's fixes are alternatives (any one fixes it) unless they name several ``need``s:
then one fix of each need is needed (a step each; the fixes of one need, alternatives).

``check --fix`` proves flag fixes by re-running the release's resolution and every
check on the edited lines: ``proven`` is ``True`` for a proven fix, ``False`` for one
that did not remove its finding or brought a new error, ``None`` when not tried (at
run time, where a flag edit is checked against the release's parser only).
"""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Edit", "Fix", "FixKind", "flag_fix"]


class FixKind(str, enum.Enum):
    """What kind of change a fix asks for."""

    FLAGS = "flags"
    CODE = "code"
    RELEASE = "release"
    NO_FLAG_FIX = "none"
    ADVICE = "advice"


@dataclass(frozen=True)
class Edit:
    """One change to one server's launch: set or remove a flag, set or unset a variable.

    ``server`` is ``"prefill"``, ``"decode"`` or, at run time, the role of the server
    that raised (``"this server"`` when unknown). ``name`` is the option string as the
    release's parser spells it (``"--page-size"``) or the variable's name (``env``).
    ``value`` is the new value; ``None`` with ``remove=False`` is a switch that takes
    no value (``--enable-dp-attention``).
    """

    server: str
    name: str
    value: str | None = None
    remove: bool = False
    env: bool = False

    def describe(self) -> str:
        """``decode: --page-size 256``, ``prefill: remove --enable-x``, ``decode env: X=1``."""
        where = f"{self.server} env" if self.env else self.server
        if self.remove:
            return f"{where}: {'unset' if self.env else 'remove'} {self.name}"
        if self.env:
            return f"{where}: {self.name}={shlex.quote(self.value or '')}"
        shown = self.name if self.value is None else f"{self.name} {shlex.quote(self.value)}"
        return f"{where}: {shown}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary of every field."""
        return {"server": self.server, "name": self.name, "value": self.value,
                "remove": self.remove, "env": self.env}


@dataclass(frozen=True)
class Fix:
    """One way to make a finding go away, as data (see the module docstring)."""

    kind: FixKind
    text: str
    field: str = ""
    edits: tuple[Edit, ...] = ()
    inputs: tuple[str, ...] = ()
    release: str = ""
    proven: bool | None = None
    need: str = ""  # the step it belongs to (see the module docstring)

    @classmethod
    def advice(cls, text: str) -> Fix:
        """A free-text fix (what a plain string in ``Finding.fixes`` becomes)."""
        return cls(FixKind.ADVICE, text)

    def with_proof(self, proven: bool | None) -> Fix:
        """This fix with ``proven`` set."""
        return replace(self, proven=proven)

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary of every field."""
        return {"kind": self.kind.value, "text": self.text, "field": self.field,
                "edits": [e.to_dict() for e in self.edits], "inputs": list(self.inputs),
                "release": self.release, "proven": self.proven, "need": self.need}


def flag_fix(text: str, field: str, edits: list[Edit | None], *inputs: str) -> Fix | None:
    """A ``FLAGS`` fix of ``edits``; ``None`` when one is ``None`` (a flag this release does
    not have: not suggested) or there are none."""
    kept = tuple(e for e in edits if e is not None)
    return None if not kept or len(kept) != len(edits) else Fix(
        FixKind.FLAGS, text, field=field, edits=kept, inputs=inputs)
