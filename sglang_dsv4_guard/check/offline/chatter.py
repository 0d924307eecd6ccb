"""What SGLang says while ``check`` imports it and resolves the two servers: kept, not printed.

``check`` prints its own report. SGLang's import emits ``UserWarning`` s ("Only CUDA, HIP
and XPU support AWQ currently."), its ``ServerArgs`` resolution logs what it chose
("Setting KV cache dtype to fp8_e4m3 ...", "No IB devices specified ...", DeepSeek-V4's
"setting page_size to 256"), and some code prints. While :func:`capturing` is active:

- ``warnings.showwarning`` records the warning instead of writing it. The warnings
  filters are not touched: a warning the filters ignore stays ignored, one they turn
  into an error still raises, one shown once per place is shown (recorded) once;
- the loggers of :data:`LOGGERS` hand their records to a recording handler
  (:class:`_Handler`; their own handlers are set aside, and they do not propagate, for
  the block); ``sglang`` records from INFO up, as a launched server shows them; the
  others at their own level; so does Python's last resort (:class:`_LastResort`);
- ``sys.stdout`` and ``sys.stderr`` are recording writers (Python-level writes; what C
  code writes to the descriptors is not seen).

Each line goes to the innermost :func:`recording` recorder, under the innermost
:func:`section` (a server's role), else under ``import`` (also what a module's import
says, wherever it is first imported: the AWQ warning comes when a server's resolution
first imports SGLang's quantization modules); at most :data:`CAP` lines per
section are kept, then only counted. Everything is put back when the outermost
:func:`capturing` ends, but only what is still ours (a hook someone set on top of ours
stays; ours then passes everything through).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

from sglang_dsv4_guard.log import LOGGER_NAME

__all__ = ["CAP", "IMPORT", "LOGGERS", "MIRRORED", "TRACE_LINES", "Output", "OutputRecorder",
           "capturing", "explaining", "leaving_out", "mirrored", "recording", "section",
           "split_mirrored"]

CAP = 200  # lines kept per section
TRACE_LINES = 30  # lines kept of one log record's traceback
IMPORT = "import"  # what is no server's: SGLang's import, and the rest
# Loggers whose records are SGLang's output for check (``sglang`` at INFO, as launched).
LOGGERS = ("sglang", "transformers", "torch")
_INFO_LOGGERS = ("sglang",)


@dataclass(frozen=True)
class Output:
    """The captured lines by section, in order, with how many past :data:`CAP` were
    dropped per section."""

    sections: tuple[tuple[str, tuple[str, ...]], ...] = ()
    dropped: tuple[tuple[str, int], ...] = ()

    def lines(self, name: str) -> tuple[str, ...]:
        return dict(self.sections).get(name, ())

    def after(self, first: Output) -> Output:
        """``first``'s lines, then this output's, per section (the cap is applied again)."""
        recorder = OutputRecorder()
        for output in (first, self):
            for name, lines in output.sections:
                for line in lines:
                    recorder.add(name, line)
            for name, count in output.dropped:
                recorder.dropped[name] = recorder.dropped.get(name, 0) + count
        return recorder.output()

    def to_dict(self, roles: Sequence[str] = ("prefill", "decode")) -> dict[str, list[str]]:
        """``{"import": [...], role: [...], ...}``; a section past the cap ends with a line
        that says how many more were not kept."""
        dropped = dict(self.dropped)
        names = [IMPORT, *roles, *(n for n, _ in self.sections if n not in (IMPORT, *roles))]
        doc: dict[str, list[str]] = {}
        for name in names:
            lines = list(self.lines(name))
            if dropped.get(name):
                lines.append(f"... {dropped[name]} more line(s) not kept (at most {CAP} are "
                             "kept per section)")
            doc[name] = lines
        return doc


@dataclass(eq=False)  # each recorder is its own: an equal, outer one is not it
class OutputRecorder:
    """Lines as they come, per section, bounded."""

    kept: dict[str, list[str]] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, line: str) -> bool:
        """Keep ``line`` under ``name`` (whether it was kept: not past the cap)."""
        lines = self.kept.setdefault(name, [])
        if len(lines) < CAP:
            lines.append(line)
            return True
        self.dropped[name] = self.dropped.get(name, 0) + 1
        return False

    def output(self) -> Output:
        return Output(tuple((n, tuple(lines)) for n, lines in self.kept.items()),
                      tuple(self.dropped.items()))


_T = TypeVar("_T")
_lock = threading.RLock()
_recorders: list[OutputRecorder] = []
_sections: list[str] = []
_left_out: list[str] = []  # loggers whose records are not kept (leaving_out)


def _importing() -> bool:
    """Whether a module is being imported (its top level running) on this stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


_mirror: list[TextIO] = []
MIRRORED = "sglang-dsv4-guard-captured\t"  # a mirrored line: MIRRORED, section, tab, line


def _record(line: str) -> None:
    with _lock:
        if _recorders and line.strip():
            name = _sections[-1] if _sections and not _importing() else IMPORT
            if _recorders[-1].add(name, line.rstrip()) and _mirror:
                with suppress(OSError, ValueError):  # a closed mirror loses only the copy
                    _mirror[-1].write(f"{MIRRORED}{name}\t"
                                      f"{line.rstrip().replace(chr(10), ' ')}\n")
                    _mirror[-1].flush()


@contextmanager
def _pushed(stack: list[_T], entry: _T, *, flush: bool = False,
            pop_last: bool = False) -> Iterator[None]:
    """``entry`` on ``stack`` for the block, then taken off: ``entry`` itself, or with
    ``pop_last`` the last entry; with ``flush``, a pending partial line is recorded first."""
    with _lock:
        stack.append(entry)
    try:
        yield
    finally:
        with _lock:
            if flush:
                _flush()
            if pop_last:
                stack.pop()
            else:
                stack.remove(entry)


def mirrored(stream: TextIO) -> AbstractContextManager[None]:
    """Each kept line is also written, as it is recorded, to ``stream`` (one
    :data:`MIRRORED` line, flushed), so it outlives a process that dies before it answers
    (``check``'s child mirrors to its stderr; :func:`split_mirrored` reads it back)."""
    return _pushed(_mirror, stream)


def split_mirrored(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """``text`` (a stream :func:`mirrored` wrote to) as the mirrored lines, each
    ``(section, line)``, and the other non-blank lines, in order."""
    said: list[tuple[str, str]] = []
    other: list[str] = []
    for line in text.splitlines():
        if line.startswith(MIRRORED):
            name, _, kept = line[len(MIRRORED):].partition("\t")
            said.append((name, kept))
        elif line.strip():
            other.append(line)
    return said, other


@contextmanager
def recording() -> Iterator[OutputRecorder]:
    """A fresh recorder for the block: lines inside go to it, not to an outer one."""
    recorder = OutputRecorder()
    with _pushed(_recorders, recorder, flush=True):
        yield recorder


def leaving_out(logger: str) -> AbstractContextManager[None]:
    """The records of ``logger`` and its children are not kept in the block (what the
    guard's own probes make SGLang log about themselves); warnings, prints and other
    loggers' records are kept as usual."""
    return _pushed(_left_out, logger)


def section(name: str) -> AbstractContextManager[None]:
    """Lines inside the block are ``name``'s (a server's role)."""
    return _pushed(_sections, name, flush=True, pop_last=True)


def _flush() -> None:
    """A last line written without its newline is recorded where it was written."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, _Writer):
            stream.flush()


class _Writer:
    """A ``sys.stdout``/``sys.stderr`` stand-in: whole lines recorded."""

    def __init__(self, real: TextIO) -> None:
        self.real = real
        self._partial = ""

    def write(self, text: str) -> int:
        if not _active:
            return self.real.write(text)
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            _record(line)
        return len(text)

    def writelines(self, lines: Sequence[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._partial:
            _record(self._partial)
            self._partial = ""
        self.real.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno, ...
        return getattr(self.real, name)


class _Handler(logging.Handler):
    """Records a log record as ``LEVEL logger: message``, then its traceback and stack
    lines (:func:`_trace`)."""

    def emit(self, record: logging.LogRecord) -> None:
        if any(record.name == name or record.name.startswith(name + ".") for name in _left_out):
            return
        try:
            text = record.getMessage()
        except Exception:  # a record whose arguments do not format: its template
            text = str(record.msg)
        lines = text.splitlines() or [""]
        lines.extend(_trace(record))
        for line in lines:
            _record(f"{record.levelname} {record.name}: {line}")


_FORMATTER = logging.Formatter()


def _trace(record: logging.LogRecord) -> list[str]:
    """The record's exception traceback (``logger.exception``, ``exc_info=``) and stack
    (``stack_info=``) as the standard ``logging.Formatter`` renders them, bounded to the
    last :data:`TRACE_LINES` lines (the exception's own line is the last)."""
    parts = []
    try:
        if record.exc_info and record.exc_info[0] is not None:
            parts.append(record.exc_text or _FORMATTER.formatException(record.exc_info))
        elif record.exc_text:
            parts.append(record.exc_text)
        if record.stack_info:
            parts.append(_FORMATTER.formatStack(record.stack_info))
    except Exception as exc:  # an exception whose str() raises: say so, keep the message
        parts.append(f"(its traceback could not be formatted: {type(exc).__name__})")
    lines = [line for part in parts for line in part.splitlines() if line.strip()]
    if len(lines) <= TRACE_LINES:
        return lines
    return [f"... {len(lines) - TRACE_LINES} traceback line(s) not kept (the last "
            f"{TRACE_LINES} follow)", *lines[-TRACE_LINES:]]


class _LastResort(_Handler):
    """Python's last-resort handler while capturing: the guard's own records go on to the
    real one."""

    def __init__(self, real: logging.Handler | None) -> None:
        super().__init__(logging.WARNING)
        self.real = real

    def handle(self, record: logging.LogRecord) -> bool:
        if record.name.split(".")[0] == LOGGER_NAME or not _active:
            return bool(self.real.handle(record)) if self.real is not None else False
        return bool(super().handle(record))


def _show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
          file: TextIO | None = None, line: str | None = None) -> None:
    if not _active:
        _saved_show(message, category, filename, lineno, file, line)
        return
    where = "/".join(filename.replace("\\", "/").split("/")[-3:])
    _record(f"{category.__name__}: {message} ({where}:{lineno})")


_active = 0
_saved_show: Any = warnings.showwarning
_in_chain = False  # someone's showwarning calls ours (set on top of it while we captured)
_saved: dict[str, Any] = {}


def _install() -> None:
    global _saved_show
    if not _in_chain:  # else ours is already called (and must not call itself)
        _saved_show = warnings.showwarning
        warnings.showwarning = _show
    handler = _Handler()
    loggers = {}
    for name in LOGGERS:
        logger = logging.getLogger(name)
        raise_level = name in _INFO_LOGGERS and logger.getEffectiveLevel() > logging.INFO
        loggers[name] = (logger, list(logger.handlers), logger.propagate, logger.level,
                         raise_level)
        logger.handlers = [handler]
        logger.propagate = False
        if raise_level:
            logger.setLevel(logging.INFO)
    last = _LastResort(logging.lastResort)
    logging.lastResort = last
    _saved.update(handler=handler, loggers=loggers, last=last,
                  stdout=sys.stdout, stderr=sys.stderr)
    sys.stdout, sys.stderr = _Writer(sys.stdout), _Writer(sys.stderr)


def _uninstall() -> None:
    """Put back what is still ours; anything added meanwhile stays."""
    global _in_chain
    for stream in ("stdout", "stderr"):
        writer = getattr(sys, stream)
        if isinstance(writer, _Writer):
            writer.flush()
            if writer.real is _saved[stream]:
                setattr(sys, stream, writer.real)
    _in_chain = warnings.showwarning is not _show
    if not _in_chain:
        warnings.showwarning = _saved_show
    for logger, handlers, propagate, level, raised in _saved["loggers"].values():
        added = [h for h in logger.handlers if h is not _saved["handler"] and h not in handlers]
        logger.handlers = handlers + added
        logger.propagate = propagate
        if raised and logger.level == logging.INFO:
            logger.setLevel(level)
    last: _LastResort = _saved["last"]
    if logging.lastResort is last:
        logging.lastResort = last.real
    _saved.clear()


@contextmanager
def capturing() -> Iterator[None]:
    """SGLang's warnings, log records and prints are recorded, not written, in the block
    (re-entrant: the outermost block installs and restores)."""
    global _active
    with _lock:
        if not _active:
            _install()
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if not _active:
                _uninstall()


def explaining(lines: Sequence[str], names: Sequence[str], value: object) -> str | None:
    """The first of ``lines`` that names the field (one of ``names``, any case) and says
    ``value`` as a whole word: SGLang's own line about the value it chose."""
    if value is None or isinstance(value, bool) or str(value) == "":
        return None
    said = re.compile(rf"(?<![\w.]){re.escape(str(value))}(?![\w]|\.\w)")
    for line in lines:
        lower = line.lower()
        if any(name.lower() in lower for name in names) and said.search(line):
            return line
    return None
