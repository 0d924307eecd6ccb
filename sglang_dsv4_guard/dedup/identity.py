"""Which launch a process belongs to: the proof that two processes may share reports.

Cross-process deduplication (:mod:`sglang_dsv4_guard.dedup.markers`) suppresses a report only
between processes of one launch:

- **The launch** is an identity the guard mints, when SGLang's ``load_plugins()``
  activates it (:func:`open_launch`, from :func:`sglang_dsv4_guard.entry.activate`),
  in every process it runs in: a random token (``secrets.token_hex``) plus the
  minter's PID, start time and PID namespace. SGLang runs ``load_plugins()`` in its
  engine and ``launch_server`` before it starts the schedulers (and in each scheduler),
  so the identity is in ``os.environ`` (``SGLANG_DSV4_GUARD_LAUNCH``) when ``spawn``
  copies the environment into the schedulers.
- **Joining**: a process deduplicates with the launch found in its environment only
  if it was started by ``multiprocessing`` (as SGLang starts schedulers) and the minter
  is one of its ancestors, alive, in its own PID namespace (same PID *and* start
  time). Every activated process then mints its own identity for its children, so the
  nearest guarded ancestor is the launch. A process without such an identity (started
  by a shell, a supervisor or a pool that ran no guard, or re-parented) deduplicates
  with nobody.
- **Limits**: processes started by ``multiprocessing`` from a guarded process count as
  its launch, whatever they run: pool workers a guarded process starts, or two servers
  run at the same time from one process (SGLang's ``load_plugins()`` runs once per
  process, so the identity is minted once), share it: a report of the second may be a
  pointer to the first's full copy, and pointers say "another process of this launch",
  never "of this server". Two servers started one after the other from one process
  share it too; the markers' time rule (see :mod:`sglang_dsv4_guard.dedup.markers`)
  keeps those apart.
- **A bad value** of ``SGLANG_DSV4_GUARD_LAUNCH`` (not ``<32 hex>-<n>-<n>-<n>``, ASCII
  digits, at most 20 each) is no identity: a warning once, and the process still mints
  its own.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import secrets
import threading
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass

from sglang_dsv4_guard.log import LOGGER_NAME

__all__ = ["ENV_LAUNCH", "Launch", "ThisProcess", "joined_launch", "minted_launch",
           "open_launch", "process_start", "this_process"]

logger = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True)
class ThisProcess:
    """A process named so that a reused PID is another process."""

    pid: int
    start: int  # clock ticks since boot
    started: float  # seconds since boot


def this_process() -> ThisProcess | None:
    """This process: PID and start time (ticks and seconds since boot), or ``None``."""
    start = process_start(os.getpid())
    if start is None:
        return None
    return ThisProcess(os.getpid(), start, start / os.sysconf("SC_CLK_TCK"))


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """``(parent PID, start time in clock ticks since boot)`` of ``pid``, or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as info:
            text = info.read()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rfind(")") + 2:].split()
    try:
        return int(fields[1]), int(fields[19])  # fields 4 (ppid) and 22 (starttime)
    except (IndexError, ValueError):
        return None


def process_start(pid: int) -> int | None:
    """The process' start time in clock ticks since boot, or ``None`` (gone, no /proc)."""
    info = _proc_stat(pid)
    return None if info is None else info[1]


def _pid_namespace() -> int | None:
    """This process' PID namespace (the inode of ``/proc/self/ns/pid``), or ``None``."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


ENV_LAUNCH = "SGLANG_DSV4_GUARD_LAUNCH"
# ASCII digits only, and few of them: ``\d`` matches any Unicode digit and ``int()`` of a
# long digit string raises (Python's int-string limit).
_LAUNCH = re.compile(r"([0-9a-f]{32})-([0-9]{1,20})-([0-9]{1,20})-([0-9]{1,20})", re.ASCII)
_LAUNCH_FORM = "<32 hex digits>-<PID namespace>-<PID>-<start time>, each number 1-20 digits"
_SHOWN_MAX = 80  # characters of a bad value quoted in the warning
_ANCESTORS_MAX = 64


@dataclass(frozen=True)
class Launch:
    """A launch identity: a random token and its minter (PID, start, PID namespace)."""

    token: str
    namespace: int
    pid: int
    start: int

    @property
    def name(self) -> str:
        """The identity as ``SGLANG_DSV4_GUARD_LAUNCH`` holds it and its directory's name."""
        return f"{self.token}-{self.namespace}-{self.pid}-{self.start}"

    @classmethod
    def parse(cls, text: str) -> Launch | None:
        match = _LAUNCH.fullmatch(text)
        if match is None:
            return None
        return cls(match[1], int(match[2]), int(match[3]), int(match[4]))

    def minter_gone(self) -> bool:
        """Provably gone: in this PID namespace, and that PID dead or another process."""
        return self.namespace == _pid_namespace() and process_start(self.pid) != self.start


def _ancestors() -> Iterator[tuple[int, int]]:
    """``(PID, start)`` of this process' parent, its parent, ... (this PID namespace)."""
    pid = os.getppid()
    for _ in range(_ANCESTORS_MAX):
        info = _proc_stat(pid) if pid > 0 else None
        if info is None:
            return
        yield pid, info[1]
        pid = info[0]


_warned_malformed = False


def _inherited(environ: MutableMapping[str, str], warn: bool = False) -> Launch | None:
    """The launch in ``environ`` if this process may join it (see the module docstring);
    ``warn``: say once per process if the variable is set to something that is no identity."""
    global _warned_malformed
    value = environ.get(ENV_LAUNCH, "")
    launch = Launch.parse(value)
    if launch is None and value and warn and not _warned_malformed:
        _warned_malformed = True
        shown = value if len(value) <= _SHOWN_MAX else f"{value[:_SHOWN_MAX]}... ({len(value)} chars)"
        logger.warning("sglang-dsv4-guard: %s=%r is not a launch identity (expected %s); this "
                       "process deduplicates with nobody and prints every report in full (a "
                       "fresh identity is set for the processes it starts)", ENV_LAUNCH, shown,
                       _LAUNCH_FORM)
    if launch is None or multiprocessing.parent_process() is None \
            or launch.namespace != _pid_namespace():
        return None
    return launch if (launch.pid, launch.start) in _ancestors() else None


@dataclass(frozen=True)
class _Opened:
    joined: Launch | None
    minted: Launch | None


_opened: _Opened | None = None
_opened_lock = threading.Lock()


def open_launch(environ: MutableMapping[str, str] | None = None) -> Launch | None:
    """Join the inherited launch, if this process may, and mint this process' own for
    the processes it starts (``environ[SGLANG_DSV4_GUARD_LAUNCH]``); once per process.
    Returns the joined launch (``None``: this process deduplicates with nobody)."""
    global _opened
    env = os.environ if environ is None else environ
    with _opened_lock:
        if _opened is not None:
            return _opened.joined
        joined = minted = None
        try:
            try:
                joined = _inherited(env, warn=True)
            except Exception as exc:  # no proof of a launch: print in full, still mint
                logger.debug("sglang-dsv4-guard: inherited launch not read (%s: %s)",
                             type(exc).__name__, exc)
            me, namespace = this_process(), _pid_namespace()
            if me is not None and namespace is not None:
                minted = Launch(secrets.token_hex(16), namespace, me.pid, me.start)
                env[ENV_LAUNCH] = minted.name
            else:  # no /proc: our children cannot check an identity either
                env.pop(ENV_LAUNCH, None)
        except Exception as exc:  # never let the identity stop SGLang's plug-in loader
            logger.debug("sglang-dsv4-guard: no launch identity (%s: %s); reports print in "
                         "full", type(exc).__name__, exc)
        _opened = _Opened(joined, minted)
        return joined


def minted_launch() -> Launch | None:
    """The launch this process minted for its children (``None``: not opened, no /proc)."""
    opened = _opened
    return None if opened is None else opened.minted


def joined_launch() -> Launch | None:
    """The launch this process deduplicates within, or ``None``. Before
    :func:`open_launch` ran (the guard installed directly), the inherited one if joinable."""
    opened = _opened
    if opened is not None:
        return opened.joined
    try:
        return _inherited(os.environ)
    except Exception:
        return None
