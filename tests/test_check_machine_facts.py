"""``check`` on flags whose resolution reads the checking machine (no GPU, no InfiniBand, not
the server's files or packages): SGLang's resolution runs with each fact answered for the
server's host (``check/offline/machine.py``'s table), so a healthy pair gives no error and
an ``unknowns`` line per server naming each such flag; a broken pair with such flags still
gets its real errors, from the rest of the resolution.

Every pair runs in-process (``run_check``), once per class; flags a release's parser does
not have are left out of the lines on that release (0.5.16 to 0.5.23)."""

from __future__ import annotations

import json
import shlex
import unittest
from typing import Any, ClassVar

from check_helpers import DSV4, LLAMA, server
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.offline.machine import MACHINE_FACTS, Answer, fact, said_fact
from sglang_dsv4_guard.check.predict import CheckResult, run_check
from sglang_dsv4_guard.findings import Severity
from sglang_dsv4_guard.host.flags import accepts

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

# DeepSeek-V4 takes EAGLE with top-k 1.
EAGLE = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")
IB = "--disaggregation-ib-device mlx5_0"
SSL = "--ssl-keyfile /srv/tls/key.pem --ssl-certfile /srv/tls/cert.pem --ssl-ca-certs /srv/tls/ca.pem"
PACK = {"pack_path": "/srv/dsv4.pack", "source_path": "/srv/dsv4.gguf", "source_sha256": "a",
        "model_identity_sha256": "b", "config_sha256": "c"}


def mooncake(role: str, model: str, extra: str = "") -> str:
    """A server of the pair over Mooncake (whose IB device flag SGLang checks)."""
    return server(role, model, extra, backend="mooncake")


def errors(result: CheckResult) -> list[str]:
    """The codes of the error findings."""
    return [f.code for f in result.report.findings if f.severity is Severity.ERROR]


def fact_lines(result: CheckResult, role: str, key: str) -> list[str]:
    """The ``unknowns`` lines of ``role`` that say SGLang checks fact ``key``'s thing on the
    server's host."""
    said = f"SGLang checks {fact(key).reads} on the server's host"
    return [u for u in result.unknowns if u.startswith(f"{role}: ") and said in u]


class MachineFactsCase(GuardTestCase):
    """Runs each pair of :attr:`PAIRS` once for the class."""

    PAIRS: ClassVar[dict[str, tuple[str, str]]] = {}
    results: ClassVar[dict[str, CheckResult]]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.results = {name: run_check(*pair) for name, pair in cls.pairs().items()}

    @classmethod
    def pairs(cls) -> dict[str, tuple[str, str]]:
        return cls.PAIRS

    def assert_named(self, result: CheckResult, role: str, key: str, flag: str) -> None:
        """One ``unknowns`` line of ``role`` names ``flag`` for fact ``key``."""
        lines = fact_lines(result, role, key)
        self.assertTrue(any(line.startswith(f"{role}: {flag}") or f", {flag}" in line
                            for line in lines), (flag, result.unknowns))


class TestInfiniBand(MachineFactsCase):
    """``--disaggregation-ib-device``: SGLang lists ``/sys/class/infiniband``, which this
    machine does not have."""

    PAIRS: ClassVar[dict[str, tuple[str, str]]] = {"eagle": (
        mooncake("prefill", DSV4, f"{EAGLE} {IB}"), mooncake("decode", DSV4, f"{EAGLE} {IB}"))}

    def test_healthy_eagle_pair_is_ok(self) -> None:
        """A healthy DeepSeek-V4 EAGLE pair with ``--disaggregation-ib-device mlx5_0`` on
        both servers: no finding, exit 0 (it was DSV4G026 twice, "InfiniBand sysfs path
        not found")."""
        result = self.results["eagle"]
        self.assertEqual((result.exit_status, list(result.report.codes)), (0, []))

    def test_each_server_names_the_flag(self) -> None:
        """Each server has one ``unknowns`` line naming ``--disaggregation-ib-device mlx5_0``
        and saying SGLang checks ``/sys/class/infiniband`` on its host."""
        for role in ("prefill", "decode"):
            with self.subTest(role=role):
                self.assert_named(self.results["eagle"], role, "infiniband", IB)

    def test_resolution_completed(self) -> None:
        """The rest of the resolution ran: each server's page size is SGLang's DeepSeek-V4
        choice (256), from its resolution."""
        for side in (self.results["eagle"].prefill, self.results["eagle"].decode):
            self.assertTrue(side.args.resolved, side.args.resolution_error)
            self.assertEqual(side.page_size, 256)


class TestHostFilesAndPackages(MachineFactsCase):
    """The server host's files (SSL, a watermark or decrypted model config, a JSON file of
    IB devices, expert-pack files), its InfiniBand devices (a JSON mapping, elastic EP's
    own flag) and packages (``granian``)."""

    @classmethod
    def pairs(cls) -> dict[str, tuple[str, str]]:
        prefill = (f"--disaggregation-ib-device {shlex.quote(json.dumps({'0': 'mlx5_0'}))} "
                   f"{SSL} --enable-http2 --decrypted-config-file /srv/model/config.dec")
        if accepts("--watermark-config"):  # 0.5.22 on
            prefill += " --watermark-config /srv/watermark.json"
        decode = ("--tp-size 2 --ep-size 2 --elastic-ep-backend mooncake "
                  "--mooncake-ib-device mlx5_1 --disaggregation-ib-device /srv/ib.json")
        pairs = {"files": (mooncake("prefill", DSV4, f"--tp-size 2 {prefill}"),
                           mooncake("decode", DSV4, decode))}
        if _expert_pack():
            flags = f"--load-format expert_pack --model-loader-extra-config {shlex.quote(json.dumps(PACK))}"
            pairs["pack"] = (mooncake("prefill", DSV4, flags), mooncake("decode", DSV4, flags))
        return pairs

    def test_healthy_pair_is_ok(self) -> None:
        """No error finding, exit 0, and every server resolved by SGLang."""
        for name, result in self.results.items():
            with self.subTest(pair=name):
                self.assertEqual((result.exit_status, errors(result)), (0, []))
                self.assertTrue(result.prefill.args.resolved and result.decode.args.resolved)

    def test_each_flag_is_named(self) -> None:
        """Each flag has its ``unknowns`` line: the IB devices (a JSON mapping, and
        ``--mooncake-ib-device``), each SSL file, granian, the decrypted model config, the
        JSON file of IB devices and, where the release has them, the watermark config and
        the expert-pack files."""
        result = self.results["files"]
        expected = [("prefill", "infiniband", '--disaggregation-ib-device {"0": "mlx5_0"}'),
                    ("prefill", "ssl_files", "--ssl-keyfile /srv/tls/key.pem"),
                    ("prefill", "ssl_files", "--ssl-certfile /srv/tls/cert.pem"),
                    ("prefill", "ssl_files", "--ssl-ca-certs /srv/tls/ca.pem"),
                    ("prefill", "granian", "--enable-http2"),
                    ("prefill", "decrypted_config", "--decrypted-config-file /srv/model/config.dec"),
                    ("decode", "infiniband", "--mooncake-ib-device mlx5_1"),
                    ("decode", "ib_device_file", "--disaggregation-ib-device /srv/ib.json")]
        if accepts("--watermark-config"):
            expected.append(("prefill", "watermark_file", "--watermark-config /srv/watermark.json"))
        for role, key, flag in expected:
            with self.subTest(flag=flag):
                self.assert_named(result, role, key, flag)
        if "pack" in self.results:
            for role in ("prefill", "decode"):
                self.assert_named(self.results["pack"], role, "expert_pack_files",
                                  "--load-format expert_pack")
                self.assertEqual(len(fact_lines(self.results["pack"], role,
                                                "expert_pack_files")), 3)  # pack, manifest, source

    def test_files_read_are_left_out(self) -> None:
        """A file whose content SGLang reads is left out of the resolution: the decode's
        resolved IB device is none (its JSON file is the host's)."""
        self.assertIsNone(self.results["files"].decode.args.resolved_field(
            "disaggregation_ib_device", "absent"))


def _expert_pack() -> bool:
    from sglang.srt.server_args import ServerArgs

    from sglang_dsv4_guard.check.offline.parse import release_parser

    action = release_parser(ServerArgs)._option_string_actions["--load-format"]
    return "expert_pack" in (action.choices or ())


class TestCudaPlatform(MachineFactsCase):
    """Refusals that test ``is_cuda()`` (this machine has no NVIDIA GPU): SGLang's resolution
    runs again as a CUDA host."""

    @classmethod
    def pairs(cls) -> dict[str, tuple[str, str]]:
        dcp = "--dcp-comm-backend fi_a2a" if accepts("--dcp-comm-backend") else ""
        return {"platform": (
            mooncake("prefill", DSV4, "--tp-size 2 --mm-feature-transport cuda_ipc"),
            mooncake("decode", DSV4, f"--tp-size 2 --dcp-size 2 {dcp}")),
            "flashinfer": (mooncake("prefill", DSV4, "--mamba-backend flashinfer"),
                           mooncake("decode", DSV4, "--mamba-backend flashinfer"))}

    def test_healthy_pair_is_ok(self) -> None:
        """No error finding, exit 0, and both servers resolved by SGLang (as CUDA hosts)."""
        for name, result in self.results.items():
            with self.subTest(pair=name):
                self.assertEqual((result.exit_status, errors(result)), (0, []))
                self.assertTrue(result.prefill.args.resolved and result.decode.args.resolved)

    def test_each_flag_is_named(self) -> None:
        """``--mm-feature-transport cuda_ipc``, the decode context parallelism flag SGLang
        refuses without CUDA (``--dcp-comm-backend fi_a2a``, ``--dcp-size`` in 0.5.16) and
        ``--mamba-backend flashinfer`` each have an ``unknowns`` line on the platform, and
        FlashInfer's on the package."""
        flag = "--dcp-comm-backend fi_a2a" if accepts("--dcp-comm-backend") else "--dcp-size 2"
        self.assert_named(self.results["platform"], "prefill", "cuda_platform",
                          "--mm-feature-transport cuda_ipc")
        self.assert_named(self.results["platform"], "decode", "cuda_platform", flag)
        for role in ("prefill", "decode"):
            self.assert_named(self.results["flashinfer"], role, "cuda_platform",
                              "--mamba-backend flashinfer")
            self.assert_named(self.results["flashinfer"], role, "flashinfer",
                              "--mamba-backend flashinfer")


class TestNotAnswerable(MachineFactsCase):
    """What nothing here can answer (the platform's quantization methods, fixed when SGLang
    is imported) is this machine's refusal, an ``unknowns`` line, never an error."""

    PAIRS: ClassVar[dict[str, tuple[str, str]]] = {"mxfp4": (
        mooncake("prefill", LLAMA, "--quantization mxfp4"),
        mooncake("decode", LLAMA, "--quantization mxfp4"))}

    def test_is_an_unknown_naming_the_flag(self) -> None:
        """``--quantization mxfp4`` (registered on CUDA hosts): exit 0, no DSV4G026, and each
        server's refusal is this machine's, naming the flag."""
        result = self.results["mxfp4"]
        self.assertEqual((result.exit_status, errors(result)), (0, []))
        for side in (result.prefill, result.decode):
            refusal = side.args.machine_refusal or ""
            self.assertIn("--quantization mxfp4: SGLang checks "
                          f"{fact('quantization_cuda').reads}", refusal)

    def test_every_said_refusal_is_recognised(self) -> None:
        """Each fact nothing here answers is recognised by SGLang's own refusal text (the
        Kimi-K3 and megakernel ones need a model or plug-in this suite has not)."""
        texts = {"quantization_cuda": "Unknown quantization method: mxfp4. Must be one of",
                 "quantization_mps": "Unknown quantization method: mlx_q4. Must be one of",
                 "nvidia_megakernel": "--enable-nvidia-megakernel cannot run this setup:\n  - "
                                      "the 'sgl_nvidia_mega' plugin is not installed; install "
                                      "sgl-nvidia-mega",
                 "flashinfer_version": "Kimi-K3 DCP with decode_attention_backend='cutedsl_mla' "
                                       "requires FlashInfer 0.6.17 or newer with ..."}
        said = {f.key for f in MACHINE_FACTS if f.answer is Answer.SAID}
        self.assertEqual(set(texts), said)
        for key, text in texts.items():
            device = "mps" if key == "quantization_mps" else "cuda"
            self.assertEqual(getattr(said_fact(text, device), "key", None), key)
        # registered on no platform, or not on a CUDA host either: the flags' refusal
        self.assertIsNone(said_fact("Unknown quantization method: marlin. Must be", "cuda"))
        self.assertIsNone(said_fact(texts["quantization_mps"], "cuda"))


class TestBrokenPairs(MachineFactsCase):
    """A pair with such flags and a real fault: the fault's finding, from the rest of the
    resolution, and the flags still ``unknowns`` lines."""

    PAIRS: ClassVar[dict[str, tuple[str, str]]] = {
        "pages": (mooncake("prefill", LLAMA, f"--page-size 16 {IB} --mm-feature-transport cuda_ipc"),
                  mooncake("decode", LLAMA, f"--page-size 32 {IB} {SSL}")),
        "refused": (mooncake("prefill", DSV4, f"{IB} --ssl-keyfile /srv/tls/key.pem"),
                    mooncake("decode", DSV4, f"{IB} --mm-feature-transport cuda_ipc "
                                             "--speculative-algorithm NEXTN"))}

    def test_page_sizes_still_compared(self) -> None:
        """Llama at page size 16 against 32, with IB, CUDA-IPC and SSL flags: DSV4G022 (the
        page sizes SGLang's resolution chose differ), exit 1, no DSV4G026."""
        result = self.results["pages"]
        self.assertEqual((result.exit_status, list(result.report.codes)), (1, ["DSV4G022"]))
        self.assert_named(result, "prefill", "infiniband", IB)
        self.assert_named(result, "prefill", "cuda_platform", "--mm-feature-transport cuda_ipc")
        self.assert_named(result, "decode", "ssl_files", "--ssl-keyfile /srv/tls/key.pem")

    def test_real_refusals_stay_errors(self) -> None:
        """``--ssl-keyfile`` without ``--ssl-certfile`` and NEXTN on DeepSeek-V4, beside an
        IB device and ``--mm-feature-transport cuda_ipc``: DSV4G026 on each server, with
        SGLang's own refusal of the flags, not the machine's."""
        result = self.results["refused"]
        self.assertEqual(errors(result), ["DSV4G026", "DSV4G026"])
        refusals = {o.role: str(o.value) for f in result.report.findings
                    for o in f.observations if f.code == "DSV4G026"}
        self.assertIn("--ssl-keyfile requires --ssl-certfile", refusals["prefill"])
        self.assertRegex(refusals["decode"], "(?i)NEXTN|speculative")
        for refusal in refusals.values():
            self.assertNotRegex(refusal, "InfiniBand|NVIDIA CUDA|SSL key file not found")


class TestNothingStays(GuardTestCase):
    """The stand-ins are the resolution's only: afterwards every function, finder and module
    is what it was."""

    def test_functions_and_modules_restored(self) -> None:
        """After a line that meets the host's paths, packages and the CUDA platform:
        ``os.path``'s, ``os.listdir``, ``Path.is_file``, ``sys.meta_path``, SGLang's
        ``is_cuda`` (where it is defined and in ``server_args``) are the originals, and no
        stand-in module is left in ``sys.modules``."""
        import os
        import pathlib
        import posixpath
        import sys

        import sglang.srt.server_args as server_args_module
        import sglang.srt.utils as utils

        from sglang_dsv4_guard.check.offline.cuda_platform import PLATFORM_PROBES
        from sglang_dsv4_guard.check.offline.parse import parse_launch

        common = getattr(utils, "common", utils)  # a package from 0.5.x, else one module
        watched = [(posixpath, "isdir"), (posixpath, "isfile"), (posixpath, "exists"),
                   (os, "listdir"), (pathlib.Path, "is_file"),
                   *((common, n) for n in PLATFORM_PROBES if hasattr(common, n)),
                   *((server_args_module, n) for n in PLATFORM_PROBES
                     if hasattr(server_args_module, n))]
        before = [getattr(owner, name) for owner, name in watched]
        finders = list(sys.meta_path)
        args = parse_launch("prefill", mooncake("prefill", DSV4, f"{IB} {SSL} --enable-http2 "
                                                "--mm-feature-transport cuda_ipc"), {})
        self.assertTrue(args.resolved, args.resolution_error)
        self.assertEqual({fact_key for fact_key in ("infiniband", "ssl_files", "granian",
                                                    "cuda_platform")
                          if any(fact(fact_key).reads in note for note in args.notes)},
                         {"infiniband", "ssl_files", "granian", "cuda_platform"})
        for (owner, name), original in zip(watched, before, strict=True):
            self.assertIs(getattr(owner, name), original, name)
        self.assertEqual(sys.meta_path, finders)
        self.assertNotIn("granian", sys.modules)


def _keys(result: CheckResult) -> set[str]:
    return {f.key for f in MACHINE_FACTS for role in ("prefill", "decode")
            if fact_lines(result, role, f.key)}


class TestTableIsExercised(GuardTestCase):
    """Every fact of the table this release has is answered by one of the pairs above."""

    def test_every_present_and_without_fact_is_met(self) -> None:
        """The facts the pairs met are every PRESENT and WITHOUT fact of the table whose
        releases include this one (the said ones: TestNotAnswerable)."""
        met: set[str] = set()
        for case in (TestInfiniBand, TestHostFilesAndPackages, TestCudaPlatform, TestBrokenPairs):
            met |= set().union(*(_keys(r) for r in case.results.values()))
        expected = {f.key for f in MACHINE_FACTS if f.answer is not Answer.SAID and _here(f)}
        self.assertEqual(met, expected)

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        for case in (TestInfiniBand, TestHostFilesAndPackages, TestCudaPlatform, TestBrokenPairs):
            if not hasattr(case, "results"):  # run alone: the cases' pairs are run here
                case.results = {name: run_check(*pair) for name, pair in case.pairs().items()}


def _here(item: Any) -> bool:
    from helpers import sglang_release
    from packaging.version import Version

    first, _, last = item.releases.partition("-")
    return Version(first) <= sglang_release() <= Version(last or first)


if __name__ == "__main__":
    unittest.main()
