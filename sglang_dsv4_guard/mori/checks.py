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


def tp_fixes(t: SendSnapshot) -> tuple[Fix, ...]:
    """Flag edits that make the attention TP sizes equal, one server at a time."""
    inputs = ("attention TP = --tp-size, or --tp-size / --dp-size with --enable-dp-attention",)
    found: list[Fix] = []
    prefill_now = (f"--tp-size {t.tp_size}" + (f" --dp-size {t.dp_size} --enable-dp-attention"
                                                if t.enable_dp_attention else "")
                   if t.tp_size is not None else "")
    if t.attn_tp_size is not None:
        found.append(Fix(
            FixKind.FLAGS,
            f"give the decode server attention TP {t.attn_tp_size}, the prefill's (it has "
            f"{t.decode_tp_size}); with --enable-dp-attention on the decode, --tp-size is "
            f"{t.attn_tp_size} x its --dp-size instead", field="decode_tp_size", inputs=inputs,
            edits=_edits(Edit("decode", "--tp-size", str(t.attn_tp_size)))))
    if t.decode_tp_size is not None:
        dp = t.dp_size if t.enable_dp_attention and t.dp_size else 1
        found.append(Fix(
            FixKind.FLAGS,
            f"or give the prefill server attention TP {t.decode_tp_size}, the decode's"
            + (f" (this prefill server runs {prefill_now})" if prefill_now else ""),
            field="attn_tp_size", inputs=inputs,
            edits=_edits(Edit("prefill", "--tp-size", str(t.decode_tp_size * dp)))))
    return tuple(f for f in found if f.edits)


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
    peer = ", ".join(f"{k}={v}" for k, v in (("engine", t.engine_key), ("endpoint", t.endpoint),
                                             ("port", t.dst_port)) if v is not None)
    details = [f"decode peer: {peer or 'unknown'}",
               "SGLang labels the prefill *attention* TP size 'prefill_tp_size'"]
    if context.phase == "register":
        details.append("found when the decode peer registered: every request to it that "
                       "carries 'swa' state will fail")
    details.append("no SGLang release from 0.5.16 to 0.5.23 transfers the non-MLA 'swa' state "
                   "across attention-TP sizes on MORI (the same check in each); other KV, and "
                   "MLA models, are transferred across TP sizes")
    return [Finding(
        code="DSV4G006", severity=Severity.ERROR, summary=CODES["DSV4G006"].title,
        subject="MORI swa state transfer", observations=tuple(observations),
        details=tuple(details), fixes=tp_fixes(t), docs=docs_url("DSV4G006"),
        host_message=host_message(t),
    )]
