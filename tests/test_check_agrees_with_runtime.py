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
from helpers import GuardTestCase, fixed_examples, guard_logs_off
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from sglang.test.ci.ci_register import register_cpu_ci
from test_peers import bootstrap_threads, published_configs

import sglang_dsv4_guard
from sglang_dsv4_guard.check.offline.parse import offline_env, parse_launch
from sglang_dsv4_guard.check.server.derive import attention_tp
from sglang_dsv4_guard.findings import Finding
from sglang_dsv4_guard.host.flags import flag_for_field
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


def _registered(backend: str, mgr: Any, frames: Any, info: Any,
                codes: tuple[str, ...]) -> list[Finding]:
    """The decode registers with ``mgr`` through the backend's real code (Mooncake's
    bootstrap thread reading ``frames``, NIXL's ``_add_remote_peer`` of ``info``; SGLang's
    own refusal rises unchanged and is not what is compared); the guard's findings under
    ``codes``."""
    with guard_logs_off(), contextlib.suppress(NotImplementedError, ValueError):
        if backend == "mooncake":
            bootstrap_threads(mgr, [frames])
        else:
            nixl.NixlKVManager._add_remote_peer(mgr, info)
    current = installation()
    assert current is not None
    found = [f for r in current.peers.reports() for f in r.findings]
    # what only check sees never appears at run time: no false asymmetry on a registration
    unseen = [f.code for f in found if f.code in CHECK_ONLY]
    assert not unseen, f"run-time findings only check may give: {unseen}"
    return [f for f in found if f.code in codes]


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
                return _registered(backend, mgr, frames, info, ("DSV4G045",))
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
                self.assertEqual([(f["code"], f["severity"], f["phase"], f["when"]) for f in checked],
                                 [(f["code"], f["severity"], f["phase"], f["when"])
                                  for f in map(Finding.to_dict, ran)])
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
        args = parse_launch("prefill", prefill, {})
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


# The pair conditions both places see (pd/conditions.py), and the ones only one sees:
# DSV4G059 (the per-tensor dimensions exist once the pools are built: run time only);
# DSV4G044 (the decode's first request: check only); DSV4G050/055-058 (the registration
# hook's, on values launch lines do not give: run time only); DSV4G020/021/023-025 (what
# SGLang never compares, pd/asymmetry.py: neither a registration nor /route carries the
# speculative settings, backend, model or KV layout, so the run time's endpoints have
# none of them: check only).
PAIR_CODES = ("DSV4G040", "DSV4G041", "DSV4G042", "DSV4G043", "DSV4G045", "DSV4G046")
CHECK_ONLY = ("DSV4G020", "DSV4G021", "DSV4G023", "DSV4G024", "DSV4G025")
EAGLE = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")


@st.composite
def launch_pairs(draw: Any) -> dict[str, Any]:
    """A prefill and a decode line over Mooncake or NIXL: gpt-oss (non-MLA, SWA state) with
    attention TP and PP drawn, or DeepSeek-V3 (MLA) with EAGLE on neither, one or both;
    HiSparse on a NIXL decode; the sampling-mask variable on either server. (NIXL
    with gpt-oss at different TP is drawn only with HiSparse, which NIXL refuses first: its
    registration of a decode of another TP needs a KV geometry the miniature manager does
    not have.)"""
    backend = draw(st.sampled_from(["mooncake", "nixl"]))
    gpt = draw(st.booleans())
    tps = draw(st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4])) if gpt
               else st.just((8, 8)))
    hisparse = backend == "nixl" and (draw(st.booleans()) or (gpt and tps[0] != tps[1]))
    pp = draw(st.sampled_from([1, 2])) if gpt else 1
    draft = "none" if gpt else draw(st.sampled_from(["none", "prefill", "decode", "both"]))
    masks = draw(st.sampled_from([(None, None), ("1", None), (None, "1")]))
    return {"backend": backend, "model": GPT_OSS if gpt else DSV3, "tps": tps, "pp": pp,
            "hisparse": hisparse, "draft": draft, "masks": masks}


class TestPairConditionsAgree(GuardTestCase):
    """The parity property: on drawn launch pairs, the pair conditions' findings from
    ``check`` equal the ones the registration wrappers report for the run-time objects
    SGLang builds from the same lines: the decode's registration sent by the release's own
    receiver and parsed by its ``from_zmq``, read by Mooncake's real bootstrap thread or
    NIXL's real ``_add_remote_peer``, with a prefill manager holding SGLang's resolution of
    the prefill line, its metadata buffers counted by SGLang's ``MetadataBuffers`` in each
    server's environment. Codes, severities and ``when`` are equal; every edit the run
    time offers is one ``check`` offers, in the same order, and the prefill's edits are
    equal (the decode's layout and lines are ``check``'s alone; DSV4G046's fixes are the
    speculative-decoding family's, derived from both lines, said without edits at run
    time)."""

    @settings(max_examples=fixed_examples(20), deadline=None, derandomize=True)
    @given(launch_pairs())
    # always: HiSparse with a decode-only draft on NIXL (DSV4G042), and gpt-oss with PP on
    # the prefill at another TP over Mooncake (DSV4G040 on every release)
    @example({"backend": "nixl", "model": DSV3, "tps": (8, 8), "pp": 1, "hisparse": True,
              "draft": "decode", "masks": (None, None)})
    @example({"backend": "mooncake", "model": GPT_OSS, "tps": (2, 1), "pp": 2,
              "hisparse": False, "draft": "none", "masks": (None, "1")})
    def test_check_and_registration_agree(self, pair: dict[str, Any]) -> None:
        published_configs(self)
        backend, (ptp, dtp) = pair["backend"], pair["tps"]
        name = mask_env()
        envs = [{name: v} if v else {} for v in pair["masks"]]
        extra = [f"--tp-size {ptp}" + (f" --pp-size {pair['pp']}" if pair["pp"] > 1 else ""),
                 f"--tp-size {dtp}" + (" --enable-hisparse" if pair["hisparse"] else "")]
        if pair["draft"] in ("prefill", "both"):
            extra[0] += f" {EAGLE}"
        if pair["draft"] in ("decode", "both"):
            extra[1] += f" {EAGLE}"
        lines = [server(role, pair["model"], x, backend=backend)
                 for role, x in zip(("prefill", "decode"), extra, strict=True)]
        more = [arg for role, env in zip(("prefill", "decode"), envs, strict=True)
                for k, v in env.items() for arg in (f"--{role}-env", f"{k}={v}")]
        _, doc = check_json(*lines, *more)
        checked = [f for f in doc["findings"] if f["code"] in PAIR_CODES]
        ran = self._runtime(pair, lines, envs)
        self.assertEqual([(f["code"], f["severity"], f["phase"], f["when"]) for f in checked],
                         [(f["code"], f["severity"], f["phase"], f["when"])
                          for f in map(Finding.to_dict, ran)])
        for at_check, at_run in zip(checked, ran, strict=True):
            if at_check["code"] == "DSV4G046":  # the speculative family's fixes: derived
                continue  # from both launch lines (check/fixing/flag_fixes.py), said at run time
            # PP 1 for a head-sliced transfer needs the decode's PP, which a registration
            # does not carry: at run time that fix is said without an edit
            offered = [_edits([f]) for f in at_check["fixes"] if f["field"] != "pp_size"]
            given = [{(e.server, e.name, e.value, e.remove, e.env) for e in f.edits}
                     for f in at_run.fixes if f.field != "pp_size"]
            self.assertEqual([f.edits for f in at_run.fixes if f.field == "pp_size"],
                             [() for f in at_check["fixes"] if f["field"] == "pp_size"])
            self.assertEqual([e for e in offered if e in given], [e for e in given if e])
            prefill_only = [e for e in offered if e and all(x[0] == "prefill" for x in e)]
            if at_check["code"] != "DSV4G045":  # the decode's variable: check's alone
                self.assertEqual([e for e in given if e and all(x[0] == "prefill" for x in e)],
                                 prefill_only)
        event(f"{backend}: {', '.join(f['code'] for f in checked) or 'accepted'}")

    def _runtime(self, pair: dict[str, Any], lines: list[str], envs: list[dict[str, str]]
                 ) -> list[Finding]:
        """The pair conditions' findings the guard reports at registration."""
        backend = pair["backend"]
        conn = mooncake if backend == "mooncake" else nixl
        args = [parse_launch(role, line, env) for role, line, env
                in zip(("prefill", "decode"), lines, envs, strict=True)]
        (attn, _), (dattn, _) = attention_tp(args[0]), attention_tp(args[1])
        counts = []
        for env in envs:
            with offline_env(env):
                counts.append(aux_buffer_count(False, None))
        gpt = pair["model"] == GPT_OSS
        speculative = [bool(a.get("speculative_algorithm")) for a in args]
        kinds = (("DRAM" if pair["hisparse"] else "VRAM",) * 2 + ("VRAM",) * 2 * speculative[1])
        peer = f"parity-{len(self._seen)}"
        self._seen.append(peer)
        with mock.patch.dict(os.environ, _environ(envs[0], mask_env()), clear=True):
            sglang_dsv4_guard.install("on", load_entry_points=False)
            try:
                frames, info = peers_real.registration(conn, backend, tp=dattn, kinds=kinds,
                                                       aux=counts[1], name=peer)
                mgr = peers_real.prefill(
                    conn, backend, tp=attn, mla=not gpt, aux=counts[0],
                    regions=4 if speculative[0] else 2,
                    state_types=[conn.StateType("swa")] if gpt else [],
                    speculative=args[0].get("speculative_algorithm"))
                mgr.server_args, mgr.pp_size = args[0].server_args, pair["pp"]
                mgr.kv_args.swa_kv_cache_layout = "nhd"  # the plain SWA pool's
                mgr.prep_handles_segment_src = {}  # NIXL 0.5.23's mixed-memory handles
                return _registered(backend, mgr, frames, info, PAIR_CODES)
            finally:
                with guard_logs_off():
                    sglang_dsv4_guard.uninstall()

    def setUp(self) -> None:
        super().setUp()
        self._seen: list[str] = []


if __name__ == "__main__":
    unittest.main()
