"""``check`` and the run-time wrappers give the same finding for a condition both can see.

For each pair, ``check`` reads two launch lines; the run time is SGLang's real connector
code: the decode's registration message built by the release's own receiver and parsed
by its ``KVArgsRegisterInfo.from_zmq``, registered with a prefill manager in the prefill's
environment (Mooncake's real bootstrap thread, NIXL's ``_add_remote_peer``). Each server's
metadata buffers are counted by SGLang's own ``MetadataBuffers`` in that server's
environment, as each server builds them. The codes, severities, ``when`` and fix edits
must agree. What only ``check`` can see (the decode's own environment and flags) is named
where the fixes are compared.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import unittest
from typing import Any
from unittest import mock

import mori_stub
import peers_real
import sglang.srt.disaggregation.mooncake.conn as mooncake
import sglang.srt.disaggregation.nixl.conn as nixl
from check_helpers import DSV3, GPT_OSS, check_json, server
from helpers import GuardTestCase, guard_logs_off
from sglang.test.ci.ci_register import register_cpu_ci
from test_peers import bootstrap_threads, published_configs

import sglang_dsv4_guard
from sglang_dsv4_guard.findings import Finding
from sglang_dsv4_guard.host.flags import flag_for_field
from sglang_dsv4_guard.launch.derive import attention_tp
from sglang_dsv4_guard.launch.parse import offline_env, parse_side
from sglang_dsv4_guard.lifecycle import installation
from sglang_dsv4_guard.pd.buffers import aux_buffer_count, mask_env

register_cpu_ci(est_time=45, suite="stage-a-test-cpu")

CHECKSUM = flag_for_field("disaggregation_enable_kv_checksum")  # 0.5.21+
Edit = tuple[str, str, Any, bool, bool]


def _edits(fixes: list[dict[str, Any]]) -> set[Edit]:
    return {(e["server"], e["name"], e["value"], e["remove"], e["env"])
            for f in fixes for e in f["edits"]}


def _environ(env: dict[str, str], name: str) -> dict[str, str]:
    """The process environment with ``name`` as ``env`` says (unset when it is not there)."""
    return {**{k: v for k, v in os.environ.items() if k != name}, **env}


class TestMetadataBufferCounts(GuardTestCase):
    """DSV4G045: the sampling-mask variable and the KV checksum flag on either server."""

    def setUp(self) -> None:
        super().setUp()
        published_configs(self)

    def _runtime(self, backend: str, prefill_env: dict[str, str], local: int, remote: int,
                 checksum: bool) -> list[Finding]:
        """The findings the guard reports when a decode with ``remote`` buffers registers
        with a prefill with ``local`` in ``prefill_env``."""
        conn = mooncake if backend == "mooncake" else nixl
        with mock.patch.dict(os.environ, _environ(prefill_env, mask_env()), clear=True):
            sglang_dsv4_guard.install("on", load_entry_points=False)
            try:
                frames, info = peers_real.registration(conn, backend, aux=remote,
                                                       name="sess-aux")
                mgr = peers_real.prefill(conn, backend, aux=local)
                mgr.server_args.disaggregation_enable_kv_checksum = checksum
                with guard_logs_off():
                    if backend == "mooncake":
                        bootstrap_threads(mgr, [frames])
                    else:
                        nixl.NixlKVManager._add_remote_peer(mgr, info)
                current = installation()
                assert current is not None
                return [f for r in current.peers.reports() for f in r.findings
                        if f.code == "DSV4G045"]
            finally:
                with guard_logs_off():
                    sglang_dsv4_guard.uninstall()

    def test_check_and_registration_agree(self) -> None:
        """Every combination of the variable and the flag on the two servers, on Mooncake
        (and NIXL with the variable only): the same code and severity, the same ``when``;
        each fix edit the registration offers is one ``check`` offers the decode, and,
        where only one of the two settings differs, all of them."""
        name = mask_env()
        checksums = (False, True) if CHECKSUM is not None else (False,)
        cases = [("mooncake", *c) for c in itertools.product((None, "1"), (None, "1"),
                                                               checksums, checksums)]
        cases += [("nixl", p, d, False, False) for p, d in ((None, "1"), ("1", None))]
        differing = 0
        for backend, p_mask, d_mask, p_sum, d_sum in cases:
            with self.subTest(backend=backend, prefill_mask=p_mask, decode_mask=d_mask,
                              prefill_checksum=p_sum, decode_checksum=d_sum):
                envs = [{name: v} if v else {} for v in (p_mask, d_mask)]
                counts = []
                for env, checksum in zip(envs, (p_sum, d_sum), strict=True):
                    with offline_env(env):
                        counts.append(aux_buffer_count(checksum, None))
                flags = [CHECKSUM.option if on and CHECKSUM else "" for on in (p_sum, d_sum)]
                more = [arg for role, env in zip(("prefill", "decode"), envs, strict=True)
                        for k, v in env.items() for arg in (f"--{role}-env", f"{k}={v}")]
                _, doc = check_json(server("prefill", GPT_OSS, flags[0], backend=backend),
                                    server("decode", GPT_OSS, flags[1], backend=backend), *more)
                checked = [f for f in doc["findings"] if f["code"] == "DSV4G045"]
                ran = self._runtime(backend, envs[0], counts[0], counts[1], p_sum)
                self.assertEqual(len(checked), int(counts[0] != counts[1]), doc["findings"])
                self.assertEqual([(f["code"], f["severity"], f["when"]) for f in checked],
                                 [(f.code, f.severity.value, f.when) for f in ran])
                if not checked:
                    continue
                differing += 1
                observed = {(o["role"], o["name"]): o["value"]
                            for o in checked[0]["observations"]}
                self.assertEqual((observed["prefill", "aux_buffer_count"],
                                  observed["decode", "aux_buffer_count"]), tuple(counts))
                offered = {e for e in _edits(checked[0]["fixes"]) if e[0] == "decode"}
                given = {(e.server, e.name, e.value, e.remove, e.env)
                         for f in ran[0].fixes for e in f.edits}
                self.assertTrue(given, ran[0].fixes)
                self.assertLessEqual(given, offered)
                if (p_mask != d_mask) != (p_sum != d_sum):
                    self.assertEqual(given, offered)
        self.assertGreaterEqual(differing, 4)


class TestAttentionTpFixes(GuardTestCase):
    """DSV4G006 on MORI: the attention-TP family's fixes (pd/attention_tp.py) on gpt-oss
    (non-MLA, swa state), from ``check``'s launch lines and from SGLang's MORI send path
    on a prefill whose server arguments are SGLang's own resolution of the same line."""

    # (prefill line, decode line): plain TP, attention DP in the release's spelling,
    # attention CP, DP replicas; each decode's attention TP differs from its prefill's.
    def layouts(self) -> list[tuple[str, str]]:
        dp = "--attn-dp-size 2" if flag_for_field("attn_dp_size") else (
            "--dp-size 2 --enable-dp-attention")
        return [("--tp-size 8", "--tp-size 4"), ("--tp-size 4", "--tp-size 8"),
                (f"--tp-size 8 {dp}", "--tp-size 8"), ("--tp-size 8", f"--tp-size 8 {dp}"),
                ("--tp-size 8 --attn-cp-size 2", "--tp-size 2"),
                # --dp-size without --enable-dp-attention: replicas, whose loss is said
                ("--tp-size 8 --dp-size 2", "--tp-size 4")]

    def _runtime(self, prefill: str, decode_attn_tp: int) -> list[Finding]:
        """The findings SGLang's MORI send path (the guard installed) reports for a prefill
        resolved from ``prefill`` and a decode peer of ``decode_attn_tp``."""
        args = parse_side("prefill", prefill, {})
        import sglang.srt.disaggregation.mori.conn as conn

        attn_tp, _ = attention_tp(args)  # SGLang's compute_dp_attention_world_info
        mgr = mori_stub.manager(conn, attn_tp=attn_tp)
        mgr.server_args = args.server_args
        # A peer of its own per pair: the guard reports a peer's mismatch once.
        peer = mori_stub.peer(conn, f"decode-{prefill}-{decode_attn_tp}", decode_tp=decode_attn_tp)
        with guard_logs_off():
            mgr._add_remote_peer(peer)
            try:
                mgr._send_swa_dsa_state(*mori_stub.send_args(conn, peer, "swa"))
            except Exception as exc:  # SGLang's refusal, carrying the guard's finding
                return [f for f in getattr(exc, "findings", ()) if f.code == "DSV4G006"]
        return []

    def test_check_and_send_path_agree(self) -> None:
        """The same code and severity, and the prefill's fix edits equal, fix by fix in
        order (``check`` keeps those the release's resolution accepts); the decode's
        layout is known to ``check`` only: its fixes carry edits there and none at run
        time, where they name both forms."""
        mori_stub.install_stub()
        self.install_guard("on", load_entry_points=False)
        for prefill, decode in self.layouts():
            with self.subTest(prefill=prefill, decode=decode):
                _, doc = check_json(server("prefill", GPT_OSS, prefill),
                                    server("decode", GPT_OSS, decode))
                [checked] = [f for f in doc["findings"] if f["code"] == "DSV4G006"]
                observed = {(o["role"], o["name"]): o["value"] for o in checked["observations"]}
                [ran] = self._runtime(server("prefill", GPT_OSS, prefill),
                                      observed["decode", "decode_tp_size"])
                self.assertEqual((ran.code, ran.severity.value),
                                 (checked["code"], checked["severity"]))

                def prefill_only(edits: list[set[Edit]]) -> list[set[Edit]]:
                    return [e for e in edits if e and all(x[0] == "prefill" for x in e)]

                at_check = prefill_only([_edits([f]) for f in checked["fixes"]])
                at_run = prefill_only([{(e.server, e.name, e.value, e.remove, e.env)
                                        for e in f.edits} for f in ran.fixes])
                self.assertTrue(at_run, ran.fixes)
                self.assertEqual(at_check, [e for e in at_run if e in at_check])
                self.assertLessEqual(len(at_run) - len(at_check), 1)
                if prefill == "--tp-size 8 --dp-size 2":  # replicas: never GPU-count-keeping
                    self.assertFalse([f for f in ran.fixes if "(its GPU count)" in f.text
                                      and f.text.startswith("give the prefill")], ran.fixes)
                decode_fixes = [f for f in ran.fixes if f.text.startswith("give the decode")]
                self.assertEqual([f.edits for f in decode_fixes], [()])


class TestStateTransfer(GuardTestCase):
    """DSV4G040 (pd/send_extra.py, one pair condition): gpt-oss (non-MLA, swa state) with
    different attention TP, with and without PP on the prefill, from ``check``'s launch
    lines and from a decode's registration (SGLang's receiver and ``from_zmq``, read by
    Mooncake's real bootstrap thread) with a prefill manager whose server arguments are
    SGLang's own resolution of the same line and whose SWA KV cache is the plain pool's
    ``nhd`` layout. (NIXL's registration of a decode of another TP needs a KV geometry
    the miniature manager does not have; its DSV4G040 is held to SGLang's own
    ``maybe_send_extra`` in ``test_peers.py``, through the same condition.)"""

    CASES = (("--tp-size 2", "--tp-size 1"), ("--tp-size 1", "--tp-size 2"),
             ("--tp-size 2 --pp-size 2", "--tp-size 1"))

    def _runtime(self, prefill: str, decode_attn_tp: int) -> list[Finding]:
        backend = "mooncake"
        args = parse_side("prefill", prefill, {})
        attn_tp, _ = attention_tp(args)  # SGLang's compute_dp_attention_world_info
        frames, _ = peers_real.registration(mooncake, backend, tp=decode_attn_tp,
                                            name=f"sess-{prefill}")
        mgr = peers_real.prefill(mooncake, backend, tp=attn_tp, state_types=[_swa()])
        mgr.server_args, mgr.pp_size = args.server_args, args.get("pp_size") or 1
        mgr.kv_args.swa_kv_cache_layout = "nhd"
        with guard_logs_off():
            bootstrap_threads(mgr, [frames])
        current = installation()
        assert current is not None
        return [f for r in current.peers.reports() for f in r.findings
                if f.code in ("DSV4G040", "DSV4G041")
                and r.context.get("peer", "").startswith(f"sess-{prefill}")]

    def test_check_and_registration_agree(self) -> None:
        """The same codes, severities and ``when``, and the prefill's fix edits equal, fix
        by fix in order; the decode's layout is known to ``check`` only (at run time its
        attention-TP fix names both forms, without an edit)."""
        published_configs(self)
        self.install_guard("on", load_entry_points=False)
        found = 0
        backend = "mooncake"
        for prefill, decode in self.CASES:
            with self.subTest(prefill=prefill, decode=decode):
                _, doc = check_json(server("prefill", GPT_OSS, prefill, backend=backend),
                                    server("decode", GPT_OSS, decode, backend=backend))
                checked = [f for f in doc["findings"] if f["code"] in ("DSV4G040", "DSV4G041")]
                decode_tp, _ = attention_tp(parse_side("decode", server(
                    "decode", GPT_OSS, decode, backend=backend), {}))
                ran = self._runtime(server("prefill", GPT_OSS, prefill, backend=backend),
                                    decode_tp)
                self.assertEqual([(f["code"], f["severity"], f["when"]) for f in checked],
                                 [(f.code, f.severity.value, f.when) for f in ran])
                if not checked:
                    continue
                found += 1
                at_check = [_edits([f]) for f in checked[0]["fixes"]]
                at_run = [{(e.server, e.name, e.value, e.remove, e.env) for e in f.edits}
                          for f in ran[0].fixes]
                self.assertEqual([e for e in at_check if e and all(x[0] == "prefill" for x in e)],
                                 [e for e in at_run if e and all(x[0] == "prefill" for x in e)])
                self.assertEqual([f.edits for f in ran[0].fixes
                                  if f.text.startswith("give the decode")], [()])
        self.assertGreaterEqual(found, 1)


class TestNixlPayload(GuardTestCase):
    """DSV4G043 and DSV4G046 (pd/nixl_payload.py, one pair condition): ``check`` on two
    launch lines, and SGLang's real ``NixlKVManager._add_remote_peer`` given the decode's
    registration (the release's receiver and ``from_zmq``) by a prefill manager whose
    server arguments are SGLang's resolution of the same prefill line."""

    EAGLE = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 "
             "--speculative-num-steps 3 --speculative-num-draft-tokens 4")

    def _runtime(self, prefill: str, *, tp: int, decode_tp: int, kinds: tuple[str, ...],
                 regions: int, name: str) -> list[Finding]:
        args = parse_side("prefill", prefill, {})
        _, info = peers_real.registration(nixl, "nixl", tp=decode_tp, kinds=kinds, name=name)
        mgr = peers_real.prefill(nixl, "nixl", tp=tp, regions=regions,
                                 speculative=args.get("speculative_algorithm"))
        mgr.server_args = args.server_args
        # SGLang's refusal is raised unchanged; the guard's report is what is compared
        with guard_logs_off(), contextlib.suppress(NotImplementedError, ValueError):
            nixl.NixlKVManager._add_remote_peer(mgr, info)
        current = installation()
        assert current is not None
        return [f for r in current.peers.reports() for f in r.findings
                if r.context.get("peer", "").startswith(name)
                and f.code in ("DSV4G042", "DSV4G043", "DSV4G046")]

    def test_check_and_registration_agree(self) -> None:
        """The same codes, severities and ``when``; every edit the registration offers is
        one ``check`` offers, in the same order (the decode's layout is known to ``check``
        only; DSV4G046's flag edits are derived from both launch lines, so at run time
        its fix is said without one)."""
        self.install_guard("on", load_entry_points=False)
        cases = [  # prefill line, decode line, run-time shape
            (server("prefill", GPT_OSS, "--tp-size 1", backend="nixl"),
             server("decode", GPT_OSS, "--tp-size 4 --enable-hisparse", backend="nixl"),
             {"tp": 1, "decode_tp": 4, "kinds": ("DRAM", "DRAM"), "regions": 2}),
            (server("prefill", DSV3, f"--tp-size 8 {self.EAGLE}", backend="nixl"),
             server("decode", DSV3, "--tp-size 8", backend="nixl"),
             {"tp": 8, "decode_tp": 8, "kinds": ("VRAM", "VRAM"), "regions": 4})]
        found = 0
        for i, (prefill, decode, shape) in enumerate(cases):
            with self.subTest(prefill=prefill, decode=decode):
                _, doc = check_json(prefill, decode)
                checked = [f for f in doc["findings"]
                           if f["code"] in ("DSV4G042", "DSV4G043", "DSV4G046")]
                ran = self._runtime(prefill, name=f"payload-{i}", **shape)
                self.assertEqual([(f["code"], f["severity"], f["when"]) for f in checked],
                                 [(f.code, f.severity.value, f.when) for f in ran])
                if not checked:
                    continue
                found += 1
                at_check = [_edits([f]) for f in checked[0]["fixes"]]
                at_run = [{(e.server, e.name, e.value, e.remove, e.env) for e in f.edits}
                          for f in ran[0].fixes]
                self.assertEqual([e for e in at_check if e in at_run], [e for e in at_run if e])
        self.assertGreaterEqual(found, 1)


def _swa() -> Any:
    from sglang_dsv4_guard.host.targets import PD_STATE_TYPE_MODULE

    return __import__(PD_STATE_TYPE_MODULE, fromlist=["StateType"]).StateType("swa")


if __name__ == "__main__":
    unittest.main()
