"""One full report per server and host: which process prints a report in full.

A TP-8 server runs 8 scheduler processes, and each meets the same problem. The first
process to meet a report (by :func:`fingerprint`) prints it in full; the others print
one line naming the fingerprint. A *different* report is printed in full wherever it
is first met.

How processes agree (Linux; anywhere else every process prints in full):

- **The launch** is the scheduler's parent process (SGLang spawns every scheduler of
  a server from one process: the engine, or its data-parallel controller; taken from
  ``multiprocessing.parent_process()``, so it may be PID 1 in a container), named by
  its PID *and its start time* (``/proc/<pid>/stat``), so a reused PID is another
  launch. Markers live in ``/dev/shm/sglang-dsv4-guard-<uid>/<pid>-<start>/`` (or the
  temporary directory when ``/dev/shm`` is missing), one file per fingerprint, claimed
  atomically (``os.link`` of a complete file: exactly one process wins).
- **A marker counts** only if another process wrote it *after this process
  started*: the schedulers of one server start together, long before they meet a
  report, so their markers count; a marker left by an earlier launch from the same
  parent (``sglang.Engine`` started twice in one script) or a crashed one is older
  than this process and never suppresses anything.
- **Clean-up**: at exit (:func:`cleanup_at_exit`, registered by ``install()``) a
  process removes the marker directory of the launch it started itself (it is the
  launcher), and that of its own launch once the launcher is gone (the last survivors
  of a crashed launcher). Besides, each process, when it first *claims* a marker (not
  at start-up), removes the directories whose launcher is gone (dead PID, or the PID
  now names a process with another start time), so a launcher killed with its
  schedulers leaves files behind only until a guarded process on that host next
  claims a report. Nothing ever depends on those files being gone.

- **Trust**: the per-user directory and the launch's directory must be this user's
  own real directories (not links), closed to group and others, or nothing is
  deduplicated. Markers are read without following links or blocking (a FIFO under
  the name is ignored) and written through a fresh ``O_EXCL`` temporary file.

Any failure here (read-only file system, no ``/proc``, an untrusted directory) is logged once at DEBUG and the
report is printed in full: deduplication may fail open, never closed.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import logging
import multiprocessing
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from dataclasses import dataclass

from sglang_dsv4_guard.findings import Report

__all__ = ["Seen", "ServerDedup", "cleanup_at_exit", "fingerprint", "launcher_key",
           "process_start"]

logger = logging.getLogger("sglang_dsv4_guard")

# Per-process or per-peer values: the same problem must give the same fingerprint in
# every scheduler and for every decode peer.
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
# Each TP rank's tensors live on its own device (``cuda:3``): the index is per-process.
_DEVICE_INDEX = re.compile(r"\b(cuda|npu|xpu|hpu|mlu|musa):\d+\b")
_NOISY_CONTEXT = frozenset({"peer"})
_NOISY_DETAILS = ("decode peer:",)


def fingerprint(report: Report) -> str:
    """A stable 12-hex-digit hash of what the report says, without per-process noise.

    Left out: object ids and pointers (any ``0x...`` number), device indices
    (``cuda:3`` counts as ``cuda``: every TP rank has its own), the context's ``peer``
    and the finding details naming the decode peer. The report's text keeps them.
    """
    data = report.to_dict()
    data["context"] = {k: v for k, v in data["context"].items() if k not in _NOISY_CONTEXT}
    for finding in data["findings"]:
        finding["details"] = [d for d in finding["details"] if not d.startswith(_NOISY_DETAILS)]
    text = _ADDRESS.sub("0x?", json.dumps(data, sort_keys=True, default=repr))
    text = _DEVICE_INDEX.sub(r"\1", text)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Seen(str, enum.Enum):
    """Where a report was printed before this occurrence."""

    FIRST = "first"  # nowhere: print it in full
    HERE = "here"  # earlier in this process (this installation)
    ELSEWHERE = "elsewhere"  # by another process of this server on this host


def process_start(pid: int) -> int | None:
    """The process' start time in clock ticks since boot, or ``None`` (gone, no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rfind(")") + 2:].split()
    try:
        return int(fields[19])  # field 22, starttime
    except (IndexError, ValueError):
        return None


def _launcher_pid() -> int | None:
    """The launching process' PID: ``multiprocessing``'s parent when this process was
    started by it (as SGLang starts schedulers), else the OS parent; ``None`` when the
    launcher is gone (this process was re-parented)."""
    parent = multiprocessing.parent_process()
    ppid = os.getppid()
    if parent is not None and parent.pid is not None:
        # The launcher may be PID 1 (a container's server without --init): that is
        # still our launcher as long as we were not re-parented away from it.
        return parent.pid if ppid == parent.pid else None
    return ppid if ppid > 1 else None


def launcher_key() -> str | None:
    """``<pid>-<start>`` of the process that launched this one, or ``None``."""
    parent = _launcher_pid()
    start = None if parent is None else process_start(parent)
    return None if parent is None or start is None else f"{parent}-{start}"


def _base_dir() -> str:
    root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else tempfile.gettempdir()
    return os.path.join(root, f"sglang-dsv4-guard-{os.getuid()}")


_MARKER_MAX = 4096  # bytes; a marker is a small JSON object


def _private_dir(path: str) -> str:
    """Create ``path`` (mode 0700) or accept it only if it is this user's own directory,
    not a symbolic link, and closed to group and others; otherwise ``OSError`` (the
    caller then prints in full: another user could plant or read markers there)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{path} is not a directory (a symbolic link or a file)")
    if info.st_uid != os.getuid():
        raise OSError(f"{path} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & 0o077:
        raise OSError(f"{path} is open to group or others (mode {info.st_mode & 0o777:o})")
    return path


def _boot_seconds() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class _Me:
    pid: int
    start: int  # clock ticks since boot
    started: float  # seconds since boot


def _me() -> _Me | None:
    start = process_start(os.getpid())
    if start is None:
        return None
    return _Me(os.getpid(), start, start / os.sysconf("SC_CLK_TCK"))


def _sweep(base: str, keep: str) -> None:
    """Remove marker directories of launchers that are gone."""
    for name in os.listdir(base):
        if name == keep:
            continue
        pid, _, start = name.partition("-")
        if not (pid.isdigit() and start.isdigit()) or process_start(int(pid)) != int(start):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _remove_private(path: str) -> None:
    """Remove the marker directory ``path`` if it exists and is privately ours."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return
    shutil.rmtree(_private_dir(path))


def cleanup_at_exit() -> None:
    """Remove the marker directories this process is the last user of (see the module
    docstring); never another live launch's. Failures are logged at DEBUG."""
    try:
        me = _me()
        if me is None:
            return
        base = _base_dir()
        _remove_private(os.path.join(base, f"{me.pid}-{me.start}"))  # I am its launcher
        parent = _launcher_pid()
        key = launcher_key()
        if parent is None or key is None:  # orphaned: the launcher is gone
            ppid = multiprocessing.parent_process()
            if ppid is not None and ppid.pid is not None:
                for name in os.listdir(base):
                    pid, _, start = name.partition("-")
                    if pid == str(ppid.pid) and start.isdigit() \
                            and process_start(ppid.pid) != int(start):
                        _remove_private(os.path.join(base, name))
    except OSError as exc:
        logger.debug("sglang-dsv4-guard: marker clean-up at exit skipped (%s)", exc)


class ServerDedup:
    """Decides, per fingerprint, whether this occurrence prints in full.

    One per installation: what this process printed is remembered in memory; what the
    other processes of the server printed is read from the launch's marker files.
    ``directory`` is for tests; by default it is derived from the launcher.
    """

    def __init__(self, directory: str | None = None) -> None:
        self._lock = threading.Lock()
        self._decided: dict[str, Seen] = {}
        self._directory = directory
        self._opened = False
        self._me: _Me | None = None

    def _session(self) -> str | None:
        if self._opened:
            return self._directory
        self._opened = True
        given, self._directory = self._directory, None  # until checked: fail open
        self._me = _me()
        if self._me is None:
            return None
        directory = given
        if directory is None:
            key = launcher_key()
            if key is None:
                return None
            base = _private_dir(_base_dir())
            _sweep(base, key)
            directory = os.path.join(base, key)
        self._directory = _private_dir(directory)
        return self._directory

    def _counts(self, path: str) -> bool:
        """Whether the marker at ``path`` was written by another, contemporary process.

        Read without following a symbolic link and without blocking (a FIFO planted
        under the name is not read); only a small regular file counts.
        """
        me = self._me
        assert me is not None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MARKER_MAX:
                return False
            data = json.loads(os.read(fd, _MARKER_MAX + 1))
            pid, start, written = int(data["pid"]), int(data["start"]), float(data["written"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        finally:
            os.close(fd)
        return (pid, start) != (me.pid, me.start) and written >= me.started

    def _write_temp(self, tmp: str) -> None:
        """Write this process' marker to ``tmp``, a name nobody else uses; removed on error."""
        me = self._me
        assert me is not None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a leftover of ours (the directory is ours alone)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as marker:
                json.dump({"pid": me.pid, "start": me.start, "written": _boot_seconds()},
                          marker)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _claim(self, fp: str) -> Seen:
        directory = self._session()
        if directory is None or self._me is None:
            return Seen.FIRST
        path = os.path.join(directory, fp)
        if self._counts(path):
            return Seen.ELSEWHERE
        tmp = os.path.join(directory, f".{fp}.{self._me.pid}")
        self._write_temp(tmp)
        try:
            try:
                os.link(tmp, path)  # atomic: exactly one process creates the marker
            except FileExistsError:
                if self._counts(path):
                    return Seen.ELSEWHERE
                os.replace(tmp, path)  # stale (an earlier launch, ours, not a file): take it
            return Seen.FIRST
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def seen(self, fp: str) -> Seen:
        """Where the report ``fp`` was printed before; the first call claims it."""
        with self._lock:
            decided = self._decided.get(fp)
            if decided is not None:
                return Seen.HERE if decided is Seen.FIRST else decided
            try:
                decided = self._claim(fp)
            except OSError as exc:
                logger.debug("sglang-dsv4-guard: cross-process deduplication unavailable "
                             "(%s); printing the report in full", exc)
                decided = Seen.FIRST
            self._decided[fp] = decided
            return decided
