"""Property: on drawn prefill/decode launch pairs, ``check``'s contract verdict per row is
the verdict of SGLang's own function called once on the same derived values.

The pairs vary what the first contact and the per-request state transfer read: the model
(gpt-oss: hybrid SWA MHA; DeepSeek-V3: MLA), the transfer backend (Mooncake, NIXL) and per
server ``--tp-size``, ``--pp-size``, ``--page-size`` and ``--kv-cache-dtype``. Each server
is derived as ``check`` derives it (``parse_launch`` / ``derive_server`` / ``endpoint_of``);
its findings are ``contract_findings``'. The oracles (:mod:`pd_real`) are SGLang's real
``try_ensure_parallel_info`` and its real Mooncake or NIXL ``maybe_send_extra``.

Few examples, whatever the profile: each distinct launch line costs a ``ServerArgs``
resolution (cached per line); the verdict counts are printed when the class ends.
"""

from __future__ import annotations

import functools
import sys
import unittest
from typing import Any, ClassVar

from check_helpers import DSV3, GPT_OSS, server
from helpers import GuardTestCase, fixed_examples, sglang_release
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pd_real import first_contact_raise, send_extra_refusal
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.offline.parse import parse_launch
from sglang_dsv4_guard.check.rows.contract import contract_findings
from sglang_dsv4_guard.check.server.derive import DerivedServer, derive_server
from sglang_dsv4_guard.check.server.endpoint_values import endpoint_of
from sglang_dsv4_guard.check.server.gpus import page_sizes
from sglang_dsv4_guard.findings import Finding, Severity
from sglang_dsv4_guard.pd.endpoint import Endpoint

register_cpu_ci(est_time=40, suite="stage-a-test-cpu")

FIRST_CONTACT = "decode's first contact with the prefill"  # the first-contact row's subject
SEND_EXTRA = "DSV4G040"
# What SGLang's first contact reads of each endpoint.
CONTACT_VALUES = ("attn_tp_size", "attn_cp_size", "attn_dp_size", "pp_size", "page_size",
                  "kv_cache_dtype_str", "dcp_size", "is_mla_backend", "is_hybrid_mla_backend",
                  "enable_kv_cache_sharding", "enable_dsa_cache_layer_split", "kv_layout",
                  "dsv41_spec_layout", "state_types")


@st.composite
def _flags(draw: Any) -> str:
    """One server's flags among those the two rows read."""
    flags = [f"--tp-size {draw(st.sampled_from([1, 2, 4]))}",
             f"--pp-size {draw(st.sampled_from([1, 2]))}"]
    page = draw(st.sampled_from([None, 16, 64]))
    dtype = draw(st.sampled_from([None, "bf16", "auto", "fp8_e4m3"]))
    flags += [f"--page-size {page}"] if page else []
    flags += [f"--kv-cache-dtype {dtype}"] if dtype else []
    return " ".join(flags)


@st.composite
def pairs(draw: Any) -> tuple[str, str]:
    """A prefill and a decode launch line: one model, one transfer backend."""
    model = draw(st.sampled_from([GPT_OSS, DSV3]))
    backend = draw(st.sampled_from(["mooncake", "nixl"]))
    return (server("prefill", model, draw(_flags()), backend=backend),
            server("decode", model, draw(_flags()), backend=backend))


@functools.cache
def _side(role: str, line: str) -> DerivedServer:
    """The server as ``check`` derives it (one ``ServerArgs`` resolution per line)."""
    return derive_server(parse_launch(role, line, {}))


@functools.cache
def _endpoint(role: str, line: str) -> Endpoint:
    return endpoint_of(_side(role, line))


@functools.cache
def _page_sizes(role: str, line: str) -> dict[str, int | None]:
    """The page size SGLang's resolution gives the line as each GPU model."""
    return page_sizes(_side(role, line))


def _messages(findings: list[Finding]) -> set[str | None]:
    return {f.host_message for f in findings}


class TestContractAgreesWithSGLang(GuardTestCase):
    """``check``'s first-contact and send-extra rows against SGLang's own functions."""

    counts: ClassVar[dict[str, int]] = {"drawn": 0, "first contact raises": 0,
                                        "send extra refuses": 0, "both accept": 0,
                                        "page size depends on the GPU": 0}

    @classmethod
    def tearDownClass(cls) -> None:
        print(f"contract property on SGLang {sglang_release()}: "
              + ", ".join(f"{v} {k}" for k, v in cls.counts.items()), file=sys.__stderr__)
        super().tearDownClass()
        if cls.counts["drawn"] and cls.counts["drawn"] == cls.counts["both accept"]:
            raise AssertionError("every drawn pair was accepted: the property tested nothing")

    @settings(max_examples=fixed_examples(20), deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(pairs())
    def test_rows_agree_with_sglang(self, lines: tuple[str, str]) -> None:
        """The first-contact row has an error iff SGLang's try_ensure_parallel_info raises
        (and its message is one of the row's), DSV4G040 iff the backend's
        maybe_send_extra refuses (same message), and no other contract finding is an
        error: where SGLang's functions accept, check reports no error."""
        counts = type(self).counts
        counts["drawn"] += 1
        roles = tuple(zip(("prefill", "decode"), lines, strict=True))
        sides = [_side(role, line) for role, line in roles]
        self.assertTrue(all(s.args.resolved for s in sides), lines)
        p, d = (_endpoint(role, line) for role, line in roles)
        findings, _ = contract_findings(sides[0], sides[1], str(sglang_release()))
        errors = [f for f in findings if f.severity is Severity.ERROR]
        contact = [f for f in findings if f.subject == FIRST_CONTACT
                   and (f.severity is Severity.ERROR or f.code == "DSV4G022")]
        send = [f for f in errors if f.code == SEND_EXTRA]

        pv = {n: p.get(n) for n in CONTACT_VALUES if p.has(n)}
        dv = {n: d.get(n) for n in CONTACT_VALUES if d.has(n)}
        raised = first_contact_raise(pv, dv)
        self.assertEqual(bool(contact), raised is not None, (lines, raised, _messages(contact)))
        if raised is not None:
            self.assertIn(raised, _messages(contact), lines)
        page = [f for f in contact if f.code == "DSV4G022"]
        if page:  # an error exactly when SGLang refuses the pair on every GPU model
            sizes = [(a, _page_sizes("decode", lines[1]).get(gpu))
                     for gpu, a in _page_sizes("prefill", lines[0]).items()]
            everywhere = all(str(first_contact_raise({**pv, "page_size": a},
                                                     {**dv, "page_size": b})
                                 ).startswith("Page size mismatch")  # SGLang's first check
                             for a, b in sizes if a is not None and b is not None)
            self.assertEqual(page[0].severity is Severity.ERROR, everywhere, (lines, sizes))
            counts["page size depends on the GPU"] += not everywhere

        refused = send_extra_refusal(
            str(p.get("transfer_backend")), int(p.get("attn_tp_size")),
            int(d.get("attn_tp_size")), int(p.get("pp_size")), bool(p.get("is_mla_backend")),
            tuple(p.get("state_types", ())), str(p.get("swa_kv_cache_layout") or "nhd"),
            bool(p.get("is_hybrid_mla_backend", False)))
        self.assertEqual(bool(send), refused is not None, (lines, refused, _messages(send)))
        if refused is not None:
            self.assertEqual(_messages(send), {refused}, lines)

        invented = [(f.code, f.subject) for f in errors if f not in contact + send]
        self.assertEqual(invented, [], lines)
        counts["first contact raises"] += raised is not None
        counts["send extra refuses"] += refused is not None
        counts["both accept"] += raised is None and refused is None


if __name__ == "__main__":
    unittest.main()
