"""The guard's logger, and the one way to silence it.

Every module logs to ``logging.getLogger("sglang_dsv4_guard")``. Code that shows the
guard's findings itself (``doctor``, ``check``, the demo) silences that logger with
:func:`silenced`, so nothing is said twice, and puts it back as it was.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["LOGGER_NAME", "silenced"]

LOGGER_NAME = "sglang_dsv4_guard"


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """The guard's logger says nothing inside the block (it is disabled, as it was after)."""
    logger = logging.getLogger(LOGGER_NAME)
    was, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = was
