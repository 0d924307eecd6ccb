"""A runtime fix quotes what this server runs as SGLang resolved it, never the raw typed
value: 0.5.23's ``runtime_context.get_server_args()`` is the operator's raw input (SGLang's
own retired-accessor message says so), while the pools are built from the resolved values
(``get_schedule().page_size``: 256 for DeepSeek-V4 whatever ``--page-size`` says).

SGLang's parser, ``ServerArgs.from_cli_args`` and its scheduler publish shim publish the
arguments as a scheduler does; pools by ``build_pair``; SGLang's real
``setup_state_kv_args`` under the installed guard."""

from __future__ import annotations

import argparse
import unittest
from pathlib import Path
from typing import Any

import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, checks_request_rows, guard_logs_off, outcome
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.testing import PoolSpec, build_pair

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

_DSV4 = Path(__file__).parent / "data" / "deepseek_v4"


def _publish(*extra: str) -> None:
    """Publish SGLang's ServerArgs for a DeepSeek-V4 launch with ``extra`` flags."""
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", str(_DSV4), "--device", "cpu", *extra])
    set_global_server_args_for_scheduler(ServerArgs.from_cli_args(args))


def _resolved_page_size() -> int:
    """The page size SGLang resolved for the published launch: its schedule bag where the
    release has one (0.5.23), else the published ServerArgs (resolved in place before)."""
    import sglang.srt.runtime_context as context

    bag = getattr(context, "get_schedule", None)
    return int(bag().page_size if bag is not None else context.get_server_args().page_size)


class TestQuotedServerValues(GuardTestCase):
    """The "(this server runs ...)" part of a runtime fix."""

    def setUp(self) -> None:
        super().setUp()
        from sglang.srt.runtime_context import reset_context

        self.addCleanup(reset_context)

    def fix_texts(self, target: PoolSpec, draft: PoolSpec, field: str) -> list[str]:
        self.install_guard("on", load_entry_points=False)
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args, *build_pair(target, draft))
        self.assertIsInstance(err, DSV4GuardError)
        finding: Any = next(f for f in err.findings if f.code == "DSV4G005")
        return [f.text for f in finding.fixes if f.field == field]

    def test_page_size_quoted_as_resolved(self) -> None:
        """A server launched with --page-size 128 runs DeepSeek-V4 at page size 256 (SGLang's
        resolution): the page-size fix never says it runs --page-size 128."""
        with guard_logs_off():
            _publish("--page-size", "128")
        self.assertEqual(_resolved_page_size(), 256)  # the premise: SGLang resolved 256
        texts = self.fix_texts(PoolSpec(), PoolSpec(page_size=64), "page_size")
        self.assertTrue(texts)
        self.assertFalse([t for t in texts if "--page-size 128" in t], texts)

    def test_switch_that_is_off_not_quoted_as_a_value(self) -> None:
        """A store-true flag the server does not run is never quoted as "--flag False"."""
        if not checks_request_rows():  # before 0.5.23 SGLang compares no request rows
            return
        with guard_logs_off():
            _publish()
        texts = self.fix_texts(PoolSpec(request_capacity=256), PoolSpec(), "request rows")
        self.assertTrue(texts)
        self.assertFalse([t for t in texts if " False)" in t], texts)


if __name__ == "__main__":
    unittest.main()
