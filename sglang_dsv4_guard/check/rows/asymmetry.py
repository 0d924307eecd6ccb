"""PD asymmetries no runtime check sees: pure functions of two sides. Page sizes are judged
by decode's first contact (:mod:`sglang_dsv4_guard.pd.first_contact`).

Their fixes are derived from both servers' flags by :mod:`.flag_fixes`.

Each finding's severity is the catalogue's (:mod:`sglang_dsv4_guard.codes`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sglang_dsv4_guard.codes import (
    CODES,
    DSV4_KV_LAYOUT,
    ONE_SIDED_DRAFT,
    SERVED_MODEL,
    SPECULATIVE_SETTINGS,
    TRANSFER_BACKENDS,
    docs_url,
)
from sglang_dsv4_guard.findings import Finding, Observation, Phase, When

__all__ = ["SideView", "asymmetry_findings"]

@dataclass(frozen=True)
class SideView:
    """The plain values of one server that the asymmetry checks compare."""

    role: str
    model_path: str
    architecture: str
    draft_path: str | None
    speculative_algorithm: str | None
    num_draft_tokens: int | None
    num_draft_tokens_source: str
    transfer_backend: str
    unified_kv: bool
    hack_flashmla_backend: str | None
    typed: frozenset[str] = frozenset()  # the ServerArgs fields the line sets itself


def _flag_source(field: str, option: str) -> Callable[[SideView], str]:
    """``server flag OPTION`` when the line typed it, else the release's default."""
    return lambda s: (f"server flag {option}" if field in s.typed
                      else f"the release's default (no {option} typed)")


# What neither the prefill's /route answer nor a decode's registration carries, by code.
_UNSENT = {ONE_SIDED_DRAFT: "the speculative settings",
           SPECULATIVE_SETTINGS: "the speculative settings",
           TRANSFER_BACKENDS: "the transfer backend", SERVED_MODEL: "the model",
           DSV4_KV_LAYOUT: "the unified-KV mode"}


def _finding(code: str, subject: str, observations: list[Observation],
             details: tuple[str, ...] = ()) -> Finding:
    info = CODES[code]
    when = When(Phase.SILENT, f"never compared by SGLang (neither the prefill's /route answer "
                f"nor a decode's registration carries {_UNSENT[code]}): no error or log line "
                "names it")
    return Finding(code=code, severity=info.severity, summary=info.title, subject=subject,
                   observations=tuple(observations), details=details,
                   docs=docs_url(code), when=when)


def _both(name: str, source: str | Callable[[SideView], str],
          get: Callable[[SideView], object], p: SideView, d: SideView) -> list[Observation]:
    return [Observation(s.role, name, get(s), source(s) if callable(source) else source)
            for s in (p, d)]


def _speculative(p: SideView, d: SideView) -> list[Finding]:
    algo = _both("speculative_algorithm",
                 _flag_source("speculative_algorithm", "--speculative-algorithm"),
                 lambda s: s.speculative_algorithm, p, d)
    if (p.speculative_algorithm is None) != (d.speculative_algorithm is None):
        return [_finding(ONE_SIDED_DRAFT, "speculative decoding", algo)]
    if p.speculative_algorithm is None:
        return []
    if p.speculative_algorithm != d.speculative_algorithm \
            or p.num_draft_tokens != d.num_draft_tokens:
        tokens = _both("speculative_num_draft_tokens", lambda s: s.num_draft_tokens_source,
                       lambda s: s.num_draft_tokens, p, d)
        return [_finding(SPECULATIVE_SETTINGS, "speculative settings", algo + tokens)]
    return []


def asymmetry_findings(p: SideView, d: SideView) -> list[Finding]:
    """Every prefill/decode asymmetry between ``p`` and ``d`` (the backends' an error)."""
    findings = _speculative(p, d)
    if p.transfer_backend != d.transfer_backend:
        findings.append(_finding(TRANSFER_BACKENDS, "transfer backend", _both(
            "transfer_backend", _flag_source("disaggregation_transfer_backend",
                                             "--disaggregation-transfer-backend"),
            lambda s: s.transfer_backend, p, d)))
    models = []
    if p.model_path != d.model_path or p.architecture != d.architecture:
        models += _both("model_path", _flag_source("model_path", "--model-path"),
                        lambda s: s.model_path, p, d)
        models += _both("architecture", "config.json architectures",
                        lambda s: s.architecture, p, d)
    if p.speculative_algorithm and d.speculative_algorithm and p.draft_path != d.draft_path:
        models += _both("draft_model_path", "server flag --speculative-draft-model-path "
                        "(the target's path when not given)", lambda s: s.draft_path, p, d)
    if models:
        findings.append(_finding(SERVED_MODEL, "served model", models,
                                 ("paths are compared as typed; two hosts may hold the same "
                                  "checkpoint under different paths",)))
    if p.unified_kv != d.unified_kv:
        findings.append(_finding(DSV4_KV_LAYOUT, "DeepSeek-V4 KV layout", _both(
            "SGLANG_HACK_FLASHMLA_BACKEND", lambda s: (
                f"the server's environment (--{s.role}-env); unified only on ROCm"
                if s.hack_flashmla_backend is not None else
                f"not set in the server's environment (no --{s.role}-env for it)"),
            lambda s: s.hack_flashmla_backend, p, d)))
    return findings
