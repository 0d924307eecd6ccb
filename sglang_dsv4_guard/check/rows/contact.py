"""``check``'s decode-first-contact and DCP-relayout rows (:mod:`..pd.first_contact`,
:mod:`..pd.relayout`): the values they read, derived from a launch line, and the fixes.

Values (each with its source): ``kv_cache_dtype_str`` as the release's own
``configure_kv_cache_dtype`` gives it (:func:`_kv_dtype`); ``dcp_size``,
``enable_kv_cache_sharding``, ``enable_dsa_cache_layer_split`` from the resolved
``ServerArgs``; ``kv_layout`` (0.5.23, DeepSeek-V4) from the release's
``select_dsv4_kv_layout`` and its pool's ``pd_kv_layout`` on a bare pool;
``dsv41_spec_layout`` from the release's ``get_dsv41_spec_layout`` (0.5.21+). For a
server SGLang's resolution did not resolve, the values only resolution decides are
unknown (:func:`_unresolved`), never parser defaults.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from sglang_dsv4_guard.check.fixing.flag_fixes import accepted_fixes
from sglang_dsv4_guard.check.fixing.refusal import CODE as REFUSAL_CODE
from sglang_dsv4_guard.check.offline.parse import CheckInputError, offline_env
from sglang_dsv4_guard.check.rows.contract_run import ContractRun
from sglang_dsv4_guard.check.rows.kv_layout_env import CODE as LAYOUT_ENV_CODE
from sglang_dsv4_guard.check.rows.kv_layout_env import EVERY_MACHINE, layout_env
from sglang_dsv4_guard.check.rows.kv_layout_gpus import layout_by_gpu, published_layout
from sglang_dsv4_guard.check.server.derive import DerivedServer, kwargs_for, release_model_config
from sglang_dsv4_guard.check.server.edit import typed_flags
from sglang_dsv4_guard.check.server.endpoint_values import (
    CONTRIBUTORS,
    field_source,
    resolved_value,
    typed_source,
)
from sglang_dsv4_guard.check.server.gpus import page_size_by_gpu
from sglang_dsv4_guard.check.server.pools import published_server_args
from sglang_dsv4_guard.findings import Finding
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.host.envs import env_reading
from sglang_dsv4_guard.host.targets import (
    DSV4_LAYOUT_ENV,
    DSV4_POOL,
    PD_DSV4_LAYOUT,
    PD_KV_DTYPE,
    PD_QUANT_CONFIG,
)
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.pd.endpoint import UNKNOWN, Value
from sglang_dsv4_guard.pd.first_contact import (
    DSPARK_CODE,
    DTYPE_CODE,
    LAYOUT_CODE,
    PAGE_CODE,
    contact_findings,
)
from sglang_dsv4_guard.pd.relayout import relayout_findings

log = logging.getLogger(LOGGER_NAME)

__all__ = ["LAYOUT_NOTES", "NOTES", "contact_row", "contact_values"]

NOTES = "first_contact_unknowns"  # the endpoint value carrying what was not derived
# ... of them, what the layout per GPU model decides when it judges the pair
LAYOUT_NOTES = "kv_layout_unknowns"


def _quantized(side: DerivedServer) -> bool:
    """Whether the server loads a quantized checkpoint: ``--quantization``, or a
    quantization config in config.json or hf_quant_config.json (what ``ModelConfig``
    reads)."""
    if resolved_value(side, "quantization", None):
        return True
    path = os.path.join(side.model.path, "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            if json.load(fh).get("quantization_config"):
                return True
    except (OSError, ValueError, AttributeError):
        return True  # unreadable here: let SGLang's ModelConfig say what it reads
    return os.path.isfile(os.path.join(side.model.path, "hf_quant_config.json"))


def _stand_in_model(side: DerivedServer) -> tuple[Any, str | None, str | None]:
    """(the model object ``configure_kv_cache_dtype`` reads, its source, why not): a
    stand-in whose ``quant_config`` is the one the model loader builds from config.json.

    SGLang passes the loaded model (``ModelRunner.configure_kv_cache_dtype``, 0.5.16 -
    0.5.23), whose ``quant_config`` comes from ``model_loader/loader.py``
    ``_get_quantization_config`` -> ``weight_utils.get_quant_config`` on the
    ``ModelConfig``; that function builds the release's own quant-config class from
    config.json (or hf_quant_config.json next to it) and reads no weights. Without a
    quantization the model has no quant config (``None`` stands for it)."""
    if not _quantized(side):
        return None, None, None  # no quantization: the model has no quant config
    try:
        model_config, _ = release_model_config(
            f"--{side.role}", side.model.path, False, side.speculative_algorithm,
            side.args.server_args, side.args.env, bool(side.args.typed.get("trust_remote_code")))
    except CheckInputError as exc:
        return None, None, f"SGLang's ModelConfig did not read it here ({exc})"
    if getattr(model_config, "quantization", None) is None:
        return None, None, None
    from sglang.srt.configs.load_config import LoadConfig

    function = getattr(importlib.import_module(PD_QUANT_CONFIG.module),  # unscanned: SGLang
                       PD_QUANT_CONFIG.attr)
    try:
        with offline_env(side.args.env):
            quant = function(model_config, LoadConfig(), {})
    except Exception as exc:  # a quantization whose config needs what is not here
        return None, None, (f"the release's {PD_QUANT_CONFIG.attr} could not build the "
                            f"{model_config.quantization} config from {side.model.path} "
                            f"({type(exc).__name__}: {exc})")
    algo = getattr(quant, "kv_cache_quant_algo", None)
    source = (f"{side.model.path}/config.json quantization_config, read by the release's "
              f"{type(quant).__name__} (kv_cache_quant_algo {algo})")
    return SimpleNamespace(quant_config=quant), source, None


def _kv_dtype(side: DerivedServer) -> tuple[Value | None, str | None]:
    """The KV cache dtype string the server's target runner publishes, or (``None``,
    why) when it is not known here.

    From 0.5.17 ``try_ensure_parallel_info`` compares the runner's ``kv_cache_dtype_str``
    (``configure_kv_cache_dtype``'s resolved string, else the flag's); 0.5.16 compares
    ``server_args.kv_cache_dtype``, which ``ModelRunner._record_kv_cache_dtype`` rewrites
    to that same resolved string when the model loads (before the KV manager is built):
    one value for every release."""
    server = str(resolved_value(side, "kv_cache_dtype", "auto"))
    source = typed_source(side, "kv_cache_dtype")
    model, model_source, unknown = _stand_in_model(side) if server == "auto" else (None, None, None)
    if unknown is not None:
        return None, (f"{side.role}: with --kv-cache-dtype auto the KV cache dtype string "
                      f"follows the checkpoint's quantization config, and {unknown}; "
                      f"{DTYPE_CODE} was not judged for this server")
    try:
        module = importlib.import_module(PD_KV_DTYPE.module)  # unscanned: SGLang
        function = getattr(module, PD_KV_DTYPE.attr)
        import torch

        candidates = {"server_args_kv_cache_dtype": server, "model": model,
                      "model_dtype": torch.bfloat16, "is_draft_worker": False,
                      "is_dflash": False, "speculative_draft_attention_backend": None,
                      "speculative_draft_kv_cache_dtype": None}
        resolved = function(**kwargs_for(function, candidates))[0]
    except Exception as exc:  # a dtype this CPU cannot build (fp8_e5m2 on 0.5.23)
        return Value(server, f"{source} (the release's configure_kv_cache_dtype did not run "
                             f"here: {type(exc).__name__}: {exc}; the string is the flag's)"), None
    value = resolved if resolved is not None else server
    via = f" and {model_source}" if model_source else ""
    return Value(value, f"{source}{via}, as the release's configure_kv_cache_dtype "
                        "publishes it for the target runner"), None


def _kv_layout(side: DerivedServer) -> tuple[Value, str | None]:
    none = Value(None, "the release publishes no KV layout for this pool")
    if not side.model.is_dsv4:
        return none, None
    backend = resolved_value(side, "dsv4_attn_backend", None)
    typed_env = ", ".join(f"{k}={side.args.env.get(k, '(unset)')}" for k in DSV4_LAYOUT_ENV)
    source = (f"the release's {PD_DSV4_LAYOUT.attr} and pd_kv_layout on "
              f"--dsv4-attn-backend {backend} and {typed_env}"
              + (f", as {side.args.gpu.name}" if side.args.gpu is not None else ""))
    module = importlib.import_module(PD_DSV4_LAYOUT.module)  # unscanned: SGLang
    pool_cls = getattr(module, DSV4_POOL.qualname, None)
    if getattr(module, PD_DSV4_LAYOUT.attr, None) is None or not hasattr(pool_cls, "pd_kv_layout"):
        return none, None  # no selector, or (before 0.5.23) no layout published
    gpu = side.args.gpu  # the GPU the server is named to run on: the selector runs as it
    try:
        _, value = published_layout(side, layout_env(side), gpu)
    except Exception as exc:
        if isinstance(exc, AssertionError) and (str(exc).startswith(EVERY_MACHINE)
                                                or gpu is not None):
            where = "on every machine" if gpu is None else f"on {gpu.name}, the server's GPU"
            return Value(None, source), (
                f"{side.role}: SGLang's {PD_DSV4_LAYOUT.attr} refuses {typed_env} with "
                f"--dsv4-attn-backend {backend} {where} ({exc}): the server would "
                f"not start ({LAYOUT_ENV_CODE}); the DeepSeek-V4 KV layout ({LAYOUT_CODE}) "
                "is not judged")
        # the V4.1 layouts need an SM100/SM103 GPU (or gfx950): their GPU assertion, or else
        return Value(None, source), (
            f"{side.role}: the DeepSeek-V4 KV layout ({LAYOUT_CODE}) depends on the GPU: "
            f"{type(exc).__name__}: {exc}; not decidable on this machine")
    # What SGLang reads when the variable is unset is its own default (v4 in 0.5.22+).
    read, _ = env_reading("SGLANG_DSV4_KV_LAYOUT", side.args.env.get("SGLANG_DSV4_KV_LAYOUT"))
    mode = str(read).lower()
    note = (f"{side.role}: SGLANG_DSV4_KV_LAYOUT={mode} gives the V4.1 layout on an "
            f"SM100/SM103 GPU and V4 elsewhere; this check computed the V4 case ({LAYOUT_CODE} "
            "compares the layouts the two servers' GPUs give)") if mode == "auto" \
        and gpu is None else None
    return Value(value, source), note


def _dspark(side: DerivedServer) -> tuple[Value, str | None]:
    from sglang.srt.disaggregation import utils

    function = getattr(utils, "get_dsv41_spec_layout", None)
    if function is None:
        return Value(None, "the release publishes no DSpark layout"), None
    kv_args = SimpleNamespace(mla_compression_ratios=list(side.model.compress_ratios))
    source = (f"the release's get_dsv41_spec_layout (--speculative-algorithm "
              f"{side.speculative_algorithm}, {side.model.path}/config.json compress_ratios)")
    try:
        with published_server_args(side.args.server_args):
            return Value(function(kv_args), source), None
    except Exception as exc:  # it reads the pools' transfer layout: not built here
        return Value(None, source), (f"{side.role}: the DeepSeek-V4.1 DSpark layout "
                                     f"({DSPARK_CODE}) is read from the built pools, not "
                                     f"derived here ({type(exc).__name__}: {exc})")


def contact_values(side: DerivedServer, values: dict[str, Value]) -> dict[str, Value]:
    """The endpoint values the first contact and the relayout read (none, and a note,
    when deriving them fails: a guard bug never stops ``check``)."""
    try:
        return _contact_values(side)
    except Exception as exc:
        log.warning("check: the first-contact values of the %s server failed (a guard bug; "
                    "please report it): %s: %s", side.role, type(exc).__name__, exc,
                    exc_info=True)
        return {NOTES: Value((f"{side.role}: the first-contact values were not derived (a "
                              f"guard bug, please report it: {type(exc).__name__}: {exc})",),
                             "check")}


# The first-contact values SGLang's resolution decides (a model override, a hook), with
# the row each decides: not known for a server whose resolution did not complete.
_RESOLVED_ONLY = {"page_size": ("the page size", PAGE_CODE),
                  "kv_cache_dtype_str": ("the KV cache dtype string", DTYPE_CODE),
                  "kv_layout": ("the DeepSeek-V4 KV layout", LAYOUT_CODE),
                  "dsv41_spec_layout": ("the DSpark layout", DSPARK_CODE)}


def _unresolved(side: DerivedServer) -> tuple[list[str], str | None]:
    """The values not known for a server SGLang's resolution did not resolve, and the
    one ``unknowns`` line saying so (its parser defaults are not what it would run)."""
    if side.args.resolved:
        return [], None
    typed = typed_flags(list(side.args.argv))
    names = []
    # DeepSeek-V4's model override sets the page size whatever --page-size says
    # (arg_groups/model_overrides/deepseek_v4.py _deepseek_v4_overrides, 0.5.23; the
    # DeepSeek-V4 hook before it); elsewhere an untyped page size is the backend's.
    if side.model.is_dsv4 or "page_size" not in typed:
        names.append("page_size")
    # --kv-cache-dtype auto is rewritten by resolution (deepseek_v4_hook's fp8_e4m3).
    if (typed.get("kv_cache_dtype") or (None, "auto"))[1] in (None, "auto"):
        names.append("kv_cache_dtype_str")
    if side.model.is_dsv4:  # from the resolved --dsv4-attn-backend and published args
        names += ["kv_layout", "dsv41_spec_layout"]
    a = side.args  # the refusal itself is said once, by its finding or its own unknowns line
    why = (f"refused its flags ({REFUSAL_CODE})" if a.resolution_error is not None else
           "did not complete on this machine" if a.machine_refusal else "did not complete")
    labels = ", ".join(_RESOLVED_ONLY[n][0] for n in names)
    rows = ", ".join(dict.fromkeys(_RESOLVED_ONLY[n][1] for n in names))
    return names, (f"{side.role}: SGLang's resolution {why}, so what only it decides for "
                   f"this server ({labels}) is not known: {rows} not judged on this "
                   "server's values")


def _contact_values(side: DerivedServer) -> dict[str, Value]:
    unknown, line = _unresolved(side)
    layout, layout_note = (Value(None, ""), None) if "kv_layout" in unknown else _kv_layout(side)
    dspark, dspark_note = (Value(None, ""), None) if "dsv41_spec_layout" in unknown else _dspark(side)
    kv_dtype, dtype_note = (None, None) if "kv_cache_dtype_str" in unknown else _kv_dtype(side)
    notes = [n for n in (line, dspark_note, dtype_note) if n]
    if kv_dtype is None and "kv_cache_dtype_str" not in unknown:
        unknown.append("kv_cache_dtype_str")
    dcp = resolved_value(side, "dcp_size", 1) or 1
    values = {
        "dcp_size": Value(int(dcp), typed_source(side, "dcp_size")),
        "is_hybrid_mla_backend": Value(False, "SGLang's setup_state_kv_args sets it only for "
                                              "a hybrid linear-attention pool"),
        **{name: Value(bool(resolved_value(side, name, False)), field_source(side, name))
           for name in ("enable_kv_cache_sharding", "enable_dsa_cache_layer_split")},
        "kv_layout": layout,
        "dsv41_spec_layout": dspark,
        NOTES: Value(tuple(notes), "what check could not derive for these rows"),
        LAYOUT_NOTES: Value(tuple(n for n in (layout_note,) if n),
                            "what check could not derive for the KV layout on this machine"),
    }
    if kv_dtype is not None:
        values["kv_cache_dtype_str"] = kv_dtype
    values[UNKNOWN] = Value(tuple(unknown), "values this check does not know for the server")
    return values


def contact_row(run: ContractRun) -> tuple[list[Finding], list[str]]:
    """Decode's first contact and the DCP relayout, on the pair's endpoints."""
    findings, unknowns = contact_findings(run.prefill, run.decode, run.release)
    findings = [page_size_by_gpu(f, run.prefill_side, run.decode_side) for f in findings]
    more, relayout_unknowns = relayout_findings(run.prefill, run.decode, run.release,
                                                run.prefill_side.args.env)
    findings += more
    by_gpu = layout_by_gpu(run)  # the layout variables differ: judged per GPU model
    if by_gpu is not None:
        findings = [f for f in findings if f.code != LAYOUT_CODE] + list(by_gpu.findings)
        unknowns += list(by_gpu.unknowns)
    for endpoint in (run.prefill, run.decode):
        unknowns += list(endpoint.get(NOTES, ()))
        if by_gpu is None or by_gpu.unknowns:
            unknowns += list(endpoint.get(LAYOUT_NOTES, ()))
    # The page size's fixes are derived_fixes' (flag_fixes._g022: the page size per GPU)
    findings = [f if f.code == PAGE_CODE else _accepted(f, run) for f in findings]
    return findings, unknowns + relayout_unknowns


def _accepted(finding: Finding, run: ContractRun) -> Finding:
    """``finding`` with the fixes the release's resolution accepts; none accepted: the
    line saying no flag change of either line the release accepts fixes it."""
    kept = accepted_fixes(finding, run.prefill_side, run.decode_side, run.derive)
    if kept.fixes or not run.derive:
        return kept
    return replace(kept, fixes=(Fix(FixKind.NO_FLAG_FIX, "no flag change of either line "
                                                        "that the release accepts fixes this"),))


CONTRIBUTORS.append(contact_values)
