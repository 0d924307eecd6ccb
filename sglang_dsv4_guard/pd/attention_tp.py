"""The fixes that give two servers the same attention TP size: one home for the family.

Attention TP is ``--tp-size / (attention DP x attention CP)`` (SGLang's
``compute_dp_attention_world_info``). Every condition that refuses different attention
TP sizes takes its fixes from :func:`attention_tp_fixes`, in ``check`` and at run time
alike; a server whose launch layout is not known (a decode peer at run time) gets its
fix without an edit, not as another sentence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_dsv4_guard.fixes import Edit, Fix, FixKind, flag_fix
from sglang_dsv4_guard.host.flags import flag_edit, flag_for_field
from sglang_dsv4_guard.pd.endpoint import Endpoint

__all__ = ["FIELD", "TYPED", "AttentionLayout", "attention_tp_fixes", "layout_of",
           "pairing_fixes"]

#: The compared field every fix of the family addresses.
FIELD = "attn_tp_size"
#: The endpoint value holding the ServerArgs fields a server's launch line typed (absent
#: at run time, where only resolved values are known).
TYPED = "typed_fields"
_DP_FIELDS = frozenset({"dp_size", "enable_dp_attention", "attn_dp_size"})


@dataclass(frozen=True)
class AttentionLayout:
    """One server's attention layout, as far as the caller knows it.

    ``tp_size`` is ``None`` when the server's launch layout is not known (a decode peer
    at run time sends its attention TP size alone). ``typed`` holds which of
    ``dp_size``, ``enable_dp_attention`` and ``attn_dp_size`` its line has: from a launch
    line, what was typed; ``None`` when only the resolved server arguments are known (then
    a field counts as typed when it differs from SGLang's default). ``dp_size`` is the
    ``--dp-size`` value (from 0.5.22, without ``--enable-dp-attention``, data-parallel
    replicas); ``dp_attention`` whether ``--enable-dp-attention`` is on."""

    role: str
    attn_tp_size: int | None
    tp_size: int | None = None
    attn_cp_size: int = 1
    dp_size: int = 1
    dp_attention: bool = False
    typed: frozenset[str] | None = frozenset()

    @property
    def known(self) -> bool:
        """Whether the server's --tp-size and attention TP are both known."""
        return self.tp_size is not None and bool(self.attn_tp_size)

    @property
    def attn_dp_size(self) -> int:
        """Attention DP: --tp-size / (attention TP x attention CP), 1 when unknown."""
        if not self.known:
            return 1
        return max(1, int(self.tp_size or 1) // (int(self.attn_tp_size or 1) * self.attn_cp_size))

    def has(self, field: str) -> bool:
        """Whether the server's line has ``field`` (see ``typed``)."""
        if self.typed is not None:
            return field in self.typed
        if field == "dp_size":
            return self.dp_size > 1
        if field == "attn_dp_size":
            return self.attn_dp_size > 1 and not self.dp_attention
        return self.dp_attention

    def describe(self) -> str:
        """What decides this server's attention TP, for a fix's ``inputs``."""
        if not self.known:
            return (f"{self.role}: attention TP {self.attn_tp_size} (its --tp-size and "
                    "attention DP are not known here)")
        return (f"{self.role}: attention TP {self.attn_tp_size} = --tp-size {self.tp_size} / "
                f"(attention DP {self.attn_dp_size} x attention CP {self.attn_cp_size}) "
                "(SGLang's compute_dp_attention_world_info)")


def layout_of(endpoint: Endpoint) -> AttentionLayout:
    """``endpoint``'s attention layout: its launch layout known when its ``tp_size`` is
    (``check``'s servers, a live prefill), else only its attention TP (a decode peer)."""
    e = endpoint
    tp = e.get("tp_size")
    return AttentionLayout(
        e.role, e.get("attn_tp_size"), None if tp is None else int(tp),
        int(e.get("attn_cp_size") or 1), int(e.get("dp_size") or 1),
        bool(e.get("enable_dp_attention")),
        frozenset(e.get(TYPED)) & _DP_FIELDS if e.has(TYPED) else None)


def attention_tp_fixes(prefill: AttentionLayout, decode: AttentionLayout) -> tuple[Fix, ...]:
    """Fixes giving one server the other's attention TP size: the decode taking the
    prefill's first. For each server whose layout is known, by its attention-DP size
    (its GPU count kept) where its --tp-size divides, then by its --tp-size (said to
    change its GPU count); for a server whose layout is not known, one fix naming both
    forms, without an edit. Spelled as the installed release's parser spells each flag;
    a fix needing a flag the release does not have is not given."""
    inputs = (prefill.describe(), decode.describe())
    pairs = [(src, dst) for src, dst in ((prefill, decode), (decode, prefill))
             if src.attn_tp_size and dst.attn_tp_size != src.attn_tp_size]
    found = [_dp_fix(src, dst, inputs) if dst.known else _unknown_fix(src, dst, inputs)
             for src, dst in pairs]
    found.append(_both_dp_fix(prefill, decode, inputs))
    found += [_tp_fix(src, dst, inputs) for src, dst in pairs if dst.known]
    return tuple(f for f in found if f is not None)


def _both_dp_fix(prefill: AttentionLayout, decode: AttentionLayout, inputs: tuple[str, ...]
                 ) -> Fix | None:
    """Both servers given the largest attention TP both --tp-size allow, by their
    attention-DP sizes (GPU counts kept), where neither server's own attention TP is it
    (then a one-server fix above does it): TP 3 against TP 2 is attention TP 1 on both."""
    if not (prefill.known and decode.known) or prefill.attn_tp_size == decode.attn_tp_size:
        return None
    widths = [int(s.tp_size or 1) // s.attn_cp_size for s in (prefill, decode)]
    if any(int(s.tp_size or 1) % s.attn_cp_size for s in (prefill, decode)):
        return None
    want = math.gcd(*widths)
    if want in (prefill.attn_tp_size, decode.attn_tp_size):
        return None
    edits: list[Edit | None] = []
    replicas = 1
    for server, width in zip((prefill, decode), widths, strict=True):
        more, dropped = _dp_edits(server, width // want)
        edits += more
        replicas = max(replicas, dropped)
    kept = ("(this changes a GPU count: it drops --dp-size replicas)" if replicas > 1
            else "keeping each --tp-size (the GPU counts)")
    return flag_fix(f"give both servers attention TP {want} by their attention DP sizes "
                    f"({widths[0] // want} and {widths[1] // want}), {kept}", FIELD, edits,
                    *inputs)


def _tp_fix(src: AttentionLayout, dst: AttentionLayout, inputs: tuple[str, ...]) -> Fix | None:
    want = int(src.attn_tp_size or 1)
    return flag_fix(f"give the {dst.role} server attention TP {want} by its --tp-size (this "
                    "changes its GPU count)", FIELD,
                    [flag_edit(dst.role, "tp_size", want * dst.attn_dp_size * dst.attn_cp_size)],
                    *inputs)


def _dp_fix(src: AttentionLayout, dst: AttentionLayout, inputs: tuple[str, ...]) -> Fix | None:
    """``dst`` given ``src``'s attention TP by its attention-DP size, keeping its
    --tp-size: ``dp = tp / (attention TP x attention CP)``."""
    want, tp, cp = int(src.attn_tp_size or 1), int(dst.tp_size or 1), dst.attn_cp_size
    if tp % (want * cp):
        return None
    dp = tp // (want * cp)
    edits, replicas = _dp_edits(dst, dp)
    if not edits:
        return None
    kept = (f"keeping its --tp-size {tp} but dropping its --dp-size {replicas} replicas "
            "(this changes its GPU count)" if replicas > 1
            else f"keeping its --tp-size {tp} (its GPU count)")
    note = ""
    if (dst.typed is None and not dst.dp_attention and dp > 1
            and flag_for_field("attn_dp_size") is not None):
        note = ("; if its line has the deprecated --dp-size N --enable-dp-attention, replace "
                "them (this release rewrites them into --attn-dp-size N)")
    return flag_fix(f"give the {dst.role} server attention TP {want} by its attention DP size "
                    f"({dp}), {kept}{note}", FIELD, edits, *inputs)


def _dp_edits(dst: AttentionLayout, dp: int) -> tuple[list[Edit | None], int]:
    """The edits giving ``dst`` attention DP ``dp``, and the --dp-size replicas they drop
    (1 when none). Where the release has --attn-dp-size (0.5.22+), that flag, the
    deprecated ``--dp-size N --enable-dp-attention`` removed (its parallel_hook rewrites
    it to --attn-dp-size, and --dp-size alone counts replicas, which it refuses beside
    attention DP); before, --dp-size with --enable-dp-attention, and no flag at all for
    attention DP 1 rather than --dp-size 1."""
    # Without --enable-dp-attention, --dp-size counts replicas (every release).
    replicas = 1 if dst.has("enable_dp_attention") else max(1, dst.dp_size)
    if flag_for_field("attn_dp_size") is None:
        if dp == 1:  # attention DP off: only a --dp-size that was its width goes
            return ([flag_edit(dst.role, f, None) for f in ("dp_size", "enable_dp_attention")]
                    if dst.has("enable_dp_attention") else []), 1
        edits: list[Edit | None] = []
        if dst.dp_size != dp:  # never an edit to the value the server already has
            edits.append(flag_edit(dst.role, "dp_size", dp))
        if not dst.has("enable_dp_attention"):
            found = flag_for_field("enable_dp_attention")
            edits.append(Edit(dst.role, found.option) if found is not None else None)
        return edits, replicas
    if dp == dst.attn_dp_size and replicas == 1:
        return [], 1
    edits = [flag_edit(dst.role, f, None) for f in ("dp_size", "enable_dp_attention")
             if dst.has(f) and (f != "dp_size" or dp > 1 or replicas == 1)]
    if dp > 1:
        edits.append(flag_edit(dst.role, "attn_dp_size", dp))
    elif dst.has("attn_dp_size"):
        edits.append(flag_edit(dst.role, "attn_dp_size", None))
    return edits, replicas if dp > 1 else 1


def _unknown_fix(src: AttentionLayout, dst: AttentionLayout, inputs: tuple[str, ...]) -> Fix:
    """``dst``'s fix when its layout is not known: both forms named, no edit."""
    want = int(src.attn_tp_size or 1)
    dp_form = ("an --attn-dp-size" if flag_for_field("attn_dp_size") is not None
               else "with --enable-dp-attention a --dp-size")
    has = f" (it has {dst.attn_tp_size})" if dst.attn_tp_size else ""
    return Fix(FixKind.ADVICE,
               f"give the {dst.role} server attention TP {want}, the {src.role}'s{has}: "
               f"--tp-size {want} (times its attention CP size) without DP attention, or "
               f"{dp_form} of its --tp-size / ({want} x its attention CP size) (the {dst.role}'s "
               "layout is not known here, so no edit is given: check with both launch "
               "lines gives the edits, proven)", field=FIELD, inputs=inputs)


def pairing_fixes(prefill: Endpoint, decode: Endpoint, state_type: str,
                  pairs_by: tuple[str, object] | None) -> tuple[Fix, ...]:
    """The decode given the TP this release's transfer pairs ``state_type`` by (the
    prefill's attention or state TP, as the release's own check accepted it; ``None``:
    the attention TP); for the attention TP, the flag edits that make both attention TP
    sizes equal first."""
    label, tp = pairs_by or ("attention", prefill.get("attn_tp_size"))
    backend = str(prefill.get("transfer_backend")).upper()
    fixes: tuple[Fix, ...] = (Fix(
        FixKind.ADVICE, f"give the decode TP {tp}: this release's {backend} pairs the "
        f"{state_type} state by the prefill's {label} TP ({tp}); the decode registered "
        f"{decode.get('attn_tp_size')}", field="decode_tp_size"),)
    if tp == prefill.get("attn_tp_size"):
        fixes = attention_tp_fixes(layout_of(prefill), layout_of(decode)) + fixes
    return fixes
