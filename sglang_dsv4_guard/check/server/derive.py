"""What one server will be, derived with the installed release's own code.

- the model: ``ModelConfig.from_server_args`` on the resolved flags (the bare
  ``ModelConfig`` when resolution refused them) and the local ``config.json`` (attention
  architecture, hybrid SWA layers, the DeepSeek-V4 fields), offline; the draft model with
  ``is_draft_model=True`` as the draft worker loads it (a DeepSeek-V4 draft becomes its
  NextN architecture); a config whose remote code is not here is read without it
  (:mod:`~sglang_dsv4_guard.check.offline.remote_code`), and a note says so;
- attention TP: the release's ``compute_dp_attention_world_info`` (called for rank 0 with
  the keyword arguments its signature takes: ``enable_dp_attention``/``dp_size`` up to
  0.5.21, ``attn_dp_size`` from 0.5.22, ``attn_cp_size`` everywhere).
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_dsv4_guard.check.offline.parse import CheckInputError, LaunchArgs, machine_cause, offline_env
from sglang_dsv4_guard.check.offline.remote_code import missing_code
from sglang_dsv4_guard.check.server.edit import typed_flags
from sglang_dsv4_guard.check.server.gpu_models import NamedGpu
from sglang_dsv4_guard.pd.attention_tp import AttentionLayout

__all__ = ["DerivedServer", "ModelFacts", "attention_layout", "derive_server", "kwargs_for",
           "load_model", "page_size_source", "release_model_config", "typed_page"]

# The page size SGLang's DeepSeek-V4 model override sets when --page-size is not given
# (arg_groups/model_overrides/deepseek_v4.py); used only when resolution did not complete.
DSV4_PAGE_SIZE = 256


@dataclass(frozen=True)
class ModelFacts:
    """What ``ModelConfig`` says about one checkpoint."""

    path: str
    architecture: str
    attention_arch: str
    is_hybrid_swa: bool
    is_dsv4: bool
    sliding_window: int | None
    compress_ratios: tuple[int, ...]
    nextn_layers: int
    num_layers: int
    # The release's ModelConfig itself, for SGLang's own pool predicates (check/server/state_types).
    config: Any = field(default=None, compare=False, repr=False)

    @property
    def uses_mla_pool(self) -> bool:
        """SGLang's ``is_mla_backend``: an MLA pool, or the DeepSeek-V4 pool it counts as one."""
        return self.attention_arch == "MLA" or self.is_dsv4

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"path": self.path, "architecture": self.architecture,
                "attention_arch": self.attention_arch, "mla_pool": self.uses_mla_pool,
                "hybrid_swa": self.is_hybrid_swa, "dsv4": self.is_dsv4,
                "sliding_window": self.sliding_window,
                "compress_ratios": list(self.compress_ratios),
                "nextn_layers": self.nextn_layers, "num_layers": self.num_layers}


@dataclass(frozen=True)
class DerivedServer:
    """One server as ``check`` derives it from its launch line (its flags, model facts and
    the values SGLang resolves from them): the input :func:`~.endpoint_values.endpoint_of`
    turns into the contract's one server type, :class:`~sglang_dsv4_guard.pd.endpoint.Endpoint`."""

    args: LaunchArgs
    model: ModelFacts
    draft: ModelFacts | None
    attn_tp_size: int
    attn_dp_size: int
    page_size: int | None
    page_size_source: str
    transfer_backend: str
    speculative_algorithm: str | None
    num_draft_tokens: int | None
    swa_state: bool
    unified_kv: bool
    notes: tuple[str, ...] = ()
    # The GPU the server was named to run on (check --gpu), None when not named.
    gpu: NamedGpu | None = None

    @property
    def role(self) -> str:
        """``prefill`` or ``decode``."""
        return self.args.role

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready derived values."""
        a = self.args
        return {
            "model": self.model.to_dict(),
            "draft_model": self.draft.to_dict() if self.draft else None,
            "tp_size": a.get("tp_size"), "attn_dp_size": self.attn_dp_size,
            "attn_cp_size": a.get("attn_cp_size"), "attn_tp_size": self.attn_tp_size,
            "mla_pool": self.model.uses_mla_pool, "hybrid_swa": self.model.is_hybrid_swa,
            "dsv4": self.model.is_dsv4, "swa_state": self.swa_state,
            "page_size": self.page_size, "page_size_source": self.page_size_source,
            "speculative_algorithm": self.speculative_algorithm,
            "speculative_num_draft_tokens": self.num_draft_tokens,
            "transfer_backend": self.transfer_backend, "unified_kv": self.unified_kv,
            "deprecated_flags": list(a.deprecated), "parsed_by": a.resolved_by,
            "gpu": None if self.gpu is None else self.gpu.to_dict(),
        }


def kwargs_for(fn: Any, candidates: dict[str, Any]) -> dict[str, Any]:
    """The ``candidates`` that ``fn``'s signature takes (each release takes its own)."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in candidates.items() if k in params}


def _build_config(path: str, draft: bool, algorithm: str | None, server_args: Any,
                  env: Mapping[str, str], remote_code: bool) -> Any:
    from sglang.srt.configs.model_config import ModelConfig

    with offline_env(env):
        if server_args is not None:  # as the server builds it: overrides, revision, quant
            if remote_code != bool(getattr(server_args, "trust_remote_code", False)):
                server_args = copy.copy(server_args)
                server_args.trust_remote_code = remote_code
            return ModelConfig.from_server_args(server_args, model_path=path,
                                                is_draft_model=draft)
        kwargs = kwargs_for(ModelConfig.__init__, {"is_draft_model": draft,
                                                    "speculative_algorithm": algorithm,
                                                    "trust_remote_code": remote_code})
        return ModelConfig(path, **kwargs)


def release_model_config(option: str, path: str, draft: bool, algorithm: str | None,
                  server_args: Any, env: Mapping[str, str], remote_code: bool
                  ) -> tuple[Any, str | None]:
    """The release's ``ModelConfig``, and a note when remote code had to be left out."""
    missing = missing_code(path) if remote_code else ()
    if missing:
        note = (f"--trust-remote-code: {path}/config.json names code that is not on this "
                f"machine ({', '.join(missing)} not in {path}); SGLang's resolution and the "
                "model were read without remote code, with the release's class for its model_type")
    try:
        if missing:
            return _build_config(path, draft, algorithm, server_args, env, False), note
        try:
            return _build_config(path, draft, algorithm, server_args, env, remote_code), None
        except Exception as exc:
            cause = machine_cause(exc, "cpu")
            if not remote_code or cause is None or "network" not in cause:
                raise
            note = (f"--trust-remote-code: {path}/config.json names code that is not on this "
                    f"machine ({type(exc).__name__}), and check downloads nothing; the model "
                    "was read without remote code, with the release's class for its "
                    "model_type")
            return _build_config(path, draft, algorithm, server_args, env, False), note
    except Exception as exc:  # SGLang's and transformers' errors on a bad config.json
        raise CheckInputError(option, f"SGLang's ModelConfig cannot read {path}/config.json: "
                                      f"{type(exc).__name__}: {exc}") from None


def load_model(option: str, path: str, draft: bool = False, algorithm: str | None = None,
               server_args: Any = None, env: Mapping[str, str] | None = None,
               remote_code: bool = False) -> tuple[ModelFacts, str | None]:
    """``ModelConfig`` on ``path``/config.json, built once, from the server's resolved
    ``ServerArgs`` when there is one (``ModelConfig.from_server_args``, so
    --json-model-override-args, --revision and quantization apply); a missing or
    unreadable config names ``option``. With the note of :func:`release_model_config`."""
    from sglang.srt.configs.model_config import is_deepseek_v4

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise CheckInputError(option, f"no config.json in {path!r} (give a local directory; "
                                      "weights are not needed)")
    config, note = release_model_config(option, path, draft, algorithm, server_args, env or {},
                                 remote_code)
    hf = config.hf_config
    arch = (getattr(hf, "architectures", None) or ["?"])[0]
    attn = getattr(config.attention_arch, "name", str(config.attention_arch))
    # DeepSeek-V4's window and ratios as SGLang passes them to its pool (ModelConfig's own).
    ratios = getattr(config, "compress_ratios", None) or getattr(hf, "compress_ratios", None)
    window = getattr(config, "window_size", None)
    if not isinstance(window, int):
        window = getattr(hf, "sliding_window", None)
    return ModelFacts(
        path=path, architecture=arch, attention_arch=attn,
        is_hybrid_swa=bool(getattr(config, "is_hybrid_swa", False)),
        is_dsv4=bool(is_deepseek_v4(hf)),
        sliding_window=int(window) if isinstance(window, int) else None,
        compress_ratios=tuple(int(r) for r in (ratios or ())),
        nextn_layers=int(getattr(hf, "num_nextn_predict_layers", 0) or 0),
        num_layers=int(getattr(hf, "num_hidden_layers", 0) or 0),
        config=config,
    ), note


def attention_tp(args: LaunchArgs) -> tuple[int, int]:
    """(attention TP, attention DP) from the release's ``compute_dp_attention_world_info``."""
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info

    candidates = {"tp_rank": 0, "tp_size": args.get("tp_size") or 1,
                  "dp_size": args.get("dp_size") or 1,
                  "enable_dp_attention": bool(args.get("enable_dp_attention")),
                  "attn_dp_size": args.get("attn_dp_size") or 1,
                  "attn_cp_size": args.get("attn_cp_size") or 1}
    result = compute_dp_attention_world_info(
        **kwargs_for(compute_dp_attention_world_info, candidates))
    return int(result[1]), int(result[3])


def _unified(args: LaunchArgs, backend: str, model: ModelFacts) -> bool:
    # is_unified_kv_triton(): is_hip() and SGLANG_HACK_FLASHMLA_BACKEND == unified_kv_triton.
    # The check runs on another machine, so ROCm is inferred: MORI is AMD's transfer engine.
    return (model.is_dsv4 and backend == "mori"
            and args.env.get("SGLANG_HACK_FLASHMLA_BACKEND", "") == "unified_kv_triton")


def derive_server(args: LaunchArgs, gpu: NamedGpu | None = None) -> DerivedServer:
    """Everything the predictions need about one server (``gpu``: the GPU it was named to
    run on, which ``args`` were resolved as when SGLang's probes can answer as it)."""
    option = f"--{args.role}"
    model_path = str(args.get("model_path"))
    remote_code = bool(args.typed.get("trust_remote_code"))
    model, note = load_model(option, model_path, server_args=args.server_args, env=args.env,
                             remote_code=remote_code)
    notes = args.notes + ((note,) if note else ())
    algorithm = args.get("speculative_algorithm")
    draft = None
    if algorithm:
        draft_path = str(args.get("speculative_draft_model_path") or model_path)
        draft, note = load_model(option, draft_path, draft=True, algorithm=str(algorithm),
                                 server_args=args.server_args, env=args.env,
                                 remote_code=remote_code)
        notes += (note,) if note and note not in notes else ()
    attn_tp, attn_dp = attention_tp(args)
    page = args.get("page_size")
    source = "SGLang's resolution of the flags" if args.resolved else "server flag --page-size"
    if page is None and model.is_dsv4 and not args.resolved:
        page, source = DSV4_PAGE_SIZE, "SGLang's DeepSeek-V4 default (no --page-size)"
    elif page is None:
        source = "SGLang's platform default (no --page-size)"
    backend = str(args.get("disaggregation_transfer_backend") or "?")
    swa_state = (model.is_hybrid_swa and not model.uses_mla_pool
                 and not args.get("disable_hybrid_swa_memory"))
    return DerivedServer(args=args, model=model, draft=draft, attn_tp_size=attn_tp,
                         attn_dp_size=attn_dp, page_size=page, page_size_source=source,
                         transfer_backend=backend,
                         speculative_algorithm=str(algorithm) if algorithm else None,
                         num_draft_tokens=args.get("speculative_num_draft_tokens"),
                         swa_state=swa_state, unified_kv=_unified(args, backend, model), notes=notes,
                         gpu=gpu)

def typed_page(side: DerivedServer) -> int | None:
    """The ``--page-size`` the line typed, ``None`` when it typed none."""
    value = side.args.typed.get("page_size")
    return int(value) if isinstance(value, int) else None


def page_size_source(side: DerivedServer) -> str:
    """Where ``side``'s page size came from: the flag typed, or the release's resolution."""
    typed = typed_page(side)
    if not side.args.resolved:
        return side.page_size_source
    if typed is None:
        return "SGLang's resolution (no --page-size typed: the release's default for the model)"
    if typed != side.page_size:
        return (f"SGLang's resolution for the model (--page-size {typed} was typed and "
                "replaced: the release sets this model's page size itself)")
    return f"server flag --page-size {typed}"


def attention_layout(side: DerivedServer) -> AttentionLayout:
    """``side``'s attention layout as its launch line gives it (what was typed known)."""
    a = side.args
    typed = frozenset(typed_flags(list(a.argv))) & {"dp_size", "enable_dp_attention",
                                                    "attn_dp_size"}
    return AttentionLayout(side.role, side.attn_tp_size, int(a.get("tp_size") or 1),
                           int(a.get("attn_cp_size") or 1), int(a.typed.get("dp_size") or 1),
                           bool(a.get("enable_dp_attention")), typed)
