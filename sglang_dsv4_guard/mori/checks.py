"""Built-in check DSV4G006: SGLang's MORI TP check for the non-MLA ``swa`` state."""

from __future__ import annotations

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Observation, Severity
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.hookspecs import hookimpl
from sglang_dsv4_guard.host import flags
from sglang_dsv4_guard.mori.snapshot import SendContext, SendSnapshot

_DECODE_TP = ("the decode server's attention TP size, sent when it registers "
              "(KVArgsRegisterInfo.decode_tp_size)")
_REWRITE = ("this release rewrites the deprecated --dp-size N --enable-dp-attention into "
            "--attn-dp-size N")


def _has_attn_dp() -> bool:
    """Whether the installed release's parser sets the attention-DP width with
    ``--attn-dp-size`` (0.5.22 on), not ``--dp-size`` under ``--enable-dp-attention``."""
    return flags.flag_for_field("attn_dp_size") is not None


def _attn_tp_source() -> str:
    """Where the prefill's attention TP size comes from, as the installed release says."""
    if _has_attn_dp():
        return (f"--tp-size divided by --attn-dp-size ({_REWRITE}) on the prefill server: "
                "MoriKVManager.attn_tp_size")
    return ("--tp-size (divided by --dp-size with --enable-dp-attention) on the prefill "
            "server: MoriKVManager.attn_tp_size")


def _inputs() -> tuple[str, ...]:
    if _has_attn_dp():
        return (f"attention TP = --tp-size / --attn-dp-size ({_REWRITE})",)
    return ("attention TP = --tp-size, or --tp-size / --dp-size with --enable-dp-attention",)


def _attn_dp(tp: int | None, attn_tp: int | None) -> int | None:
    """The server's attention-DP width, from its --tp-size and the attention TP size it
    runs (SGLang's attention TP is --tp-size / attention DP), or ``None`` unknown."""
    if tp is None or attn_tp is None or attn_tp <= 0 or tp % attn_tp:
        return None
    return tp // attn_tp


def _dp_edits(server: str, new_dp: int, deprecated: bool | None) -> tuple[Edit, ...]:
    """Edits that give ``server`` attention-DP width ``new_dp`` in the release's spelling;
    ``deprecated``: the line was seen with --enable-dp-attention (its --dp-size is then
    the width, and both go on a release with --attn-dp-size)."""
    if _has_attn_dp():
        old = ((Edit(server, "--enable-dp-attention", remove=True),
                Edit(server, "--dp-size", remove=True)) if deprecated else ())
        if new_dp == 1:
            return old or (Edit(server, "--attn-dp-size", remove=True),)
        return (Edit(server, "--attn-dp-size", str(new_dp)), *old)
    if new_dp == 1:
        return (Edit(server, "--enable-dp-attention", remove=True),
                Edit(server, "--dp-size", remove=True))
    return (Edit(server, "--dp-size", str(new_dp)),)


def _edits(*candidates: Edit) -> tuple[Edit, ...]:
    """The edits the installed release's parser accepts (:func:`flags.vetted`)."""
    return flags.vetted(*candidates)


def _layout_edits(server: str, tp: int | None, attn_tp: int | None,
                  dp_attention: bool | None, want: int) -> tuple[Edit, ...]:
    """Edits that give ``server`` attention TP ``want`` from its layout (``--tp-size``
    and the attention TP it runs), keeping its GPU count when they can: with attention DP
    a new attention-DP width (or none at width 1), else --tp-size. Never an edit that
    sets a value the server already has."""
    dp = _attn_dp(tp, attn_tp)
    if tp is None or dp is None or attn_tp == want:
        return ()
    if dp > 1:
        if tp % want == 0:
            return _dp_edits(server, tp // want, dp_attention)
        return (Edit(server, "--tp-size", str(want * dp)),)
    return (Edit(server, "--tp-size", str(want)),)


def _layout(tp: int | None, attn_tp: int | None) -> str:
    dp = _attn_dp(tp, attn_tp)
    if tp is None:
        return ""
    if dp is None or dp == 1:
        return f"--tp-size {tp}"
    spelled = f"--attn-dp-size {dp}" if _has_attn_dp() else f"--dp-size {dp} --enable-dp-attention"
    return f"--tp-size {tp} {spelled}"


def tp_fixes(t: SendSnapshot) -> tuple[Fix, ...]:
    """Flag edits that make the attention TP sizes equal, one server at a time, from that
    server's layout; the decode's layout is known before launch only, so at run time its
    fix names both forms and carries no edit."""
    inputs = _inputs()
    found: list[Fix] = []
    if t.attn_tp_size is not None and t.attn_tp_size > 0:
        want = t.attn_tp_size
        text = (f"give the decode server attention TP {want}, the prefill's (it has "
                f"{t.decode_tp_size})")
        decode_now = _layout(t.decode_tp, t.decode_tp_size)
        edits = _edits(*_layout_edits("decode", t.decode_tp, t.decode_tp_size,
                                      t.decode_enable_dp_attention, want))
        if edits:
            found.append(Fix(FixKind.FLAGS, f"{text} (it runs {decode_now})",
                             field="decode_tp_size", inputs=inputs, edits=edits))
        else:
            dp_form = ("an --attn-dp-size" if _has_attn_dp()
                       else "with --enable-dp-attention a --dp-size")
            found.append(Fix(
                FixKind.ADVICE,
                f"{text}: --tp-size {want} without DP attention, or {dp_form} of its "
                f"--tp-size / {want} (the decode's layout is not known here, so no edit is "
                "given)",
                field="decode_tp_size", inputs=inputs))
    if t.decode_tp_size is not None and t.decode_tp_size > 0:
        prefill_now = _layout(t.tp_size, t.attn_tp_size)
        edits = _edits(*_layout_edits("prefill", t.tp_size, t.attn_tp_size,
                                      t.enable_dp_attention, t.decode_tp_size))
        if edits:
            hint = (_has_attn_dp() and not t.enable_dp_attention
                    and any(e.name == "--attn-dp-size" for e in edits))
            note = ("; if its line has the deprecated --dp-size N --enable-dp-attention, "
                    "replace them (this release rewrites them into --attn-dp-size N)"
                    if hint else "")
            found.append(Fix(
                FixKind.FLAGS,
                f"or give the prefill server attention TP {t.decode_tp_size}, the decode's"
                + (f" (this prefill server runs {prefill_now}{note})" if prefill_now else note),
                field="attn_tp_size", inputs=inputs, edits=edits))
    return tuple(found)


def _peer(t: SendSnapshot, phase: str) -> str:
    if phase == "check":
        return "decode server: the decode launch line checked with this prefill's"
    peer = ", ".join(f"{k}={v}" for k, v in (("engine", t.engine_key), ("endpoint", t.endpoint),
                                             ("port", t.dst_port)) if v is not None)
    return f"decode peer: {peer or 'unknown'}"


def host_message(t: SendSnapshot) -> str:
    """SGLang's message, verbatim (it labels the attention TP size prefill_tp_size)."""
    return ("PD state transfer does not support TP-mismatched non-MLA SWA models "
            f"(prefill_tp_size={t.attn_tp_size}, decode_tp_size={t.decode_tp_size})")


def violates(t: SendSnapshot) -> bool:
    """SGLang's condition, unchanged from 0.5.14 to 0.5.23."""
    return t.state_type == "swa" and not t.is_mla_backend and t.decode_tp_size != t.attn_tp_size


# tryfirst: SGLang's own checks come first in every report, under pluggy's call order.
@hookimpl(tryfirst=True)
def sglang_dsv4_guard_check_send(transfer: SendSnapshot, context: SendContext) -> list[Finding]:
    """DSV4G006 with both sides' TP layout, the peer and the fixes."""
    if not violates(transfer):
        return []
    t = transfer
    observations = [
        Observation("prefill", "attn_tp_size", t.attn_tp_size, _attn_tp_source()),
        Observation("decode", "decode_tp_size", t.decode_tp_size, _DECODE_TP),
        Observation("prefill", "is_mla_backend", t.is_mla_backend,
                    "the KV pool class (MLA pools, DeepSeek-V4 included, are exempt)"),
        Observation("prefill", "state_type", t.state_type, "kv_args.state_types (the pool's "
                    "state components, from setup_state_kv_args)"),
    ]
    for name, value, source in (("tp_size", t.tp_size, "server flag --tp-size"),
                                ("dp_size", t.dp_size, "server flag --dp-size"),
                                ("enable_dp_attention", t.enable_dp_attention,
                                 "server flag --enable-dp-attention"),
                                ("pp_size", t.pp_size, "server flag --pp-size")):
        if value is not None:
            observations.append(Observation("prefill", name, value, source))
    details = [_peer(t, context.phase),
               "SGLang labels the prefill *attention* TP size 'prefill_tp_size'"]
    if context.phase == "register":
        details.append("found when the decode peer registered: every request to it that "
                       "carries 'swa' state will fail")
    elif context.phase == "check":
        details.append("SGLang finds this when the decode peer registers (at run time): "
                       "every request carrying 'swa' state then fails")
    details.append("no SGLang release from 0.5.16 to 0.5.23 transfers the non-MLA 'swa' state "
                   "across attention-TP sizes on MORI (the same check in each); other KV, and "
                   "MLA models, are transferred across TP sizes")
    return [Finding(
        code="DSV4G006", severity=Severity.ERROR, summary=CODES["DSV4G006"].title,
        subject="MORI swa state transfer", observations=tuple(observations),
        details=tuple(details), fixes=tp_fixes(t), docs=docs_url("DSV4G006"),
        host_message=host_message(t),
    )]
