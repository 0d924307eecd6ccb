"""A file's text and where a typed argument stands in it.

Offsets are characters of the text as read (UTF-8, line endings kept), lines 1-based.
An argument is placed by finding its typed text verbatim in a region of the file (the
YAML scalar, shell word or assignment it came from), in order: each search starts where
the previous one in that region ended, so repeated values map to successive places. A
match must stand alone (no name character either side), so ``1`` is not found inside
``--tp-size 16``. Text not written verbatim (a YAML escape, a folded quote) gets the line
where the search stands and no span.
"""

from __future__ import annotations

import bisect
import gc
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Region", "Source", "no_collection"]

_NAME_CHAR = re.compile(r"[\w.\-/:=@+%,]")


@contextmanager
def no_collection() -> Iterator[None]:
    """The cyclic garbage collector paused while files are read: reading builds many
    small acyclic objects (words, YAML nodes), and the collector's passes over them took
    half the time; reference counting still frees them. Restored afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Source:
    """One input file: its path as given and its text."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.text = text
        self._starts = [0] + [m.end() for m in re.finditer(r"\n", text)]

    def line_of(self, offset: int) -> int:
        """The 1-based line holding character ``offset``."""
        return bisect.bisect_right(self._starts, offset)

    def offset(self, line0: int, column: int) -> int:
        """The offset of a 0-based line and column (as YAML marks give them)."""
        line0 = min(max(line0, 0), len(self._starts) - 1)
        return min(self._starts[line0] + column, len(self.text))

    def region(self, start: int, end: int) -> Region:
        """A searchable region ``[start, end)`` of this file."""
        return Region(self, start, end)

    def everywhere(self) -> Region:
        return Region(self, 0, len(self.text))


@dataclass
class Region:
    """Part of a file where typed arguments are looked for, in order."""

    source: Source
    start: int
    end: int
    cursor: int = -1

    def __post_init__(self) -> None:
        if self.cursor < 0:
            self.cursor = self.start

    @property
    def line(self) -> int:
        """The line the search stands at."""
        return self.source.line_of(min(self.cursor, max(self.end - 1, self.start)))

    def fresh(self) -> Region:
        """The same region, searched from its start."""
        return Region(self.source, self.start, self.end)

    def place(self, typed: str) -> tuple[int, tuple[int, int] | None]:
        """The line and span of the next stand-alone occurrence of ``typed``."""
        text = self.source.text
        at = text.find(typed, self.cursor, self.end) if typed else -1
        while at >= 0:
            stop = at + len(typed)
            before = text[at - 1] if at > self.start else ""
            after = text[stop] if stop < self.end else ""
            if not (_NAME_CHAR.match(before) and _NAME_CHAR.match(typed[0])) and \
                    not (_NAME_CHAR.match(after) and _NAME_CHAR.match(typed[-1])):
                self.cursor = stop
                return self.source.line_of(at), (at, stop)
            at = text.find(typed, at + 1, self.end)
        return self.line, None
