"""One full report per server and host: which process prints a report in full.

A TP-8 server runs 8 scheduler processes, and each meets the same problem. The first
process to meet a report (by :func:`fingerprint`) prints it in full; the others print
one line naming the fingerprint. A *different* report is printed in full wherever it
is first met. Suppression needs proof that two processes belong to one launch of one
server; without it every process prints in full (deduplication fails open).

How processes agree (Linux; anywhere else every process prints in full):

- **The launch** (:mod:`sglang_dsv4_guard.dedup.identity`): a process deduplicates
  only within the launch it joined, an identity minted by an ancestor that ran the
  guard before starting it; without one it deduplicates with nobody. Two servers
  started one after the other from one process share the identity; the marker rule
  below keeps them apart.
- **Markers** live in ``/dev/shm/sglang-dsv4-guard-launches-<uid>/<launch>/`` (or the
  temporary directory without ``/dev/shm``; a name that earlier versions of the guard,
  which swept by another rule, never touch), one file per fingerprint, claimed
  atomically (``os.link`` of a complete file: exactly one process wins). A marker
  counts only if another process wrote it *after this process started*: the
  schedulers of one server start together, long before they meet a report; a marker
  of an earlier launch from the same process is older and never suppresses anything.
- **Clean-up**: at exit (:func:`cleanup_at_exit`, registered by ``install()``) the
  minter removes its launch's directory, and a process removes that of the launch it
  joined once the minter is gone. After its first claim, outside the lock, a process
  looks at no more than ``_SWEEP_MAX`` other directories, at random, for at most
  ``_SWEEP_SECONDS``, and removes one only when its minter is provably gone: same PID
  namespace and that PID dead or with another start time, or nothing written in it for
  ``_STALE_SECONDS`` (a rule that holds across namespaces; a live launch losing its
  markers to it only prints in full again). Nothing ever depends on those files being
  gone.
- **Trust**: the per-user directory and the launch's directory must be this user's
  own real directories (not links), closed to group and others, or nothing is
  deduplicated. Markers are read without following links or blocking (a FIFO under
  the name is ignored) and written through a fresh ``O_EXCL`` temporary file.

Any failure here (read-only file system, no ``/proc``, an untrusted directory) is
logged once at DEBUG and the report is printed in full.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time

from sglang_dsv4_guard.dedup.identity import (
    Launch,
    ThisProcess,
    joined_launch,
    minted_launch,
    this_process,
)
from sglang_dsv4_guard.findings import Report

__all__ = ["Seen", "ServerDedup", "cleanup_at_exit", "fingerprint", "sweep"]

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


def _base_dir() -> str:
    root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else tempfile.gettempdir()
    return os.path.join(root, f"sglang-dsv4-guard-launches-{os.getuid()}")


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


_SWEEP_MAX = 64  # directories looked at per process
_SWEEP_SECONDS = 0.05
_STALE_SECONDS = 7 * 24 * 3600.0  # nothing written for a week


def _sweepable(path: str, name: str) -> bool:
    launch = Launch.parse(name)
    if launch is not None and launch.minter_gone():
        return True
    return time.time() - os.lstat(path).st_mtime > _STALE_SECONDS


def sweep(base: str, keep: str) -> int:
    """Remove up to ``_SWEEP_MAX`` marker directories (at random, for at most
    ``_SWEEP_SECONDS``) of launches provably gone; never ``keep``. Returns how many."""
    names = [n for n in os.listdir(base) if n != keep]
    chosen = secrets.SystemRandom().sample(names, min(_SWEEP_MAX, len(names)))
    deadline, removed = time.monotonic() + _SWEEP_SECONDS, 0
    for name in chosen:
        if time.monotonic() > deadline:
            break
        path = os.path.join(base, name)
        try:
            if _sweepable(path, name):
                _remove_private(path)
                removed += 1
        except OSError as exc:
            logger.debug("sglang-dsv4-guard: %s not swept (%s)", path, exc)
    return removed


def _remove_private(path: str) -> None:
    """Remove the marker directory ``path`` if it exists and is privately ours."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return
    shutil.rmtree(_private_dir(path))


def cleanup_at_exit() -> None:
    """Remove the marker directory of the launch this process minted, and that of the
    launch it joined once its minter is gone; never another live launch's. Failures
    are logged at DEBUG."""
    try:
        base = _base_dir()
        minted = minted_launch()
        if minted is not None:
            _remove_private(os.path.join(base, minted.name))
        joined = joined_launch()
        if joined is not None and joined.minter_gone():
            _remove_private(os.path.join(base, joined.name))
    except OSError as exc:
        logger.debug("sglang-dsv4-guard: marker clean-up at exit skipped (%s)", exc)


class ServerDedup:
    """Decides, per fingerprint, whether this occurrence prints in full.

    One per installation: what this process printed is remembered in memory; what the
    other processes of the server printed is read from the launch's marker files.
    ``directory`` is for tests; by default it is the joined launch's (none: no
    cross-process deduplication).
    """

    def __init__(self, directory: str | None = None) -> None:
        self._lock = threading.Lock()
        self._decided: dict[str, Seen] = {}
        self._directory = directory
        self._opened = False
        self._me: ThisProcess | None = None
        self._sweep: tuple[str, str] | None = None  # (base, own launch), swept once

    def _session(self) -> str | None:
        if self._opened:
            return self._directory
        self._opened = True
        given, self._directory = self._directory, None  # until checked: fail open
        self._me = this_process()
        if self._me is None:
            return None
        directory = given
        if directory is None:
            launch = joined_launch()
            if launch is None:  # no proof of one launch with anyone: print in full
                return None
            base = _private_dir(_base_dir())
            self._sweep = (base, launch.name)
            directory = os.path.join(base, launch.name)
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
        """Where the report ``fp`` was printed before; the first call claims it, then
        (outside the lock, once per process) sweeps a few gone launches' directories."""
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
            pending, self._sweep = self._sweep, None
        if pending is not None:
            try:
                sweep(*pending)
            except OSError as exc:
                logger.debug("sglang-dsv4-guard: marker sweep skipped (%s)", exc)
        return decided
