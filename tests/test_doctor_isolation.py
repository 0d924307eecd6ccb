"""``sglang-dsv4-guard doctor`` isolates guard plug-ins that fail at import, BaseExceptions
included, and reports them instead of dying with their output."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

from helpers import GuardTestCase, fresh_python
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=43, suite="stage-a-test-cpu")

DOCTOR = "from sglang_dsv4_guard.cli import main; raise SystemExit(main(['doctor']))"

# A plug-in module that parses the command line at import, as a careless one does.
ARGPARSE_PLUGIN = '''
import argparse
parser = argparse.ArgumentParser(prog="acme-argparse-plugin")
parser.add_argument("--acme-level", required=True)
parser.parse_args()
'''


def _site_with_plugin(directory: str) -> str:
    """A site directory holding the plug-in module and a dist-info whose entry point puts
    it in the guard's group, so importlib.metadata finds it as a third-party plug-in."""
    site = Path(directory)
    (site / "acme_argparse_plugin.py").write_text(ARGPARSE_PLUGIN)
    dist = site / "acme_argparse_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-argparse-plugin\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text("[sglang_dsv4_guard]\nacme_argparse = "
                                           "acme_argparse_plugin\n")
    return str(site)


class TestDoctorIsolatesPlugins(GuardTestCase):
    """doctor keeps running when a plug-in raises SystemExit at import."""

    def test_doctor_reports_a_plugin_that_calls_argparse_at_import(self) -> None:
        """The plug-in's usage error is not printed as doctor's own and does not end doctor:
        doctor names the plug-in and SystemExit, prints its verdict and exits 1."""
        with tempfile.TemporaryDirectory() as tmp:
            done = fresh_python(DOCTOR, path_first=_site_with_plugin(tmp))
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr[-2000:])
        self.assertNotIn("usage: acme-argparse-plugin", done.stderr)
        self.assertNotIn("usage: acme-argparse-plugin", done.stdout)
        problems = [line for line in done.stdout.splitlines() if line.startswith("problem:")]
        self.assertTrue(any("acme_argparse" in line and "SystemExit" in line
                            for line in problems), done.stdout)
        self.assertIn("the following arguments are required: --acme-level", done.stdout)
        self.assertEqual(done.stdout.splitlines()[-1], "doctor: problems found")


class TestDoctorWithStubModules(GuardTestCase):
    """doctor never crashes on what another import put in sys.modules."""

    def test_doctor_with_a_spec_less_mori_module(self) -> None:
        """A ``mori`` module without a spec in ``sys.modules`` (a stub, an injected module)
        made ``find_spec`` raise ValueError inside doctor; it is reported as installed."""
        import contextlib
        import io

        import mori_stub

        from sglang_dsv4_guard.cli import main

        mori_stub.install_stub()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["doctor"])
        self.assertIn("MORI installed", out.getvalue())
        self.assertEqual(out.getvalue().splitlines()[-1], "doctor: OK", out.getvalue())
        self.assertEqual(code, 0)


if __name__ == "__main__":
    unittest.main()
