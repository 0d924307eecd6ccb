"""``check --gpu MODEL`` (``--prefill-gpu``/``--decode-gpu`` per server, ``run_check(gpus=)``):
a server named to run on an NVIDIA GPU is resolved by SGLang with its device probes
answering as that GPU, so what SGLang decides by GPU model is settled for it: the
first-contact page size, the DeepSeek-V4 KV layout, ``--kv-cache-dtype mxfp8``. An error
where that GPU fails, nothing where it passes; without a GPU, the per-GPU-model warning of
before. A name the table does not know is exit 2 naming the option, the value and the
accepted names; an AMD GPU is named but not modelled (an ``unknowns`` line)."""

from __future__ import annotations

import re
import unittest

from check_helpers import DSV4, LLAMA, run_cli, server
from helpers import GuardTestCase, sglang_release
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.child import fix_status
from sglang_dsv4_guard.check.offline.parse import CheckInputError
from sglang_dsv4_guard.check.predict import CheckResult, run_check
from sglang_dsv4_guard.check.prove import fix_check
from sglang_dsv4_guard.check.requests import request_of
from sglang_dsv4_guard.check.rerun import Lines
from sglang_dsv4_guard.check.server.gpu_models import GPU_MODELS, gpu_model, named_gpus
from sglang_dsv4_guard.check.text import render_check
from sglang_dsv4_guard.cli import _parser
from sglang_dsv4_guard.findings import Severity

register_cpu_ci(est_time=45, suite="stage-a-test-cpu")

PAGE = "DSV4G022"
REFUSED = "DSV4G026"
LAYOUT_PAIR = "DSV4G031"
LAYOUT_REFUSED = "DSV4G047"
SELECTOR = Version("0.5.21")  # select_dsv4_kv_layout: the layout variable is read from here
COMPARED = Version("0.5.23")  # decode's first contact compares the KV layouts from here
PAGE_64 = (server("prefill", LLAMA, "--page-size 64", "mooncake"),
           server("decode", LLAMA, "", "mooncake"))
MXFP8 = tuple(server(r, LLAMA, "--kv-cache-dtype mxfp8", "mooncake") for r in ("prefill", "decode"))
DSV4_PAIR = tuple(server(r, DSV4, "--tp-size 8", backend="mooncake") for r in ("prefill", "decode"))
V41 = {"SGLANG_DSV4_KV_LAYOUT": "v41"}


def _both(name: str) -> dict[str, str | None]:
    return {"prefill": name, "decode": name}


def _codes(result: CheckResult) -> list[str]:
    return list(result.report.codes)


def _page(result: CheckResult) -> list[Severity]:
    return [f.severity for f in result.report.findings if f.code == PAGE]


class TestGpuNames(GuardTestCase):
    """The table reads the names operators type and the labels nodes carry."""

    def test_every_name_and_label_reads_as_its_model(self) -> None:
        """Each model's name, other names and product labels, in any case, read as it."""
        for model in GPU_MODELS:
            for text in (*model.names, *model.labels):
                for typed in (text, text.lower(), text.upper()):
                    with self.subTest(typed=typed):
                        self.assertEqual(gpu_model(typed).name, model.name)

    def test_label_spellings(self) -> None:
        """A product label's board words (memory, form factor, MIG profile) and vendor
        words are read past; spaces, hyphens and underscores are one."""
        for text, name in (("NVIDIA H100 80GB HBM3", "H100"), ("h20", "H20"),
                           ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100"),
                           ("rtx_pro_6000", "RTX PRO 6000"), ("NVIDIA-H200-141GB", "H200"),
                           ("amd-instinct-mi355x", "MI355X"), ("L40S", "L40S"), ("l4", "L4")):
            with self.subTest(text=text):
                self.assertEqual(gpu_model(text).name, name)

    def test_near_names_are_refused(self) -> None:
        """A name that is not a model's (or a model's followed by other words) raises,
        naming the option given, the value and the accepted names."""
        for text in ("Z100", "H2000", "H100X", "B200 turbo", "", "NVIDIA", "GB"):
            with self.subTest(text=text), self.assertRaises(CheckInputError) as raised:
                gpu_model(text, "--decode-gpu")
            self.assertEqual(raised.exception.argument, "--decode-gpu")
            self.assertIn(repr(text), str(raised.exception))
            self.assertIn("H100", str(raised.exception))

    def test_bad_name_is_exit_2(self) -> None:
        """``check --gpu Z100``: exit 2, one line naming --gpu, the value and the accepted
        names, before anything is resolved."""
        status, out, err = run_cli("check", "--prefill", PAGE_64[0], "--decode", PAGE_64[1],
                                   "--gpu", "Z100")
        self.assertEqual((status, out), (2, ""))
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertTrue(err.startswith("sglang-dsv4-guard check: error: --gpu: "), err)
        for word in ("'Z100'", "H100", "B200", "MI300X"):
            self.assertIn(word, err)

    def test_per_server_option_overrides_gpu(self) -> None:
        """``--decode-gpu`` overrides ``--gpu`` for the decode; the request says which
        option named each server's GPU."""
        args = _parser().parse_args(["check", "--prefill", "x", "--decode", "y",
                                     "--gpu", "H100", "--decode-gpu", "NVIDIA-B200"])
        request = request_of(args)
        self.assertEqual((request["gpus"], request["gpu_sources"]),
                         ({"prefill": "H100", "decode": "NVIDIA-B200"},
                          {"prefill": "--gpu", "decode": "--decode-gpu"}))
        none = request_of(_parser().parse_args(["check", "--prefill", "x", "--decode", "y"]))
        self.assertEqual((none["gpus"], none["gpu_sources"]),
                         ({"prefill": None, "decode": None}, {}))

    def test_a_gpu_needs_a_cuda_line(self) -> None:
        """A GPU named for a ``--device cpu`` line is input ``check`` cannot judge: an
        NVIDIA GPU is refused before resolution (naming the line), an AMD one after it
        (naming the option that named it)."""
        cpu = (server("prefill", LLAMA, "--device cpu", "mooncake"), PAGE_64[1])
        for name, argument in (("H100", "--prefill"), ("MI300X", "--gpu")):
            with self.subTest(name=name), self.assertRaises(CheckInputError) as raised:
                run_check(*cpu, gpus={"prefill": name}, gpu_sources={"prefill": "--gpu"})
            self.assertEqual(raised.exception.argument, argument)
            self.assertIn("--device cpu", str(raised.exception))

    def test_run_check_refuses_a_key_that_is_no_role(self) -> None:
        """``run_check(gpus=)`` keys are the servers' roles."""
        with self.assertRaises(CheckInputError) as raised:
            named_gpus({"server": "H100"})
        self.assertEqual(raised.exception.argument, "gpus")


class TestPageSizeOnTheGpu(GuardTestCase):
    """``--page-size 64`` on the prefill only (Llama): the decode's page size is its
    attention backend's, chosen by the GPU model."""

    def test_h100_is_an_error(self) -> None:
        """As an H100 the decode keeps page size 1: DSV4G022 is an error, exit 1, and
        the document says both servers were checked as the H100 named by --gpu."""
        result = run_check(*PAGE_64, gpus=_both("H100"), gpu_sources=_both("--gpu"))
        self.assertEqual((result.exit_status, _page(result)), (1, [Severity.ERROR]))
        self.assertEqual(result.decode.page_size, 1)
        derived = result.to_dict()["derived"]
        for role in ("prefill", "decode"):
            gpu = derived[role]["gpu"]
            self.assertEqual((gpu["name"], gpu["source"], gpu["compute_capability"]),
                             ("H100", "--gpu", "9.0"))

    def test_b200_is_settled_by_the_release(self) -> None:
        """As a B200 the decode gets the page size SGLang's B200 backend gives it: where
        that is 64 (0.5.23: trtllm_mha), no DSV4G022 and exit 0; elsewhere the error."""
        result = run_check(*PAGE_64, gpus=_both("B200"))
        agree = result.decode.page_size == 64
        self.assertEqual((result.exit_status, _page(result)),
                         (0, []) if agree else (1, [Severity.ERROR]))
        if sglang_release() >= COMPARED:
            self.assertTrue(agree)

    def test_per_server_gpus(self) -> None:
        """Prefill on a B200, decode on an H100: the decode's page size is the H100's, an
        error; the text output names each server's GPU once."""
        result = run_check(*PAGE_64, gpus={"prefill": "B200", "decode": "H100"},
                           gpu_sources={"prefill": "--prefill-gpu", "decode": "--decode-gpu"})
        self.assertEqual((result.exit_status, _page(result)), (1, [Severity.ERROR]))
        text = render_check(result)
        self.assertEqual(len(re.findall(r"^GPU: ", text, re.M)), 1, text)
        self.assertIn("prefill B200 (SM100, from --prefill-gpu); decode H100", text)

    def test_without_a_gpu_the_warning_stays(self) -> None:
        """No GPU named: the warning naming the GPU models that fail, as before, and no
        GPU in the document or the text."""
        result = run_check(*PAGE_64)
        if sglang_release() >= COMPARED:
            self.assertEqual(_page(result), [Severity.WARNING])
        self.assertEqual(result.exit_status, 0 if _page(result) != [Severity.ERROR] else 1)
        self.assertIsNone(result.to_dict()["derived"]["decode"]["gpu"])
        self.assertNotIn("\nGPU: ", render_check(result))

    def test_one_gpu_named_judges_the_other_per_model(self) -> None:
        """Only the prefill's GPU named (H100): the decode is judged on each GPU model it
        may have, against the H100: a warning on 0.5.23 (a B200 decode takes 64)."""
        result = run_check(*PAGE_64, gpus={"prefill": "H100"})
        if sglang_release() >= COMPARED:
            self.assertEqual((result.exit_status, _page(result)), (0, [Severity.WARNING]))
        (finding,) = [f for f in result.report.findings if f.code == PAGE]
        self.assertIn("prefill H100 with decode", finding.when.effect if finding.when else "")


class TestFixOnTheGpu(GuardTestCase):
    def test_fix_is_proven_on_the_named_gpu(self) -> None:
        """``check --fix`` re-runs the check as the same GPUs: page size 64 on the prefill
        only, as an H100, is corrected by typing one page size on both, and the corrected
        lines' check (as the H100 too) has no finding."""
        lines = Lines(*PAGE_64, gpus=_both("H100"), gpu_sources=_both("--gpu"))
        fixed = fix_check(lines)
        self.assertEqual(fix_status(fixed), "corrected")
        assert fixed.lines_result is not None and fixed.lines is not None
        self.assertEqual(fixed.lines_result.report.codes, ())
        self.assertEqual(fixed.lines_result.decode.args.gpu, gpu_model("H100").device)
        self.assertEqual(fixed.lines.gpus, _both("H100"))


class TestMxfp8OnTheGpu(GuardTestCase):
    """``--kv-cache-dtype mxfp8`` needs an SM100+ GPU (SGLang's resolution asserts it)."""

    def test_h100_refuses(self) -> None:
        """As an H100 both servers' resolution refuses mxfp8: DSV4G026 twice, exit 1, each
        observed as resolved as the H100, each with a fix that drops the dtype."""
        result = run_check(*MXFP8, gpus=_both("H100"))
        self.assertEqual((result.exit_status, _codes(result)), (1, [REFUSED, REFUSED]))
        for finding in result.report.findings:
            self.assertIn("mxfp8", str(finding.observations[0].value))
            self.assertIn("H100", finding.observations[0].source)
            self.assertIn(("--kv-cache-dtype", True),
                          [(e.name, e.remove) for fix in finding.fixes for e in fix.edits])

    def test_b200_accepts(self) -> None:
        """As a B200 both servers resolve: no finding, exit 0, and no 'this machine'
        refusal left in unknowns."""
        result = run_check(*MXFP8, gpus=_both("B200"))
        self.assertEqual((result.exit_status, _codes(result)), (0, []))
        self.assertTrue(result.prefill.args.resolved and result.decode.args.resolved)
        self.assertIsNone(result.prefill.args.machine_refusal)


class TestDsv4LayoutOnTheGpu(GuardTestCase):
    """``SGLANG_DSV4_KV_LAYOUT=v41`` on the prefill only (DeepSeek-V4)."""

    def test_h100_stops_the_prefill(self) -> None:
        """As an H100 (no V4.1 layout), 0.5.21+'s selector stops the prefill at start-up:
        DSV4G047 for the prefill, exit 1, and no per-GPU table. Before 0.5.21 nothing
        reads the variable."""
        result = run_check(*DSV4_PAIR, V41, gpus=_both("H100"))
        if sglang_release() < SELECTOR:
            self.assertEqual((result.exit_status, _codes(result)), (0, []))
            return
        self.assertEqual((result.exit_status, _codes(result)), (1, [LAYOUT_REFUSED]))
        self.assertTrue(result.report.findings[0].subject.startswith("prefill"))

    def test_b200_compares_the_layouts(self) -> None:
        """As a B200 the prefill gets V4.1 and the decode V4: 0.5.23's first contact
        refuses the pair, DSV4G031 an error with one row, the B200's; 0.5.21 - 0.5.22
        compare no layout: no finding."""
        result = run_check(*DSV4_PAIR, V41, gpus=_both("B200"))
        if sglang_release() < COMPARED:
            self.assertEqual((result.exit_status, _codes(result)), (0, []))
            return
        self.assertEqual((result.exit_status, _codes(result)), (1, [LAYOUT_PAIR]))
        (finding,) = result.report.findings
        rows = {o.name: o.value for o in finding.observations if o.role == "prefill/decode"}
        self.assertEqual(list(rows), ["on B200"])
        self.assertEqual(rows["on B200"]["fails_at"], "first contact")


class TestAmdGpu(GuardTestCase):
    def test_amd_gpu_is_named_not_modelled(self) -> None:
        """An AMD GPU: each server's unknowns line says ROCm is not modelled; the
        per-GPU-model findings stay as without a GPU (the page-size warning on 0.5.23),
        and the document names the GPU with its platform."""
        result = run_check(*PAGE_64, gpus=_both("MI300X"))
        lines = [u for u in result.unknowns if "MI300X" in u and "ROCm" in u]
        self.assertEqual([u.split(":")[0] for u in lines], ["prefill", "decode"])
        if sglang_release() >= COMPARED:
            self.assertEqual(_page(result), [Severity.WARNING])
        gpu = result.to_dict()["derived"]["prefill"]["gpu"]
        self.assertEqual((gpu["platform"], gpu["probes_answered_as_it"]), ("rocm", False))
        self.assertIsNone(result.prefill.args.gpu)


if __name__ == "__main__":
    unittest.main()
