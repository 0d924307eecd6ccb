"""``check``'s start-up row DSV4G049: SGLang's own refusal of a server's KV pool when the
server sets up its KV transfer (:class:`~.state_types.Refused`, from SGLang's own calls
as :func:`~.state_types.registered_state` makes them on the pool it builds).

Some pools are refused there on every machine: ``MHATokenToKVPool.get_contiguous_buf_infos``
asserts the NHD layout ("HND KV cache (SGLANG_USE_HND_KVCACHE) is not supported with
disagg yet.", every release 0.5.16+), and ``setup_state_kv_args`` refuses a MiniMax
sparse pool with index-value layers ("only K-only sparse layers are"). The fixes are
derived: each variable the server's line sets whose removal makes the same calls pass,
proven by the release's resolution.
"""

from __future__ import annotations

from collections.abc import Mapping

from sglang_dsv4_guard.check.fixing.flag_fixes import kept_fixes
from sglang_dsv4_guard.check.offline.chatter import section
from sglang_dsv4_guard.check.rows.contract_run import ContractRun
from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.check.server.state_types import (
    Refused,
    layers_of,
    model_pool_kind,
    pool_kind,
    registered_state,
)
from sglang_dsv4_guard.codes import CODES, KV_SETUP_REFUSED, docs_url
from sglang_dsv4_guard.findings import STOPS_AT_START, Finding, Observation, Severity
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.host.envs import env_copy

__all__ = ["CODE", "kv_setup_row", "setup_refusal"]

CODE = KV_SETUP_REFUSED

_POOL_NAMES = {"mha": "MHATokenToKVPool", "mla": "MLATokenToKVPool",
               "swa": "SWAKVPool", "minimax": "MiniMaxSparseKVPool"}


def setup_refusal(side: DerivedServer, env: Mapping[str, str]) -> Refused | None:
    """SGLang's refusal of ``side``'s pool in the environment ``env``, when the pool is
    one :mod:`.state_types` builds (not DeepSeek-V4's, nor the unified SWA pool's: those
    say theirs where they are built) and SGLang's own KV setup calls refuse it."""
    kind = pool_kind(side)
    if kind not in _POOL_NAMES:
        return None
    draft_kind = model_pool_kind(side.draft) if side.draft is not None else None
    if side.draft is not None and draft_kind not in ("mha", "mla", "swa"):
        return None  # a draft pool not built here: its set-up is unknown
    got = registered_state(kind, draft_kind, layers_of(side, kind), tuple(sorted(env.items())))
    return got if isinstance(got, Refused) else None


def _causes(side: DerivedServer) -> list[str]:
    """The variables of the server's line whose removal alone lets SGLang's calls pass."""
    env = dict(side.args.env)
    return [name for name in env
            if setup_refusal(side, {k: v for k, v in env.items() if k != name}) is None]


def _finding(run: ContractRun, side: DerivedServer, refused: Refused) -> Finding:
    role, kind = side.role, pool_kind(side) or ""
    causes = _causes(side)
    env = side.args.env
    observations = [Observation(role, name, env[name], f"{name}={env[name]} in the {role} "
                                "server's environment") for name in causes]
    observations.append(Observation(role, "KV pool", _POOL_NAMES[kind], (
        f"the pool SGLang's KV-cache configurator builds for {side.model.path}/config.json, "
        "built here by SGLang's own constructor")))
    fixes = kept_fixes((Fix(FixKind.FLAGS, f"unset {name} on the {role} server (SGLang's "
                            f"{refused.function} then accepts its pool)", field=name,
                            edits=(env_copy(role, name, None),)) for name in causes),
                       run.prefill_side, run.decode_side) if run.derive else ()
    message = refused.message.split(": ", 1)[-1]
    return Finding(
        code=CODE, severity=Severity.ERROR, summary=CODES[CODE].title,
        subject=f"{role} server: the KV transfer set-up of its {_POOL_NAMES[kind]}",
        observations=tuple(observations),
        details=(f"SGLang's {refused.function} refuses the {role} server's pool when its KV "
                 "manager is set up (_init_kv_manager), on every machine: the server never "
                 f"serves ({refused.message}); run here on a miniature {_POOL_NAMES[kind]} "
                 "built by SGLang's own constructor in this server's environment",),
        fixes=fixes, docs=docs_url(CODE), host_message=message, when=STOPS_AT_START)


def kv_setup_row(run: ContractRun) -> tuple[list[Finding], list[str]]:
    """DSV4G049 for each server whose pool SGLang refuses at KV set-up."""
    findings = []
    for side in (run.prefill_side, run.decode_side):
        with section(side.role):  # what SGLang logs building its pool is that server's
            refused = setup_refusal(side, side.args.env)
            if refused is not None:
                findings.append(_finding(run, side, refused))
    return findings, []
