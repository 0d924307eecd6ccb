"""The docs' example plug-in is real: its own tests pass and it loads by entry point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from helpers import GuardTestCase, fresh_python
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=54, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "acme_guard_policy"

# Run in a fresh interpreter: SGLang's own loader, then SGLang's real function on a pair
# that SGLang accepts but the example policy flags.
PROBE = r"""
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.disaggregation.utils as utils
from sglang_dsv4_guard.testing import PoolSpec, build_pair, new_kv_args
utils.setup_state_kv_args(new_kv_args(), *build_pair(PoolSpec(unified=True),
                                                     PoolSpec(unified=True)))
print(json.dumps({"passed": True}))
"""


class TestExamplePlugin(GuardTestCase):
    """examples/acme_guard_policy, as a third party would ship it."""

    def test_docs_show_the_example_verbatim(self) -> None:
        """docs/plugins.md quotes the plug-in, its entry point and its test exactly as they are."""
        page = (ROOT / "docs" / "plugins.md").read_text()
        for name in ("acme_guard_policy.py", "test_acme_guard_policy.py"):
            self.assertIn((EXAMPLE / name).read_text(), page, name)
        self.assertIn('[project.entry-points.sglang_dsv4_guard]\nacme_policy = "acme_guard_policy"',
                      page)

    def test_example_tests_pass(self) -> None:
        """The example's own test, written with sglang_dsv4_guard.testing, passes."""
        done = fresh_python("import sys, unittest; sys.argv = ['x']; "
                            "unittest.main(module='test_acme_guard_policy')",
                            path_first=str(EXAMPLE))
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("Ran 2 tests", done.stderr)

    def test_loaded_through_a_real_entry_point(self) -> None:
        """Installed as a distribution with an entry point, SGLang's loader brings the guard
        up, the guard loads the plug-in, and its finding is in the real report."""
        with tempfile.TemporaryDirectory() as site, tempfile.TemporaryDirectory() as build:
            # Built from its own pyproject.toml, as its author would publish it.
            shutil.copytree(EXAMPLE, build, dirs_exist_ok=True)
            pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                                  "--no-build-isolation", "--disable-pip-version-check",
                                  "--target", site, build],
                                 capture_output=True, text=True, timeout=300, check=False)
            self.assertEqual(pip.returncode, 0, pip.stdout + pip.stderr)
            done = fresh_python(PROBE, env={"SGLANG_DSV4_GUARD": "1"}, path_first=site)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertEqual(json.loads(done.stdout.strip().splitlines()[-1]), {"passed": True})
        self.assertEqual(done.stderr.count("[ACME001] warning: the target pool does not use"), 1)
        self.assertEqual(done.stderr.count("[ACME001] warning: the draft pool does not use"), 1)
        self.assertIn("reported by plug-in: acme_policy", done.stderr)
        self.assertNotIn("DSV4G090", done.stderr)


if __name__ == "__main__":
    unittest.main()
