"""Built-in registration check: what SGLang will refuse later for this decode peer, for
the conditions not yet written as pair conditions (:mod:`sglang_dsv4_guard.pd.conditions`,
which the registration wrappers run after this hook: NIXL's payload, DSV4G042/043/046;
``maybe_send_extra``, DSV4G040/041; the metadata buffer counts, DSV4G045).

On the endpoints the registration snapshot built from the live manager and the decode's
``KVArgsRegisterInfo``: the DCP relayout (DSV4G036, :mod:`..pd.relayout`), NIXL's
prepared state transfer (DSV4G055, :mod:`..pd.nixl_state`), NIXL's and MORI's replicated
Mamba state (DSV4G058, :mod:`..pd.mamba_state`), MORI's state refusals
(DSV4G041/056/057, :mod:`..pd.mori_send`) and Mooncake's state-layout verdict (DSV4G050,
:mod:`..pd.state_layout`). Pure apart from running those SGLang functions on half-built
objects, as ``check`` does.
"""

from __future__ import annotations

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Severity
from sglang_dsv4_guard.fixes import Fix, FixKind
from sglang_dsv4_guard.hookmarkers import hookimpl
from sglang_dsv4_guard.host.pd_digests import SITES, NotJudged, locate
from sglang_dsv4_guard.host.verdict import imported_package_dir
from sglang_dsv4_guard.pd.attention_tp import attention_tp_fixes, layout_of
from sglang_dsv4_guard.pd.mamba_state import MAMBA_CODE, mamba_refusal
from sglang_dsv4_guard.pd.mori_send import mori_state_refusals
from sglang_dsv4_guard.pd.nixl_payload import payload_verdict
from sglang_dsv4_guard.pd.nixl_state import state_layout_verdict
from sglang_dsv4_guard.pd.relayout import relayout_findings
from sglang_dsv4_guard.pd.state_layout import CODE as LAYOUT_CODE
from sglang_dsv4_guard.pd.state_layout import state_layout_refusal, state_layout_when
from sglang_dsv4_guard.pd.when import Phase, when_text
from sglang_dsv4_guard.peers.snapshot import Registration, RegistrationContext

__all__ = ["registration_findings", "sglang_dsv4_guard_check_registration", "with_peer"]


def _peer_line(reg: Registration) -> str:
    return f"decode peer: {reg.peer} at {reg.address} ({reg.backend})"


def _tp_fixes(reg: Registration) -> tuple[Fix, ...]:
    """The attention-TP family's fixes (:mod:`..pd.attention_tp`) on the prefill's layout
    and the TP size the decode registered (its layout is not known at run time)."""
    return attention_tp_fixes(layout_of(reg.prefill), layout_of(reg.decode))


def _finding(reg: Registration, code: str, message: str, function: str, subject: str,
             names: tuple[str, ...], phase: Phase, detail: str,
             fixes: tuple[Fix, ...] = (), severity: Severity = Severity.ERROR) -> Finding:
    p, d = reg.prefill, reg.decode
    return Finding(
        code=code, severity=severity, summary=CODES[code].title, subject=subject,
        observations=tuple(e.observation(n) for n in names for e in (p, d) if e.has(n)),
        details=(_peer_line(reg), f"found when the decode peer registered: {detail}",
                 f"SGLang's {function} raises it"),
        fixes=fixes, docs=docs_url(code), host_message=message,
        when=when_text(phase, reg.backend, reg.env))


def _nixl_state_layout(reg: Registration) -> tuple[list[Finding], list[str]]:
    """NIXL's prepared state transfer (0.5.23+) rejects a decode whose state slot strides
    differ: every request to that peer then fails."""
    package = imported_package_dir()
    if package is None:
        return [], []
    try:
        verdict = state_layout_verdict(reg.prefill, reg.decode, package, reg.peer)
    except NotJudged as exc:
        return [], [f"DSV4G055 (nixl): not judged: {exc}"]
    if verdict is None:
        return [], []
    differ = "; ".join(f"component {i} ({st}): prefill {list(p)}, decode {list(d)}"
                       for i, st, p, d in verdict.components)
    fix = Fix(FixKind.ADVICE, "give the decode the prefill's state pool geometry (the same "
              "model, state dtypes and state TP share on both servers): the slot strides in "
              f"bytes differ for {differ or verdict.rejection}", field="state_item_lens")
    return [_finding(reg, "DSV4G055", verdict.message, verdict.function,
                     "decode peer's NIXL state registration",
                     ("state_item_lens", "state_types", "prepared_state_components",
                      "attn_tp_size", "is_mla_backend"), Phase.PER_REQUEST,
                     "SGLang logs \"NIXL state layout rejected\" and every request to this "
                     f"peer will fail ({verdict.rejection})", (fix,))], []


def _mori_state(reg: Registration) -> list[Finding]:
    """MORI's per-request state refusals for this decode (DSV4G041, 056, 057)."""
    found = []
    p, d = reg.prefill, reg.decode
    for r in mori_state_refusals(p, d):
        if r.code == "DSV4G057":
            fixes: tuple[Fix, ...] = (Fix(
                FixKind.ADVICE, "give both servers the same state pools (the same model and "
                f"the flags that add state, e.g. speculative decoding): the decode registered "
                f"{d.get('state_components')} state components, the prefill has "
                f"{p.get('state_components')}", field="state_components"),)
        else:
            fixes = _pairing_fixes(reg, str(r.state_type),
                                   r.pairs_by or ("attention", p.get("attn_tp_size")))
        subject = (f"prefill -> decode MORI transfer of the {r.state_type} state"
                   if r.state_type else "prefill -> decode MORI state transfer")
        found.append(_finding(
            reg, r.code, r.message, r.function, subject,
            ("attn_tp_size", "state_tp_size", "state_components", "state_types",
             "is_mla_backend"), Phase.PER_REQUEST,
            f"every request that carries {r.state_type or 'state'} will fail", fixes))
    return found


def _mamba(reg: Registration) -> tuple[list[Finding], list[str]]:
    """NIXL's and MORI's per-request refusal of replicated Mamba state for a decode of
    another TP (DSV4G058, 0.5.20+)."""
    package = imported_package_dir()
    if package is None:
        return [], []
    try:
        refusal = mamba_refusal(reg.backend, reg.prefill, reg.decode, package)
    except NotJudged as exc:
        return [], [f"{MAMBA_CODE} ({reg.backend}): not judged: {exc}"]
    if refusal is None:
        return [], []
    return [_finding(reg, MAMBA_CODE, refusal.message, refusal.function,
                     f"prefill -> decode {reg.backend} transfer of the mamba state",
                     ("attn_tp_size", "state_tp_size", "state_types", "state_dim_per_tensor"),
                     Phase.PER_REQUEST, "every request that carries mamba state will fail",
                     _pairing_fixes(reg, "mamba", refusal.pairs_by))], []


def _pairing_fixes(reg: Registration, state_type: str, pairs_by: tuple[str, object]
                   ) -> tuple[Fix, ...]:
    """The decode's TP this release's transfer pairs ``state_type`` by (the prefill's
    attention or state TP, as its own check accepted it); for the attention TP, the
    flag edits that make the attention TP sizes equal come first."""
    label, tp = pairs_by
    fixes: tuple[Fix, ...] = (Fix(FixKind.ADVICE, f"give the decode TP {tp}: this release's "
                 f"{reg.backend.upper()} pairs the {state_type} state by the prefill's "
                 f"{label} TP ({tp}); the decode registered {reg.decode.get('attn_tp_size')}",
                 field="decode_tp_size"),)
    if tp == reg.prefill.get("attn_tp_size"):
        fixes = _tp_fixes(reg) + fixes
    return fixes


def _mooncake_state_layout(reg: Registration) -> tuple[list[Finding], list[str]]:
    """Mooncake's own state-layout verdict on the peer (DSV4G050, 0.5.22+)."""
    reason, unknown = state_layout_refusal(reg.prefill, reg.decode, reg.peer)
    if reason is None:
        return [], [f"{LAYOUT_CODE} ({reg.backend}): not judged: {unknown}"] if unknown else []
    p, d = reg.prefill, reg.decode
    fix = Fix(FixKind.ADVICE, "run both servers with the same model, attention TP and "
              "state-pool flags: the decode registered state item lengths "
              f"{d.get('state_item_lens')}, the prefill has {p.get('state_item_lens')} "
              f"(state components {p.get('state_types')})", field="state_item_lens")
    return [Finding(
        code=LAYOUT_CODE, severity=Severity.ERROR, summary=CODES[LAYOUT_CODE].title,
        subject="decode peer's Mooncake state layout",
        observations=tuple(e.observation(n) for n in ("state_types", "state_item_lens",
                                                       "attn_tp_size")
                           for e in (p, d) if e.has(n)),
        details=(_peer_line(reg), f"found when the decode peer registered: SGLang's "
                 f"MooncakeKVManager._validate_peer_state_layout rejects it: {reason}"),
        fixes=(fix,), docs=docs_url(LAYOUT_CODE), host_message=reason,
        when=state_layout_when())], []


def registration_findings(reg: Registration) -> tuple[list[Finding], list[str]]:
    """Every refusal SGLang will make for this peer, in the order it meets them, and
    what could not be judged. A DCP relayout that raises stops registration there."""
    release = "this release"
    relayout, unknowns = ([], []) if not _relayouts(reg) else relayout_findings(
        reg.prefill, reg.decode, release, reg.env)
    if relayout:
        return [with_peer(reg, f) for f in relayout], unknowns
    found: list[Finding] = []
    if reg.backend == "mooncake":
        layout, notes = _mooncake_state_layout(reg)
        found, unknowns = found + layout, unknowns + notes
    # MORI's per-request TP refusal is its own hook's (DSV4G006, mori/checks.py);
    # Mooncake's and NIXL's send_extra (DSV4G040/041) a pair condition (pd/send_extra.py).
    extra = _mori_state(reg) if reg.backend == "mori" else []
    mamba, more = _mamba(reg)
    extra += mamba
    # NIXL prepares the state only once the payload was prepared: a refusal there
    # (DSV4G042/043/046, the pair condition of pd/nixl_payload.py) ends it.
    state, rest = (_nixl_state_layout(reg) if reg.backend == "nixl"
                   and not (reg.decode.has("kv_mem_kinds")
                            and payload_verdict(reg.prefill, reg.decode)) else ([], []))
    return found + extra + state, unknowns + more + rest


def _relayouts(reg: Registration) -> bool:
    """Whether the backend's registration decides the DCP relayout: Mooncake's and
    NIXL's (0.5.17+), MORI's from 0.5.22 (its ``_add_remote_peer`` calls it)."""
    if reg.backend != "mori":
        return True
    package = imported_package_dir()
    return package is not None and locate(package, SITES["peers.mori_relayout"]) is not None


def with_peer(reg: Registration, finding: Finding) -> Finding:
    """``finding`` with the registering peer named first in its details."""
    return Finding(**{**finding.__dict__, "details": (_peer_line(reg), *finding.details)})


# tryfirst: SGLang's own checks come first in every report, under pluggy's call order.
@hookimpl(tryfirst=True)
def sglang_dsv4_guard_check_registration(registration: Registration,
                                         context: RegistrationContext) -> list[Finding]:
    """What SGLang will refuse for this decode peer: DSV4G036, 041 and 056-057 (MORI),
    050, 055 and 058."""
    del context
    return registration_findings(registration)[0]
