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

``check`` prices each flag fix against the two launch lines (:class:`Cost`: which servers
it changes, what it turns on or off, any GPU count or checkpoint it changes); ``None`` at
run time, where the launch lines are not known.

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

__all__ = ["COST_TIERS", "Cost", "Edit", "Fix", "FixKind", "flag_fix"]


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


#: What each cost tier gives up, cheapest first (:attr:`Cost.tier`).
COST_TIERS = {1: "adds settings the operator left unset; nothing typed changes",
              2: "changes values the operator typed",
              3: "turns a feature on or off",
              4: "changes a server's GPU count",
              5: "changes a checkpoint"}


@dataclass(frozen=True)
class Cost:
    """What a flag fix changes against the operator's two launch lines.

    ``servers``: the servers it edits. ``off`` / ``on``: the features it turns off or on
    (a switch, ``--speculative-algorithm``, attention DP), each ``"decode: --enable-x"``.
    ``values``: typed values it changes or removes, and variables it sets or unsets.
    ``gpus``: each GPU count it changes, ``"decode: 12 -> 8"``. ``checkpoints``: the model
    or draft paths it changes.
    ``tier`` is the most expensive of these (:data:`COST_TIERS`).
    """

    servers: tuple[str, ...] = ()
    off: tuple[str, ...] = ()
    on: tuple[str, ...] = ()
    values: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()
    edit_count: int = 0

    @property
    def tier(self) -> int:
        """1 to 5 (:data:`COST_TIERS`)."""
        return (5 if self.checkpoints else 4 if self.gpus else 3 if self.off or self.on
                else 2 if self.values else 1)

    def key(self) -> tuple[int, ...]:
        """The order fixes are chosen in, least given up first: the tier, then checkpoints,
        GPU counts, features turned off, turned on, typed values changed, servers, edits."""
        return (self.tier, len(self.checkpoints), len(self.gpus), len(self.off),
                len(self.on), len(self.values), len(self.servers), self.edit_count)

    def given_up(self) -> tuple[int, ...]:
        """:meth:`key` without servers and edits: what the operator gives up, so a change
        with fewer edits that gives up more (a GPU count) is not the cheaper one."""
        return self.key()[:-2]

    def describe(self) -> str:
        """``changes the decode; turns off decode: --enable-hisparse; GPU count decode: 12 -> 8``."""
        parts = [f"changes the {' and '.join(self.servers) or 'no'} server"
                 + ("s" if len(self.servers) > 1 else "")]
        for label, items in (("turns off", self.off), ("turns on", self.on),
                             ("changes", self.values), ("GPU count", self.gpus),
                             ("checkpoint", self.checkpoints)):
            if items:
                parts.append(f"{label} {', '.join(items)}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary of every field, with ``tier`` and its ``gives_up``."""
        return {"tier": self.tier, "gives_up": COST_TIERS[self.tier],
                "servers": list(self.servers), "off": list(self.off), "on": list(self.on),
                "values": list(self.values), "gpus": list(self.gpus),
                "checkpoints": list(self.checkpoints), "edit_count": self.edit_count}


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
    cost: Cost | None = None  # what it changes (``check`` only; see the module docstring)

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
                "release": self.release, "proven": self.proven, "need": self.need,
                "cost": None if self.cost is None else self.cost.to_dict()}


def flag_fix(text: str, field: str, edits: list[Edit | None], *inputs: str) -> Fix | None:
    """A ``FLAGS`` fix of ``edits``; ``None`` when one is ``None`` (a flag this release does
    not have: not suggested) or there are none."""
    kept = tuple(e for e in edits if e is not None)
    return None if not kept or len(kept) != len(edits) else Fix(
        FixKind.FLAGS, text, field=field, edits=kept, inputs=inputs)
