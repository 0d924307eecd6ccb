"""The fixes of decode's first-contact findings and of the DCP relayout (:mod:`.relayout`): one
home for the family, in ``check`` and at run time alike.

Each fix gives one server what SGLang's condition needs, derived from the two endpoints'
values (never a finding's text): the other server's value (KV cache dtype, page size,
PP, the DeepSeek-V4 KV layout variables; for the decode's PP also 1, which SGLang's rank
mapping takes with any prefill PP, and either with --tp-size scaled to keep the decode's
GPU count), the neutral one (attention CP, DCP and KV
cache sharding off), or equal attention TP (:mod:`.attention_tp`). A value is copied
only from a server where it is known, and a variable only from a server whose
environment is known; an edit needs a flag the installed release's parser has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.envs import env_copy
from sglang_dsv4_guard.host.flags import flag_edit, vetted
from sglang_dsv4_guard.host.targets import DSV4_LAYOUT_ENV
from sglang_dsv4_guard.pd.attention_tp import TYPED, attention_tp_fixes, layout_of
from sglang_dsv4_guard.pd.endpoint import REFUSED, Endpoint

__all__ = ["NO_FIX", "contact_fixes"]

# What each fix gives the edited server, by the value SGLang's condition reads.
_LABELS = {"kv_cache_dtype_str": "the {src}'s KV cache dtype string",
           "page_size": "the {src}'s page size",
           "pp_size": "the {src}'s pipeline-parallel size",
           "attn_cp_size": "attention context parallel size 1",
           "dcp_size": "decode context parallel size 1",
           "enable_kv_cache_sharding": "KV cache sharding off",
           "kv_layout": "the {src}'s DeepSeek-V4 KV layout variables"}
# The ServerArgs field of each copied value.
_COPIED = {"kv_cache_dtype_str": "kv_cache_dtype", "page_size": "page_size", "pp_size": "pp_size"}
# Values SGLang's condition needs at their default (1 / off); the condition says whose
# value it reads (``reads``, else either server's).
_NEUTRAL = ("attn_cp_size", "dcp_size", "enable_kv_cache_sharding")
# What both servers need, said without an edit where none is derived (no flag sets it,
# or the environment to copy it from is not known here).
_ADVICE = {"dsv41_spec_layout": "DSpark enabled the same way (speculative algorithm, block "
                                "size, target/draft KV layout) and the same release",
           "kv_layout": "the same --dsv4-attn-backend and SGLANG_DSV4_KV_LAYOUT / "
                        "SGLANG_DSV4_COMPRESSED_KV_LAYOUT (the layouts differ)"}
#: The fix of a finding none of whose values a flag of either server sets.
NO_FIX = Fix(FixKind.NO_FLAG_FIX, "no flag change of either server fixes this")


def contact_fixes(reads: Mapping[str, str], names: tuple[str, ...], prefill: Endpoint,
                  decode: Endpoint) -> tuple[Fix, ...]:
    """The fixes of one finding whose condition reads ``names`` (a neutral value of the
    server ``reads`` names, where it names one), in order: equal attention TP first, then
    per value, the decode changed before the prefill."""
    found: list[Fix] = []
    names = tuple(dict.fromkeys(names))
    if "attn_tp_size" in names:
        found += attention_tp_fixes(layout_of(prefill), layout_of(decode))
    for name in names:
        inputs = tuple(f"{e.role}: {name} {e.get(name)!r} from {e.source(name)}"
                       for e in (prefill, decode))
        edited = []
        for src, dst in ((prefill, decode), (decode, prefill)):
            edits = _edits(reads, name, src, dst)
            if edits and all(e is not None for e in edits):
                label = _LABELS.get(name, name).format(src=src.role)
                edited.append(Fix(FixKind.FLAGS, f"launch the {dst.role} server with {label}",
                                  field=name, edits=tuple(e for e in edits if e is not None),
                                  inputs=inputs))
        if name == "pp_size" and decode.get(name) not in (None, 1) \
                and not prefill.get(REFUSED) and _typed(decode, name, decode.get(name)):
            edited += _decode_pp(prefill, decode, inputs)
        if name in _ADVICE and not edited and prefill.get(name) != decode.get(name):
            found.append(Fix(FixKind.ADVICE, f"give both servers {_ADVICE[name]}: prefill "
                             f"{prefill.get(name)!r}, decode {decode.get(name)!r}",
                             field=name, inputs=inputs))
        found += edited
    return tuple(dict.fromkeys(found)) or (NO_FIX,)


def _decode_pp(prefill: Endpoint, decode: Endpoint, inputs: tuple[str, ...]) -> list[Fix]:
    """The decode's PP made one SGLang's rank mapping takes (the prefill's, or 1), its
    --tp-size scaled to keep its GPU count (tp x pp) where that gives a power of two (a TP
    the model's attention heads divide; ``check`` cannot see them), then PP 1 alone."""
    pp, want = int(decode.get("pp_size")), int(prefill.get("pp_size") or 1)
    tp = decode.get("tp_size")
    found: list[Fix] = []
    for target in dict.fromkeys((want, 1)):
        if tp is None or (int(tp) * pp) % target:
            continue
        scaled = int(tp) * pp // target
        if scaled & (scaled - 1):  # head counts are powers of two: so is a TP that loads
            continue
        edits = [_vetted(flag_edit("decode", "pp_size", None if target == 1 else target)),
                 _vetted(flag_edit("decode", "tp_size", scaled))]
        if all(e is not None for e in edits):
            found.append(Fix(FixKind.FLAGS, f"launch the decode server with PP {target} and "
                             f"--tp-size {scaled}, keeping its GPU count ({int(tp) * pp})",
                             field="pp_size", edits=tuple(e for e in edits if e is not None),
                             inputs=inputs))
    edit = _vetted(flag_edit("decode", "pp_size", None))
    if edit is not None:
        found.append(Fix(FixKind.FLAGS, "launch the decode server without pipeline "
                         "parallelism (PP 1, which any prefill PP maps onto)", field="pp_size",
                         edits=(edit,), inputs=inputs))
    return found


def _vetted(edit: Edit | None) -> Edit | None:
    """``edit`` when the installed release's parser takes it (its flag, and a value among
    its choices: a value copied from a server of another release may not be), else
    ``None`` (no fix of that kind)."""
    return edit if edit is not None and vetted(edit) else None


def _typed(endpoint: Endpoint, name: str, value: Any) -> bool:
    """Whether ``endpoint``'s line sets ``name``: from its launch line where known, else
    (a live server's resolved value) whether the value is other than the default."""
    if endpoint.has(TYPED):
        return name in (endpoint.get(TYPED) or ())
    return value not in (None, False, 1)


def _edits(reads: Mapping[str, str], name: str, src: Endpoint, dst: Endpoint) -> list[Edit | None]:
    """The edits giving ``dst`` a value of ``name`` that satisfies the condition (none:
    no fix of this kind)."""
    want = src.get(name)
    if src.get(REFUSED):
        return []  # its values are not copied: the refusal's own fixes come first
    if name in _COPIED:
        if not src.has(name) or want == dst.get(name) or (
                name == "pp_size" and dst.role != "decode"):  # a decode's PP follows
            return []
        return [_vetted(flag_edit(dst.role, _COPIED[name], want))]
    if name in _NEUTRAL:
        own = dst.get(name)
        server = reads.get(name, dst.role)
        if server != dst.role or own in (None, False, 1) or not _typed(dst, name, own):
            return []
        return [_vetted(flag_edit(dst.role, name, None))]  # back to the default (1 / off)
    if name == "kv_layout":
        if src.env is None or src.get(name) == dst.get(name):
            return []
        return [env_copy(dst.role, key, src.env.get(key)) for key in DSV4_LAYOUT_ENV
                if dst.env is None or src.env.get(key) != dst.env.get(key)] or [None]
    return []
