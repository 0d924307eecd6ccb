"""Built-in check DSV4G006: SGLang's MORI TP check for the non-MLA ``swa`` state."""

from __future__ import annotations

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Observation, Phase
from sglang_dsv4_guard.hookmarkers import hookimpl
from sglang_dsv4_guard.host import flags
from sglang_dsv4_guard.mori.snapshot import SendContext, SendSnapshot
from sglang_dsv4_guard.pd.attention_tp import AttentionLayout, attention_tp_fixes
from sglang_dsv4_guard.pd.when import when_of

CODE = "DSV4G006"

_DECODE_TP = ("the decode server's attention TP size, sent when it registers "
              "(KVArgsRegisterInfo.decode_tp_size)")
_REWRITE = ("this release reads a typed --dp-size N --enable-dp-attention as "
            "--attn-dp-size N")


def _source(t: SendSnapshot, field: str) -> str:
    """Where the prefill's ``field`` comes from (at run time: typed or not is unknown)."""
    option = "--" + field.replace("_", "-")
    if t.typed is None:
        return f"the prefill server's arguments ({option} as typed, or the release's default)"
    return (f"server flag {option}" if field in t.typed
            else f"the release's default (no {option} typed)")


def _attn_tp_source() -> str:
    """Where the prefill's attention TP size comes from, as the installed release says
    (``--attn-dp-size`` from 0.5.22, ``--dp-size`` under ``--enable-dp-attention`` before)."""
    if flags.flag_for_field("attn_dp_size") is not None:
        return (f"--tp-size divided by --attn-dp-size ({_REWRITE}) on the prefill server: "
                "MoriKVManager.attn_tp_size")
    return ("--tp-size (divided by --dp-size with --enable-dp-attention) on the prefill "
            "server: MoriKVManager.attn_tp_size")


def layouts(t: SendSnapshot) -> tuple[AttentionLayout, AttentionLayout]:
    """The two servers' attention layouts as the transfer knows them: the prefill's from
    its server arguments, the decode's from its launch line before launch (``check``),
    else only the attention TP size it registered."""
    prefill = AttentionLayout("prefill", t.attn_tp_size, t.tp_size, t.attn_cp_size or 1,
                              t.dp_size or 1, bool(t.enable_dp_attention), typed=None)
    if t.decode_tp is None:
        return prefill, AttentionLayout("decode", t.decode_tp_size)
    return prefill, AttentionLayout("decode", t.decode_tp_size, t.decode_tp, 1,
                                    t.decode_dp_size or 1, bool(t.decode_enable_dp_attention),
                                    typed=None)


def _peer(t: SendSnapshot, place: str) -> str:
    if place == "check":
        return "decode server: the one the decode launch line describes (checked before launch)"
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
    for name, value in (("tp_size", t.tp_size), ("dp_size", t.dp_size),
                        ("enable_dp_attention", t.enable_dp_attention), ("pp_size", t.pp_size)):
        if value is not None:
            observations.append(Observation("prefill", name, value, _source(t, name)))
    details = [_peer(t, context.place),
               "SGLang labels the prefill *attention* TP size 'prefill_tp_size'"]
    if context.place == "registration":
        details.append("found when the decode peer registered: SGLang raises it on every "
                       "request to that peer that carries 'swa' state")
    elif context.place == "check":
        details.append("the guard reports it when the decode peer registers (at run time); "
                       "SGLang raises it on every request carrying 'swa' state")
    details.append("no SGLang release from 0.5.16 to 0.5.23 transfers the non-MLA 'swa' state "
                   "across attention-TP sizes on MORI (the same check in each); other KV, and "
                   "MLA models, are transferred across TP sizes")
    # the attention-TP family's fixes whose every edit the installed release's parser accepts
    fixes = tuple(fix for fix in attention_tp_fixes(*layouts(t))
                  if len(flags.vetted(*fix.edits)) == len(fix.edits))
    return [Finding(
        code=CODE, severity=CODES[CODE].severity, summary=CODES[CODE].title,
        subject="MORI swa state transfer", observations=tuple(observations),
        details=tuple(details), fixes=fixes, docs=docs_url(CODE),
        host_message=host_message(t), when=when_of(Phase.PER_REQUEST, "mori"),
    )]
