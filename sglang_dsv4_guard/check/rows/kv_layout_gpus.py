"""The DeepSeek-V4 KV layout of a pair whose layout variables differ, judged on each GPU
model (the first-contact row's KV layout code, ``LAYOUT_CODE``).

SGLang's ``select_dsv4_kv_layout`` (0.5.21+) chooses a server's layout from
``SGLANG_DSV4_KV_LAYOUT`` (and ``SGLANG_DSV4_COMPRESSED_KV_LAYOUT``) and the GPU: ``v41``
asserts off SM100/SM103 (the server stops at start-up), ``auto`` is V4.1 there and V4
elsewhere. So when the two servers' variables differ, each pair of GPUs the servers may
have (:func:`~..server.gpus.device_pairs`: the GPU a server is named to run on, else each
model a ``--device cuda`` server may have) is tried: each server's selector runs with the
probes (and torch) answering as its GPU (:func:`~..offline.probes.cuda_present`);
where both start, the release's own ``try_ensure_parallel_info``
(:func:`~sglang_dsv4_guard.pd.first_contact.first_contact`) runs on the layouts their
pools publish there (0.5.21 - 0.5.22 publish none: nothing compares them). The pair fails
on every GPU model: an error; on some: a warning naming them; on none: no finding.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from sglang_dsv4_guard.check.fixing.flag_fixes import accepted_fix
from sglang_dsv4_guard.check.offline.probes import Device, cuda_present
from sglang_dsv4_guard.check.rows.contract_run import ContractRun
from sglang_dsv4_guard.check.rows.kv_layout_env import layout_env, selecting
from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.check.server.endpoint_values import resolved_value
from sglang_dsv4_guard.check.server.gpus import device_pairs
from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Observation, Phase, Severity, When
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.targets import DSV4_LAYOUT_ENV, DSV4_POOL, PD_DSV4_LAYOUT
from sglang_dsv4_guard.pd.endpoint import Value
from sglang_dsv4_guard.pd.first_contact import LAYOUT_CODE, first_contact
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["GpuRow", "LayoutByGpu", "layout_by_gpu", "published_layout"]

_HOW = (f"SGLang's {PD_DSV4_LAYOUT.attr} for each server as this GPU, then its "
        "try_ensure_parallel_info on the layouts their pools publish")


@dataclass(frozen=True)
class GpuRow:
    """The pair on one GPU model: the layout each server gets (``None``: it stops at
    start-up), where the pair fails (``start-up``, ``first contact`` or ``None``), the
    servers that fail and SGLang's message."""

    gpu: str
    prefill: str | None
    decode: str | None
    fails_at: str | None
    fails: tuple[str, ...]
    message: str | None

    def as_value(self) -> dict[str, Any]:
        """The row as the finding's observation value."""
        return {"prefill": self.prefill, "decode": self.decode, "fails_at": self.fails_at,
                "fails": list(self.fails), "message": self.message}


@dataclass(frozen=True)
class LayoutByGpu:
    """The per-GPU judgement of the pair: its finding (none when every GPU model accepts
    the pair) and what it could not judge."""

    findings: tuple[Finding, ...]
    unknowns: tuple[str, ...] = ()


def published_layout(side: DerivedServer, env: Mapping[str, str],
                     device: Device | None = None) -> tuple[str, Any]:
    """(the layout SGLang's selector chooses for ``side`` with the layout variables
    ``env``, the value its DeepSeek-V4 pool publishes for first contact, ``None`` where the
    release publishes none), as ``device`` (this machine when ``None``). Raises what the
    selector raises."""
    module = importlib.import_module(PD_DSV4_LAYOUT.module)  # unscanned: SGLang
    pool_cls = getattr(module, DSV4_POOL.qualname, None)
    with selecting(side, dict(env), unset_others=True) as select, \
            (cuda_present(device) if device is not None else nullcontext()):
        layout, option = select()
    chosen = str(getattr(layout, "value", layout)) + (f" ({option})" if option else "")
    if pool_cls is None or not hasattr(pool_cls, "pd_kv_layout"):
        return chosen, None
    pool = object.__new__(pool_cls)
    pool.kv_layout, pool.compressed_kv_layout_option = layout, option
    pool.compression_ratios = list(side.model.compress_ratios)
    pool.uniform_fp8 = (resolved_value(side, "dsv4_attn_backend", None) == "trtllm"
                        and not side.unified_kv)
    return chosen, pool.pd_kv_layout()


def _judged(run: ContractRun) -> bool:
    """Whether the pair is judged per GPU model: two resolved DeepSeek-V4 servers with
    pairs of GPUs to judge (:func:`~..server.gpus.device_pairs`), a release with the
    selector, different layout variables, neither refused on every machine or on the GPU
    it is named to run on (the layout variables' start-up row, :mod:`.kv_layout_env`,
    says that)."""
    p, d = run.prefill_side, run.decode_side
    module = importlib.import_module(PD_DSV4_LAYOUT.module)  # unscanned: SGLang
    return (getattr(module, PD_DSV4_LAYOUT.attr, None) is not None
            and all(s.model.is_dsv4 and s.args.server_args is not None for s in (p, d))
            and bool(device_pairs(p.args, d.args))
            and layout_env(p) != layout_env(d)
            and not (run.prefill.has("dsv4_kv_layout_refused")
                     or run.decode.has("dsv4_kv_layout_refused")))


def _rows(run: ContractRun, envs: Mapping[str, Mapping[str, str]]) -> list[GpuRow]:
    """The pair on each GPU model, the servers' layout variables being ``envs``."""
    sides = (run.prefill_side, run.decode_side)
    rows = []
    for pair in device_pairs(run.prefill_side.args, run.decode_side.args):
        chosen: dict[str, tuple[str, Any]] = {}
        refused: dict[str, str] = {}
        for side in sides:
            device = pair.prefill if side.role == "prefill" else pair.decode
            try:
                chosen[side.role] = published_layout(side, envs[side.role], device)
            except AssertionError as exc:  # the selector's own refusal on this GPU
                refused[side.role] = str(exc)
        if refused:
            layouts = {role: layout for role, (layout, _) in chosen.items()}
            rows.append(GpuRow(pair.label, layouts.get("prefill"), layouts.get("decode"),
                               "start-up", tuple(refused), next(iter(refused.values()))))
            continue
        ends = [end.with_values(kv_layout=Value(chosen[end.role][1], _HOW))
                for end in (run.prefill, run.decode)]
        raised = next((r for r in first_contact(ends[0], ends[1], run.release).raised
                       if r.code == LAYOUT_CODE), None)
        rows.append(GpuRow(pair.label, chosen["prefill"][0], chosen["decode"][0],
                           None if raised is None else "first contact",
                           () if raised is None else ("decode",),
                           None if raised is None else raised.message))
    return rows


def _said(env: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in env.items()) or "unset"


def _when(rows: list[GpuRow], backend: str) -> When:
    failing = [r for r in rows if r.fails_at]
    parts = []
    for at, effect in (("start-up", "{servers} stops at start-up (SGLang's "
                                    f"{PD_DSV4_LAYOUT.attr} asserts)"),
                       ("first contact", when_of(Phase.FIRST_CONTACT, backend).effect)):
        group = [r for r in failing if r.fails_at == at]
        if group:
            servers = " and ".join(dict.fromkeys(s for r in group for s in r.fails))
            parts.append(f"on {', '.join(r.gpu for r in group)}: "
                         + effect.format(servers=f"the {servers} server"))
    phase = (Phase.FIRST_CONTACT if any(r.fails_at == "first contact" for r in failing)
             else Phase.START_UP)
    return When(phase, "; ".join(parts))


def _fixes(run: ContractRun) -> tuple[Fix, ...]:
    """Unset the layout variables of a server that sets them, or give the other server
    the same ones; each kept where the pair then fails on no GPU model (or the two are
    equal) and the release's resolution accepts the edited line."""
    sides = {"prefill": run.prefill_side, "decode": run.decode_side}
    envs = {role: layout_env(side) for role, side in sides.items()}
    candidates: list[tuple[str, str, dict[str, str]]] = []
    for role, env in envs.items():
        if env:
            candidates.append((f"unset the {role} server's DeepSeek-V4 layout variables "
                               "(the release's default)", role, {}))
    for role, other in (("decode", "prefill"), ("prefill", "decode")):
        if envs[other]:
            candidates.append((f"give the {role} server the {other}'s DeepSeek-V4 layout "
                               f"variables ({_said(envs[other])})", role, envs[other]))
    fixes = []
    for text, role, wanted in candidates:
        edited = {**envs, role: wanted}
        if edited["prefill"] != edited["decode"] and any(r.fails_at for r in _rows(run, edited)):
            continue
        edits = tuple(Edit(role, k, wanted[k], env=True) if k in wanted
                      else Edit(role, k, remove=True, env=True)
                      for k in DSV4_LAYOUT_ENV if envs[role].get(k) != wanted.get(k))
        fix = accepted_fix(Fix(FixKind.FLAGS, text, field="kv_layout", edits=edits), sides)
        if fix is not None:
            fixes.append(fix)
    return tuple(fixes)


def layout_by_gpu(run: ContractRun) -> LayoutByGpu | None:
    """The pair's layout judged per GPU model, ``None`` when it is not judged so."""
    if not _judged(run):
        return None
    envs = {"prefill": layout_env(run.prefill_side), "decode": layout_env(run.decode_side)}
    try:
        rows = _rows(run, envs)
    except Exception as exc:  # the selector read what this check does not set
        return LayoutByGpu((), (f"the DeepSeek-V4 KV layout ({LAYOUT_CODE}) per GPU model: "
                                  f"not judged: {type(exc).__name__}: {exc}",))
    failing = [r for r in rows if r.fails_at]
    if not failing:
        return LayoutByGpu(())
    every = len(failing) == len(rows)
    messages = [r.message for r in failing if r.fails_at == "first contact"] or \
        [r.message for r in failing]
    observations = (
        *(Observation(role, "DeepSeek-V4 layout variables", _said(env),
                      "the server's environment") for role, env in envs.items()),
        *(Observation("prefill/decode", f"on {r.gpu}", r.as_value(), _HOW) for r in rows))
    lines = tuple(f"  on {r.gpu}: prefill {r.prefill or 'stops'}, decode {r.decode or 'stops'}: "
                  + (f"the {' and '.join(r.fails)} server fails at {r.fails_at}" if r.fails_at
                     else "SGLang accepts the pair" + (
                         " (the layouts differ, and this release's first contact compares "
                         "none)" if r.prefill != r.decode else "")) for r in rows)
    finding = Finding(
        code=LAYOUT_CODE, severity=Severity.ERROR if every else Severity.WARNING,
        summary=CODES[LAYOUT_CODE].title,
        subject="the prefill and decode servers' DeepSeek-V4 KV layout variables",
        observations=observations,
        details=("the layout variables differ, and the layout each server gets depends on "
                 f"the GPU model; {_HOW}, as each GPU model:", *lines),
        fixes=_fixes(run) if run.derive else (), docs=docs_url(LAYOUT_CODE),
        host_message=messages[0],
        when=_when(rows, str(run.decode.get("transfer_backend", "?"))))
    return LayoutByGpu((finding,))
