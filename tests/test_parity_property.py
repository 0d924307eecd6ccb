"""Property: on every drawn target/draft pair the guard agrees with unwrapped SGLang.

Agreement means: the guarded call succeeds exactly when SGLang's does, with equal
``kv_args``; on failure the same exception type and the same first line; the pools
are not changed; and the guard's own prediction matches SGLang (no ``DSV4G099``).
"""

from __future__ import annotations

import unittest
from typing import Any

import sglang.srt.disaggregation.utils as utils
from helpers import UNWRAPPED, GuardTestCase, outcome
from hypothesis import given
from hypothesis import strategies as st
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.testing import MAPPING_KINDS, PoolSpec, build_pair, record

register_cpu_ci(est_time=44, suite="stage-a-test-cpu")

ratios = st.lists(st.sampled_from([0, 0, 4, 128]), min_size=0, max_size=3).map(tuple)
DROPPABLE = ("compression_ratios", "_unified_kv", "page_size", "sliding_window",
             "unified_swa_ring_size", "unified_swa_pages", "swa_req_ring_size")


@st.composite
def pool_specs(draw: Any, role: str) -> PoolSpec:
    return PoolSpec(
        compression_ratios=draw(ratios),
        unified=draw(st.booleans()),
        page_size=draw(st.sampled_from([64, 256])),
        sliding_window=draw(st.sampled_from([64, 128])),
        ring=(draw(st.sampled_from([64, 128])), draw(st.sampled_from([130, 131])),
              draw(st.sampled_from([2, 3]))),
        request_capacity=draw(st.sampled_from([None, 128, 256])) if role == "target" else None,
        swa_req_ring_size=draw(st.sampled_from([None, 128, 256])) if role == "draft" else None,
    )


@st.composite
def pairs(draw: Any) -> tuple[Any, Any]:
    target = draw(pool_specs("target"))
    draft = draw(pool_specs("draft"))
    pair = build_pair(target, draft, mapping=draw(st.sampled_from(MAPPING_KINDS)),
                      target_mapping=draw(st.sampled_from(["tensor", "tensor", "none",
                                                           "missing"])))
    drop = draw(st.sampled_from([None, None, None, *DROPPABLE]))
    if drop is not None:
        victim = pair[draw(st.integers(0, 1))]
        if drop in vars(victim):
            delattr(victim, drop)
    return pair


def _state(pool: Any) -> dict[str, int]:
    return {name: id(value) for name, value in vars(pool).items()}


class TestParity(GuardTestCase):
    """Guarded and unguarded SGLang agree on every configuration hypothesis draws.

    The guard is installed once per test, not per example: every example calls the
    installed wrapper (install and uninstall have their own tests), which keeps 2,000
    examples affordable on every release."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on")
        self.recorder = record()


    @given(pair=pairs())
    def test_guard_agrees_with_sglang(self, pair: tuple[Any, Any]) -> None:
        """Same success, same kv_args, same error type and first line, pools untouched."""
        before = [_state(p) for p in pair]
        expected = outcome(UNWRAPPED, *pair)
        seen = len(self.recorder.reports)
        actual = outcome(utils.setup_state_kv_args, *pair)
        codes = [code for r in self.recorder.reports[seen:] for code in r.codes]
        self.assertEqual([_state(p) for p in pair], before)
        self.assertEqual(actual[0], expected[0])
        if expected[0] == "ok":
            self.assertEqual(actual[1], expected[1])
        else:
            host, guarded = expected[1], actual[1]
            self.assertIsInstance(guarded, type(host))
            self.assertEqual(str(guarded).splitlines()[0], str(host).splitlines()[0])
            self.assertEqual(type(getattr(guarded, "host_error", guarded)), type(host))
        self.assertNotIn("DSV4G099", codes)
        self.assertNotIn("DSV4G090", codes)


if __name__ == "__main__":
    unittest.main()
