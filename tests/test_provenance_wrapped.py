"""Who registered a pool's mapping, when another plug-in wraps ``register_mapping`` too.

A third-party wrapper installed after the guard (well behaved: ``functools.wraps``, the
caller's arguments passed on) sits between the registering code and the guard's observer.
The ``from:`` line must still name the code that called ``register_mapping``, not the
wrapper. SGLang's real class and ``setup_state_kv_args``, pools by ``build_pair``."""

from __future__ import annotations

import functools
import unittest
from typing import Any

import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, guard_logs_off, outcome
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.testing import build_pair

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")


class TestWrappedRegisterMapping(GuardTestCase):
    """The guard's register_mapping observer under another plug-in's wrapper."""

    def wrap_register_mapping(self) -> None:
        """Another plug-in wraps the pool class' register_mapping as it now stands
        (``functools.wraps``, arguments passed on); undone when the test ends."""
        from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

        observed = DeepSeekV4TokenToKVPool.register_mapping

        @functools.wraps(observed)
        def other_plugins_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            return observed(self, *args, **kwargs)

        DeepSeekV4TokenToKVPool.register_mapping = other_plugins_wrapper
        self.addCleanup(setattr, DeepSeekV4TokenToKVPool, "register_mapping", observed)

    def assert_draft_source_names_build_pair(self) -> None:
        with guard_logs_off():
            _, err = outcome(utils.setup_state_kv_args, *build_pair(mapping="clone"))
        self.assertIsInstance(err, DSV4GuardError)
        finding: Any = next(f for f in err.findings if f.code == "DSV4G004")
        [source] = [o.source for o in finding.observations if o.role == "draft pool"]
        self.assertNotIn("other_plugins_wrapper", source)
        self.assertIn("build_pair", source)

    def test_wrapper_is_not_named_as_the_registrar(self) -> None:
        """The draft's from: line names build_pair (which called register_mapping), never
        the other plug-in's wrapper it went through."""
        self.install_guard("on", load_entry_points=False)
        self.wrap_register_mapping()
        self.assert_draft_source_names_build_pair()

    def test_reinstall_under_a_wrapper_names_the_registrar(self) -> None:
        """Guard, another plug-in's wrapper, uninstall (which leaves that wrapper, and ours
        inside it, in place), install again: the observer now sits in the chain twice, and
        the from: line still names build_pair, never the wrapper between the two."""
        from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

        import sglang_dsv4_guard

        stock = DeepSeekV4TokenToKVPool.register_mapping  # put back last: no wrapper left
        self.addCleanup(setattr, DeepSeekV4TokenToKVPool, "register_mapping", stock)
        self.install_guard("on", load_entry_points=False)
        self.wrap_register_mapping()
        sglang_dsv4_guard.uninstall()
        self.install_guard("on", load_entry_points=False)
        self.assert_draft_source_names_build_pair()


if __name__ == "__main__":
    unittest.main()
