"""Servers grouped the way the manifest groups them, and paired by their PD role.

1. Servers: the invocations of one unit (an LWS leader and its workers, OME's leader and
   worker) are one server; the leader (else the first) stands for it, and a worker whose
   arguments differ from its leader's beyond the per-node flags is a note.
2. Routers: a PD router's ``--prefill``/``--decode`` URLs name servers of its file (the
   URL's host is a role, service or object name, else its port a server's ``--port``);
   those servers form the router's group. A router that lists a server under the other
   role than its ``--disaggregation-mode`` is a note.
3. Pairs, by ``--disaggregation-mode``: first in each object (or router group), then
   among what is left in each file, then among what is left in the files named together
   (or found in one directory). Servers of one shape (the same arguments and env but
   per-instance ones such as ``--port``, ``--base-gpu-id``) are replicas and count once;
   several shapes of a role in an object or file pair each with each (the pair says
   so); across files only one prefill and one decode shape pair. What is left is
   unpaired, with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from urllib.parse import urlsplit

from sglang_dsv4_guard.check.inputs.commands import Draft, Found, RouterDraft
from sglang_dsv4_guard.check.inputs.model import MAX_PAIRS, InputError, Inputs, Invocation, Pair

__all__ = ["INSTANCE_FLAGS", "pair"]

# Flags that differ between instances of one server shape (replicas, nodes).
INSTANCE_FLAGS = frozenset({"--port", "--host", "--base-gpu-id", "--node-rank",
                            "--dist-init-addr", "--nccl-port", "--disaggregation-bootstrap-port",
                            "--metrics-port"})
_INSTANCE_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                           "ROCR_VISIBLE_DEVICES"})
Group = tuple[str, str]


def _flags(invocation: Invocation) -> tuple[str, ...]:
    """The arguments without the per-instance flags and their values."""
    argv, kept, i = invocation.argv, [], 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag in INSTANCE_FLAGS:
            i += 1 if "=" in argv[i] or i + 1 >= len(argv) or argv[i + 1].startswith("--") \
                else 2
            continue
        kept.append(argv[i])
        i += 1
    return tuple(kept)


def _shape(invocation: Invocation) -> tuple[object, ...]:
    env = tuple(sorted((k, v) for k, v in invocation.env.items() if k not in _INSTANCE_ENV))
    return invocation.role, _flags(invocation), env, invocation.gpu


def _differences(leader: Invocation, worker: Invocation) -> str:
    ours, theirs = _flags(leader), _flags(worker)
    only_leader = [a for a in ours if a.startswith("-") and a not in theirs]
    only_worker = [a for a in theirs if a.startswith("-") and a not in ours]
    parts = [f"{', '.join(only_leader[:5])} on the leader only"] if only_leader else []
    parts += [f"{', '.join(only_worker[:5])} on the worker only"] if only_worker else []
    return "; ".join(parts) or "its arguments' values or order"


def _servers(found: Found, notes: list[str]) -> list[Draft]:
    """One draft per server: its leader, else its first invocation."""
    units: dict[str, list[Draft]] = {}
    for draft in found.drafts:
        units.setdefault(draft.invocation.unit, []).append(draft)
    servers = []
    for members in units.values():
        members.sort(key=lambda d: d.invocation.node != "leader")
        leader = members[0]
        servers.append(leader)
        for other in members[1:]:
            if _shape(other.invocation) != _shape(leader.invocation):
                notes.append(f"{other.invocation.file}:{other.invocation.line}: "
                             f"{other.invocation.where} differs from its leader "
                             f"(line {leader.invocation.line}): "
                             f"{_differences(leader.invocation, other.invocation)}")
    return servers


def _host_label(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url if "//" in url else f"http://{url}")
    host = (parts.hostname or "").split(".")[0]
    try:
        port = str(parts.port) if parts.port else None
    except ValueError:
        port = None
    return re.sub(r"-\d+$", "", host), port


def _match(url: str, candidates: list[Draft]) -> Draft | None:
    label, port = _host_label(url)
    scored = [(max(len(n) for n in d.names if label == n or label.endswith("-" + n)), d)
              for d in candidates if any(label == n or label.endswith("-" + n) for n in d.names)]
    if scored:
        return max(scored, key=lambda s: s[0])[1]
    by_port = [d for d in candidates if port is not None and d.port == port]
    return by_port[0] if len(by_port) == 1 else None


def _routed(servers: list[Draft], routers: list[RouterDraft], notes: list[str]
            ) -> dict[str, Group]:
    """The router group of each server a router's lists name, by unit."""
    groups: dict[str, Group] = {}
    for router in routers:
        group = (f"{router.group[0]}|router:{router.line}",
                 f"{router.group[1]} (router at line {router.line})")
        candidates = [d for d in servers if d.invocation.file == router.file]
        for listed, urls in (("prefill", router.prefill), ("decode", router.decode)):
            for url, line in urls:
                draft = _match(url, candidates)
                if draft is None:
                    notes.append(f"{router.file}:{line}: the router's --{listed} {url} names "
                                 "no server found in the file")
                    continue
                groups.setdefault(draft.invocation.unit, group)
                if draft.invocation.role != listed:
                    mode = draft.mode or "absent"
                    notes.append(f"{router.file}:{line}: the router lists "
                                 f"{draft.invocation.where} as {listed}, but its "
                                 f"--disaggregation-mode is {mode}")
    return groups


def _shapes(drafts: Iterable[Draft], role: str) -> list[Draft]:
    seen: dict[tuple[object, ...], Draft] = {}
    for draft in drafts:
        if draft.invocation.role == role:
            seen.setdefault(_shape(draft.invocation), draft)
    return list(seen.values())


def _role_reason(draft: Draft) -> str:
    said = f"; the manifest names it {draft.declared}" if draft.declared else ""
    if draft.mode is None:
        return f"no --disaggregation-mode: not a prefill or decode server{said}"
    return f"--disaggregation-mode is {draft.mode!r} (prefill or decode pair){said}"


def pair(found: Found, together: dict[str, Group]) -> Inputs:
    """The pairs of what was found; ``together`` is the last group of each file (the
    files named together, or the directory a walk found it in)."""
    notes = list(found.notes)
    servers = _servers(found, notes)
    routed = _routed(servers, found.routers, notes)
    final: dict[str, str] = {}
    pairs: list[Pair] = []
    unpaired: list[tuple[Draft, str]] = []
    pending = []
    for draft in servers:
        if draft.invocation.role is None:
            unpaired.append((draft, _role_reason(draft)))
            final[draft.invocation.unit] = draft.group[1]
        else:
            pending.append(draft)
    for level in range(3):
        groups: dict[Group, list[Draft]] = {}
        for draft in pending:
            file = draft.invocation.file
            key = (routed.get(draft.invocation.unit, draft.group),
                   (f"file:{file}", file), together.get(file, (file, file)))[level]
            groups.setdefault(key, []).append(draft)
        pending = []
        for (_, label), members in groups.items():
            prefill, decode = _shapes(members, "prefill"), _shapes(members, "decode")
            ambiguous = level == 2 and (len(prefill) > 1 or len(decode) > 1)
            if not prefill or not decode or ambiguous:
                pending += members
                for draft in members:
                    final[draft.invocation.unit] = label
                if level == 2:
                    unpaired += [(d, _left_reason(d, label, prefill, decode)) for d in members]
                continue
            note = ""
            if len(pairs) + len(prefill) * len(decode) > MAX_PAIRS:
                raise InputError(label, f"{len(prefill)} prefill and {len(decode)} decode "
                                 f"shapes pair into more than {MAX_PAIRS:,} pairs; name fewer "
                                 "files or give each pair its own object")
            if len(prefill) * len(decode) > 1:
                note = (f"{len(prefill)} prefill and {len(decode)} decode shapes in {label}: "
                        "each prefill is paired with each decode")
                notes.append(note)
            for p in prefill:
                for d in decode:
                    pairs.append(Pair(_name(level, label, p.invocation, d.invocation, note),
                                      p.invocation, d.invocation, note))
            for draft in members:
                final[draft.invocation.unit] = label
    return Inputs(
        pairs=tuple(replace(p, prefill=replace(p.prefill, group=final[p.prefill.unit]),
                            decode=replace(p.decode, group=final[p.decode.unit]))
                    for p in pairs),
        unpaired=tuple((replace(d.invocation, group=final.get(d.invocation.unit, d.group[1])),
                        why) for d, why in unpaired),
        notes=tuple(dict.fromkeys(notes)),
        invocations=tuple(replace(d.invocation, group=final.get(d.invocation.unit, d.group[1]))
                          for d in found.drafts))


def _left_reason(draft: Draft, label: str, prefill: list[Draft], decode: list[Draft]) -> str:
    if prefill and decode:
        return (f"{len(prefill)} prefill and {len(decode)} decode shapes in {label}, in "
                "different files: which pairs with which is not known (put each pair in "
                "one file, or name two files)")
    missing = "decode" if draft.invocation.role == "prefill" else "prefill"
    if draft.group[1] == draft.invocation.file:
        return f"no {missing} server in {draft.group[1]} or {label}"
    return f"no {missing} server in {draft.group[1]}, its file or {label}"


def _name(level: int, label: str, prefill: Invocation, decode: Invocation, note: str) -> str:
    """A pair's name: its group, and its two servers where the group holds others."""
    if level == 2:
        return f"{prefill.file} + {decode.file}"
    if note or level == 1:
        return f"{label}: {prefill.where} + {decode.where}"
    return label
