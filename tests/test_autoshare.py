"""Auto-share on SGLang's real pool class and setup_state_kv_args: only when provably safe."""

from __future__ import annotations

import contextlib
import logging
import types
import unittest
from collections.abc import Iterator
from typing import Any

import sglang.srt.disaggregation.utils as utils
from helpers import UNWRAPPED, GuardTestCase, guard_logs_off, outcome
from hypothesis import given
from sglang.test.ci.ci_register import register_cpu_ci
from test_parity_property import pairs

from sglang_dsv4_guard import DSV4GuardError, Severity
from sglang_dsv4_guard.testing import PoolSpec, build_pair, record

register_cpu_ci(est_time=50, suite="stage-a-test-cpu")

_ABSENT = object()  # a pool without a ``full_to_swa_index_mapping`` attribute


@contextlib.contextmanager
def cuda_graphs(disabled: bool | None, legacy: bool | None = None) -> Iterator[None]:
    """SGLang's own runtime context as a scheduler publishes it: a resolved
    ``cuda_graph_config`` whose phases are all ``disabled`` (or decode ``full``), and the
    legacy ``disable_cuda_graph`` (``legacy``, by default the same as ``disabled``);
    ``None`` publishes nothing (the value is then unknown to the guard)."""
    if disabled is None:
        yield
        return
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig
    from sglang.srt.runtime_context import get_context

    config = CudaGraphConfig(decode=PhaseConfig(backend="disabled" if disabled else "full"),
                             prefill=PhaseConfig(backend="disabled"))
    with get_context().override_server_args(
            disable_cuda_graph=disabled if legacy is None else legacy, cuda_graph_config=config):
        yield


def _mapping_line(exc: BaseException | None) -> bool:
    return exc is not None and str(exc).startswith(
        "DSV4 target and draft pools must share the SWA index mapping")


def _verdict(result: object) -> str:
    """SGLang's first line for a rejection, or ``accepted``."""
    if not isinstance(result, Exception):
        return "accepted"
    text = str(result)
    return text.splitlines()[0] if text else type(result).__name__


class TestAutoshareRule(GuardTestCase):
    """Each case of the rule, through the real function."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", autoshare=True, load_entry_points=False)
        self.recorder = record()

    def assert_copy_refused(self, target_spec: PoolSpec, draft_spec: PoolSpec, why: str,
                            disabled: bool = True, legacy: bool | None = None) -> None:
        """An equal copy between pools built from the specs is not shared (SGLang's
        mapping error, the draft keeps its tensor, no DSV4G007) and the report says ``why``."""
        target, draft = build_pair(target_spec, draft_spec, mapping="clone")
        before = draft.full_to_swa_index_mapping
        with cuda_graphs(disabled, legacy):
            _, err = outcome(utils.setup_state_kv_args, target, draft)
        self.assertTrue(_mapping_line(err), err)
        self.assertIs(draft.full_to_swa_index_mapping, before)
        self.assertNotIn("DSV4G007", err.report.codes)
        self.assertIn(why, " ".join(err.findings[0].details))

    def test_g007_view_is_shared(self) -> None:
        """Same storage (a view): shared at INFO, the call succeeds, the draft component is registered."""
        target, draft = build_pair(mapping="view")
        kind, kv = outcome(utils.setup_state_kv_args, target, draft)
        self.assertEqual(kind, "ok")
        self.assertIs(draft.full_to_swa_index_mapping, target.full_to_swa_index_mapping)
        self.assertEqual(len(kv["state_types"]), 2)
        [shared] = self.recorder.reports[0].findings
        self.assertEqual((shared.code, shared.severity), ("DSV4G007", Severity.INFO))

    def test_g007_equal_copy_shared_only_with_cuda_graphs_disabled(self) -> None:
        """Different storage, equal contents and geometry, SGLang's disable_cuda_graph True and
        no other holder of the draft's tensor: shared, with a WARNING finding and log line."""
        target, draft = build_pair(mapping="clone")
        with cuda_graphs(disabled=True), \
                self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
            kind, _ = outcome(utils.setup_state_kv_args, target, draft)
        self.assertEqual(kind, "ok")
        self.assertIs(draft.full_to_swa_index_mapping, target.full_to_swa_index_mapping)
        [shared] = self.recorder.reports[0].findings
        self.assertEqual((shared.code, shared.severity), ("DSV4G007", Severity.WARNING))
        self.assertIn("CUDA graphs are disabled (SGLang's cuda_graph_fully_disabled() is True",
                      shared.details[0])
        [line] = [r for r in logs.records
                  if r.getMessage().startswith("sglang-dsv4-guard auto-share: draft pool now "
                                               "uses the target pool's SWA index mapping")]
        self.assertEqual(line.levelno, logging.WARNING)
        self.assertIn("CUDA graphs are disabled", line.getMessage())

    def test_equal_copy_refused_when_cuda_graphs_may_hold_the_old_pointer(self) -> None:
        """CUDA graphs on, or SGLang's setting unreadable (nothing published): an equal copy
        is not shared, and DSV4G004 says a captured graph may hold the old pointer."""
        for disabled in (False, None):
            with self.subTest(disable_cuda_graph=disabled):
                target, draft = build_pair(mapping="clone")
                before = draft.full_to_swa_index_mapping
                with cuda_graphs(disabled):
                    _, err = outcome(utils.setup_state_kv_args, target, draft)
                self.assertTrue(_mapping_line(err), err)
                self.assertIs(draft.full_to_swa_index_mapping, before)
                self.assertNotIn("DSV4G007", err.report.codes)
                details = " ".join(err.findings[0].details)
                self.assertIn("auto-share would not help:", details)
                self.assertIn("a CUDA graph captured on the draft may hold its old tensor's "
                              "pointer", details)

    def test_equal_copy_refused_when_cuda_graph_config_reenables_graphs(self) -> None:
        """The deprecated disable_cuda_graph=True, but the resolved cuda_graph_config (what
        --cuda-graph-backend-decode / --cuda-graph-config set, and what SGLang obeys)
        captures decode graphs: SGLang's cuda_graph_fully_disabled() is False, so the equal
        copy is not shared and the report says why."""
        self.assert_copy_refused(PoolSpec(), PoolSpec(),
                                 "SGLang's cuda_graph_fully_disabled() is False",
                                 disabled=False, legacy=True)

    def test_equal_copy_refused_when_the_old_tensor_has_another_holder(self) -> None:
        """CUDA graphs off, but something else (here a stand-in for the draft's own allocator)
        holds the draft's tensor: not shared, and the report counts the other reference."""
        target, draft = build_pair(mapping="clone")
        allocator = types.SimpleNamespace(full_to_swa_index_mapping=draft.full_to_swa_index_mapping)
        with cuda_graphs(disabled=True):
            _, err = outcome(utils.setup_state_kv_args, target, draft)
        self.assertTrue(_mapping_line(err), err)
        self.assertIs(draft.full_to_swa_index_mapping, allocator.full_to_swa_index_mapping)
        self.assertIn("but 1 other reference(s) to the draft's tensor exist",
                      " ".join(err.findings[0].details))

    def test_equal_copy_refused_when_the_swa_capacity_differs(self) -> None:
        """CUDA graphs off and no other holder, but the draft's SWA pool is smaller than the
        target's (``swa_size``): the target's indices may not fit it, so the equal copy is
        not shared and the report says the SWA capacity differs."""
        self.assert_copy_refused(PoolSpec(swa_size=4096), PoolSpec(swa_size=1024),
                                 "the SWA capacity differs (swa_size: target=4096, draft=1024)")

    def test_equal_copy_refused_when_the_paged_geometry_differs(self) -> None:
        """CUDA graphs off, no other holder, equal SWA capacity, but the draft's sliding
        window differs from the target's (the release's paged geometry): sharing would not
        make the pools agree, so the equal copy is not shared and the report says so."""
        self.assert_copy_refused(PoolSpec(), PoolSpec(sliding_window=64),
                                 "the paged SWA geometry differs (target=")

    def test_differing_clone_is_refused(self) -> None:
        """Contents differ: not shared; the report names the first differing index."""
        target, draft = build_pair(mapping="different")
        before = draft.full_to_swa_index_mapping
        _, err = outcome(utils.setup_state_kv_args, target, draft)
        self.assertIsInstance(err, DSV4GuardError)
        self.assertIs(draft.full_to_swa_index_mapping, before)
        self.assertIn("first at index 3 (target=3, draft=-7)", str(err))

    def test_none_on_either_side_is_refused(self) -> None:
        """A missing mapping on either side is never filled in."""
        for pair in (build_pair(mapping="none"), build_pair(target_mapping="none",
                                                             mapping="clone")):
            _, err = outcome(utils.setup_state_kv_args, *pair)
            self.assertTrue(_mapping_line(err))
            self.assertIn("auto-share would not help", str(err))

    def test_unified_not_attempted(self) -> None:
        """Unified-KV pools are never touched."""
        target, draft = build_pair(PoolSpec(unified=True), PoolSpec(unified=True),
                                   mapping="clone")
        before = draft.full_to_swa_index_mapping
        self.assertEqual(outcome(utils.setup_state_kv_args, target, draft)[0], "ok")
        self.assertIs(draft.full_to_swa_index_mapping, before)

    def test_fix_line_offers_autoshare_only_when_it_would_share(self) -> None:
        """With auto-share off, DSV4G004 offers the variable for a view, not for a differing copy."""
        self.install_guard("on", autoshare=False, load_entry_points=False)
        _, view = outcome(utils.setup_state_kv_args, *build_pair(mapping="view"))
        _, diff = outcome(utils.setup_state_kv_args, *build_pair(mapping="different"))
        def env_edits(err: Any) -> list[tuple[str, str | None]]:
            return [(e.name, e.value) for f in err.findings[0].fixes for e in f.edits if e.env]

        self.assertEqual(env_edits(view), [("SGLANG_DSV4_GUARD_AUTOSHARE", "1")])
        self.assertEqual(env_edits(diff), [])


class TestAutoshareHidesNothing(GuardTestCase):
    """Auto-share changes only the mapping check's outcome (installed once per test;
    every example builds its own pair)."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", autoshare=True, load_entry_points=False)


    @given(pair=pairs())
    def test_other_rejections_unchanged(self, pair: tuple[Any, Any]) -> None:
        """On every drawn pair, auto-share changes nothing but SGLang's mapping rejection:
        a pair SGLang accepts or rejects for another reason gets SGLang's own outcome and
        first line; one SGLang rejects for the mapping gets SGLang's verdict on the pools
        as auto-share left them (the next check's, once shared); and a mapping rejection
        appears only where SGLang gave one. Pools SGLang accepts keep their own mappings:
        auto-share rebinds nothing SGLang did not reject."""
        kind, host = outcome(UNWRAPPED, *pair)
        mappings = [getattr(pool, "full_to_swa_index_mapping", _ABSENT) for pool in pair]
        with guard_logs_off():
            _, guarded = outcome(utils.setup_state_kv_args, *pair)
        if kind == "ok":
            for pool, mapping in zip(pair, mappings, strict=True):
                self.assertIs(getattr(pool, "full_to_swa_index_mapping", _ABSENT), mapping)
        _, after = outcome(UNWRAPPED, *pair)  # SGLang on the pools as the guard left them
        expected = _verdict(after) if _mapping_line(host) else _verdict(host)
        self.assertEqual(_verdict(guarded), expected)
        self.assertLessEqual(_mapping_line(guarded), _mapping_line(host))


if __name__ == "__main__":
    unittest.main()
