"""Built-in check DSV4G006: SGLang's MORI TP check for the non-MLA ``swa`` state."""

from __future__ import annotations

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Observation, Severity
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.hookspecs import hookimpl
from sglang_dsv4_guard.host import flags
from sglang_dsv4_guard.mori.snapshot import SendContext, SendSnapshot

_ATTN_TP = ("--tp-size (divided by --dp-size with --enable-dp-attention) on the prefill "
            "server: MoriKVManager.attn_tp_size")
_DECODE_TP = ("the decode server's attention TP size, sent when it registers "
              "(KVArgsRegisterInfo.decode_tp_size)")


def _edits(*candidates: Edit) -> tuple[Edit, ...]:
    """The edits the installed release's parser accepts (:func:`flags.vetted`)."""
    return flags.vetted(*candidates)


def _layout_edits(server: str, tp: int | None, dp: int | None, dp_attention: bool | None,
                  want: int) -> tuple[Edit, ...]:
    """Edits that give ``server`` attention TP ``want`` from its known layout, keeping its
    GPU count when they can: with DP attention (attention TP = tp / dp) a new --dp-size
    (or, at dp 1, no DP attention), else --tp-size."""
    if tp is None:
        return ()
    if dp_attention and dp:
        if tp % want == 0:
            new_dp = tp // want
            if new_dp == 1:
                return (Edit(server, "--enable-dp-attention", remove=True),
                        Edit(server, "--dp-size", remove=True))
            return (Edit(server, "--dp-size", str(new_dp)),)
        return (Edit(server, "--tp-size", str(want * dp)),)
    return (Edit(server, "--tp-size", str(want)),)


def _layout(tp: int | None, dp: int | None, dp_attention: bool | None) -> str:
    if tp is None:
        return ""
    return f"--tp-size {tp}" + (f" --dp-size {dp} --enable-dp-attention" if dp_attention else "")


def tp_fixes(t: SendSnapshot) -> tuple[Fix, ...]:
    """Flag edits that make the attention TP sizes equal, one server at a time, from that
    server's layout; the decode's layout is known before launch only, so at run time its
    fix names both forms and carries no edit."""
    inputs = ("attention TP = --tp-size, or --tp-size / --dp-size with --enable-dp-attention",)
    found: list[Fix] = []
    if t.attn_tp_size is not None and t.attn_tp_size > 0:
        want = t.attn_tp_size
        text = (f"give the decode server attention TP {want}, the prefill's (it has "
                f"{t.decode_tp_size})")
        decode_now = _layout(t.decode_tp, t.decode_dp_size, t.decode_enable_dp_attention)
        edits = _edits(*_layout_edits("decode", t.decode_tp, t.decode_dp_size,
                                      t.decode_enable_dp_attention, want))
        if edits:
            found.append(Fix(FixKind.FLAGS, f"{text} (it runs {decode_now})",
                             field="decode_tp_size", inputs=inputs, edits=edits))
        else:
            found.append(Fix(
                FixKind.ADVICE,
                f"{text}: --tp-size {want} without DP attention, or with "
                f"--enable-dp-attention a --dp-size of its --tp-size / {want} (the decode's "
                "layout is not known here, so no edit is given)",
                field="decode_tp_size", inputs=inputs))
    if t.decode_tp_size is not None and t.decode_tp_size > 0:
        prefill_now = _layout(t.tp_size, t.dp_size, t.enable_dp_attention)
        edits = _edits(*_layout_edits("prefill", t.tp_size, t.dp_size, t.enable_dp_attention,
                                      t.decode_tp_size))
        if edits:
            found.append(Fix(
                FixKind.FLAGS,
                f"or give the prefill server attention TP {t.decode_tp_size}, the decode's"
                + (f" (this prefill server runs {prefill_now})" if prefill_now else ""),
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
        Observation("prefill", "attn_tp_size", t.attn_tp_size, _ATTN_TP),
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
