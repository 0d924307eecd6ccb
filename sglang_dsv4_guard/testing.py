"""What a plug-in author needs to test a guard plug-in, on SGLang's real classes.

- Pools: :func:`build_pair` and :class:`PoolSpec` build a pair of SGLang's own pool class
  without a GPU or a model (:mod:`sglang_dsv4_guard.samples`).
- Hooks: :func:`check_pools` and :func:`check_transfer` run the built-ins and your
  plug-ins through the guard's real plug-in manager (the same isolation, ordering and
  plug-in failure handling as in a server) and return the :class:`Report`;
  :class:`Recorder` is a reporter that keeps every report it is handed.
- The installed guard: :func:`record` and :func:`register` add a recorder or a plug-in
  to the guard ``install()`` put in place; each comes with its :data:`Undo`.
- :func:`reset` puts the process back as a fresh import of the guard left it (run it
  around every test, as the project's own test case does).

Built on the guard, never used by it. Imports sglang and torch only when a function that
needs them is called.
"""

from __future__ import annotations

from sglang_dsv4_guard.assembly import standalone_runtime
from sglang_dsv4_guard.findings import Report
from sglang_dsv4_guard.host.targets import MORI_SEND
from sglang_dsv4_guard.lifecycle import installation, reset
from sglang_dsv4_guard.mori.snapshot import SendContext, SendSnapshot
from sglang_dsv4_guard.plugins import add_all
from sglang_dsv4_guard.reporter import Recorder
from sglang_dsv4_guard.samples import (
    MAPPING_KINDS,
    PoolSpec,
    build_pair,
    new_kv_args,
    three_mismatch_pair,
)
from sglang_dsv4_guard.state.wrapper import check_pair, prepare_pair
from sglang_dsv4_guard.undo import Undo

__all__ = [
    "MAPPING_KINDS",
    "PoolSpec",
    "Recorder",
    "Undo",
    "build_pair",
    "check_pools",
    "check_transfer",
    "new_kv_args",
    "record",
    "register",
    "reset",
    "three_mismatch_pair",
]

def check_pools(target_pool: object, draft_pool: object, *plugins: object, mode: str = "on",
                autoshare: bool = False) -> Report:
    """Run the remediation and check hooks on a pool pair, as the wrapper does.

    ``plugins`` are registered after the built-ins exactly as a server registers entry
    points (a refused one raises ``ValueError`` with its failure's details). The
    pools are snapshotted as in a server, remediation plug-ins may act (auto-share only
    when ``autoshare``), then every ``check_state`` implementation runs; the report
    goes to every reporter (a :class:`Recorder` among ``plugins`` receives it) and is
    returned. ``mode`` (``"on"`` or ``"strict"``) is what ``context.mode`` says.
    SGLang's own function is not called: for the full path, ``install()`` the guard
    and call ``setup_state_kv_args``.

    Raises ``ValueError`` when SGLang's DeepSeek-V4 draft block would not run for these
    pools (not both ``DeepSeekV4TokenToKVPool``, or an NPU release that skips it), so a
    test never passes for want of anything checked.
    """
    rt = standalone_runtime(plugins, mode, autoshare)
    prep = prepare_pair(rt, target_pool, draft_pool, "sglang_dsv4_guard.testing")
    if prep is None:
        raise ValueError(
            "SGLang's DeepSeek-V4 draft check does not run for these pools (target "
            f"{type(target_pool).__qualname__}, draft {type(draft_pool).__qualname__}): both "
            "must be DeepSeekV4TokenToKVPool (build them with build_pair)")
    report = Report.of(check_pair(rt, prep), prep.context.describe())
    rt.publish(report)
    return report


def check_transfer(transfer: SendSnapshot, *plugins: object, place: str = "send") -> Report:
    """Run every ``check_send`` implementation on one MORI transfer snapshot.

    ``place`` is ``"send"`` (a transfer), ``"registration"`` (a decode peer registering) or
    ``"check"`` (before launch, as the ``check`` command runs it).
    ``plugins`` are registered as in :func:`check_pools`. The report goes to every
    reporter and is returned.
    """
    if place not in ("send", "registration", "check"):
        raise ValueError(f"place must be 'send', 'registration' or 'check' (got {place!r})")
    rt = standalone_runtime(plugins)
    context = SendContext(rt.profile, "on", place)
    findings = rt.plugins.collect("sglang_dsv4_guard_check_send",
                                  {"transfer": transfer, "context": context})
    report = Report.of(findings, {"function": MORI_SEND.qualname,
                                  "peer": transfer.engine_key or "?",
                                  "sglang": rt.profile.name, "mode": context.mode})
    rt.publish(report)
    return report


def register(*plugins: object) -> Undo:
    """Register ``plugins`` on the guard ``install()`` put in place; return the undo.

    Registered as a server registers entry points, all or nothing: a refused plug-in
    raises ``ValueError`` with its failure's details and none is left registered.
    The undo unregisters them and returns ``True``; ``False`` when none was still
    registered (undone before, or after ``uninstall()``).
    """
    current = installation()
    if current is None:
        raise RuntimeError("the guard is not installed: call sglang_dsv4_guard.install() first")
    manager = current.plugins
    added = add_all(manager, plugins)

    def undo() -> bool:
        if installation() is not current:  # uninstalled: the plug-ins went with it
            return False
        left = [plugin for plugin in added if manager.pm.is_registered(plugin)]
        for plugin in left:
            manager.pm.unregister(plugin)
        return bool(left)

    return undo


def record() -> Recorder:
    """A :class:`Recorder` registered on the installed guard (until ``uninstall()``, or
    until its ``undo`` is called)."""
    recorder = Recorder()
    recorder.undo = register(recorder)
    return recorder
