"""``sglang-dsv4-guard check``: predictions from two launch command lines, on the
installed release's own parser, ModelConfig, attention-TP function and pools."""

from __future__ import annotations

import unittest

from check_helpers import (
    DSV3,
    DSV4,
    DSV4_WINDOW64,
    GPT_OSS,
    LLAMA,
    check_json,
    codes,
    run_cli,
    server,
)
from helpers import GuardTestCase, sglang_release
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=44, suite="stage-a-test-cpu")

# DeepSeek-V4 takes EAGLE with top-k 1 (SGLang's resolution refuses NEXTN for it).
NEXTN = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")


class TestMoriTp(GuardTestCase):
    """DSV4G006 only for MORI, a non-MLA model with swa state and differing attention TP."""

    def test_g006_gpt_oss_attention_tp_differs(self) -> None:
        """gpt-oss (MHA, hybrid SWA) over MORI, prefill TP 8 and decode TP 4: an error,
        exit 1, with both attention TP sizes."""
        status, doc = check_json(server("prefill", GPT_OSS, "--tp-size 8"),
                                 server("decode", GPT_OSS, "--tp-size 4"))
        self.assertEqual(status, 1)
        self.assertEqual(codes(doc), ["DSV4G006"])
        values = {(o["role"], o["name"]): o["value"] for o in doc["findings"][0]["observations"]}
        self.assertEqual(values[("prefill", "attn_tp_size")], 8)
        self.assertEqual(values[("decode", "decode_tp_size")], 4)
        self.assertEqual(doc["derived"]["prefill"]["swa_state"], True)
        self.assertEqual(doc["derived"]["prefill"]["mla_pool"], False)

    def test_g006_deprecated_dp_attention_resolved_by_the_release(self) -> None:
        """``--tp-size 8 --dp-size 2 --enable-dp-attention`` is attention TP 4 on every release
        (0.5.22+ rewrite it to --attn-dp-size): equal to a decode at TP 4, not to one at 8."""
        prefill = server("prefill", GPT_OSS, "--tp-size 8 --dp-size 2 --enable-dp-attention")
        status, doc = check_json(prefill, server("decode", GPT_OSS, "--tp-size 4"))
        self.assertEqual((status, codes(doc)), (0, []))
        self.assertEqual(doc["derived"]["prefill"]["attn_tp_size"], 4)
        deprecated = "--enable-dp-attention" in doc["derived"]["prefill"]["deprecated_flags"]
        self.assertEqual(deprecated, sglang_release() >= Version("0.5.22"))
        status, doc = check_json(prefill, server("decode", GPT_OSS, "--tp-size 8"))
        self.assertEqual((status, codes(doc)), (1, ["DSV4G006"]))
        typed = {o["name"]: o["value"] for o in doc["findings"][0]["observations"]
                 if o["role"] == "prefill"}
        self.assertEqual((typed["attn_tp_size"], typed["dp_size"], typed["enable_dp_attention"]),
                         (4, 2, True))

    def test_attn_dp_size_where_the_release_has_it(self) -> None:
        """0.5.22+ take ``--attn-dp-size``; older releases refuse it with exit 2 naming it."""
        prefill = server("prefill", GPT_OSS, "--tp-size 8 --attn-dp-size 2")
        status, out, err = run_cli("check", "--prefill", prefill,
                                   "--decode", server("decode", GPT_OSS, "--tp-size 4"))
        if sglang_release() >= Version("0.5.22"):
            self.assertEqual(status, 0, err)
            self.assertIn("attention TP 4", out)
        else:
            self.assertEqual(status, 2)
            self.assertIn("--attn-dp-size", err)

    def test_mla_and_dense_and_dsv4_never_g006(self) -> None:
        """An MLA model, a dense model without SWA and DeepSeek-V4 (an MLA pool to SGLang)
        pass over MORI with different TP sizes."""
        for model in (DSV3, LLAMA, DSV4):
            with self.subTest(model=model):
                status, doc = check_json(server("prefill", model, "--tp-size 8"),
                                         server("decode", model, "--tp-size 2"))
                self.assertEqual((status, codes(doc)), (0, []))

    def test_other_backend_never_g006_and_says_so(self) -> None:
        """The same gpt-oss TP mismatch over Mooncake is not DSV4G006: Mooncake's own rule
        is judged instead (DSV4G040 before 0.5.22, head-sliced and accepted from 0.5.22)."""
        status, doc = check_json(server("prefill", GPT_OSS, "--tp-size 8", "mooncake"),
                                 server("decode", GPT_OSS, "--tp-size 4", "mooncake"))
        sliced = sglang_release() >= Version("0.5.22")
        self.assertEqual((status, codes(doc)), (0, []) if sliced else (1, ["DSV4G040"]))


class TestDeepSeekV4State(GuardTestCase):
    """SGLang's real setup_state_kv_args on miniature real pools of each server."""

    def test_stock_nextn_is_accepted_and_unknowns_named(self) -> None:
        """DeepSeek-V4 with NEXTN on both servers: SGLang accepts both pools; the mapping
        identity (DSV4G004) is listed as not knowable from flags."""
        status, doc = check_json(server("prefill", DSV4, NEXTN), server("decode", DSV4, NEXTN))
        self.assertEqual((status, codes(doc)), (0, []))
        self.assertEqual([r["sglang_error"] for r in doc["state_check_runs"]], [None, None])
        self.assertEqual(doc["state_check_runs"][0]["draft_compress_ratios"], [0])
        self.assertTrue(any(u.startswith("DSV4G004") for u in doc["unknowns"]))
        self.assertEqual(doc["derived"]["decode"]["page_size"], 256)

    def test_g005_draft_window_differs(self) -> None:
        """A draft checkpoint with sliding_window 64 under a target with 128: SGLang's real
        check rejects each server's pools; one DSV4G005 per server, exit 1."""
        draft = f"{NEXTN} --speculative-draft-model-path {DSV4_WINDOW64}"
        status, doc = check_json(server("prefill", DSV4, draft), server("decode", DSV4, draft))
        self.assertEqual(status, 1)
        self.assertEqual(codes(doc), ["DSV4G005", "DSV4G005"])
        self.assertEqual([f["subject"].split(":")[0] for f in doc["findings"]],
                         ["prefill server", "decode server"])
        for run in doc["state_check_runs"]:
            self.assertTrue(run["sglang_error"].startswith("DSV4 target and draft pools must "
                                                           "share"), run)

    def test_pools_get_the_resolved_draft_token_count(self) -> None:
        """Each server's pools are built under its own resolved ServerArgs and get
        ``online_mtp_max_draft_tokens`` as SGLang's KV-cache configurator passes it: 4 on the
        prefill, 2 on the decode (not the constructor's default 0)."""
        two = NEXTN.replace("--speculative-num-draft-tokens 4",
                            "--speculative-num-draft-tokens 2").replace(
            "--speculative-num-steps 3", "--speculative-num-steps 1")
        _, doc = check_json(server("prefill", DSV4, NEXTN), server("decode", DSV4, two))
        counts = {r["server"]: r["online_mtp_max_draft_tokens"]
                  for r in doc["state_check_runs"]}
        self.assertEqual(counts, {"prefill": 4, "decode": 2})
        self.assertEqual([r["sglang_error"] for r in doc["state_check_runs"]], [None, None])

    def test_no_draft_no_state_check(self) -> None:
        """Without speculative decoding SGLang's DSV4 block does not run, nor do the pools."""
        status, doc = check_json(server("prefill", DSV4), server("decode", DSV4))
        self.assertEqual((status, doc["state_check_runs"]), (0, []))


class TestResolution(GuardTestCase):
    """The release's own ServerArgs resolution runs on each server's flags."""

    def test_g026_nextn_refused_for_deepseek_v4(self) -> None:
        """SGLang refuses ``--speculative-algorithm NEXTN`` for DeepSeek-V4 during resolution:
        DSV4G026 quotes its message, exit 1."""
        status, doc = check_json(server("prefill", DSV4, "--speculative-algorithm NEXTN"),
                                 server("decode", DSV4))
        self.assertEqual(status, 1)
        self.assertEqual(codes(doc)[0], "DSV4G026")
        refusal = doc["findings"][0]["observations"][0]["value"]
        self.assertIn("speculative algorithm", refusal)
        self.assertEqual(doc["findings"][0]["subject"], "prefill server flags")

    def test_dsv4_page_size_from_the_release(self) -> None:
        """DeepSeek-V4's page size is what the release's resolution makes it (256), whatever
        --page-size says; so 128 against 256 is no asymmetry."""
        status, doc = check_json(server("prefill", DSV4, "--page-size 128"), server("decode", DSV4))
        self.assertEqual((status, codes(doc)), (0, []))
        self.assertEqual(doc["derived"]["prefill"]["page_size"], 256)
        self.assertEqual(doc["derived"]["prefill"]["page_size_source"],
                         "SGLang's resolution of the flags")


    def test_resolved_as_a_gpu_by_default(self) -> None:
        """DSpark refuses any device but CUDA, NPU or XPU during resolution; a line without
        --device is resolved as cuda (a PD server's GPU), so the pair is accepted, with no
        DSV4G026 and no refusal in ``unknowns``."""
        dspark = f"--speculative-algorithm DSPARK --speculative-draft-model-path {DSV4}"
        status, doc = check_json(server("prefill", DSV4, dspark), server("decode", DSV4, dspark))
        self.assertEqual((status, codes(doc)), (0, []))
        self.assertEqual([u for u in doc["unknowns"] if "failed on this machine" in u], [])
        self.assertIn("as --device cuda", doc["derived"]["prefill"]["parsed_by"])

    def test_refusal_on_the_servers_own_device_is_g026(self) -> None:
        """The same DSpark servers launched with ``--device cpu`` are refused by SGLang on
        that device: DSV4G026 for each, quoting SGLang's message."""
        dspark = (f"--speculative-algorithm DSPARK --speculative-draft-model-path {DSV4} "
                  "--device cpu")
        status, doc = check_json(server("prefill", DSV4, dspark), server("decode", DSV4, dspark))
        self.assertEqual((status, codes(doc)), (1, ["DSV4G026", "DSV4G026"]))
        self.assertIn("CUDA", doc["findings"][0]["observations"][0]["value"])

    def test_cpu_defaults_never_make_a_gpu_pair_broken(self) -> None:
        """A Llama pair with ``--enable-deterministic-inference`` (on CPU SGLang picks
        intel_amx and then refuses it) is healthy on the servers' GPU: exit 0, no DSV4G026."""
        flags = "--enable-deterministic-inference"
        status, doc = check_json(server("prefill", LLAMA, flags, "mooncake"),
                                 server("decode", LLAMA, flags, "mooncake"))
        self.assertEqual((status, codes(doc)), (0, []))

    def test_modelscope_path_is_an_unknown_not_a_download(self) -> None:
        """``SGLANG_USE_MODELSCOPE=1`` with a Hub-style ``--tokenizer-path`` would make SGLang
        download it from ModelScope (a package missing here, too): not DSV4G026; an
        ``unknowns`` line names the flag, the path and the variable."""
        status, doc = check_json(
            server("prefill", LLAMA, "--tokenizer-path someorg/some-tokenizer", "mooncake"),
            server("decode", LLAMA, backend="mooncake"),
            "--prefill-env", "SGLANG_USE_MODELSCOPE=1")
        self.assertEqual((status, codes(doc)), (0, []))
        notes = [u for u in doc["unknowns"] if "SGLANG_USE_MODELSCOPE" in u]
        self.assertEqual(len(notes), 1, doc["unknowns"])
        self.assertTrue(notes[0].startswith("prefill: --tokenizer-path 'someorg/some-tokenizer'"),
                        notes[0])

    def test_local_auto_map_without_its_code_is_an_unknown(self) -> None:
        """DeepSeek-V3's config.json with its local ``auto_map``
        (``configuration_deepseek.DeepseekV3Config``) copied alone, with
        ``--trust-remote-code``: read with the release's class, exit 0, and an ``unknowns``
        line per server naming the missing file."""
        import json
        import shutil
        import tempfile
        from pathlib import Path

        root = Path(tempfile.mkdtemp(prefix="dsv4-local-auto-map-"))
        self.addCleanup(shutil.rmtree, root, True)
        config = json.loads((Path(DSV3) / "config.json").read_text())
        config["auto_map"] = {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                              "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}
        (root / "config.json").write_text(json.dumps(config))
        status, doc = check_json(server("prefill", str(root), "--trust-remote-code"),
                                 server("decode", str(root), "--trust-remote-code"))
        self.assertEqual(status, 0, doc["findings"])
        notes = [u for u in doc["unknowns"] if "configuration_deepseek.py" in u]
        self.assertEqual(len(notes), 2, doc["unknowns"])

    def test_machine_cause_names_what_this_machine_lacks(self) -> None:
        """A refusal this machine caused is told apart from the flags' own: a missing package
        (named), the network, a GPU probe on a GPU server; a refusal about the flags, or a
        device refusal for a CPU server, is the server's."""
        from sglang_dsv4_guard.check.offline.parse import machine_cause

        missing = ModuleNotFoundError("No module named 'modelscope'", name="modelscope")
        self.assertIn("'modelscope' is not installed", machine_cause(missing, "cuda") or "")
        offline = OSError("We couldn't connect to 'https://huggingface.co' to load the files")
        self.assertIn("network", machine_cause(offline, "cuda") or "")
        probe = RuntimeError("Found no NVIDIA driver on your system.")
        self.assertIn("GPU probe", machine_cause(probe, "cuda") or "")
        self.assertIsNone(machine_cause(probe, "cpu"))
        self.assertIsNone(machine_cause(ValueError("speculative algorithm NEXTN is not "
                                                   "supported"), "cuda"))

    def test_missing_package_without_a_module_name_quotes_the_message(self) -> None:
        """An ImportError that names no module (SGLang's ``torch_npu is required when run on
        npu device.``) is a missing package, quoted as SGLang says it."""
        from sglang_dsv4_guard.check.offline.parse import machine_cause

        exc = ImportError("torch_npu is required when run on npu device.")
        self.assertEqual(machine_cause(exc, "npu"), "a package is missing on this machine: "
                                                    "torch_npu is required when run on npu "
                                                    "device.")

    def test_model_config_from_the_resolved_flags(self) -> None:
        """``--json-model-override-args`` reaches the model as SGLang builds it
        (``ModelConfig.from_server_args``): a sliding window overridden to 64 is what the
        check derives for the target and the draft."""
        override = "--json-model-override-args '{\"sliding_window\": 64}'"
        _, doc = check_json(server("prefill", DSV4, f"{NEXTN} {override}"),
                            server("decode", DSV4, NEXTN))
        prefill = doc["derived"]["prefill"]
        self.assertEqual((prefill["model"]["sliding_window"],
                          prefill["draft_model"]["sliding_window"]), (64, 64))
        self.assertEqual(doc["derived"]["decode"]["model"]["sliding_window"], 128)
        self.assertTrue(prefill["model"]["dsv4"])

    def test_launcher_prefixes_are_dropped(self) -> None:
        """``python3``, ``/usr/bin/python3.11 -m sglang.launch_server`` and ``sglang serve``
        prefixes are stripped whole: the servers read as without them."""
        for prefix in ("python -m sglang.launch_server", "python3 -m sglang.launch_server",
                       "/usr/bin/python3.11 -m sglang.launch_server", "-m sglang.launch_server",
                       "sglang serve", "/opt/venv/bin/sglang serve"):
            with self.subTest(prefix=prefix):
                status, doc = check_json(f"{prefix} {server('prefill', GPT_OSS, '--tp-size 8')}",
                                         server("decode", GPT_OSS, "--tp-size 4"))
                self.assertEqual((status, codes(doc)), (1, ["DSV4G006"]))
                self.assertEqual(doc["derived"]["prefill"]["attn_tp_size"], 8)


class TestAsymmetries(GuardTestCase):
    """Prefill/decode differences the runtime checks never see: warnings, exit 0 (but
    different transfer backends, an error)."""

    def test_g020_speculative_on_one_side_only(self) -> None:
        """NEXTN on the prefill only is DSV4G020."""
        status, doc = check_json(server("prefill", DSV4, NEXTN), server("decode", DSV4))
        self.assertEqual((status, codes(doc)), (0, ["DSV4G020"]))
        self.assertEqual(doc["findings"][0]["severity"], "warning")

    def test_g021_draft_token_counts_differ(self) -> None:
        """4 draft tokens against 2 is DSV4G021 with both counts."""
        decode = server("decode", DSV4, "--speculative-algorithm EAGLE --speculative-eagle-topk 1 "
                                        "--speculative-num-steps 1 --speculative-num-draft-tokens 2")
        status, doc = check_json(server("prefill", DSV4, NEXTN), decode)
        self.assertEqual((status, codes(doc)), (0, ["DSV4G021"]))
        tokens = [o["value"] for o in doc["findings"][0]["observations"]
                  if o["name"] == "speculative_num_draft_tokens"]
        self.assertEqual(tokens, [4, 2])

    def test_g022_page_sizes_differ(self) -> None:
        """Llama at page size 16 against 32 is DSV4G022, an error: decode's first contact
        with the prefill raises on it (exit 1)."""
        status, doc = check_json(server("prefill", LLAMA, "--page-size 16"),
                                 server("decode", LLAMA, "--page-size 32"))
        self.assertEqual((status, codes(doc)), (1, ["DSV4G022"]))

    def test_g023_transfer_backends_differ(self) -> None:
        """Mooncake against NIXL is DSV4G023, an error (the pair cannot connect): exit 1."""
        status, doc = check_json(server("prefill", LLAMA, backend="mooncake"),
                                 server("decode", LLAMA, backend="nixl"))
        self.assertEqual((status, codes(doc)), (1, ["DSV4G023"]))
        self.assertEqual(doc["findings"][0]["severity"], "error")

    def test_g024_models_differ(self) -> None:
        """Llama on the prefill and gpt-oss on the decode is DSV4G024 naming both."""
        status, doc = check_json(server("prefill", LLAMA), server("decode", GPT_OSS))
        self.assertEqual((status, codes(doc)), (0, ["DSV4G024"]))
        archs = [o["value"] for o in doc["findings"][0]["observations"]
                 if o["name"] == "architecture"]
        self.assertEqual(archs, ["LlamaForCausalLM", "GptOssForCausalLM"])

    def test_g025_unified_kv_on_one_side(self) -> None:
        """SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton for the decode over MORI (ROCm) only
        is DSV4G025; the unified ring geometry is listed as not predicted."""
        status, doc = check_json(server("prefill", DSV4, NEXTN), server("decode", DSV4, NEXTN),
                                 "--decode-env", "SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton")
        self.assertEqual((status, codes(doc)), (0, ["DSV4G025"]))
        self.assertEqual(doc["derived"]["decode"]["unified_kv"], True)
        self.assertTrue(any(u.startswith("DSV4G003 (decode)") for u in doc["unknowns"]))

    def test_unified_kv_env_without_mori_is_an_unknown(self) -> None:
        """SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton over Mooncake: the check cannot tell
        ROCm from flags, so it says in ``unknowns`` that it built paged pools."""
        env = "SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton"
        _, doc = check_json(server("prefill", DSV4, NEXTN, backend="mooncake"),
                            server("decode", DSV4, NEXTN, backend="mooncake"),
                            "--prefill-env", env, "--decode-env", env)
        notes = [u for u in doc["unknowns"] if "unified_kv_triton selects" in u]
        self.assertEqual([n.split(":")[0] for n in notes], ["prefill", "decode"])
        self.assertIn("mooncake", notes[0])

    def test_same_env_both_sides_no_g025(self) -> None:
        """The same unified-KV setting on both servers is no finding."""
        env = "SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton"
        status, doc = check_json(server("prefill", DSV4), server("decode", DSV4),
                                 "--prefill-env", env, "--decode-env", env)
        self.assertEqual((status, codes(doc)), (0, []))


class TestOutput(GuardTestCase):
    """The text and JSON forms carry the derived values of both servers."""

    def test_json_derived_fields(self) -> None:
        """Every derived field the issue asks for is in the JSON, per side."""
        _, doc = check_json(server("prefill", DSV4, NEXTN), server("decode", DSV4, NEXTN))
        for role in ("prefill", "decode"):
            derived = doc["derived"][role]
            for key in ("attn_tp_size", "mla_pool", "hybrid_swa", "dsv4", "page_size",
                        "speculative_algorithm", "speculative_num_draft_tokens",
                        "transfer_backend"):
                self.assertIn(key, derived)
            self.assertEqual(derived["dsv4"], True)
            self.assertEqual(derived["model"]["compress_ratios"], [0, 4, 128, 4, 0])
            self.assertEqual(derived["draft_model"]["architecture"],
                             "DeepseekV4ForCausalLMNextN")

    def test_text_names_findings_and_verdict(self) -> None:
        """The text form shows each side, the finding with its fix, and the counts."""
        status, out, _ = run_cli("check", "--prefill", server("prefill", GPT_OSS, "--tp-size 8"),
                                 "--decode", server("decode", GPT_OSS, "--tp-size 4"))
        self.assertEqual(status, 1)
        self.assertIn("prefill: ", out)
        self.assertIn("[DSV4G006] error:", out)
        self.assertIn("fix: ", out)
        self.assertTrue(out.rstrip().endswith("check: 1 error(s), 0 warning(s)"))

    def test_every_code_explained(self) -> None:
        """Every catalogued code, the new check codes included, has an ``explain`` entry
        that says how its fix is derived (its row in docs/codes.md is checked by
        test_docs)."""
        from sglang_dsv4_guard.codes import CODES

        for code in CODES:
            with self.subTest(code=code):
                status, out, _ = run_cli("explain", code)
                self.assertEqual(status, 0)
                self.assertIn("how the fix is derived: ", out)

    def test_code_with_spaces_or_lower_case_is_known(self) -> None:
        """A code typed in lower case or pasted with spaces around is the code's entry."""
        for typed in ("DSV4G004 ", " dsv4g004", "\tDSV4G004\n"):
            with self.subTest(typed=typed):
                status, out, err = run_cli("explain", typed)
                self.assertEqual((status, err), (0, ""))
                self.assertTrue(out.startswith("DSV4G004: "), out[:80])

    def test_unknown_code_is_named_cut(self) -> None:
        """An unknown code exits 2 naming it, cut to a line however long it was typed."""
        for typed in ("DSV4G999", "x" * 100_000):
            with self.subTest(length=len(typed)):
                status, out, err = run_cli("explain", typed)
                self.assertEqual((status, out), (2, ""))
                self.assertTrue(err.startswith(f"unknown code {typed[:8]!r}"[:-1]), err[:80])
                self.assertLess(len(err), 1000)
                self.assertIn("known codes: DSV4G001, ", err)


if __name__ == "__main__":
    unittest.main()
