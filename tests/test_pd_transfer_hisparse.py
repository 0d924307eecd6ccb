"""``check`` predicts HiSparse on the decode failing its transfer: NIXL's registration
(DSV4G042, DSV4G043) and the decode's first request off Mooncake (DSV4G044)."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from check_helpers import DSV3, DSV4, GPT_OSS, check_json, server
from helpers import GuardTestCase, sglang_release
from host_trees import disguised_tree, real_package
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host.pd_digests import SITES, digest_pd_tree, locate, row_releases
from sglang_dsv4_guard.pd.endpoint import Endpoint, Value
from sglang_dsv4_guard.pd.nixl_payload import REGIONS, decode_kv_kinds

register_cpu_ci(est_time=37, suite="stage-a-test-cpu")

RELEASE = sglang_release()
EAGLE = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")
G042 = ("NIXL PD transfer does not support HiSparse combined with decode-only speculative "
        "decoding.")
# pop_preallocated: DeepSeek-V4 only from 0.5.17, DeepSeek-V4 or a draft pool from 0.5.22.
G044 = ("HiSparse device-only PD transfer currently requires the Mooncake backend"
        if Version("0.5.22") <= RELEASE else
        "DSV4 HiSparse direct PD transfer currently requires the Mooncake backend"
        if Version("0.5.17") <= RELEASE else None)


def found(doc: dict[str, Any], code: str) -> list[str | None]:
    return [f["host_message"] for f in doc["findings"] if f["code"] == code]


class TestNixlRegistration(GuardTestCase):
    """NIXL's ``_prepare_payload_xfer`` on the registration the two lines imply."""

    def test_hisparse_with_decode_only_draft(self) -> None:
        """DeepSeek-V4, HiSparse and EAGLE on the decode only, on NIXL: DSV4G042 on every
        release, at registration (a dead bootstrap thread and timeouts)."""
        _, doc = check_json(server("prefill", DSV4, backend="nixl"),
                            server("decode", DSV4, f"--enable-hisparse {EAGLE}", backend="nixl"))
        self.assertEqual(found(doc, "DSV4G042"), [G042])
        when = next(f["when"] for f in doc["findings"] if f["code"] == "DSV4G042")
        self.assertIn("bootstrap thread dies", when)

    def test_draft_on_both_servers_is_registered(self) -> None:
        """Near miss: the same draft on both servers is no DSV4G042."""
        _, doc = check_json(server("prefill", DSV4, EAGLE, backend="nixl"),
                            server("decode", DSV4, f"--enable-hisparse {EAGLE}", backend="nixl"))
        self.assertEqual(found(doc, "DSV4G042"), [])

    def test_draft_on_the_prefill_only_is_dsv4g046(self) -> None:
        """DeepSeek-V3 with EAGLE on the prefill only, on NIXL: the prefill registers its
        draft's KV regions too, the decode fewer; DSV4G046, an error at registration with
        SGLang's message, in place of DSV4G020's warning, with proven speculative-flag
        fixes. Near misses: the draft on both servers, and the same pair on Mooncake."""
        prefill = server("prefill", DSV3, f"--tp-size 8 {EAGLE}", backend="nixl")
        status, doc = check_json(prefill, server("decode", DSV3, "--tp-size 8", backend="nixl"),
                                 "--fix")
        self.assertEqual(status, 1)
        [message] = found(doc, "DSV4G046")
        self.assertTrue(str(message).startswith(
            "NIXL PD transfer: decode registered fewer KV regions"), message)
        finding = next(f for f in doc["findings"] if f["code"] == "DSV4G046")
        self.assertIn("bootstrap thread dies", finding["when"])
        self.assertEqual(found(doc, "DSV4G020"), [])
        self.assertTrue(finding["fixes"])
        self.assertTrue(all(f["proven"] for f in finding["fixes"]), finding["fixes"])
        _, doc = check_json(prefill, server("decode", DSV3, f"--tp-size 8 {EAGLE}",
                                            backend="nixl"))
        self.assertEqual(found(doc, "DSV4G046"), [])
        _, doc = check_json(prefill.replace("nixl", "mooncake"),
                            server("decode", DSV3, "--tp-size 8", backend="mooncake"))
        self.assertEqual(found(doc, "DSV4G046"), [])

    def test_direct_to_host_with_heterogeneous_tp(self) -> None:
        """gpt-oss (MHA), HiSparse on a TP4 decode behind a TP1 prefill: DSV4G043; with
        equal TP it registers."""
        _, doc = check_json(server("prefill", GPT_OSS, "--tp-size 1", backend="nixl"),
                            server("decode", GPT_OSS, "--tp-size 4 --enable-hisparse",
                                   backend="nixl"))
        self.assertEqual(found(doc, "DSV4G043"),
                         ["NIXL heterogeneous-TP direct-to-host KV transfer is not "
                          "implemented safely yet"])
        _, doc = check_json(server("prefill", GPT_OSS, "--tp-size 4", backend="nixl"),
                            server("decode", GPT_OSS, "--tp-size 4 --enable-hisparse",
                                   backend="nixl"))
        self.assertEqual(found(doc, "DSV4G043"), [])

    def test_real_function_on_the_derived_registration(self) -> None:
        """SGLang's real ``_prepare_payload_xfer``, called here on a half-built manager
        with the decode's memory kinds as check derives them, refuses the decode-only
        draft with HiSparse and accepts it without HiSparse: check's verdicts."""
        from sglang.srt.disaggregation.nixl.conn import NixlKVManager

        def run(hisparse: bool) -> str | None:
            decode = Endpoint("decode", {"enable_hisparse": Value(hisparse, "t")})
            kinds = decode_kv_kinds(decode, decode_only_draft=True)
            manager = object.__new__(NixlKVManager)
            manager.__dict__.update(attn_tp_size=1, src_mem_kind="VRAM", is_mla_backend=True,
                                    is_hybrid_mla_backend=False, prep_handles={},
                                    kv_args=SimpleNamespace(kv_item_lens=[64] * REGIONS,
                                                            kv_data_mem_kinds=["VRAM"] * REGIONS))
            peer = SimpleNamespace(dst_kv_item_lens=[64] * len(kinds), dst_kv_mem_kinds=kinds,
                                   decode_tp_size=1, requires_dcp_relayout=False)
            try:
                NixlKVManager._prepare_payload_xfer(manager, peer)
            except NotImplementedError as exc:
                return str(exc)
            except Exception:  # past the checks, into the handles it cannot build
                return None
            return None

        self.assertEqual((run(True), run(False)), (G042, None))


class TestHisparseBackend(GuardTestCase):
    """The decode's ``pop_preallocated`` with HiSparse off Mooncake."""

    def test_deepseek_v4_hisparse_on_nixl(self) -> None:
        """DeepSeek-V4 with HiSparse on NIXL: DSV4G044 from 0.5.17 (SGLang's message of
        that release), absent on 0.5.16 which has no such check."""
        _, doc = check_json(server("prefill", DSV4, backend="nixl"),
                            server("decode", DSV4, "--enable-hisparse", backend="nixl"))
        self.assertEqual(found(doc, "DSV4G044"), [G044] if G044 else [])

    def test_fake_backend_decode_is_accepted(self) -> None:
        """Near miss: a decode on the ``fake`` backend (decode-only, no prefill) with
        HiSparse: SGLang's own ``_is_fake_transfer`` holds for its requests, so
        ``pop_preallocated`` does not refuse it: no DSV4G044."""
        _, doc = check_json(server("prefill", DSV4, backend="fake"),
                            server("decode", DSV4, "--enable-hisparse", backend="fake"))
        self.assertEqual(found(doc, "DSV4G044"), [])

    def test_the_finding_names_the_first_request_and_no_absent_draft(self) -> None:
        """DSV4G044 without speculative decoding: its ``when:`` names the decode's first
        request (``pop_preallocated``), not decode's first contact, and its details speak
        of no draft, which neither server has."""
        _, doc = check_json(server("prefill", DSV4, backend="nixl"),
                            server("decode", DSV4, "--enable-hisparse", backend="nixl"))
        if G044 is None:
            self.assertEqual(found(doc, "DSV4G044"), [])
            return
        g044 = next(f for f in doc["findings"] if f["code"] == "DSV4G044")
        self.assertIn("first request", g044["when"])
        self.assertIn("pop_preallocated", g044["when"])
        self.assertNotIn("first contact", g044["when"])
        self.assertNotIn("draft", " ".join(g044["details"]))

    def test_the_nixl_finding_speaks_of_no_absent_draft(self) -> None:
        """DSV4G043 (gpt-oss, no speculative decoding): its details name the decode's
        HiSparse KV in host memory and no draft."""
        _, doc = check_json(server("prefill", GPT_OSS, "--tp-size 1", backend="nixl"),
                            server("decode", GPT_OSS, "--tp-size 4 --enable-hisparse",
                                   backend="nixl"))
        g043 = next(f for f in doc["findings"] if f["code"] == "DSV4G043")
        self.assertIn("host memory", " ".join(g043["details"]))
        self.assertNotIn("draft", " ".join(g043["details"]))

    def test_mooncake_is_accepted(self) -> None:
        """Near miss: the same pair on Mooncake is no DSV4G044 (nor DSV4G042/043)."""
        _, doc = check_json(server("prefill", DSV4, backend="mooncake"),
                            server("decode", DSV4, "--enable-hisparse", backend="mooncake"))
        self.assertEqual([c for c in ("DSV4G042", "DSV4G043", "DSV4G044")
                          if found(doc, c)], [])

    def test_the_fixed_lines_pass_check(self) -> None:
        """``check --fix`` on the NIXL pair: its fixes are proven and the corrected lines
        have none of these findings."""
        _, doc = check_json(server("prefill", DSV4, backend="nixl"),
                            server("decode", DSV4, "--enable-hisparse", backend="nixl"), "--fix")
        if G044 is None:
            self.assertEqual(found(doc, "DSV4G044"), [])
            return
        g044 = next(f for f in doc["findings"] if f["code"] == "DSV4G044")
        self.assertTrue(g044["fixes"] and all(f["proven"] for f in g044["fixes"]))
        self.assertNotIn("DSV4G044", [f["code"] for f in doc["fixed_check"]["findings"]])

    def test_an_edited_condition_matches_no_known_release(self) -> None:
        """``pop_preallocated``'s Mooncake test edited in a disguised copy: its digest is
        no known release's, so the row is not judged (0.5.16 has no such site at all)."""
        rel = "srt/disaggregation/decode.py"
        keys = ("decode.hisparse_mooncake",)
        old = "self.transfer_backend != TransferBackend.MOONCAKE"
        with tempfile.TemporaryDirectory() as tmp:
            if G044 is None:
                tree = disguised_tree(Path(tmp)) / "sglang"
                self.assertIsNone(locate(tree, SITES[keys[0]]))
                return
            tree = disguised_tree(Path(tmp), edits={rel: (old, old.replace("!=", "=="))})
            self.assertEqual(row_releases(digest_pd_tree(tree / "sglang"), keys), [])
            self.assertTrue(row_releases(digest_pd_tree(real_package()), keys))


if __name__ == "__main__":
    unittest.main()
