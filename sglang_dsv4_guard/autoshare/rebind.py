"""Built-in remediation: auto-share the draft pool's SWA index mapping (``DSV4G007``).

Acts only with auto-share on, and only on a ``share=True`` decision of
:func:`sglang_dsv4_guard.state.sharing.decide`. Sharing always goes through
``draft_pool.register_mapping(target_mapping)``, SGLang's own registration call.
"""

from __future__ import annotations

import logging

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Observation, Phase, Severity, When
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.hookmarkers import hookimpl
from sglang_dsv4_guard.host.targets import MAPPING_ATTR, POOL_REGISTER
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.state.pool_fixes import mapping_source
from sglang_dsv4_guard.state.sharing import decide
from sglang_dsv4_guard.state.snapshot import StateContext, StatePair

logger = logging.getLogger(LOGGER_NAME)


# tryfirst: the built-in remedy runs before any third-party one, under pluggy's order.
@hookimpl(tryfirst=True)
def sglang_dsv4_guard_remediate_state(target_pool: object, draft_pool: object,
                                      pair: StatePair, context: StateContext) -> list[Finding]:
    """Rebind the draft to the target's mapping when the rule proves it safe."""
    if not context.autoshare:
        return []
    decision = decide(pair, context.profile)
    if not decision.share:
        return []
    before = pair.draft.mapping.describe()
    getattr(draft_pool, POOL_REGISTER)(getattr(target_pool, MAPPING_ATTR))
    severity = Severity.WARNING if decision.warn else Severity.INFO
    details = [f"why it is safe: {decision.reason}"]
    if decision.warn:
        details.append("the draft pool no longer reads its own tensor; writes to that tensor "
                       "are not seen by the draft any more")
    details.append("uninstall() does not undo the share")
    logger.log(logging.WARNING if decision.warn else logging.INFO,
               "sglang-dsv4-guard auto-share: draft pool now uses the target pool's SWA index "
               "mapping (%s)", decision.reason)
    return [Finding(
        code="DSV4G007", severity=severity, summary=CODES["DSV4G007"].title,
        subject=MAPPING_ATTR, when=When(Phase.START_UP, "at start-up, before SGLang's check: "
                                        "the guard rebound the mapping; the server starts"),
        observations=(
            Observation("draft pool", f"{MAPPING_ATTR} (before)", before,
                        mapping_source(pair.draft, context)),
            Observation("target pool", MAPPING_ATTR, pair.target.mapping.describe(),
                        mapping_source(pair.target, context)),
        ),
        details=tuple(details), fixes=(Fix(
            FixKind.CODE,
            "nothing to do for this server; so that no rebinding is needed, hand the draft "
            "worker the target's token_to_kv_pool_allocator" + (
                f" (the draft's old mapping was registered by {pair.draft.registered_by})"
                if pair.draft.registered_by else ""),
            field=MAPPING_ATTR, inputs=(f"the allocator handed to the draft worker: its "
                                        f"{MAPPING_ATTR} is what the draft pool registers",)),),
        docs=docs_url("DSV4G007"),
    )]
