"""The one type of every undo the guard hands out.

``install()`` returns one, and so do :func:`sglang_dsv4_guard.testing.register` and
:func:`sglang_dsv4_guard.testing.record` (as ``Recorder.undo``): calling it reverses what
that one call did and returns ``True``, or returns ``False`` when nothing of it was left
to reverse (already undone, or replaced by a newer call). Calling it twice is harmless.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

__all__ = ["Undo", "nothing_to_undo"]

Undo: TypeAlias = Callable[[], bool]


def nothing_to_undo() -> bool:
    """The undo of a call that changed nothing: always ``False``."""
    return False
