"""``check`` derives the state types each server's KV pool registers, as the installed
release's real ``setup_state_kv_args`` registers them: for plain MHA (llama), MLA
(DeepSeek-V3), hybrid SWA (gpt-oss), MiniMax-M3 sparse (its ``MiniMaxSparseKVPool``, with
DSV4G041 then judged on a pair with different attention TP) and DeepSeek-V4 (read from its
pool run); pools it does not build (block-scaled KV dtypes, hybrid linear attention) stay
unknown."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unittest
from typing import Any

from check_helpers import DATA, DSV3, DSV4, GPT_OSS, LLAMA, check_json, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=35, suite="stage-a-test-cpu")

# DeepSeek-V4 takes EAGLE with top-k 1 (SGLang's resolution refuses NEXTN for it).
NEXTN = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")
# MiniMax-M3 sparse: layers 1 and 3 sparse, both without index value (K-only).
MINIMAX = os.path.join(DATA, "minimax_m3")
# A hybrid linear-attention model (Qwen3-Next): a Mamba-like state pool, not built by check.
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "num_hidden_layers": 4, "full_attention_interval": 4, "linear_num_value_heads": 4,
    "linear_num_key_heads": 2, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4, "intermediate_size": 512, "vocab_size": 1024,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128, "decoder_sparse_step": 1,
    "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6,
}


def decode_of(model: str, extra: str = "", backend: str = "nixl") -> tuple[Any, Any]:
    """The decode's contract endpoint of a P TP2 / D TP4 pair of ``model`` (its pool run
    made first, as check makes it), and its derived side."""
    from sglang_dsv4_guard.check.predict import run_check
    from sglang_dsv4_guard.check.server.endpoint_values import endpoint_of

    result = run_check(server("prefill", model, f"--tp-size 2 {extra}", backend),
                       server("decode", model, f"--tp-size 4 {extra}", backend))
    return endpoint_of(result.decode), result.decode


def endpoint(model: str, extra: str = "", backend: str = "nixl") -> Any:
    """The decode's contract endpoint of :func:`decode_of`."""
    return decode_of(model, extra, backend)[0]


def real_state_types(pool: Any, draft: Any = None) -> tuple[str, ...]:
    """What the release's real ``setup_state_kv_args`` registers for ``pool``."""
    from sglang.srt.disaggregation.utils import setup_state_kv_args

    from sglang_dsv4_guard.samples import new_kv_args

    kv_args = new_kv_args()
    setup_state_kv_args(kv_args, pool, draft)
    return tuple(str(getattr(t, "value", t)) for t in kv_args.state_types)


def unknown_state_lines(doc: dict[str, Any]) -> list[str]:
    """The unknowns that say a server's state types are not known."""
    return [u for u in doc["unknowns"]
            if "state types" in u and ("not judged" in u or "not derived" in u)]


def block_scaled_dtypes() -> list[str]:
    """The release's MXFP8 and FP4 ``--kv-cache-dtype`` choices (its own parser's)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    choices = parser._option_string_actions["--kv-cache-dtype"].choices or ()
    found = [c for c in choices if "mxfp" in c or "fp4" in c]
    assert found, choices
    return found


def qwen3_next_dir(test: unittest.TestCase) -> str:
    path = tempfile.mkdtemp(prefix="qwen3_next_")
    test.addCleanup(shutil.rmtree, path, ignore_errors=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(QWEN3_NEXT, fh)
    return path


class TestParity(GuardTestCase):
    """The derived state types equal the real function's on a pool SGLang's constructor
    builds in the test, at the model's own dimensions."""

    def assert_parity(self, model: str, pool: Any) -> None:
        """check's state types for ``model`` are the real function's on ``pool``, and
        their source names ``pool``'s class."""
        ep = endpoint(model)
        self.assertEqual(tuple(ep.get("state_types")), real_state_types(pool))
        self.assertIn(type(pool).__name__, ep.values["state_types"].source)

    def test_plain_mha_llama(self) -> None:
        """llama: an ``MHATokenToKVPool`` with the model's heads and head size registers
        what check derived (no state), with a source naming the pool built."""
        import torch
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        self.assert_parity(LLAMA, MHATokenToKVPool(
            256, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=64, layer_num=4,
            device="cpu", enable_memory_saver=False))

    def test_mla_deepseek_v3(self) -> None:
        """DeepSeek-V3: an ``MLATokenToKVPool`` with its kv_lora_rank 512 and rope head 64
        registers what check derived."""
        import torch
        from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

        self.assert_parity(DSV3, MLATokenToKVPool(
            256, page_size=1, dtype=torch.bfloat16, kv_lora_rank=512, qk_rope_head_dim=64,
            layer_num=3, device="cpu", enable_memory_saver=False))

    def test_hybrid_swa_gpt_oss(self) -> None:
        """gpt-oss: the real function on an ``SWAKVPool`` registers what check derived."""
        from sglang_dsv4_guard.check.server.state_types import miniature_pool

        ep = endpoint(GPT_OSS)
        self.assertEqual(tuple(ep.get("state_types")), real_state_types(miniature_pool("swa")))
        self.assertIn("swa", ep.get("state_types"))

    def test_deepseek_v4_read_from_its_pool_run(self) -> None:
        """DeepSeek-V4 with a draft: the state types are those the real function registers
        on target and draft ``DeepSeekV4TokenToKVPool``\\ s built here by its constructor
        (the model's ratios 0/4/128/4, a SWA-only draft layer, one shared mapping)."""
        import torch
        from sglang.srt.runtime_context import get_context

        ep, side = decode_of(DSV4, NEXTN)
        override = get_context().override_server_args()
        override.install()  # the constructor reads the server's published ServerArgs
        try:
            get_context().set_server_args(side.args.server_args)
            target, draft = _dsv4_pool([0, 4, 128, 4], False), _dsv4_pool([0], True)
        finally:
            override.restore()
        mapping = torch.arange(2049, dtype=torch.int64)
        target.register_mapping(mapping)
        draft.register_mapping(mapping)
        self.assertEqual(tuple(ep.get("state_types")), real_state_types(target, draft))
        self.assertIn("DeepSeekV4TokenToKVPool", ep.values["state_types"].source)


def _dsv4_pool(ratios: list[int], draft: bool) -> Any:
    import inspect

    import torch
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

    wanted = dict(max_num_reqs=2, swa_size=2048, c4_size=2048, c128_size=512,
                  c4_state_pool_size=4, c128_state_pool_size=4, page_size=256,
                  swa_page_size=256, dtype=torch.float8_e4m3fn, c4_state_dtype=torch.float32,
                  c128_state_dtype=torch.float32, qk_nope_head_dim=448, qk_rope_head_dim=64,
                  indexer_head_dim=128, layer_num=len(ratios), device="cpu",
                  enable_memory_saver=False, compression_ratios=ratios, sliding_window=128,
                  is_draft_worker=draft, online_mtp_max_draft_tokens=4)
    params = inspect.signature(DeepSeekV4TokenToKVPool.__init__).parameters
    return DeepSeekV4TokenToKVPool(**{k: v for k, v in wanted.items() if k in params})


class TestPairsSGLangAccepts(GuardTestCase):
    """Pairs with different TP that SGLang accepts: no finding, no unknown state types."""

    def test_llama_tp2_tp4_nixl(self) -> None:
        """llama P TP2 / D TP4 over NIXL: exit 0, no finding, no "not judged" line."""
        status, doc = check_json(server("prefill", LLAMA, "--tp-size 2", "nixl"),
                                 server("decode", LLAMA, "--tp-size 4", "nixl"))
        self.assertEqual((status, doc["findings"], unknown_state_lines(doc)), (0, [], []))

    def test_deepseek_v3_tp2_tp4_nixl(self) -> None:
        """DeepSeek-V3 P TP2 / D TP4 over NIXL: exit 0, no finding, no unknown state."""
        status, doc = check_json(server("prefill", DSV3, "--tp-size 2", "nixl"),
                                 server("decode", DSV3, "--tp-size 4", "nixl"))
        self.assertEqual((status, doc["findings"], unknown_state_lines(doc)), (0, [], []))


def minimax_pool() -> Any:
    """The ``MiniMaxSparseKVPool`` SGLang's configurator builds for MINIMAX at TP 4 (two KV
    heads of 128), its layers read by SGLang's own helpers, built here on CPU."""
    import inspect

    import torch
    from sglang.srt.configs import model_config as mc
    from sglang.srt.mem_cache.memory_pool import MiniMaxSparseKVPool
    from transformers import PretrainedConfig

    with open(os.path.join(MINIMAX, "config.json"), encoding="utf-8") as fh:
        hf = PretrainedConfig(**json.load(fh))
    sparse_cfg = mc.get_minimax_sparse_attention_config(hf)
    dense, sparse = mc.get_minimax_sparse_layer_ids(sparse_cfg)
    wanted = dict(size=256, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=128,
                  idx_head_dim=128, dense_layer_ids=dense, sparse_layer_ids=sparse,
                  device="cpu", enable_memory_saver=False, start_layer=0, end_layer=4,
                  disable_value_sparse_layer_ids=mc.get_minimax_sparse_disable_value_layer_ids(
                      sparse_cfg))
    params = inspect.signature(MiniMaxSparseKVPool.__init__).parameters
    return MiniMaxSparseKVPool(**{k: v for k, v in wanted.items() if k in params})


def first_contact_refuses_minimax() -> bool:
    """Whether the release's own try_ensure_parallel_info compares MiniMax TP (0.5.23)."""
    import inspect

    from sglang.srt.disaggregation.common.conn import CommonKVManager

    return "MiniMax sparse PD requires matching attention TP" in inspect.getsource(
        CommonKVManager.try_ensure_parallel_info)


def g041(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == "DSV4G041"]


class TestMiniMaxSparse(GuardTestCase):
    """MiniMax-M3 sparse (``MiniMaxM3SparseForCausalLM``, K-only sparse layers): check
    builds its ``MiniMaxSparseKVPool`` and judges DSV4G041, on every release."""

    def test_state_types_parity(self) -> None:
        """The state types check derives are the real function's on the pool SGLang's
        constructor builds at the model's dimensions: the MiniMax index state among them."""
        ep = endpoint(MINIMAX, backend="mooncake")
        self.assertEqual(tuple(ep.get("state_types")), real_state_types(minimax_pool()))
        self.assertIn("minimax_index_k", ep.get("state_types"))
        self.assertIn("MiniMaxSparseKVPool", ep.values["state_types"].source)

    def test_different_tp_is_an_error(self) -> None:
        """P TP2 / D TP4 over Mooncake and NIXL: one DSV4G041 error, at decode's first
        contact where the release's try_ensure_parallel_info compares it (0.5.23), else
        per request in the prefill's transfer; no "not judged" line."""
        first = first_contact_refuses_minimax()
        for backend in ("mooncake", "nixl"):
            with self.subTest(backend=backend):
                status, doc = check_json(server("prefill", MINIMAX, "--tp-size 2", backend),
                                         server("decode", MINIMAX, "--tp-size 4", backend))
                [found] = g041(doc)
                self.assertEqual((status, found["severity"]), (1, "error"))
                self.assertIn("first contact" if first else "per request", found["when"])
                self.assertIn("MiniMax", found["host_message"])
                self.assertEqual(unknown_state_lines(doc), [])
                self.assertFalse([u for u in doc["unknowns"] if "DSV4G04" in u])

    def test_equal_tp_is_accepted(self) -> None:
        """Near miss: the same attention TP on both: exit 0, no finding, nothing unknown."""
        status, doc = check_json(server("prefill", MINIMAX, "--tp-size 4", "mooncake"),
                                 server("decode", MINIMAX, "--tp-size 4", "mooncake"))
        self.assertEqual((status, doc["findings"], unknown_state_lines(doc)), (0, [], []))

    def test_index_value_layers_stop_both_servers(self) -> None:
        """Sparse layers with index value (``sparse_disable_index_value`` all 0): SGLang's
        own setup_state_kv_args refuses that pool ("only K-only sparse layers are") on
        every machine: DSV4G049 on both servers, at start-up, with no flag fix; equal TP."""
        path = tempfile.mkdtemp(prefix="minimax_kv_")
        self.addCleanup(shutil.rmtree, path, ignore_errors=True)
        with open(os.path.join(MINIMAX, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
        config["sparse_attention_config"]["sparse_disable_index_value"] = [0, 0, 0, 0]
        with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(config, fh)
        status, doc = check_json(server("prefill", path, "--tp-size 4", "mooncake"),
                                 server("decode", path, "--tp-size 4", "mooncake"))
        found = [f for f in doc["findings"] if f["code"] == "DSV4G049"]
        self.assertEqual(status, 1)
        self.assertEqual(sorted(f["subject"].split()[0] for f in found), ["decode", "prefill"])
        for finding in found:
            self.assertIn("only K-only sparse layers are", finding["host_message"])
            self.assertIn("start-up", finding["when"])
            self.assertEqual(finding["fixes"], [])

    def test_the_fixed_lines_pass_check(self) -> None:
        """``check --fix``: every DSV4G041 fix is proven, the corrected pair exits 0."""
        _, doc = check_json(server("prefill", MINIMAX, "--tp-size 2", "mooncake"),
                            server("decode", MINIMAX, "--tp-size 4", "mooncake"), "--fix")
        fixes = [f for x in g041(doc) for f in x["fixes"]]
        self.assertTrue(fixes and all(f["proven"] for f in fixes), fixes)
        status, again = check_json(doc["fixed"]["prefill"], doc["fixed"]["decode"])
        self.assertEqual((status, again["findings"]), (0, []))


class TestStaysUnknown(GuardTestCase):
    """Pools check does not build keep their state types unknown (never "no state")."""

    def test_block_scaled_kv_dtype(self) -> None:
        """llama with an MXFP8 or FP4 KV cache dtype: its own pool class (block scales),
        so no state types are derived for it."""
        from sglang_dsv4_guard.check.server.endpoint_values import endpoint_of

        for dtype in block_scaled_dtypes():
            with self.subTest(dtype=dtype):
                side = _decode_side(LLAMA, f"--kv-cache-dtype {dtype}")
                self.assertFalse(endpoint_of(side).has("state_types"))

    def test_hybrid_linear_model(self) -> None:
        """A Qwen3-Next (hybrid linear attention) pair: no state types derived, and the
        TP-dependent rows say they are not judged."""
        path = qwen3_next_dir(self)
        self.assertFalse(endpoint(path).has("state_types"))
        _, doc = check_json(server("prefill", path, "--tp-size 2", "nixl"),
                            server("decode", path, "--tp-size 4", "nixl"))
        self.assertTrue(unknown_state_lines(doc), doc["unknowns"])


def _decode_side(model: str, extra: str) -> Any:
    from sglang_dsv4_guard.check.offline.parse import parse_launch
    from sglang_dsv4_guard.check.server.derive import derive_server

    return derive_server(parse_launch("decode", server("decode", model, extra, "nixl"), {}))


if __name__ == "__main__":
    unittest.main()
