"""``check`` predicts prefill and decode registering different numbers of metadata buffers
(DSV4G045), counted by SGLang's own ``MetadataBuffers``, as each release builds them, and
buffers of different row widths (DSV4G048, ``--sampling-mask-max-tokens``), compared with
SGLang's own ``send_aux`` between the two servers' real buffers."""

from __future__ import annotations

import os
import unittest
from typing import Any

from check_helpers import GPT_OSS, check_json, server
from helpers import GuardTestCase, sglang_release
from packaging.version import Version
from pd_real import mooncake_mask_rows
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.offline.parse import offline_env
from sglang_dsv4_guard.host.flags import flag_for_field
from sglang_dsv4_guard.pd.buffers import (
    MAX_WIDTH,
    aux_buffer_count,
    aux_row_widths,
    peer_count_log,
)

register_cpu_ci(est_time=39, suite="stage-a-test-cpu")

RELEASE = sglang_release()
READS_MASK = Version("0.5.20") <= RELEASE  # SGLANG_ENABLE_DISAGG_SAMPLING_MASK
HAS_CHECKSUM = flag_for_field("disaggregation_enable_kv_checksum") is not None  # 0.5.21+
LOGS = Version("0.5.23") <= RELEASE  # check_peer_aux_buffer_count
SHORTER_LIST = Version("0.5.23") <= RELEASE  # send_aux stops at the shorter buffer list
MASK = "SGLANG_ENABLE_DISAGG_SAMPLING_MASK"
WIDTH_FLAG = flag_for_field("sampling_mask_max_tokens")  # 0.5.20+
BOTH_MASKED = ("--prefill-env", f"{MASK}=1", "--decode-env", f"{MASK}=1")


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



def g048(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == "DSV4G048"]


def _widths(prefill: int, decode: int, *more: str, backend: str = "mooncake",
            masked: bool = True) -> dict[str, Any]:
    return _pair(f"--sampling-mask-max-tokens {prefill}", f"--sampling-mask-max-tokens {decode}",
                 *(BOTH_MASKED if masked else ()), *more, backend=backend)


def _slots(finding: dict[str, Any], words: str) -> list[int]:
    """The request slots a finding's details name after ``words``."""
    text = " ".join(finding["details"])
    if words not in text:
        return []
    listed = text.split(words, 1)[1].split("]", 1)[0].split("[", 1)[1]
    return [int(x) for x in listed.split(",")]


class TestMetadataBufferRowWidths(GuardTestCase):
    """DSV4G048: --sampling-mask-max-tokens differs with the sampling mask on both servers
    (0.5.20+): as many buffers, rows of different widths. What check says is compared with
    SGLang's own MooncakeKVManager.send_aux between the two servers' real MetadataBuffers."""

    def _has_widths(self) -> bool:
        """Whether the release sizes the sampling-mask buffers with the flag (0.5.20+);
        before, the flag does not exist and the class reads an environment variable."""
        if WIDTH_FLAG is None:
            self.assertLess(RELEASE, Version("0.5.20"))
            with self.assertRaises(TypeError):
                aux_row_widths(False, 64)
            return False
        return True

    def test_wider_decode_on_mooncake_misplaces_rows(self) -> None:
        """Prefill 64, decode 128 on Mooncake: an error, silent; the slots check names are
        the ones SGLang's real send_aux leaves misplaced in the decode's real buffers."""
        if not self._has_widths():
            return
        with offline_env({MASK: "1"}):
            misplaced, outside = mooncake_mask_rows(64, 128)
        (found,) = g048(_widths(64, 128))
        self.assertEqual(found["severity"], "error")
        self.assertTrue(misplaced)
        self.assertEqual(_slots(found, "than the prefill's row for request slots "), misplaced)
        self.assertEqual(outside, [])
        self.assertIn("never reported", found["when"])
        self.assertIsNone(found["host_message"])  # SGLang compares nothing here

    def test_wider_prefill_on_mooncake_reaches_past_the_decode_buffer(self) -> None:
        """Prefill 128, decode 64: SGLang's real send_aux hands the engine copies past the
        decode's buffers; check names those slots."""
        if not self._has_widths():
            return
        with offline_env({MASK: "1"}):
            misplaced, outside = mooncake_mask_rows(128, 64)
        (found,) = g048(_widths(128, 64))
        self.assertEqual(found["severity"], "error")
        self.assertTrue(outside)
        self.assertIn(f"a request in slots {outside} reaches past the end",
                      " ".join(found["details"]))
        self.assertEqual(_slots(found, "than the prefill's row for request slots "), misplaced)

    def test_equal_widths_are_accepted(self) -> None:
        """Near miss: the same width on both servers; SGLang's send_aux misplaces nothing."""
        if not self._has_widths():
            return
        with offline_env({MASK: "1"}):
            self.assertEqual(mooncake_mask_rows(64, 64), ([], []))
        self.assertEqual(g048(_widths(64, 64)), [])

    def test_widths_without_the_mask_are_accepted(self) -> None:
        """Near miss: different widths with the sampling mask off on both servers: SGLang's
        MetadataBuffers builds no sampling-mask buffer, so every row width agrees."""
        if not self._has_widths():
            return
        self.assertEqual(aux_row_widths(False, 64), aux_row_widths(False, 128))
        self.assertEqual(g048(_widths(64, 128, masked=False)), [])

    def test_nixl_is_an_error_both_ways(self) -> None:
        """NIXL's send_aux writes at the prefill's stride too: an error either way."""
        if not self._has_widths():
            return
        for prefill, decode in ((64, 128), (128, 64)):
            self.assertEqual([f["severity"] for f in g048(_widths(prefill, decode,
                                                                   backend="nixl"))], ["error"])

    def test_mori_tcp_narrower_prefill_stays_correct(self) -> None:
        """MORI's default TCP path writes at the decode's stride: a narrower prefill is a
        warning (its rows land where the decode reads them), a wider one an error (its rows
        run into the next slot and past the buffer's end)."""
        if not self._has_widths():
            return
        (narrow,) = g048(_widths(64, 128, backend="mori"))
        self.assertEqual(narrow["severity"], "warning")
        self.assertIn("transfers stay correct", narrow["when"])
        (wide,) = g048(_widths(128, 64, backend="mori"))
        self.assertEqual(wide["severity"], "error")
        self.assertIn("past the end", " ".join(wide["details"]))

    def test_a_width_too_wide_to_build_is_not_judged(self) -> None:
        """A width wider than check builds (MAX_WIDTH) is an unknowns line when the widths
        differ with the mask on, never a guess; with the mask off SGLang's class sizes
        nothing with it, and nothing is said."""
        if not self._has_widths():
            return
        wide = MAX_WIDTH + 1
        doc = _widths(wide, 64)
        self.assertEqual(g048(doc), [])
        self.assertTrue(any(u.startswith("DSV4G048: not judged") and str(wide) in u
                            for u in doc["unknowns"]), doc["unknowns"])
        quiet = _widths(wide, 64, masked=False)
        self.assertEqual(g048(quiet), [])
        self.assertFalse(any("DSV4G048" in u for u in quiet["unknowns"]))

    def test_the_fixed_lines_pass_check(self) -> None:
        """``check --fix``: one server takes the other's width, proven; the corrected pair
        has no DSV4G048."""
        if not self._has_widths():
            return
        doc = _widths(64, 128, "--fix")
        fixes = g048(doc)[0]["fixes"]
        self.assertTrue(fixes and all(f["proven"] for f in fixes))
        self.assertEqual({(e["server"], e["value"]) for f in fixes for e in f["edits"]},
                         {("decode", "64"), ("prefill", "128")})
        self.assertEqual(doc["fix_status"], "corrected")
        self.assertEqual(g048(doc["fixed_check"]), [])


WIDTH_ENV = "SGLANG_DISAGGREGATION_SAMPLING_MASK_MAX_TOKENS"  # read by 0.5.16 - 0.5.19's class


def _env_widths(prefill: str | None, decode: str | None, *more: str,
                backend: str = "mooncake") -> dict[str, Any]:
    """A pair with ``WIDTH_ENV`` as given on each server (``None``: unset)."""
    env = [*(("--prefill-env", f"{WIDTH_ENV}={prefill}") if prefill is not None else ()),
           *(("--decode-env", f"{WIDTH_ENV}={decode}") if decode is not None else ())]
    return _pair("", "", *env, *more, backend=backend)


class TestSamplingMaskWidthVariable(GuardTestCase):
    """``SGLANG_DISAGGREGATION_SAMPLING_MASK_MAX_TOKENS``: in 0.5.16 - 0.5.19 the scheduler
    gives ``MetadataBuffers`` no width and the class reads the variable (above 0: the
    sampling-mask buffers exist, that wide); 0.5.20+ refuse it at start-up."""

    def _counts(self, prefill: str | None, decode: str | None) -> tuple[int, int]:
        """SGLang's own buffer counts in each server's environment."""
        with offline_env({WIDTH_ENV: prefill} if prefill is not None else {}):
            local = aux_buffer_count(False, None)
        with offline_env({WIDTH_ENV: decode} if decode is not None else {}):
            remote = aux_buffer_count(False, None)
        return local, remote

    def _refused(self, doc: dict[str, Any]) -> None:
        """0.5.20+: SGLang's resolution refuses the variable (DSV4G026 with its message,
        whose fix unsets it, proven with ``--fix``); no metadata-buffer finding."""
        self.assertIn("DSV4G026", [f["code"] for f in doc["findings"]])
        self.assertTrue(any("SAMPLING_MASK_MAX_TOKENS is no longer supported" in o["value"]
                            for f in doc["findings"] for o in f["observations"]
                            if o["name"] == "resolution"), doc["findings"])
        self.assertEqual(g045(doc) + g048(doc), [])
        for f in doc["findings"]:  # SGLang says "Unset it": the fix unsets it
            if f["code"] == "DSV4G026":
                unset = [x for x in f["fixes"] if any(
                    e["name"] == WIDTH_ENV and e["remove"] and e["env"] for e in x["edits"])]
                self.assertTrue(unset, f["fixes"])
                if "fixed_check" in doc:
                    self.assertTrue(all(x["proven"] for x in unset))
        if "fixed_check" in doc:
            self.assertEqual(doc["fix_status"], "corrected")

    def test_variable_on_the_prefill_only(self) -> None:
        """The variable on the prefill only: before 0.5.20 SGLang's class builds three more
        buffers there (DSV4G045, an error: misaligned, silent on Mooncake); environment
        fixes, each proven, and the corrected pair passes."""
        doc = _env_widths("64", None, "--fix")
        if READS_MASK:
            self._refused(doc)
            return
        local, remote = self._counts("64", None)
        self.assertEqual(local, remote + 3)
        (found,) = g045(doc)
        self.assertEqual(found["severity"], "error")
        self.assertIn("no error, no log line", found["when"])
        values = {(o["role"], o["name"]): o["value"] for o in found["observations"]}
        self.assertEqual((values[("prefill", "aux_buffer_count")],
                          values[("decode", "aux_buffer_count")]), (local, remote))
        edits = {(e["server"], e["name"], e["value"], e["remove"])
                 for f in found["fixes"] for e in f["edits"]}
        self.assertEqual(edits, {("decode", WIDTH_ENV, "64", False),
                                 ("prefill", WIDTH_ENV, None, True)})
        self.assertTrue(all(f["proven"] for f in found["fixes"]))
        self.assertTrue(all(e["env"] for f in found["fixes"] for e in f["edits"]))
        self.assertEqual(doc["fix_status"], "corrected")

    def test_variable_on_the_decode_only_kills_the_mooncake_worker(self) -> None:
        """The variable on the decode only, on Mooncake before 0.5.20: the prefill's real
        send_aux loops over the decode's buffers and raises (its worker exits)."""
        doc = _env_widths(None, "64")
        if READS_MASK:
            self._refused(doc)
            return
        (found,) = g045(doc)
        self.assertEqual(found["severity"], "error")
        self.assertIn("Transfer thread failed", found["when"])

    def test_different_values_on_both(self) -> None:
        """64 on the prefill, 128 on the decode: as many buffers, rows of different widths
        (DSV4G048, an error on Mooncake: the slots SGLang's real send_aux misplaces in the
        decode's real buffers); environment fixes, proven."""
        doc = _env_widths("64", "128", "--fix")
        if READS_MASK:
            self._refused(doc)
            return
        self.assertEqual(g045(doc), [])
        with offline_env({WIDTH_ENV: "64"}):
            narrow = aux_row_widths(False, None)
        misplaced, _ = mooncake_mask_rows(None, None, prefill_env={WIDTH_ENV: "64"},
                                          decode_env={WIDTH_ENV: "128"})
        (found,) = g048(doc)
        self.assertEqual(found["severity"], "error")
        self.assertTrue(misplaced)
        self.assertEqual(_slots(found, "than the prefill's row for request slots "), misplaced)
        self.assertIn(("output_token_sampling_mask_idx", 64 * 4), narrow)
        self.assertEqual({(e["server"], e["name"], e["value"]) for f in found["fixes"]
                          for e in f["edits"]},
                         {("decode", WIDTH_ENV, "64"), ("prefill", WIDTH_ENV, "128")})
        self.assertTrue(all(f["proven"] for f in found["fixes"]))
        self.assertEqual(doc["fix_status"], "corrected")
        self.assertEqual(g048(doc["fixed_check"]), [])

    def test_equal_values_are_accepted(self) -> None:
        """Near miss: the same value on both servers (and 0 against unset: SGLang's class
        builds no sampling-mask buffer for either)."""
        for prefill, decode in (("64", "64"), ("0", None)):
            doc = _env_widths(prefill, decode)
            if READS_MASK:
                if prefill != "0":
                    self._refused(doc)
                continue
            self.assertEqual(self._counts(prefill, decode)[0], self._counts(prefill, decode)[1])
            self.assertEqual(g045(doc) + g048(doc), [])
        self.assertNotIn(WIDTH_ENV, os.environ)


if __name__ == "__main__":
    unittest.main()
