"""One full report per launch and host: which process prints a report in full.

A TP-8 server runs 8 scheduler processes, and each meets the same problem. The first
process to meet a report (by :func:`fingerprint`) prints it in full; the others print
one line naming the fingerprint, once they have proof that it was printed. A
*different* report is printed in full wherever it is first met. Suppression needs proof
that two processes belong to one launch and that the full report was written out;
without either, every process prints in full (deduplication fails open).

How processes agree (Linux; anywhere else every process prints in full):

- **The launch** (:mod:`sglang_dsv4_guard.dedup.identity`): a process deduplicates
  only within the launch it joined; without one, with nobody.
- **Markers** live in ``/dev/shm/sglang-dsv4-guard-launches-<uid>/<launch>/`` (or the
  temporary directory without ``/dev/shm``; a name that earlier versions of the guard,
  which swept by another rule, never touch), one claim per fingerprint, made
  atomically (``os.link`` of a complete file: exactly one process wins). A marker
  counts only if another process wrote it *after this process started*: the
  schedulers of one server start together, long before they meet a report; a marker
  of an earlier launch from the same process is older and never suppresses anything.
- **Proof of printing**: the claimant writes ``<fingerprint>.printed`` (the same way)
  once its log call returned. A process finding a claim without that proof waits up to
  ``PROOF_SECONDS`` for it, then prints the report in full itself (``Seen.UNPROVEN``):
  the claimant may have been killed between its claim and its print.
- **Clean-up**: at exit (:func:`cleanup_at_exit`, registered by ``install()``) the
  minter removes its launch's directory, and a process removes that of the launch it
  joined once the minter is gone. After its first report is printed (never between a
  claim and its print), outside the lock, a process reads at most ``_SWEEP_SCAN`` names
  of other launches' directories and looks at no more than ``_SWEEP_MAX`` of them, at
  random, for at most ``_SWEEP_SECONDS``; it removes one only when its minter is
  provably gone (same PID namespace, and that PID dead or with another start time) and
  it holds at most ``_ENTRIES_MAX`` plain files (a bigger one is left as it is). A
  directory of another PID namespace is never removed, however old (each is tiny).
  Nothing ever depends on those files being gone.
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
import itertools
import json
import logging
import os
import re
import secrets
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
from sglang_dsv4_guard.log import LOGGER_NAME

__all__ = ["PROOF_SECONDS", "Seen", "ServerDedup", "cleanup_at_exit", "fingerprint", "sweep"]

logger = logging.getLogger(LOGGER_NAME)

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
    (``cuda:3`` counts as ``cuda``: every TP rank has its own), the context's ``peer``,
    the finding details naming the decode peer and the peer's name wherever else it
    appears (SGLang's messages). The report's text keeps them.
    """
    data = report.to_dict()
    peer = str(data["context"].get("peer") or "")  # "<name> at <address>" (registrations)
    data["context"] = {k: v for k, v in data["context"].items() if k not in _NOISY_CONTEXT}
    for finding in data["findings"]:
        finding["details"] = [d for d in finding["details"] if not d.startswith(_NOISY_DETAILS)]
    text = json.dumps(data, sort_keys=True, default=repr)
    # SGLang's own message may name the peer too ("... rejected for <agent>"): every rank
    # of a server meets its own peers, and the problem is the same
    for name in sorted({peer, peer.split(" at ", 1)[0]} - {""}, key=len, reverse=True):
        text = text.replace(json.dumps(name)[1:-1], "<peer>")
    text = _ADDRESS.sub("0x?", text)
    text = _DEVICE_INDEX.sub(r"\1", text)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Seen(str, enum.Enum):
    """Where a report was printed before this occurrence."""

    FIRST = "first"  # nowhere: print it in full
    HERE = "here"  # earlier in this process (this installation)
    ELSEWHERE = "elsewhere"  # by another process of this launch on this host
    # claimed by another process that showed no proof of printing it in time (it may
    # have been killed between its claim and its log line): print it in full here too
    UNPROVEN = "unproven"


def _base_dir() -> str:
    root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else tempfile.gettempdir()
    return os.path.join(root, f"sglang-dsv4-guard-launches-{os.getuid()}")


_MARKER_MAX = 4096  # bytes; a marker is a small JSON object
_PRINTED = ".printed"  # suffix of the marker proving the claimant printed the report
PROOF_SECONDS = 1.0  # how long a non-claimant waits for that proof before printing
_PROOF_POLL = 0.01


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


_SWEEP_MAX = 64  # directories looked at per process
_SWEEP_SCAN = 4 * _SWEEP_MAX  # names read from the base directory per sweep
_SWEEP_SECONDS = 0.05
_ENTRIES_MAX = 64  # a launch directory holding more is left as it is (not ours to walk)


def _names(path: str, cap: int) -> list[str] | None:
    """Up to ``cap`` names in the directory ``path``; ``None`` if it holds more."""
    names: list[str] = []
    with os.scandir(path) as entries:
        for entry in entries:
            if len(names) == cap:
                return None
            names.append(entry.name)
    return names


def _remove_private(path: str, cap: int = _ENTRIES_MAX) -> bool:
    """Remove the marker directory ``path`` if it is privately ours and holds no more than
    ``cap`` plain entries (markers); otherwise leave it. Whether it is gone now."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    names = _names(_private_dir(path), cap)
    if names is None:
        logger.debug("sglang-dsv4-guard: %s holds over %d entries; left as it is", path, cap)
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name in names:
            os.unlink(name, dir_fd=fd)  # a directory inside is not a marker: OSError
    finally:
        os.close(fd)
    os.rmdir(path)
    return True


def sweep(base: str, keep: str) -> int:
    """Remove up to ``_SWEEP_MAX`` marker directories (picked at random among the first
    ``_SWEEP_SCAN`` names, for at most ``_SWEEP_SECONDS``) of launches whose minter is
    provably gone (:meth:`Launch.minter_gone`); never ``keep``, never one of another PID
    namespace or of a name that is no launch. Returns how many."""
    deadline, removed = time.monotonic() + _SWEEP_SECONDS, 0
    with os.scandir(base) as entries:
        names = [e.name for e in itertools.islice(entries, _SWEEP_SCAN) if e.name != keep]
    for name in secrets.SystemRandom().sample(names, min(_SWEEP_MAX, len(names))):
        if time.monotonic() > deadline:
            break
        launch, path = Launch.parse(name), os.path.join(base, name)
        try:
            if launch is not None and launch.minter_gone() and _remove_private(path):
                removed += 1
        except OSError as exc:
            logger.debug("sglang-dsv4-guard: %s not swept (%s)", path, exc)
    return removed


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
                json.dump({"pid": me.pid, "start": me.start,
                           "written": time.clock_gettime(time.CLOCK_BOOTTIME)}, marker)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _place(self, directory: str, name: str) -> bool:
        """Create this process' marker ``name`` atomically; ``False`` if another,
        contemporary process holds it (see :meth:`_counts`)."""
        assert self._me is not None
        path = os.path.join(directory, name)
        if self._counts(path):
            return False
        tmp = os.path.join(directory, f".{name}.{self._me.pid}")
        self._write_temp(tmp)
        try:
            try:
                os.link(tmp, path)  # atomic: exactly one process creates the marker
            except FileExistsError:
                if self._counts(path):
                    return False
                os.replace(tmp, path)  # stale (an earlier launch, ours, not a file): take it
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _proven(self, directory: str, fp: str) -> Seen:
        """Another process claimed ``fp``: ELSEWHERE once its proof of printing is there
        (waiting up to ``PROOF_SECONDS``), else UNPROVEN."""
        proof, deadline = os.path.join(directory, fp + _PRINTED), \
            time.monotonic() + PROOF_SECONDS
        while not self._counts(proof):
            if time.monotonic() > deadline:
                return Seen.UNPROVEN
            time.sleep(_PROOF_POLL)
        return Seen.ELSEWHERE

    def seen(self, fp: str) -> Seen:
        """Where the report ``fp`` was printed before; the first call claims it."""
        with self._lock:
            decided = self._decided.get(fp)
            if decided is not None:
                return Seen.HERE if decided in (Seen.FIRST, Seen.UNPROVEN) else decided
            try:
                directory = self._session()
                if directory is None or self._me is None or self._place(directory, fp):
                    decided = Seen.FIRST
                else:
                    decided = self._proven(directory, fp)
            except OSError as exc:
                logger.debug("sglang-dsv4-guard: cross-process deduplication unavailable "
                             "(%s); printing the report in full", exc)
                decided = Seen.FIRST
            self._decided[fp] = decided
            return decided

    def printed(self, fp: str) -> None:
        """Record that this process has written the report ``fp`` out in full (its log
        call returned): the proof the other processes wait for before they suppress it.
        Then, outside the lock and once per process, sweep a few gone launches'
        directories: never between a claim and its print."""
        with self._lock:
            directory = self._directory if self._opened else None
            if directory is not None and self._me is not None:
                try:
                    self._place(directory, fp + _PRINTED)
                except OSError as exc:
                    logger.debug("sglang-dsv4-guard: proof of printing %s not written (%s)",
                                 fp, exc)
        self.sweep_once()

    def sweep_once(self) -> None:
        """The first call after a claim sweeps (see :func:`sweep`); later ones do nothing."""
        with self._lock:
            pending, self._sweep = self._sweep, None
        if pending is not None:
            try:
                sweep(*pending)
            except OSError as exc:
                logger.debug("sglang-dsv4-guard: marker sweep skipped (%s)", exc)
