"""The request rows (0.5.23): SGLang's own ``RequestWindow`` rounds the target's capacity up
to whole SWA pages, exactly as ``get_draft_swa_ring_size`` rounds the draft's ring, so the
runtime report must not blame the rounding nor offer a draft-token count to fix it.

Real-constructor pools (``build_pair``) and SGLang's real ``setup_state_kv_args`` under the
installed guard; the premise (SGLang's ``RequestWindow`` rounds) is checked on the installed
SGLang in each test, with its own class."""

from __future__ import annotations

import importlib
import unittest
from typing import Any

import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, checks_request_rows, guard_logs_off, outcome
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.samples import _Buffers
from sglang_dsv4_guard.testing import PoolSpec, build_pair

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

_WINDOW, _DRAFT_TOKENS, _PAGE = 128, 3, 256


def _sglang_window_capacity() -> int:
    """The capacity SGLang's own RequestWindow keeps for sliding_window + D rows."""
    module = importlib.import_module("sglang.srt.mem_cache.dsv41_request_window")
    window = module.RequestWindow(lambda size, layers: _Buffers(_PAGE, 4, layers),
                                  num_slots=2, layers=1, page_size=_PAGE,
                                  capacity=_WINDOW + _DRAFT_TOKENS)
    return int(window.capacity)


class TestRequestRowsRounding(GuardTestCase):
    """DSV4G005's request rows on 0.5.23, against SGLang's own rounding."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)

    def request_rows_finding(self) -> Any:
        """DSV4G005 for a target window of sliding_window + D rows left unrounded (131, as
        a plug-in building its own window might) and the draft ring SGLang computes for
        the same D (256)."""
        target, draft = build_pair(PoolSpec(request_capacity=_PAGE),
                                   PoolSpec(swa_req_ring_size=_PAGE))
        target.request_window.capacity = _WINDOW + _DRAFT_TOKENS  # not SGLang's rounding
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args, target, draft)
        self.assertIsInstance(err, DSV4GuardError)
        return next(f for f in err.findings if f.code == "DSV4G005")

    def test_one_servers_pools_agree(self) -> None:
        """A window asked for sliding_window + D rows and the draft ring SGLang's
        get_draft_swa_ring_size gives for the same D are equal once the window rounds as
        SGLang's RequestWindow does: SGLang accepts the pair and the guard reports nothing."""
        if not checks_request_rows():  # before 0.5.23 SGLang compares no request rows
            return
        pool = importlib.import_module("sglang.srt.mem_cache.deepseek_v4_memory_pool")
        ring = pool.get_draft_swa_ring_size(_WINDOW, _DRAFT_TOKENS, _PAGE)
        self.assertEqual(_sglang_window_capacity(), ring)  # the premise, on SGLang's code
        pair = build_pair(PoolSpec(request_capacity=_WINDOW + _DRAFT_TOKENS),
                          PoolSpec(swa_req_ring_size=ring))
        with guard_logs_off():
            self.assertEqual(outcome(utils.setup_state_kv_args, *pair)[0], "ok")

    def test_no_draft_token_edit_for_a_window_sglang_rounds(self) -> None:
        """SGLang's RequestWindow rounds sliding_window + D up to whole SWA pages (131 ->
        256), as the draft ring is rounded: a 131-row window was not built by SGLang, and
        no draft-token count changes the comparison, so no flag edit is offered for it."""
        if not checks_request_rows():  # before 0.5.23 SGLang compares no request rows
            return
        self.assertEqual(_sglang_window_capacity(), _PAGE)  # the premise, on SGLang's class
        finding = self.request_rows_finding()
        edits = [e.describe() for f in finding.fixes if f.field == "request rows"
                 for e in f.edits]
        self.assertEqual(edits, [])

    def test_target_source_names_sglangs_rounding(self) -> None:
        """The target's request-rows from: line says what SGLang's RequestWindow does: the
        capacity is sliding_window + D rounded up to whole SWA pages."""
        if not checks_request_rows():  # before 0.5.23 SGLang compares no request rows
            return
        self.assertEqual(_sglang_window_capacity(), _PAGE)  # the premise, on SGLang's class
        finding = self.request_rows_finding()
        [source] = [o.source for o in finding.observations
                    if (o.role, o.name) == ("target pool", "request_window.capacity")]
        self.assertIn("page", source)


if __name__ == "__main__":
    unittest.main()
