"""``check``'s start-up row for a DeepSeek-V4 server's KV layout variables (DSV4G047).

SGLang's ``select_dsv4_kv_layout`` (0.5.21+, ``mem_cache/deepseek_v4_memory_pool.py``)
reads ``SGLANG_DSV4_KV_LAYOUT`` (and ``SGLANG_DSV4_COMPRESSED_KV_LAYOUT``) when the server
builds its KV pool. It is run here, as the server would run it (its resolved
``ServerArgs`` published, its layout variables set), never re-derived: an assertion it
makes before it looks at the GPU (:data:`EVERY_MACHINE`) stops that server on every
machine, an error; its SM100 assertion depends on the GPU and stays an ``unknowns`` line
(the first-contact row's), but for a server named to run on a GPU (``check --gpu``): the
selector runs as that GPU, and what it asserts there stops that server, an error. What
it accepts is found the same way: each name its own code compares the variable with (the
string constants of the function) is tried, and the fixes are the values it accepts here
(unset: the release's default; the other server's value).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from sglang_dsv4_guard.check.fixing.flag_fixes import accepted_fix
from sglang_dsv4_guard.check.offline.parse import offline_env
from sglang_dsv4_guard.check.offline.probes import cuda_present
from sglang_dsv4_guard.check.rows.contract_run import ContractRun
from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.check.server.endpoint_values import CONTRIBUTORS
from sglang_dsv4_guard.check.server.pools import published_server_args
from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import STOPS_AT_START, Finding, Severity
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.targets import DSV4_LAYOUT_ENV, PD_DSV4_LAYOUT
from sglang_dsv4_guard.pd.endpoint import Value

__all__ = ["EVERY_MACHINE", "kv_layout_env_row", "layout_env", "selecting"]

CODE = "DSV4G047"
# select_dsv4_kv_layout's assertions that hold before it looks at the GPU (0.5.21+): a
# value it does not know, and (0.5.22+) trtllm with a V4.1 layout; its SM100 assertion is
# the GPU's.
EVERY_MACHINE = ("unknown SGLANG_DSV4_KV_LAYOUT", "trtllm uses uniform FP8 pools")
_NAME = re.compile(r"^[a-z0-9_]+$")


def _select() -> Any:
    module = importlib.import_module(PD_DSV4_LAYOUT.module)  # unscanned: SGLang
    return getattr(module, PD_DSV4_LAYOUT.attr, None)


@contextmanager
def selecting(side: DerivedServer, env: dict[str, str], *, unset_others: bool) -> Iterator[Any]:
    """SGLang's ``select_dsv4_kv_layout``, to call in the block with ``side``'s resolved
    ``ServerArgs`` published and ``env`` set (``unset_others``: and the layout variables
    ``env`` does not set unset)."""
    select = _select()
    with offline_env(env), published_server_args(side.args.server_args):
        if unset_others:
            for name in DSV4_LAYOUT_ENV:
                if name not in env:
                    os.environ.pop(name, None)
        yield select


def selection(side: DerivedServer, env: dict[str, str]) -> tuple[str, str | None]:
    """SGLang's ``select_dsv4_kv_layout`` for ``side`` with its layout variables ``env``
    (the others unset), as the GPU ``side`` is named to run on if it is: ``("accepted",
    None)``, ``("refused", message)`` on every machine or on that GPU, or ``("gpu",
    message)`` when what it says depends on the GPU."""
    gpu = side.args.gpu
    with selecting(side, env, unset_others=True) as select, \
            (cuda_present(gpu) if gpu is not None else nullcontext()):
        try:
            select()
        except AssertionError as exc:
            if str(exc).startswith(EVERY_MACHINE) or gpu is not None:
                return "refused", str(exc)
            return "gpu", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # the V4.1 layouts read the GPU (HIP: gfx950)
            return "gpu", f"{type(exc).__name__}: {exc}"
    return "accepted", None


def layout_env(side: DerivedServer) -> dict[str, str]:
    """The DeepSeek-V4 layout variables of ``side``'s environment."""
    return {k: v for k, v in side.args.env.items() if k in DSV4_LAYOUT_ENV}


def _accepted(side: DerivedServer) -> list[str]:
    """The ``SGLANG_DSV4_KV_LAYOUT`` values SGLang's selection does not refuse on every
    machine for this server: the names its own code compares the variable with, each
    tried (a value needing an SM100 GPU marked so)."""
    code = getattr(_select(), "__code__", None)
    names = sorted({c for c in (code.co_consts if code is not None else ())
                    if isinstance(c, str) and _NAME.match(c)})
    found = []
    for name in names:
        outcome, _ = selection(side, {**layout_env(side), DSV4_LAYOUT_ENV[0]: name})
        if outcome != "refused":
            found.append(name + (" (needs an SM100/SM103 GPU)" if outcome == "gpu" else ""))
    return found


def _refusal(side: DerivedServer, values: dict[str, Value]) -> dict[str, Value]:
    """The refusal of this server's layout variables, when SGLang's selection refuses
    them on every machine, or (set or not) on the GPU the server is named to run on (a
    resolved DeepSeek-V4 server on a release with the selector)."""
    env = layout_env(side)
    if (not env and side.args.gpu is None) or not side.model.is_dsv4 \
            or side.args.server_args is None or _select() is None:
        return {}
    outcome, message = selection(side, env)
    if outcome != "refused":
        return {}
    typed = ", ".join(f"{k}={v}" for k, v in env.items()) or "unset"
    return {"dsv4_kv_layout_refused": Value(message, (
        f"{typed} in the server's environment, run through the release's "
        f"{PD_DSV4_LAYOUT.attr} with its resolved flags{_as_gpu(side)}")),
        "dsv4_kv_layout_env": Value(typed, "the server's environment")}


CONTRIBUTORS.append(_refusal)


def _fixes(run: ContractRun, side: DerivedServer, other: DerivedServer) -> tuple[Fix, ...]:
    """The layout variables unset (the release's default), or the other server's values,
    each only where SGLang's selection accepts the result for this server here."""
    env, theirs = layout_env(side), layout_env(other)
    candidates: list[tuple[str, dict[str, str]]] = []
    if theirs != env and (theirs or other.args.server_args is not None):
        said = ", ".join(f"{k}={v}" for k, v in theirs.items()) or "unset"
        candidates.append((f"give the {side.role} server the {other.role}'s DeepSeek-V4 "
                           f"layout variables ({said})", theirs))
    if theirs:  # unset is the other candidate; when theirs is empty it is the same
        candidates.append((f"unset the {side.role} server's DeepSeek-V4 layout variables "
                           "(the release's default)", {}))
    sides = {"prefill": run.prefill_side, "decode": run.decode_side}
    fixes = []
    for text, wanted in candidates:
        if selection(side, wanted)[0] != "accepted":
            continue
        edits = tuple(Edit(side.role, k, wanted[k], env=True) if k in wanted
                      else Edit(side.role, k, remove=True, env=True)
                      for k in DSV4_LAYOUT_ENV if env.get(k) != wanted.get(k))
        fixes.append(accepted_fix(Fix(FixKind.FLAGS, text, field="dsv4_kv_layout_env",
                                      edits=edits), sides))
    return tuple(f for f in fixes if f is not None)


def _as_gpu(side: DerivedServer) -> str:
    return "" if side.args.gpu is None else f" as {side.args.gpu.name}, the server's GPU"


def kv_layout_env_row(run: ContractRun) -> tuple[list[Finding], list[str]]:
    """DSV4G047 for each server whose layout variables SGLang refuses on every machine,
    or on the GPU the server is named to run on."""
    findings = []
    for end, side, other in ((run.prefill, run.prefill_side, run.decode_side),
                             (run.decode, run.decode_side, run.prefill_side)):
        if not end.has("dsv4_kv_layout_refused"):
            continue
        message = str(end.get("dsv4_kv_layout_refused"))
        findings.append(Finding(
            code=CODE, severity=Severity.ERROR, summary=CODES[CODE].title,
            subject=f"{side.role} server's DeepSeek-V4 KV pool",
            observations=(end.observation("dsv4_kv_layout_env"),),
            details=(f"SGLang's {PD_DSV4_LAYOUT.attr} (called when the server builds its KV "
                     f"pool) asserts{_as_gpu(side)}: {message}; for this server it accepts "
                     f"{DSV4_LAYOUT_ENV[0]} = " + ", ".join(_accepted(side))
                     + " (unset: the release's default)",),
            fixes=_fixes(run, side, other) if run.derive else (), docs=docs_url(CODE),
            host_message=message, when=STOPS_AT_START))
    return findings, []
