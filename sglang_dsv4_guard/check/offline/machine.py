"""Facts of the checking machine that SGLang's resolution reads, and how ``check`` answers each.

``check`` resolves a server's flags with the installed release's ``ServerArgs`` on this
machine, which is not the server's host: it has no GPU, no InfiniBand, not the server's
files nor all of its packages. Where a refusal of the resolution (a ``raise`` or
``assert`` in ``__post_init__``/``resolve_once``, its ``_handle_*`` steps and hooks,
``check_server_args`` and the validators they call) tests such a fact, the refusal would be
this machine's, not the flags'. :data:`MACHINE_FACTS` lists every one found in 0.5.16 to
0.5.23 (read from each release's sources and found again by resolving every flag of each
release's parser): what SGLang reads, the flags that make it read it, the releases, and
how ``check`` answers it (:class:`Answer`):

- ``PRESENT``: the fact answers as on a server that has it, inside the sandboxed child,
  for the resolution only (:mod:`.standins`), and its read is an ``unknowns`` line naming
  the flag;
- ``WITHOUT``: a file of the server's host whose content SGLang reads: the resolution runs
  without the flag, and an ``unknowns`` line says so;
- ``SAID``: nothing here can answer it: the refusal is an ``unknowns`` line (this
  machine's), never an error, and the flags are used as parsed.

A fact read is a :class:`FactRead`; :func:`fact_line` is its ``unknowns`` line.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = ["CUDA_MEMORY_GIB", "MACHINE_FACTS", "Answer", "FactRead", "MachineFact", "fact",
           "fact_line", "said_cause", "said_fact"]

# The GPU memory a CUDA server is resolved with when SGLang's refusal depended on this
# machine's platform (``get_device_memory_capacity``; this machine answers None).
CUDA_MEMORY_GIB = 80


class Answer(enum.Enum):
    """How ``check`` answers a fact of this machine (module docstring)."""

    PRESENT = "present"
    WITHOUT = "without"
    SAID = "said"


@dataclass(frozen=True)
class MachineFact:
    """One fact of this machine that a refusal of SGLang's resolution reads."""

    key: str
    reads: str  # what SGLang reads on the server's host
    probe: str  # how SGLang reads it
    flags: tuple[str, ...]  # the flags (and values) that make the resolution read it
    releases: str  # "0.5.16-0.5.23"
    refusal: str  # what SGLang raises on a machine without it
    where: str  # the SGLang functions that read it, and when
    answer: Answer
    answered: str  # how check's resolution runs instead ("ran with ...")
    # SAID facts: a pattern of the refusal's text (the exception's, all lines) naming it,
    # and the servers' devices it is this machine's on (every device when empty)
    said: str = ""
    devices: tuple[str, ...] = ()


MACHINE_FACTS: tuple[MachineFact, ...] = (
    MachineFact(
        "infiniband", "/sys/class/infiniband (the host's InfiniBand devices)",
        "os.path.isdir, os.listdir", ("--disaggregation-ib-device", "--mooncake-ib-device"),
        "0.5.16-0.5.23", "RuntimeError: InfiniBand sysfs path not found / No IB devices "
        "found / ValueError: Invalid IB devices specified",
        "validate_ib_devices (ServerArgs._validate_ib_devices to 0.5.18), with "
        "--disaggregation-transfer-backend mooncake on a prefill/decode server, "
        "--encoder-transfer-backend mooncake, or --elastic-ep-backend mooncake",
        Answer.PRESENT, "ran with the devices the flag names present"),
    MachineFact(
        "ib_device_file", "the JSON file of IB devices per GPU an IB device flag names "
        "(a value ending in .json)", "os.path.isfile, open",
        ("--disaggregation-ib-device", "--mooncake-ib-device"), "0.5.16-0.5.23",
        "RuntimeError: File ... does not exist.",
        "parse_ib_device_config, from validate_ib_devices", Answer.WITHOUT,
        "ran without the flag (its file is not on this machine)"),
    MachineFact(
        "ssl_files", "the key and certificate files", "os.path.isfile",
        ("--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs"), "0.5.16-0.5.23",
        "ValueError: SSL key file not found / SSL certificate file not found / SSL CA "
        "certificates file not found", "handle_ssl_validation (_handle_ssl_validation)",
        Answer.PRESENT, "ran with each file the flags name present"),
    MachineFact(
        "expert_pack_files", "the expert-pack files (pack_path, manifest_path, source_path "
        "of --model-loader-extra-config, or SGLANG_EXPERT_PACK_PATH)", "Path.is_file",
        ("--load-format expert_pack", "--model-loader-extra-config"), "0.5.19-0.5.23",
        "ValueError: Invalid expert_pack configuration: expert-pack file does not exist",
        "handle_expert_pack", Answer.PRESENT,
        "ran with each file the loader config names present"),
    MachineFact(
        "watermark_file", "the watermark config file", "os.open, read",
        ("--watermark-config",), "0.5.22-0.5.23",
        "WatermarkConfigError: failed to read watermark config JSON",
        "load_watermark_config, from handle_watermark_config", Answer.WITHOUT,
        "ran without the flag (its value is a path not on this machine)"),
    MachineFact(
        "decrypted_config", "the model config file", "transformers' config loading",
        ("--decrypted-config-file",), "0.5.16-0.5.23",
        "OSError: ... does not appear to have a file named ...",
        "the resolution's ModelConfig", Answer.WITHOUT,
        "ran without the flag (its file is not on this machine), reading the model path's "
        "config.json"),
    MachineFact(
        "granian", "the granian package", "import granian", ("--enable-http2",),
        "0.5.16-0.5.23", "ValueError: --enable-http2 requires the 'granian' package",
        "handle_ssl_validation (_handle_ssl_validation)", Answer.PRESENT,
        "ran with an empty stand-in granian module"),
    MachineFact(
        "cuda_platform", "the platform (an NVIDIA CUDA GPU, and with it FlashInfer and the "
        "GPU's memory)", "is_cuda(), get_platform().is_cuda, is_cuda_alike(), "
        "is_flashinfer_available(), get_device_memory_capacity()",
        ("--mm-feature-transport cuda_ipc", "--mm-feature-transport cuda_vmm",
         "--keep-mm-feature-on-device", "--kv-cache-dtype nvfp4",
         "--kv-cache-dtype fp4_mx_block16", "--enable-mamba-cache-stochastic-rounding",
         "--dcp-size", "--dcp-comm-backend fi_a2a", "--moe-a2a-backend megamoe",
         "--mamba-radix-cache-strategy extra_buffer", "--mamba-backend flashinfer",
         "--enable-kv-cache-sharding --chunked-prefill-size", "--enable-mis"),
        "0.5.16-0.5.23",
        "ValueError: ... requires NVIDIA CUDA / RuntimeError: KV4 is not tested on non-CUDA "
        "platforms / ValueError: ... only supported on NVIDIA CUDA platforms / ... requires "
        "Blackwell and a DCP group within one MNNVL domain / ... needs a CUDA SM90 GPU / "
        "... without a known device-memory capacity",
        "handle_multimodal_feature_transport (cuda_vmm from 0.5.18), "
        "handle_kv4_compatibility, handle_mamba_backend, handle_decode_context_parallelism "
        "(fi_a2a from 0.5.17; --dcp-size on 0.5.16's _handle_dcp_validation), "
        "check_mega_moe_compat (0.5.21 on), validate_mamba_extra_buffer (to 0.5.21), "
        "handle_kv_cache_sharding (0.5.22 on), and a refusal reached only where "
        "FlashInfer is not installed", Answer.PRESENT,
        f"ran again as an NVIDIA CUDA host (is_cuda() true, FlashInfer present, "
        f"{CUDA_MEMORY_GIB} GiB of GPU memory), after such a refusal only"),
    MachineFact(
        "flashinfer", "the flashinfer package", "is_flashinfer_available(), "
        "get_platform().has_flashinfer, import flashinfer.mamba",
        ("--mamba-backend flashinfer",), "0.5.16-0.5.23",
        "ValueError: FlashInfer mamba module not available",
        "handle_mamba_backend (_handle_mamba_backend)", Answer.PRESENT,
        "ran with empty stand-in flashinfer modules, as a CUDA host"),
    MachineFact(
        "quantization_cuda", "the quantization methods of a CUDA host (mxfp4)",
        "registered when SGLang is imported, by is_cuda()", ("--quantization mxfp4",),
        "0.5.16-0.5.23", "ValueError: Unknown quantization method: mxfp4",
        "the resolution's ModelConfig (a checkpoint's quantization_config too), on a "
        "--device cuda server", Answer.SAID, "cannot run: the flags are used as parsed",
        r"Unknown quantization method: mxfp4\b", ("cuda",)),
    MachineFact(
        "quantization_mps", "the quantization methods of an Apple GPU (mlx_q4, mlx_q8)",
        "registered when SGLang is imported, by is_mps()",
        ("--quantization mlx_q4", "--quantization mlx_q8"), "0.5.16-0.5.23",
        "ValueError: Unknown quantization method: mlx_q4",
        "the resolution's ModelConfig, on a --device mps server", Answer.SAID,
        "cannot run: the flags are used as parsed",
        r"Unknown quantization method: mlx_q[48]\b", ("mps",)),
    MachineFact(
        "nvidia_megakernel", "the sgl-nvidia-mega plug-in and the GPU",
        "entry points, torch.cuda", ("--enable-nvidia-megakernel",), "0.5.23",
        "ValueError: --enable-nvidia-megakernel cannot run this setup: the plugin is not "
        "installed / no GPU is visible", "handle_nvidia_megakernel", Answer.SAID,
        "cannot run: the flags are used as parsed",
        r"--enable-nvidia-megakernel cannot run this setup:.*(plugin is not installed|"
        r"registered no spec|no GPU is visible)"),
    MachineFact(
        "flashinfer_version", "the installed FlashInfer's version",
        "inspect.signature(flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla)",
        ("--decode-attention-backend cutedsl_mla",), "0.5.17-0.5.23",
        "RuntimeError: Kimi-K3 DCP with decode_attention_backend='cutedsl_mla' requires "
        "FlashInfer 0.6.17 or newer", "_require_kimi_k3_cutedsl_dcp_support (Kimi-K3, "
        "--dcp-size > 1)", Answer.SAID, "cannot run: the flags are used as parsed",
        r"requires FlashInfer [0-9.]+ or newer|enable_dcp in the signature of"),
)

_BY_KEY = {f.key: f for f in MACHINE_FACTS}


def fact(key: str) -> MachineFact:
    """The fact ``key`` of :data:`MACHINE_FACTS`."""
    return _BY_KEY[key]


def said_fact(text: str, device: str) -> MachineFact | None:
    """The ``SAID`` fact whose refusal ``text`` (an exception's, all lines) is on a
    ``--device device`` server, if any."""
    joined = " ".join(text.split())
    for item in MACHINE_FACTS:
        if item.said and (not item.devices or device in item.devices) \
                and re.search(item.said, joined):
            return item
    return None


@dataclass(frozen=True)
class FactRead:
    """A fact of this machine SGLang's resolution read for a line's flags, as answered.

    ``flags``: the flags as the line gives them (``--disaggregation-ib-device mlx5_0``);
    ``detail``: what this machine lacks (``this machine has no /sys/class/infiniband``), and
    for the platform the refusal it made."""

    key: str
    flags: tuple[str, ...]
    detail: str = ""


def fact_line(read: FactRead) -> str:
    """The ``unknowns`` line of ``read``: the flags, what SGLang checks on the server's
    host, what this machine lacks, and what the resolution ran with instead."""
    item = fact(read.key)
    named = ", ".join(read.flags) or " or ".join(item.flags)
    lacks = read.detail or "this machine is not the server's host"
    return (f"{named}: SGLang checks {item.reads} on the server's host; {lacks}: not checked "
            f"here (SGLang's resolution {item.answered})")


def said_cause(item: MachineFact, flags: tuple[str, ...]) -> str:
    """The machine cause of a refusal of the ``SAID`` fact ``item`` for the line's ``flags``."""
    named = ", ".join(flags) or " or ".join(item.flags)
    return (f"{named}: SGLang checks {item.reads} on the server's host ({item.probe}), which "
            "this machine cannot answer")
