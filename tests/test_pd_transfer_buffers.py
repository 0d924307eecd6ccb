"""``check`` predicts prefill and decode registering different numbers of metadata buffers
(DSV4G045), counted by SGLang's own ``MetadataBuffers``, as each release builds them."""

from __future__ import annotations

import os
import unittest
from typing import Any

from check_helpers import GPT_OSS, check_json, server
from helpers import GuardTestCase, sglang_release
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host.flags import flag_for_field
from sglang_dsv4_guard.launch.parse import offline_env
from sglang_dsv4_guard.pd.buffers import aux_buffer_count, peer_count_log

register_cpu_ci(est_time=90, suite="stage-a-test-cpu")

RELEASE = sglang_release()
READS_MASK = Version("0.5.20") <= RELEASE  # SGLANG_ENABLE_DISAGG_SAMPLING_MASK
HAS_CHECKSUM = flag_for_field("disaggregation_enable_kv_checksum") is not None  # 0.5.21+
LOGS = Version("0.5.23") <= RELEASE  # check_peer_aux_buffer_count
SHORTER_LIST = Version("0.5.23") <= RELEASE  # send_aux stops at the shorter buffer list
MASK = "SGLANG_ENABLE_DISAGG_SAMPLING_MASK"


def g045(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == "DSV4G045"]


def _pair(prefill_extra: str = "", decode_extra: str = "", *more: str,
          backend: str = "mooncake") -> dict[str, Any]:
    _, doc = check_json(server("prefill", GPT_OSS, prefill_extra, backend=backend),
                        server("decode", GPT_OSS, decode_extra, backend=backend), *more)
    return doc


class TestMetadataBufferCount(GuardTestCase):
    """The sampling-mask variable and the KV checksum flag on one server only."""

    def _checksum_on(self, role: str, backend: str = "mooncake") -> list[dict[str, Any]]:
        """DSV4G045 with the KV checksum flag on ``role`` only: one finding, a warning on
        0.5.23 (the transfer stops at the shorter list), an error before (checked by the
        caller); none on a release without the flag (0.5.21's)."""
        if not HAS_CHECKSUM:
            self.assertLess(RELEASE, Version("0.5.21"))
            return []
        flag = "--disaggregation-enable-kv-checksum"
        found = g045(_pair(*((flag, "") if role == "prefill" else ("", flag)), backend=backend))
        self.assertEqual(len(found), 1)
        self.assertEqual(found[0]["severity"], "warning" if SHORTER_LIST else "error")
        return [] if SHORTER_LIST else found

    def test_sampling_mask_on_the_prefill_only(self) -> None:
        """The variable on the prefill only: an error from 0.5.20 (its buffers sit in the
        middle of the list), logged from 0.5.23 with SGLang's own line, silent before;
        nothing on releases that do not read it."""
        found = g045(_pair("", "", "--prefill-env", f"{MASK}=1"))
        if not READS_MASK:
            self.assertEqual(found, [])
            return
        self.assertEqual([f["severity"] for f in found], ["error"])
        values = {(o["role"], o["name"]): o["value"] for o in found[0]["observations"]}
        self.assertGreater(values[("prefill", "aux_buffer_count")],
                           values[("decode", "aux_buffer_count")])
        if LOGS:
            self.assertIn("metadata buffers but this prefill has", found[0]["host_message"])
            self.assertIn("SGLang logs an error", found[0]["when"])
        else:
            self.assertIsNone(found[0]["host_message"])
            self.assertIn("no error, no log line", found[0]["when"])

    def test_same_environment_is_accepted(self) -> None:
        """Near miss: the variable on both servers is no DSV4G045."""
        self.assertEqual(g045(_pair("", "", "--prefill-env", f"{MASK}=1",
                                    "--decode-env", f"{MASK}=1")), [])

    def test_checksum_on_the_prefill_only_is_a_warning(self) -> None:
        """--disaggregation-enable-kv-checksum on the prefill only, on Mooncake: a warning on
        every release with the flag (its buffer is last: the decode's buffers are all
        filled), whose ``when:`` says the transfers stay correct; no such flag before
        0.5.21."""
        if not HAS_CHECKSUM:
            self.assertLess(RELEASE, Version("0.5.21"))  # the flag is 0.5.21's
            return
        found = g045(_pair("--disaggregation-enable-kv-checksum", ""))
        self.assertEqual([f["severity"] for f in found], ["warning"])
        self.assertIn("warning, not an error", found[0]["details"][0])
        self.assertNotIn("misaligned", found[0]["when"])
        self.assertIn("correct", found[0]["when"])

    def test_checksum_on_the_decode_only_kills_the_mooncake_worker(self) -> None:
        """The checksum on the decode only, on Mooncake: 0.5.21 and 0.5.22's ``send_aux``
        loops over the decode's buffers and raises IndexError in the prefill's transfer
        worker (an error, per request: the worker dies); 0.5.23 stops at the shorter list
        (a warning whose ``when:`` is one statement: logged, transfers correct)."""
        for f in self._checksum_on("decode"):
            self.assertIn("Transfer thread failed", f["when"])
            self.assertIn("IndexError", " ".join(f["details"]))
        if SHORTER_LIST:
            when = g045(_pair("", "--disaggregation-enable-kv-checksum"))[0]["when"]
            self.assertNotIn("misaligned", when)
            self.assertIn("SGLang logs an error", when)

    def test_checksum_on_the_decode_only_fails_each_nixl_request(self) -> None:
        """The same on NIXL: before 0.5.23 its ``send_aux`` raises IndexError, which its
        transfer worker catches: each request fails (an error, per request)."""
        for f in self._checksum_on("decode", "nixl"):
            self.assertIn("per request, in the prefill's nixl transfer: each request fails",
                          f["when"])

    def test_checksum_on_the_prefill_only_breaks_the_mori_decode_before_0_5_23(self) -> None:
        """The checksum on the prefill only, on MORI: its TCP path sends every prefill
        buffer with its index, and before 0.5.23 the decode's real codec raises for the
        checksum's index (an error, per request, in the decode's receiving thread); 0.5.23
        sends the shorter list (a warning)."""
        for f in self._checksum_on("prefill", "mori"):
            self.assertIn("decode's mori thread", f["when"])
            self.assertIn("IndexError", f["host_message"])

    def test_sampling_mask_on_the_decode_only_kills_the_mooncake_worker(self) -> None:
        """The variable on the decode only, on Mooncake: an error on every release that
        reads it; before 0.5.23 found per request (the prefill's worker raises IndexError
        and dies), on 0.5.23 logged at registration (misaligned buffers)."""
        found = g045(_pair("", "", "--decode-env", f"{MASK}=1"))
        if not READS_MASK:
            self.assertEqual(found, [])
            return
        self.assertEqual([f["severity"] for f in found], ["error"])
        if SHORTER_LIST:
            self.assertIn("misaligned", found[0]["when"])
        else:
            self.assertIn("Transfer thread failed", found[0]["when"])

    def test_the_fixed_lines_pass_check(self) -> None:
        """``check --fix`` with the variable on the prefill only: an environment edit,
        proven, and the corrected pair has no DSV4G045."""
        doc = _pair("", "", "--prefill-env", f"{MASK}=1", "--fix")
        if not READS_MASK:
            self.assertEqual(g045(doc), [])
            return
        fixes = g045(doc)[0]["fixes"]
        self.assertTrue(fixes and all(f["proven"] for f in fixes))
        self.assertTrue(fixes[0]["edits"][0]["env"])
        self.assertEqual([f["code"] for f in doc["fixed_check"]["findings"]
                          if f["code"] == "DSV4G045"], [])


class TestMetadataBufferParity(GuardTestCase):
    """check's verdict equals SGLang's own ``check_peer_aux_buffer_count`` (0.5.23)."""

    def test_real_check_logs_exactly_when_counts_differ(self) -> None:
        """For each setting on each side, SGLang's real check, run on a half-built manager
        with the counts of SGLang's real buffers, logs iff check reports DSV4G045."""
        for prefill_env, decode_env in (({}, {}), ({MASK: "1"}, {}), ({MASK: "1"}, {MASK: "1"})):
            with offline_env(prefill_env):
                local = aux_buffer_count(False, None)
            with offline_env(decode_env):
                remote = aux_buffer_count(False, None)
            more = [*(["--prefill-env", f"{MASK}=1"] if prefill_env else []),
                    *(["--decode-env", f"{MASK}=1"] if decode_env else [])]
            reported = bool(g045(_pair("", "", *more)))
            self.assertEqual(reported, local != remote)
            if LOGS:
                self.assertEqual(peer_count_log(local, remote) is not None, reported)
            else:
                with self.assertRaises(AttributeError):
                    peer_count_log(local, remote)
        self.assertNotIn(MASK, os.environ)


if __name__ == "__main__":
    unittest.main()
