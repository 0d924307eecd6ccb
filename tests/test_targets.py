"""What the guard reads of SGLang is declared once and covered by the code digests."""

from __future__ import annotations

import unittest
from pathlib import Path
from typing import Any

import sglang
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host import targets
from sglang_dsv4_guard.host.digests import digest_tree
from sglang_dsv4_guard.state.snapshot import change_token, snapshot_pair
from sglang_dsv4_guard.testing import PoolSpec, build_pair, check_pools

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

_POOL_PREFIX = f"{targets.DSV4_POOL.qualname}."


def _digested_attributes() -> set[str]:
    parts = digest_tree(Path(sglang.__file__).parent)
    return {key[len(_POOL_PREFIX):] for key in parts if key.startswith(_POOL_PREFIX)}


def _recording(pool: Any, seen: set[str]) -> Any:
    """``pool`` itself, its class swapped for a subclass that records every attribute read
    on it (SGLang's class stays its base: ``isinstance`` checks still hold)."""
    base = type(pool)

    def __getattribute__(self: Any, name: str) -> Any:
        if not name.startswith("__"):
            seen.add(name)
        return base.__getattribute__(self, name)

    pool.__class__ = type(f"Recording{base.__name__}", (base,),
                          {"__getattribute__": __getattribute__})
    return pool


class TestDigestsCoverWhatIsRead(GuardTestCase):
    """A change in how SGLang sets an attribute the guard reads changes the digests."""

    def test_declared_attributes_are_digested(self) -> None:
        """Every pool attribute the targets module declares as read (SGLang's check's,
        auto-share's, the mapping) has a digest part on the installed release."""
        missing = set(targets.pool_attributes_read()) - _digested_attributes()
        self.assertEqual(missing, set())

    def test_attributes_the_snapshots_touch_are_digested(self) -> None:
        """Reading a real pair as the guard does (snapshot, change token, auto-share's
        rule and remedy) touches only digested attributes and methods of the pool."""
        seen: set[str] = set()
        target, draft = build_pair(PoolSpec(), PoolSpec(), mapping="clone")
        target, draft = _recording(target, seen), _recording(draft, seen)
        snapshot_pair(target, draft, npu_gate=False)
        change_token(target)
        check_pools(target, draft, autoshare=True)
        self.assertIn("swa_size", seen)  # auto-share's read is among them
        covered = _digested_attributes() | {targets.POOL_REGISTER}
        self.assertEqual(seen - covered, set())


if __name__ == "__main__":
    unittest.main()
