"""Release by release: the guard follows what the installed SGLang does, not the newest.

``make test`` runs this whole suite once per release in ``matrix.txt``. The facts each
test expects come from the releases' sources (``helpers``), not from ``releases.py``.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import unittest
from pathlib import Path
from unittest import mock

import mori_stub
import sglang
import sglang._version as sglang_version
import sglang.srt.disaggregation.utils as utils
from helpers import (
    UNWRAPPED,
    GuardTestCase,
    checks_request_rows,
    geometry_prefix,
    guard_logs_off,
    mapping_set_in_init,
    mori_send_parameters,
    outcome,
    raw_setup_state_kv_args,
    sglang_release,
    skips_draft_block_on_npu,
)
from packaging.version import Version
from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError
from sglang_dsv4_guard.cli import main
from sglang_dsv4_guard.host.releases import SUPPORTED_MAX, SUPPORTED_MIN, is_supported, profile_for
from sglang_dsv4_guard.testing import PoolSpec, build_pair, record, three_mismatch_pair

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

MATRIX_RELEASE = "DSV4_GUARD_MATRIX_RELEASE"


def _base_release() -> str:
    """The release matrix.txt installs in the venv itself: its line with "-" for overlay."""
    lines = Path(__file__).resolve().parent.parent.joinpath("matrix.txt").read_text()
    base = [words[0] for line in lines.splitlines()
            if (words := line.split("#", 1)[0].split()) and words[1:] == ["-"]]
    assert len(base) == 1, f"matrix.txt must name exactly one base release (got {base})"
    return base[0]


class TestInstalledRelease(GuardTestCase):
    """The process imports the release the matrix asked for, and the guard's table fits it."""

    def test_imported_release_is_the_one_asked_for(self) -> None:
        """Metadata, imported code and the matrix line agree (a wrong PYTHONPATH would make
        every release test the base one). Outside the matrix the release asked for is the
        base release of matrix.txt (its "-" line), never the imported one itself."""
        asked = os.environ.get(MATRIX_RELEASE)
        if asked is None:
            self.assertFalse(os.environ.get("CI"), f"CI runs the suite through tools/matrix.py, "
                             f"which sets {MATRIX_RELEASE}")
            asked = _base_release()
        self.assertEqual(sglang_release(), Version(asked))
        self.assertEqual(Version(sglang_version.__version__), Version(asked),
                         f"the imported sglang code ({sglang.__file__}) is not {asked}")
        dist = Path(sglang.__file__).resolve().parent.parent
        self.assertTrue((dist / f"sglang-{asked}.dist-info").is_dir(),
                        f"sglang imported from {dist}, which has no sglang-{asked}.dist-info")
        self.assertTrue(is_supported(sglang_release()))

    def test_profile_matches_installed_source(self) -> None:
        """Each field of the guard's profile for this release is what the installed source
        does: geometry message, NPU condition, mapping set in ``__init__``."""
        profile = profile_for(sglang_release())
        state_source = inspect.getsource(raw_setup_state_kv_args())
        self.assertIn(profile.paged_geometry_prefix.strip(), state_source)
        self.assertEqual(profile.npu_gate, "not is_npu()" in state_source)
        self.assertEqual(profile.npu_gate, skips_draft_block_on_npu())
        init_source = inspect.getsource(DeepSeekV4TokenToKVPool.__init__)
        self.assertEqual(profile.mapping_always_set,
                         "self.full_to_swa_index_mapping = None" in init_source)
        self.assertEqual(profile.mapping_always_set, mapping_set_in_init())
        self.assertEqual(len(profile.paged_geometry), 3 if checks_request_rows() else 2)


class TestReleaseBehaviour(GuardTestCase):
    """Through the real function: what differs between releases is predicted right."""

    def setUp(self) -> None:
        super().setUp()
        self.install_guard("on", load_entry_points=False)
        self.recorder = record()

    def test_g005_request_rows_follow_release(self) -> None:
        """A different draft SWA ring size: DSV4G005 from 0.5.23 on (its own first line);
        accepted, and nothing reported about it, before."""
        pair = build_pair(draft=PoolSpec(swa_req_ring_size=256))
        host = outcome(UNWRAPPED, *pair)
        guarded = outcome(utils.setup_state_kv_args, *pair)
        if checks_request_rows():
            self.assertEqual(host[0], "raised")
            self.assertTrue(str(host[1]).startswith(geometry_prefix()))
            self.assertIsInstance(guarded[1], DSV4GuardError)
            self.assertEqual(str(guarded[1]).splitlines()[0], str(host[1]))
            finding = guarded[1].findings[0]
            self.assertEqual(finding.code, "DSV4G005")
            self.assertEqual(finding.value("draft pool", "swa_req_ring_size"), 256)
            self.assertIsNone(finding.value("target pool", "request_window.capacity"))
        else:
            self.assertEqual(host[0], "ok")
            self.assertEqual(guarded, host)
            self.assertEqual(self.recorder.codes, [])

    def test_npu_condition_follows_release(self) -> None:
        """On NPU, 0.5.16-0.5.17 skip the draft block (both accept a mismatched pair, nothing
        is reported); later releases check it (both raise, with the full report)."""
        pair = three_mismatch_pair()
        with mock.patch.object(utils, "is_npu", return_value=True), \
                mock.patch.object(utils, "DSV4NPUTokenToKVPool", _OtherPool, create=True):
            host = outcome(UNWRAPPED, *pair)
            guarded = outcome(utils.setup_state_kv_args, *pair)
        if skips_draft_block_on_npu():
            self.assertEqual(host[0], "ok")
            self.assertEqual(guarded, host)
            self.assertEqual(self.recorder.reports, [])
        else:
            self.assertEqual(host[0], "raised")
            self.assertIsInstance(guarded[1], DSV4GuardError)
            self.assertEqual(str(guarded[1]).splitlines()[0], str(host[1]))
            self.assertEqual(self.recorder.codes, ["DSV4G001", "DSV4G004", "DSV4G005"])

    def test_mori_signature_follows_release(self) -> None:
        """The send method has this release's parameters; the wrapper binds them by name and
        reads the peer's TP and the state type right."""
        mori_stub.install_stub()
        import sglang.srt.disaggregation.mori.conn as conn

        send = conn.MoriKVManager._send_swa_dsa_state
        self.assertEqual(len(inspect.signature(send).parameters), mori_send_parameters())
        mgr = mori_stub.manager(conn, attn_tp=8)
        p = mori_stub.peer(conn, "decode-x", decode_tp=2)
        with guard_logs_off(), self.assertRaises(DSV4GuardError) as caught:
            send(mgr, *mori_stub.send_args(conn, p, "swa"))
        finding = caught.exception.findings[0]
        self.assertEqual(finding.code, "DSV4G006")
        self.assertEqual(finding.value("decode", "decode_tp_size"), 2)
        self.assertEqual(finding.value("prefill", "attn_tp_size"), 8)


class _OtherPool:
    """Stands in for the Ascend pool class, absent on CPU: no pool here is one."""


class TestVersionFlag(GuardTestCase):
    """``--version`` names the guard and the imported release (mismatched and unknown
    releases: tests/test_host.py)."""

    def test_version_flag_names_both(self) -> None:
        """``sglang-dsv4-guard --version``: the guard's version and the installed release."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["--version"])
        self.assertEqual(code, 0)
        self.assertEqual(out.getvalue().strip(),
                         f"sglang-dsv4-guard {sglang_dsv4_guard.__version__}; SGLang: "
                         f"{sglang_release()} (supported; range {SUPPORTED_MIN} to "
                         f"{SUPPORTED_MAX})")


if __name__ == "__main__":
    unittest.main()
