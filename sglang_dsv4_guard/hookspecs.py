"""The guard's hook specifications (pluggy project ``sglang_dsv4_guard``).

Built-in checks, the auto-share remediation and the log reporter are ordinary
implementations of these hooks. Third-party plug-ins register under the
entry-point group ``sglang_dsv4_guard``::

    [project.entry-points.sglang_dsv4_guard]
    my_checks = "my_package.guard_checks"

and implement any of the hooks below with :data:`hookimpl`. Each implementation is
called on its own, in pluggy's order (``tryfirst`` first, ``trylast`` last, otherwise
the last registered first; the built-ins are registered first). One that raises, or
returns something other than a list of :class:`~sglang_dsv4_guard.findings.Finding`,
becomes a plug-in failure finding naming the plug-in, and the others still run. Every
returned finding is checked field by field (``severity`` a ``Severity``,
``observations`` ``Observation`` instances, values whose ``repr`` works, ...); a bad
one becomes a plug-in failure and the plug-in's other findings are kept. Hook wrappers
(``wrapper=True`` / ``hookwrapper=True``) are refused at registration.

A plug-in's failure never blocks, in strict mode either, and never changes SGLang's
verdict. ``SystemExit`` and every other ``BaseException`` count as the plug-in's
failure, except ``KeyboardInterrupt`` in the main thread (the operator's Ctrl-C),
which propagates. See :mod:`sglang_dsv4_guard.plugins` for the full policy.
"""

from __future__ import annotations

from collections.abc import Sequence

# Only the plug-in manager imports these specs; the wrapped places' packages, whose
# snapshot types they name, import the markers (hookmarkers) and never reach this module.
from sglang_dsv4_guard.contact.snapshot import ContactContext, ContactSnapshot
from sglang_dsv4_guard.findings import Finding, Report
from sglang_dsv4_guard.hookmarkers import PAIR_HOOK, PROJECT, hookimpl, hookspec
from sglang_dsv4_guard.mori.snapshot import SendContext, SendSnapshot
from sglang_dsv4_guard.pd.endpoint import Endpoint, PairContext
from sglang_dsv4_guard.peers.snapshot import Registration, RegistrationContext
from sglang_dsv4_guard.state.snapshot import StateContext, StatePair

__all__ = ["PAIR_HOOK", "PROJECT", "hookimpl", "hookspec"]


@hookspec
def sglang_dsv4_guard_remediate_state(
    target_pool: object, draft_pool: object, pair: StatePair, context: StateContext
) -> Sequence[Finding]:
    """Repair a target/draft pool pair before SGLang's checks run, when provably safe.

    :param target_pool: the live target ``DeepSeekV4TokenToKVPool`` (may be changed).
    :param draft_pool: the live draft pool (may be changed).
    :param pair: a snapshot of both pools taken before any remediation.
    :param context: the call's context (release profile, caller, mode, autoshare).
    :return: findings describing what was changed or refused; empty when nothing applied.
        A remediation that changes what SGLang reads but returns no finding is named
        in a plug-in failure finding (the guard notices the change and re-reads the pools).
    """
    raise NotImplementedError  # pragma: no cover - a spec has no body


@hookspec
def sglang_dsv4_guard_check_state(pair: StatePair, context: StateContext) -> Sequence[Finding]:
    """Check a target/draft pool pair as ``setup_state_kv_args`` receives it.

    Must be pure: no I/O, no logging, no change to anything.

    :param pair: snapshots of the target and draft pools and how their mappings relate.
    :param context: the call's context (release profile, caller, mode, autoshare).
    :return: every problem found, in the order SGLang would meet them.
    """
    raise NotImplementedError  # pragma: no cover


@hookspec
def sglang_dsv4_guard_check_send(transfer: SendSnapshot, context: SendContext) -> Sequence[Finding]:
    """Check one MORI state transfer (or a decode peer at registration).

    Must be pure. Called on the failure path of a transfer and once per peer at
    registration, never on a passing transfer.

    :param transfer: the prefill manager's and the decode peer's values.
    :param context: the release profile, mode and place ("registration", "send" or "check").
    :return: every problem found.
    """
    raise NotImplementedError  # pragma: no cover


@hookspec
def sglang_dsv4_guard_check_registration(
    registration: Registration, context: RegistrationContext
) -> Sequence[Finding]:
    """Check a decode peer registering with a Mooncake or NIXL prefill rank.

    Must be pure. Called once per new peer, when SGLang registers it, never per request:
    after SGLang's registration code ran (also when it raised), except on Mooncake before
    0.5.22 in mode ``on``, where it runs once SGLang parsed the registration, before
    SGLang's relayout and its write of the peer table.

    :param registration: the prefill's and the decode's values as two
        :class:`~sglang_dsv4_guard.pd.endpoint.Endpoint` (each value with its source),
        the backend, the peer's name and address.
    :param context: the release profile and mode.
    :return: every refusal SGLang will make for this peer, at registration or later.
    """
    raise NotImplementedError  # pragma: no cover


@hookspec
def sglang_dsv4_guard_check_pair(
    prefill: Endpoint, decode: Endpoint, context: PairContext
) -> Sequence[Finding]:
    """A prefill/decode contract condition, judged in ``check`` and at run time alike.

    Must be pure. ``check`` calls it on the endpoints two launch lines imply (in the
    prefill's environment), before launch; at run time it is called once per new decode
    peer SGLang registers with a Mooncake, NIXL or MORI prefill rank (not for one whose
    DCP relayout SGLang refused: that peer is not registered), on the
    endpoints the prefill's manager and the peer's registration give (the prefill's
    environment is the process's own; the decode's ``env`` is ``None``: not known). A
    value an endpoint does not hold is not known there: judge only what both hold, and
    say what could not be judged with ``context.not_judged(line)``. ``check`` keeps a flag
    fix only when the release's parser accepts its edits and ``check --fix`` proves it; at
    run time fixes are shown unproven. ``docs/plugins.md`` has a complete example.

    :param prefill: the prefill's values by the name SGLang's code reads, with sources.
    :param decode: the decode's.
    :param context: the place (``check`` or ``registration``), the transfer backend, the
        release profile; where unknowns go.
    :return: every problem found.
    """
    raise NotImplementedError  # pragma: no cover




@hookspec
def sglang_dsv4_guard_check_first_contact(
    contact: ContactSnapshot, context: ContactContext
) -> Sequence[Finding]:
    """Check decode's first contact with a prefill, once SGLang refused it.

    Must be pure. Called only on the failure path: SGLang's
    ``CommonKVManager.try_ensure_parallel_info`` raised (the decode server is about to
    exit), never while the prefill's info is fetched or cached.

    :param contact: both servers' values by endpoint name, each with its source (the
        decode's from its live manager, the prefill's from the ``PrefillServerInfo``
        SGLang built, ``None`` when not readable), the prefill's bootstrap address and
        SGLang's error message and type.
    :param context: the decode's release profile, mode and transfer backend.
    :return: every mismatch found.
    """
    raise NotImplementedError  # pragma: no cover


@hookspec
def sglang_dsv4_guard_report(report: Report) -> None:
    """Receive a finished report (log it, export it, page someone).

    :param report: the findings and context of one guarded call.
    """
