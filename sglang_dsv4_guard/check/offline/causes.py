"""What made SGLang's resolution refuse a server's flags: this machine
(:func:`machine_cause`), or the flags (:func:`failing_source`: a bare ``assert`` has no
message; its condition names the fields it tests).
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Iterator

__all__ = ["failing_source", "joined", "machine_cause"]


def joined(text: str) -> str:
    """``text`` on one line: its lines joined by single spaces (SGLang's and transformers'
    messages can span several)."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


# A failure of a GPU probe on this machine, by the message (the frames are checked too).
_GPU_PROBE = re.compile(r"nvidia-smi|rocm-smi|npu-smi|NVIDIA driver|not compiled with (CUDA|ROCm)|"
                        r"No CUDA GPUs|CUDA driver|libcuda|cuInit|no GPU|"
                        r"Torch not compiled|device count", re.IGNORECASE)
_NETWORK = re.compile(r"couldn't connect to|offline mode|HF_HUB_OFFLINE|TRANSFORMERS_OFFLINE|"
                      r"Name or service not known|makes no network call", re.IGNORECASE)
_NETWORK_TYPES = ("OfflineModeIsEnabled", "LocalEntryNotFoundError", "NetworkRefused",
                  "ConnectionError", "ConnectTimeout", "MaxRetryError")


def _frames(exc: BaseException) -> Iterator[str]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            yield tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
            tb = tb.tb_next
        current = current.__cause__ or current.__context__


def machine_cause(exc: BaseException, device: str) -> str | None:
    """What on this machine made SGLang's resolution fail, or ``None`` when the refusal is
    the flags' own: a package missing here, a network fetch (``check`` makes none), a
    write (``check`` writes none), a GPU probe (this machine need not have the servers'
    GPU; not when the servers run on ``cpu``)."""
    chain = [type(e).__name__ for e in (exc, exc.__cause__, exc.__context__) if e is not None]
    if isinstance(exc, ImportError):
        if exc.name is None:  # a message of SGLang's, not a module name
            return f"a package is missing on this machine: {joined(str(exc))}"
        return f"the package {exc.name!r} is not installed on this machine"
    if any(name in _NETWORK_TYPES for name in chain) or _NETWORK.search(str(exc)):
        return "it needs the network, and check makes no network call"
    if "WriteRefused" in chain:
        return "it writes a file, and check writes nothing"
    if device != "cpu" and (_GPU_PROBE.search(str(exc)) or any(
            "/torch/cuda/" in name or "/torch/mps/" in name or "/torch/_C" in name for name in _frames(exc))):
        return "a GPU probe, which fails on this machine (it has no GPU of the servers')"
    return None


_LINES = re.compile(r"[^\n]*\n|[^\n]+")


@functools.lru_cache(maxsize=64)
def _tree(path: str) -> tuple[tuple[ast.stmt, ...], tuple[str, ...]] | None:
    """A source file's ``assert``, ``if`` and ``raise`` statements (by line) and its lines
    (read once: SGLang's ``server_args.py`` is one of the files, and each refusal asks)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
    checks = sorted((node for node in ast.walk(tree)
                     if isinstance(node, (ast.Assert, ast.If, ast.Raise))),
                    key=lambda node: node.lineno)
    return tuple(checks), tuple(_LINES.findall(text))  # as the parser counts lines: at \n


def _segment(lines: tuple[str, ...], node: ast.AST) -> str:
    """The source text of ``node`` (``ast.get_source_segment`` on lines already split:
    its offsets count UTF-8 bytes)."""
    first: int = node.lineno - 1  # type: ignore[attr-defined]
    last: int = (node.end_lineno or node.lineno) - 1  # type: ignore[attr-defined]
    start: int = node.col_offset  # type: ignore[attr-defined]
    end: int | None = node.end_col_offset  # type: ignore[attr-defined]
    if end is None or last >= len(lines):
        return ""
    if first == last:
        return lines[first].encode()[start:end].decode(errors="replace")
    return "".join([lines[first].encode()[start:].decode(errors="replace"), *lines[first + 1:last],
                    lines[last].encode()[:end].decode(errors="replace")])


def failing_source(exc: BaseException) -> str:
    """The source of the innermost SGLang statement (``assert``/``if``/``raise``) that
    raised ``exc``, on one line; ``""`` when it cannot be read."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        if "/sglang/" in tb.tb_frame.f_code.co_filename.replace(os.sep, "/"):
            last = tb
        tb = tb.tb_next
    if last is None:
        return ""
    parsed = _tree(last.tb_frame.f_code.co_filename)
    if parsed is None:
        return ""
    checks, lines = parsed
    line = last.tb_lineno
    around = [node for node in checks if node.lineno <= line <= (node.end_lineno or node.lineno)]
    if not around:
        return ""
    inner = around[-1]
    shown = inner.test if isinstance(inner, (ast.Assert, ast.If)) else inner
    found = joined(_segment(lines, shown))
    outer = [node for node in around[:-1] if isinstance(node, ast.If)]
    if outer and not isinstance(inner, ast.If):  # the condition it is checked under
        found += f" (when {joined(_segment(lines, outer[-1].test))})"
    return found
