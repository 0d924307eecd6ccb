"""One distinct mismatch in a process: the peers it covers, its failures, where its full
report was printed.

Shared by every wrapper that reports decode peers (MORI's, and the registration checks of
Mooncake and NIXL in :mod:`sglang_dsv4_guard.peers`): the first peer of a mismatch gets
the full report, later ones are counted, and the count is logged at 1, 10, 100, ...
(:func:`sparse`). The caller keys its mismatches by what makes two peers' reports the
same problem and holds its own lock around the counts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sglang_dsv4_guard.dedup.markers import Seen, fingerprint
from sglang_dsv4_guard.findings import Report

__all__ = ["PLACED_WAIT", "Mismatch", "sparse"]

PLACED_WAIT = 5.0  # seconds a concurrent occurrence waits for the first one's log line


def sparse(n: int) -> bool:
    """Whether a running count is logged: at 1, 10, 100, ... (powers of ten)."""
    return n > 0 and str(n).rstrip("0") == "1"


@dataclass
class Mismatch:
    """One distinct mismatch in this process: the peers it covers and its failures.

    ``label`` says what differs, for the count lines (``prefill attention TP 8, decode
    TP 4, ...``)."""

    label: str = "?"
    peers: set[str] = field(default_factory=set)
    failures: int = 0
    shown: bool = False  # its full report went to the log or into an exception
    fingerprint: str = "?"  # set with ``shown``, under the owner's lock
    where: Seen | None = None  # where that full report was printed
    # Set once ``where`` is known: a concurrent occurrence waits for it to name its pointer.
    placed: threading.Event = field(default_factory=threading.Event)

    def claim(self, peer: str, report: Report) -> tuple[int, bool]:
        """Count ``peer`` under this mismatch: (its peers so far, whether the full report
        was shown before). The first claim takes the report's fingerprint. Call it under
        the owner's lock."""
        self.peers.add(peer)
        quiet, self.shown = self.shown, True
        if not quiet:
            self.fingerprint = fingerprint(report)
        return len(self.peers), quiet

    def place(self, where: Seen | None) -> None:
        """Record where the full report was printed and release the waiters."""
        self.where = where
        self.placed.set()
