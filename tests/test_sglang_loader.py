"""SGLang's real ``load_plugins()`` in a fresh interpreter, with our entry point visible."""

from __future__ import annotations

import json
import unittest

from helpers import GuardTestCase, fresh_python
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=93, suite="stage-a-test-cpu")

PROBE = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import sglang.srt.disaggregation.utils as utils
keep = {"original": utils.setup_state_kv_args}  # a module global would be rebound too
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.disaggregation.prefill as prefill
import sglang_dsv4_guard
print(json.dumps({
    "untouched": utils.setup_state_kv_args is keep["original"],
    "prefill_bound": prefill.setup_state_kv_args is utils.setup_state_kv_args,
    "installed": sglang_dsv4_guard.is_installed(),
    "mori_imported": "sglang.srt.disaggregation.mori.conn" in sys.modules or "mori" in sys.modules,
}))
"""


def run_probe(**env: str) -> tuple[dict[str, bool], str]:
    """Run PROBE with only the given guard/SGLang variables set; return its JSON and stderr."""
    done = fresh_python(PROBE, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


class TestLoadPlugins(GuardTestCase):
    """The entry point ``dsv4_guard`` in group ``sglang.srt.plugins``, run by SGLang itself."""

    def test_inert_without_variable(self) -> None:
        """Unset: SGLang's loader runs our entry point and the function stays the original."""
        result, _ = run_probe()
        self.assertEqual(result["untouched"], True)
        self.assertEqual(result["installed"], False)

    def test_installed_with_variable(self) -> None:
        """SGLANG_DSV4_GUARD=1: installed, one INFO line, MORI never imported by us."""
        result, stderr = run_probe(SGLANG_DSV4_GUARD="1")
        self.assertEqual(result, {"untouched": False, "prefill_bound": True, "installed": True,
                                  "mori_imported": False})
        self.assertIn("sglang-dsv4-guard installed: mode=on", stderr)
        self.assertNotIn("Traceback", stderr)

    def test_sglang_plugins_allow_list(self) -> None:
        """SGLANG_PLUGINS that does not name dsv4_guard keeps the guard out; naming it lets it in."""
        excluded, _ = run_probe(SGLANG_DSV4_GUARD="1", SGLANG_PLUGINS="someone_else")
        self.assertEqual(excluded["installed"], False)
        included, _ = run_probe(SGLANG_DSV4_GUARD="strict", SGLANG_PLUGINS="dsv4_guard")
        self.assertEqual(included["installed"], True)

    def test_garbage_value_warns_and_stays_inert(self) -> None:
        """A value outside the accepted set is named in one warning; the guard stays inert."""
        result, stderr = run_probe(SGLANG_DSV4_GUARD="yes please")
        self.assertEqual(result["untouched"], True)
        self.assertIn("SGLANG_DSV4_GUARD must be one of", stderr)
        self.assertIn("'yes please'", stderr)
        self.assertEqual(stderr.count("SGLANG_DSV4_GUARD must be one of"), 1)


if __name__ == "__main__":
    unittest.main()
