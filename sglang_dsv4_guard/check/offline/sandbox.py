"""The walls of ``check``'s child process: no network, no writes outside its scratch directory.

:func:`install` adds an audit hook (``sys.addaudithook``; it cannot be removed, so only
the child that ``check`` starts installs it) that refuses, by raising, every socket
look-up or connection (``socket.getaddrinfo``, ``socket.connect``, ...) and every file
write, directory creation, removal, rename or link outside the scratch directory the
parent made for this run (and ``/dev/null``). What it refused is kept, so the check can
say in ``unknowns`` what SGLang wanted and did not get. The environment the parent gives
the child (``HF_HUB_OFFLINE=1`` and the rest, :mod:`.child`) keeps the libraries from
trying in the first place; this hook is the wall behind it.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

__all__ = ["NetworkRefused", "WriteRefused", "install", "refusals"]

_NETWORK_EVENTS = frozenset({"socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
                             "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg"})
# Events whose path arguments are written (created, removed, renamed, linked, changed):
# (index of the path, index of its ``dir_fd`` or None).
_PATH_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.mkdir": ((0, 2),), "os.rmdir": ((0, 1),), "os.remove": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)), "os.symlink": ((1, 2),), "os.link": ((1, 3),),
    "os.truncate": ((0, None),), "os.chmod": ((0, 2),), "os.chown": ((0, 3),),
    "os.utime": ((0, 3),), "shutil.rmtree": ((0, 1),), "shutil.copyfile": ((1, None),),
    "shutil.copytree": ((1, None),), "shutil.move": ((0, None), (1, None)),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_ALLOWED_FILES = frozenset({os.devnull})
_scratch: list[str] = []
_refused: list[str] = []


class NetworkRefused(OSError):
    """A network call refused in ``check``'s child (``check`` makes none)."""


class WriteRefused(PermissionError):
    """A write refused in ``check``'s child (``check`` writes nothing)."""


def refusals() -> tuple[str, ...]:
    """What the hook refused so far, one line each (``socket.getaddrinfo huggingface.co``)."""
    return tuple(_refused)


def _path(value: Any, dir_fd: Any = None) -> str | None:
    if isinstance(value, int) or value is None:  # a descriptor: no new name is written
        return None
    try:
        path = os.fsdecode(os.fspath(value))
        if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    except (TypeError, OSError):
        return None
    return os.path.normpath(os.path.abspath(path))


def _allowed(path: str) -> bool:
    return path in _ALLOWED_FILES or any(path == root or path.startswith(root + os.sep)
                                         for root in _scratch)


def _refuse(line: str, exc: OSError) -> None:
    if len(_refused) < 64:  # a retry loop must not grow this without bound
        _refused.append(line)
    raise exc


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event in _NETWORK_EVENTS:
        target = args[0] if event.startswith("socket.get") else args[1] if len(args) > 1 else ""
        _refuse(f"{event} {target!r}", NetworkRefused(
            errno.ENETUNREACH, f"sglang-dsv4-guard check makes no network call ({event} "
                               f"{target!r} refused)"))
    elif event == "open" and len(args) > 2 and isinstance(args[2], int) \
            and args[2] & _WRITE_FLAGS:
        path = _path(args[0])
        if path is not None and not _allowed(path):
            _refuse(f"write {path}", WriteRefused(
                errno.EACCES, "sglang-dsv4-guard check writes nothing (refused)", path))
    elif event in _PATH_EVENTS:
        for index, fd_index in _PATH_EVENTS[event]:
            dir_fd = args[fd_index] if fd_index is not None and len(args) > fd_index else None
            path = _path(args[index], dir_fd) if len(args) > index else None
            if path is not None and not _allowed(path):
                _refuse(f"{event.split('.')[-1]} {path}", WriteRefused(
                    errno.EACCES, "sglang-dsv4-guard check writes nothing (refused)", path))


def install(scratch: str) -> None:
    """Refuse network calls, and writes outside ``scratch``, for the rest of this process.

    Once per process; a second call only adds ``scratch`` to the allowed roots."""
    first = not _scratch
    _scratch.append(os.path.normpath(os.path.abspath(scratch)))
    if first:
        sys.addaudithook(_hook)
