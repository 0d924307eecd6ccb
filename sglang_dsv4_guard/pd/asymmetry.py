"""Prefill/decode asymmetries SGLang never compares: a one-sided or different speculative
decoding, different transfer backends, served models or DeepSeek-V4 KV layouts.

Neither the prefill's ``/route`` answer nor a decode's registration carries these values,
so only ``check`` (the endpoints two launch lines imply) can see them; at run time they
are not on the endpoints and nothing is judged. Page sizes are compared by decode's first
contact (:mod:`.first_contact`). Each severity is the catalogue's; the fixes are derived
from both launch lines by ``check`` (``check/fixing/flag_fixes.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from sglang_dsv4_guard.host.targets import FLASHMLA_ENV
from sglang_dsv4_guard.pd.endpoint import REFUSED, Endpoint

__all__ = ["asymmetry_findings"]

# What neither the prefill's /route answer nor a decode's registration carries, by code.
_UNSENT = {ONE_SIDED_DRAFT: "the speculative settings",
           SPECULATIVE_SETTINGS: "the speculative settings",
           TRANSFER_BACKENDS: "the transfer backend", SERVED_MODEL: "the model",
           DSV4_KV_LAYOUT: "the unified-KV mode"}


def _finding(code: str, subject: str, observations: list[Observation],
             details: tuple[str, ...] = ()) -> Finding:
    info = CODES[code]
    seen = (": the two transfer engines cannot talk, so requests fail or hang at the KV "
            "transfer, and no error or log line names the backends"
            if code == TRANSFER_BACKENDS else ": no error or log line names it")
    when = When(Phase.SILENT, f"never compared by SGLang (neither the prefill's /route answer "
                f"nor a decode's registration carries {_UNSENT[code]}){seen}")
    return Finding(code=code, severity=info.severity, summary=info.title, subject=subject,
                   observations=tuple(observations), details=details,
                   docs=docs_url(code), when=when)


def _both(ends: tuple[Endpoint, Endpoint], *names: str) -> list[Observation]:
    return [e.observation(n) for n in names for e in ends]


def _known(ends: tuple[Endpoint, Endpoint], name: str) -> bool:
    return all(e.has(name) for e in ends)


def _differ(ends: tuple[Endpoint, Endpoint], name: str,
            form: Callable[[Any], Any] = lambda v: v) -> bool:
    return _known(ends, name) and form(ends[0].get(name)) != form(ends[1].get(name))


def _path(value: Any) -> Any:
    """A path as written, but for its form (``/m/x/`` is ``/m/x``)."""
    return os.path.normpath(value) if isinstance(value, str) and value else value


def _refused(ends: tuple[Endpoint, Endpoint]) -> list[str]:
    """The roles whose flags SGLang's resolution refused: their algorithm, draft tokens
    and draft are as typed, not as the release resolves them (NEXTN is EAGLE)."""
    return [e.role for e in ends if e.get(REFUSED)]


def _speculative(ends: tuple[Endpoint, Endpoint], unknowns: list[str]) -> list[Finding]:
    if not _known(ends, "speculative_algorithm"):
        return []
    p, d = (e.get("speculative_algorithm") for e in ends)
    if (p is None) != (d is None):
        return [_finding(ONE_SIDED_DRAFT, "speculative decoding",
                         _both(ends, "speculative_algorithm"))]
    if p is None or not (p != d or _differ(ends, "speculative_num_draft_tokens")):
        return []
    if refused := _refused(ends):
        unknowns.append(f"{SPECULATIVE_SETTINGS}: not judged: SGLang's resolution refused the "
                        f"{' and '.join(refused)} server's flags, so their speculative "
                        "settings are known only as typed, not as the release resolves them")
        return []
    return [_finding(SPECULATIVE_SETTINGS, "speculative settings", _both(
        ends, "speculative_algorithm", "speculative_num_draft_tokens"))]


def _layout(end: Endpoint) -> Observation:
    value = (end.env or {}).get(FLASHMLA_ENV)
    return Observation(end.role, FLASHMLA_ENV, value, (
        f"the server's environment (--{end.role}-env); unified only on ROCm"
        if value is not None else
        f"not set in the server's environment (no --{end.role}-env for it)"))


def asymmetry_findings(prefill: Endpoint, decode: Endpoint, package: Path | None = None
                       ) -> tuple[list[Finding], list[str]]:
    """The pair condition: every asymmetry between the two servers whose values both
    endpoints carry (the transfer backends' an error, the others warnings)."""
    ends = (prefill, decode)
    unknowns: list[str] = []
    findings = _speculative(ends, unknowns)
    if _differ(ends, "transfer_backend"):
        findings.append(_finding(TRANSFER_BACKENDS, "transfer backend",
                                 _both(ends, "transfer_backend")))
    models = (_both(ends, "model_path", "architecture")
              if _differ(ends, "model_path", _path) or _differ(ends, "architecture") else [])
    if all(e.get("speculative_algorithm") for e in ends) and not _refused(ends) \
            and _differ(ends, "draft_model_path", _path):
        models += _both(ends, "draft_model_path")
    if models:
        findings.append(_finding(SERVED_MODEL, "served model", models,
                                 ("paths are compared as written but for their form (a "
                                  "trailing slash); two hosts may hold the same "
                                  "checkpoint under different paths",)))
    if _differ(ends, "unified_kv") and all(e.env is not None for e in ends):
        findings.append(_finding(DSV4_KV_LAYOUT, "DeepSeek-V4 KV layout",
                                 [_layout(e) for e in ends]))
    return findings, unknowns
