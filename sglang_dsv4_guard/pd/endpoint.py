"""One server as SGLang's prefill/decode code sees it: named values, each with its source."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Observation, PlacedContext, Severity, When, cut_text
from sglang_dsv4_guard.fixes import Fix
from sglang_dsv4_guard.host.releases import HostProfile

__all__ = ["MAX_UNKNOWNS", "PEER", "PLACES", "REFUSED", "UNKNOWN", "Endpoint", "PairContext", "Refusal",
           "Value", "nested_lists", "pair_finding"]

# The value naming the values left out of an endpoint on purpose (SGLang's resolution
# did not run for that server, a checkpoint the release could not read ...): the rows
# do not judge them, and one ``unknowns`` line of the row that left them out says why.
UNKNOWN = "unknown_values"
#: The value saying that SGLang's resolution refused this server's own flags (``check``'s
#: refusal finding, check/fixing/refusal.py): its values are never copied to the other server.
REFUSED = "resolution_refused"
#: The value naming a decode peer registering at run time (its name on the prefill);
#: ``check``'s endpoints, built from launch lines, have none.
PEER = "peer_name"


@dataclass(frozen=True)
class Value:
    """One value and where it is decided (a flag, an env variable, config.json, a default)."""

    value: Any
    source: str


@dataclass(frozen=True)
class Endpoint:
    """The values of one server that SGLang's PD code reads.

    ``values`` is keyed by the name SGLang's code reads (``attn_tp_size``, ``page_size``,
    ``kv_cache_dtype_str``, ``state_types`` ...); ``notes`` says what could not be derived.
    A missing name means the value is not known for this server (never a default).
    ``env`` is the server's environment as typed (``check``: the launch line's; at run
    time: the live process's), ``None`` when it is not known (the peer of a run-time
    check): a fix copies a variable only from a server whose environment is known.
    """

    role: str
    values: Mapping[str, Value] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        # read-only: every condition and plug-in reads the same two servers
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        if self.env is not None:
            object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    def has(self, name: str) -> bool:
        """Whether ``name`` is known for this server."""
        return name in self.values

    def get(self, name: str, default: Any = None) -> Any:
        """The value of ``name``, ``default`` when it is not known."""
        item = self.values.get(name)
        return default if item is None else item.value

    def source(self, name: str) -> str:
        """Where the value of ``name`` comes from."""
        item = self.values.get(name)
        return item.source if item is not None else "not known for this server"

    def observation(self, name: str, label: str | None = None) -> Observation:
        """``name`` as an observation of this server's role."""
        return Observation(self.role, label or name, self.get(name), self.source(name))

    def explained(self, name: str) -> bool:
        """Whether ``name`` was left out on purpose (its ``unknowns`` line is said)."""
        return name in (self.get(UNKNOWN, ()) or ())

    def with_values(self, **values: Value) -> Endpoint:
        """A copy with ``values`` added or replaced."""
        return Endpoint(self.role, {**self.values, **values}, self.notes, self.env)


def nested_lists(endpoint: Endpoint, name: str) -> list[list[int]]:
    """``endpoint``'s per-component value ``name`` (``state_item_lens`` ...) as the fresh
    lists of lists SGLang's ``kv_args`` hold (empty when it is not known)."""
    return [list(v) for v in endpoint.get(name) or ()]


#: The most ``unknowns`` lines one pair keeps (the rest are counted): a condition that
#: calls :meth:`PairContext.not_judged` in a loop cannot flood ``check``'s output.
MAX_UNKNOWNS = 256


#: Where a pair is judged: ``check`` (two launch lines, before launch) or
#: ``registration`` (a decode peer registering with a live prefill rank).
PLACES = ("check", "registration")


@dataclass(frozen=True)
class PairContext(PlacedContext):
    """Where a prefill/decode condition runs (``place``, one of :data:`PLACES`), on which
    transfer backend and release profile (``None``: not judged), and what it could not
    judge: a condition calls :meth:`not_judged` with one line naming its code, the value
    and why (``check`` prints them as ``unknowns``; never an error)."""

    place: str
    backend: str
    profile: HostProfile | None = None
    _lines: list[str] = field(default_factory=list, init=False, repr=False)
    _dropped: list[int] = field(default_factory=lambda: [0], init=False, repr=False)

    def not_judged(self, line: str) -> None:
        """Record that a condition could not be judged here, and why (the line as text,
        cut to the findings' string cap; past :data:`MAX_UNKNOWNS` lines, only counted)."""
        if len(self._lines) >= MAX_UNKNOWNS:
            self._dropped[0] += 1
            return
        try:
            text = line if isinstance(line, str) else str(line)
        except Exception as exc:  # a line that cannot be shown is still counted
            text = f"(a line that cannot be shown: str raised {type(exc).__name__})"
        self._lines.append(cut_text(text))

    @property
    def unknowns(self) -> tuple[str, ...]:
        """What the conditions could not judge, in order (read-only)."""
        dropped = self._dropped[0]
        more = [f"... +{dropped} more lines not kept"] if dropped else []
        return (*self._lines, *more)

@dataclass(frozen=True)
class Refusal:
    """One of SGLang's refusals of the pair, made by the release's own code: the code,
    SGLang's message, the function that raises it, the state type it refuses (``None``:
    not one state type's), and the prefill's TP the decode's must equal for that state as
    the release's own check accepts it (``("attention" | "state", size)``; ``None``: the
    attention TP, or no TP pairing)."""

    code: str
    message: str
    function: str
    state_type: str | None = None
    pairs_by: tuple[str, int] | None = None


def pair_finding(code: str, subject: str, ends: tuple[Endpoint, Endpoint],
                 names: Sequence[str], details: Sequence[str], fixes: Sequence[Fix],
                 host_message: str | None, when: When, severity: Severity | None = None,
                 *, unknown_too: bool = False) -> Finding:
    """A pair condition's finding: the catalogue's title, docs and (unless given) severity
    for ``code``, and each of ``names`` observed on each server where it is known (the
    prefill's first); with ``unknown_too``, on each server, a value it does not know
    observed as "not known for this server"."""
    return Finding(
        code=code, severity=CODES[code].severity if severity is None else severity,
        summary=CODES[code].title, subject=subject,
        observations=tuple(e.observation(n) for n in names for e in ends
                           if unknown_too or e.has(n)),
        details=tuple(details), fixes=tuple(fixes), docs=docs_url(code),
        host_message=host_message, when=when)
