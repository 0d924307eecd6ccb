"""The state checks' fixes, derived from what differs and from the installed release.

Only a field that differs produces a fix, and each fix names what decides that field in
the installed release's code (``Fix.inputs``). A flag is named only when the release's
own parser has it (:func:`edits`); a flag that is an input is quoted with this server's
current value when SGLang published its arguments (:mod:`sglang_dsv4_guard.host.server`).
Within one server both pools take their values from the same server arguments, so most
differences are a code path's (swapped pools, a custom runner, a plug-in), said as such.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from sglang_dsv4_guard.codes import ONE_SIDED_DRAFT
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host import flags
from sglang_dsv4_guard.host.server import server_value
from sglang_dsv4_guard.host.targets import FLASHMLA_ENV, MAPPING_ATTR
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.state.sharing import ShareDecision
from sglang_dsv4_guard.state.snapshot import PoolSnapshot, StateContext, StatePair

__all__ = ["AUTOSHARE_ENV", "edits", "geometry_fixes", "geometry_source", "incomplete_fixes", "mapping_fixes",
           "mapping_source", "ratio_fixes", "server_of", "swapped", "unified_fixes"]

logger = logging.getLogger(LOGGER_NAME)

AUTOSHARE_ENV = "SGLANG_DSV4_GUARD_AUTOSHARE"
_CONFIGURATOR = "KVCacheConfigurator._build_token_to_kv_pool_allocator"
_USUAL_REGISTRAR = {
    "target pool": "SWATokenToKVPoolAllocator (it registers its full_to_swa_index_mapping "
                   "on the pool it is built for)",
    "draft pool": f"the draft worker's {_CONFIGURATOR}, from the target allocator it was "
                  "handed",
}


def edits(*candidates: Edit) -> tuple[Edit, ...]:
    """``candidates`` the installed release's parser accepts (variables pass):
    :func:`sglang_dsv4_guard.host.flags.vetted`, as for plug-ins' edits."""
    return flags.vetted(*candidates)


def server_of(context: StateContext) -> str:
    """The server an edit is for: this server's role, or ``"this server"``."""
    return context.role if context.role in ("prefill", "decode") else "this server"


def _runs(context: StateContext, field: str) -> str:
    """``" (this decode server runs --x 3)"`` when SGLang published this server's args."""
    found = flags.flag_for_field(field)
    value = server_value(field)
    if found is None or value is None or value is False:  # unset or off: nothing it runs
        return ""
    if value is True:
        shown = found.option
    elif found.takes_value:
        shown = f"{found.option} {getattr(value, 'name', value)}"
    else:  # a value for a switch: nothing it runs
        return ""
    role = server_of(context)
    return f" ({role if role == 'this server' else f'this {role} server'} runs {shown})"


# -- the draft ratios --------------------------------------------------------------------

def _all_zero(values: object) -> bool | None:
    if not isinstance(values, tuple) or not values:
        return None
    try:
        return all(v == 0 for v in values)
    except Exception:  # an element whose == raises: no judgement
        return None


def swapped(pair: StatePair) -> bool:
    """Whether the target looks like a draft worker's pool and the draft like a target's:
    the target's ratios are all 0 (what KVCacheConfigurator gives a draft worker), the
    draft's are not, and the draft has more layers (a target has the model's)."""
    t, d = pair.target.get("compression_ratios"), pair.draft.get("compression_ratios")
    return (_all_zero(t) is True and _all_zero(d) is False
            and isinstance(t, tuple) and isinstance(d, tuple) and len(t) < len(d))


def ratio_fixes(pair: StatePair, context: StateContext) -> tuple[Fix, ...]:
    """The draft ratios: they come from no flag; the code paths that produce them."""
    if swapped(pair):  # the swap is named and is the fix: no other code path, no workaround
        t = pair.target.get("compression_ratios")
        at = f" at {context.location}" if context.location else ""
        return (Fix(
            FixKind.CODE,
            f"the pools look passed in swapped order: setup_state_kv_args(kv_args, <draft "
            f"pool>, <target pool>){at}: the target argument has a draft worker's ratios "
            f"(all 0, {len(t) if isinstance(t, tuple) else '?'} layer(s)) and the draft "
            "argument the model's compressed ratios; pass the target pool second and the "
            "draft pool third",
            field="pool order",
            inputs=("the argument order: setup_state_kv_args(kv_args, token_to_kv_pool, "
                    "draft_token_to_kv_pool)",)),)
    found = [Fix(
        FixKind.CODE,
        f"no flag sets the draft pool's compression ratios in SGLang {context.profile.name}: "
        "KVCacheConfigurator gives every layer of a draft worker's pool "
        "COMPRESS_RATIO_NEXTN_LAYER (0) whatever the speculative algorithm, so these ratios "
        "come from the code that built this pool: a custom draft or model runner, a plug-in "
        "that builds the draft pool, or pools passed in swapped order",
        field="compression_ratios",
        inputs=("KVCacheConfigurator (is_draft_worker): [COMPRESS_RATIO_NEXTN_LAYER] * "
                "num_effective_layers", "COMPRESS_RATIO_NEXTN_LAYER = 0 (srt/models/deepseek_v4_nextn.py)"))]
    kept = edits(Edit("prefill", "--speculative-algorithm", remove=True),
                 Edit("decode", "--speculative-algorithm", remove=True))
    if kept:
        found.append(Fix(
            FixKind.FLAGS, "serve without speculative decoding, on both servers of the pair "
            f"(a draft on one server only is {ONE_SIDED_DRAFT})"
            f"{_runs(context, 'speculative_algorithm')}", field="compression_ratios",
            edits=kept, inputs=("--speculative-algorithm",)))
    return tuple(found)


# -- unified-KV modes, ring and paged geometry -------------------------------------------

def unified_fixes(pair: StatePair, context: StateContext) -> tuple[Fix, ...]:
    """Unified-KV modes: the mode is read from the environment when each pool is built."""
    unified = "target pool" if pair.target.get("_unified_kv") else "draft pool"
    now = context.environ.get(FLASHMLA_ENV)
    state = f"={now}" if now is not None else " unset"
    return (Fix(
        FixKind.CODE,
        f"in SGLang {context.profile.name} each pool takes its mode when it is built "
        "(DeepSeekV4TokenToKVPool.__init__: is_unified_kv_triton(), i.e. a ROCm build with "
        "SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton); both pools of one server read one "
        f"process environment, so only the {unified} being unified means the variable "
        "changed between the two pool builds or one pool was built elsewhere (a plug-in, a "
        f"custom runner); set it once, before launch (now SGLANG_HACK_FLASHMLA_BACKEND{state})",
        field="_unified_kv",
        inputs=("SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton", "is_hip() (a ROCm build)")),)


def _request_rows(context: StateContext, tv: object, dv: object, page: object) -> list[Fix]:
    """0.5.23's request rows: the target's request window (``RequestWindow``) and the
    draft's SWA ring (``get_draft_swa_ring_size``) are both ``sliding_window + D`` rounded
    up to whole SWA pages, from one server's D, page size and window (KVCacheConfigurator),
    so SGLang-built pools of one server always agree: a difference is a code path's."""
    inputs = ("the draft-token count D (online_mtp_max_draft_tokens), one per server",
              "encoder replay (--enable-encoder-swa-bounded-replay, DeepSeek-V4.1 only, "
              "refused on a PD decode): the target's request window; the DSpark draft's "
              "SWA ring (uses_draft_swa_ring(), not on ROCm)",
              "RequestWindow.__init__ and get_draft_swa_ring_size: ceil_div(sliding_window "
              "+ D, SWA page) * SWA page")
    if tv is None or dv is None:
        side = "target has no request window" if tv is None else "draft has no SWA ring"
        return [Fix(
            FixKind.CODE,
            f"the {side}: both are decided by encoder replay, which both pools of a server "
            "read from one set of server arguments (and which SGLang refuses on a PD decode, "
            "and on a PD prefill on ROCm, where the draft keeps no ring), so one pool was "
            "built elsewhere or under other arguments (a plug-in, a custom runner, pools of "
            "two servers)", field="request rows", inputs=inputs)]
    whole = ""
    if isinstance(page, int) and page > 0:
        odd = [f"the {role}'s {value}" for role, value in (("target", tv), ("draft", dv))
               if isinstance(value, int) and value % page]
        if odd:
            whole = (f"; {' and '.join(odd)} is not a whole number of SWA pages ({page}), "
                     "which SGLang never builds")
    return [Fix(
        FixKind.CODE,
        f"no flag: SGLang {context.profile.name} rounds both the target's request window "
        "(RequestWindow) and the draft's SWA ring (get_draft_swa_ring_size) up to whole SWA "
        "pages from one server's draft-token count, page size and window, so one server's "
        f"pools always agree; {tv} against {dv} means the pools come from two servers (other "
        "draft-token counts), a plug-in or a custom runner that built one of them" + whole,
        field="request rows", inputs=inputs)]


def _geometry_fix(name: str, context: StateContext, values: dict[str, tuple[object, object]],
                  differing: dict[str, tuple[object, object]]) -> list[Fix]:
    tv, dv = values[name]
    if name == "page_size":
        return [Fix(
            FixKind.NO_FLAG_FIX,
            f"no flag: SGLang {context.profile.name} resolves DeepSeek-V4's page size itself (the "
            "DeepSeek-V4 model override; KVCacheConfigurator asserts 256 in paged SWA mode "
            "on GPU) and both pools of a server take that one value, so a pool with page "
            f"size {dv if tv == 256 else tv} was built elsewhere or under other arguments "
            f"(a plug-in, a custom runner){_runs(context, 'page_size')}",
            field="page_size",
            inputs=("ServerArgs.page_size as the DeepSeek-V4 model override resolves it",))]
    if name in ("sliding_window", "window"):
        return [Fix(
            FixKind.CODE,
            "each pool takes sliding_window from its model's config (ModelConfig.window_size): "
            "the target's model and the draft's (--speculative-draft-model-path); serve a "
            f"draft whose config.json has the target's sliding_window ({tv}), or fix the code "
            "that built the draft pool", field=name,
            inputs=("model config sliding_window (config.json of --model-path and of "
                    "--speculative-draft-model-path)",))]
    if name == "request rows":
        return _request_rows(context, tv, dv, values.get("page_size", (None, None))[0])
    if name == "ring size" and "window" in differing:
        return []  # the ring is window + D - 1: the window's fix covers it
    follows = {"ring size": "get_swa_ring_size: sliding_window + (--speculative-num-draft-"
                            "tokens - 1) when speculative, one value per server",
               "pages": "DeepSeekV4UnifiedKVPool.swa_pages, from the ring size and page size"}
    if name == "pages" and ("ring size" in differing or "window" in differing):
        return []
    return [Fix(
        FixKind.CODE,
        f"both pools compute {name} from one server's arguments ({follows.get(name, name)}), "
        "so a pool with another value was built elsewhere or under other arguments (a "
        "plug-in, a custom runner)", field=name, inputs=(follows.get(name, name),))]


_GEOMETRY_SOURCES = {
    ("page_size", "both"): "the server's page size, which SGLang resolves for DeepSeek-V4 "
                           "itself (its model override)",
    ("request rows", "target"): "ceil_div(sliding_window + D, SWA page) * SWA page (D: the "
                                "draft-token count): the target's request window under "
                                "encoder replay; SGLang's RequestWindow rounds it up to "
                                "whole SWA pages",
    ("request rows", "draft"): "ceil_div(sliding_window + D, SWA page) * SWA page "
                               "(get_draft_swa_ring_size): the draft's SWA ring, rounded up "
                               "to whole pages",
}


def geometry_source(name: str, side: str, default: str) -> str:
    """The ``from:`` line of one side's geometry field (``side``: target or draft)."""
    return (_GEOMETRY_SOURCES.get((name, side))
            or _GEOMETRY_SOURCES.get((name, "both"), default))


def geometry_fixes(pair: StatePair, context: StateContext,
                   fields: list[tuple[str, str, str, str]]) -> tuple[Fix, ...]:
    """Ring or paged geometry: one fix (or two) per field that differs, none for equal ones."""
    values = {label: (pair.target.get(t), pair.draft.get(d)) for label, t, d, _ in fields}
    differing = {k: v for k, v in values.items() if v[0] != v[1]}
    return tuple(replace(f, need=name) for name in differing  # each differing field: a step
                 for f in _geometry_fix(name, context, values, differing))


# -- the shared mapping, an attribute missing --------------------------------------------

def mapping_source(snap: PoolSnapshot, context: StateContext) -> str:
    """The ``from:`` line of a pool's mapping: the registration seen, or what usually does."""
    if snap.registered_by:
        return f"registered by {snap.registered_by}"
    return ("not seen registered since the guard was installed; in SGLang "
            f"{context.profile.name} it is usually registered by {_USUAL_REGISTRAR[snap.role]}")


def mapping_fixes(pair: StatePair, context: StateContext, decision: ShareDecision | None,
                  never: list[str]) -> tuple[Fix, ...]:
    """The shared mapping: register the target's tensor on the draft; auto-share only when it would."""
    inputs = (f"the target allocator's full_to_swa_index_mapping, registered on the draft "
              f"by {_CONFIGURATOR}",)
    where = pair.draft.registered_by
    if pair.target.mapping.kind != "tensor" and pair.draft.mapping.kind == "tensor":
        text = ("the target pool holds no mapping tensor, the draft pool does"
                + (f" (registered by {where})" if where else "") + ": register the target "
                "allocator's full_to_swa_index_mapping on the target pool "
                "(SWATokenToKVPoolAllocator does) and hand the draft worker that allocator, "
                "so the same tensor is registered on both pools")
    elif pair.target.mapping.kind != "tensor":
        text = ("no pool holds a mapping tensor: register the target allocator's "
                "full_to_swa_index_mapping on the target pool (SWATokenToKVPoolAllocator "
                "does) and the same tensor on the draft pool; there is no tensor to share")
    elif never:
        text = (f"register the target's mapping on the {', '.join(never)} "
                f"({MAPPING_ATTR} exists only once register_mapping() ran)")
    else:
        text = ("hand the draft worker the target's token_to_kv_pool_allocator so the same "
                "tensor is registered on the draft pool" + (
                    f"; the draft's own tensor was registered by {where}" if where else ""))
    found = [Fix(FixKind.CODE, text, field=MAPPING_ATTR, inputs=inputs)]
    if decision is not None and decision.share:
        found.append(Fix(
            FixKind.FLAGS, f"let the guard rebind it: {decision.reason}", field=MAPPING_ATTR,
            inputs=("state/sharing.decide: the auto-share rule",),
            edits=(Edit(server_of(context), AUTOSHARE_ENV, "1", env=True),)))
    return tuple(found)


def incomplete_fixes(snap: PoolSnapshot, name: str, context: StateContext) -> tuple[Fix, ...]:
    """An attribute missing: the constructor sets the attribute; the pool was built another way."""
    unified_only = name.startswith("unified_swa_")
    return (Fix(
        FixKind.CODE,
        f"DeepSeekV4TokenToKVPool.__init__ sets {name}"
        + (" in unified-KV mode" if unified_only else "")
        + f" in SGLang {context.profile.name}; this {snap.role} ({snap.type_name}) was built "
        "another way (object.__new__, a subclass that skips __init__, a plug-in): build it "
        f"with the constructor or set {name}",
        field=name, inputs=(f"DeepSeekV4TokenToKVPool.__init__ ({name})",)),)
