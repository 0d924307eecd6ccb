"""The catalogue of stable finding codes: what each means and where it is documented.

Codes never change meaning once released. ``sglang-dsv4-guard explain CODE`` prints
an entry; the README's table is the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from sglang_dsv4_guard.findings import Severity

__all__ = ["CODES", "DSV4_KV_LAYOUT", "KV_SETUP_REFUSED", "ONE_SIDED_DRAFT", "SERVED_MODEL",
           "SPECULATIVE_SETTINGS", "TRANSFER_BACKENDS", "CodeInfo", "docs_url"]

# Codes that modules besides the one raising them name, where importing the raiser would
# point a layer or a folder up: named here, in the catalogue. The prefill/decode
# asymmetries (pd/asymmetry.py raises them; check/fixing/flag_fixes.py derives their
# fixes, the state fixes name a one-sided draft), and SGLang's refusal of a KV pool at KV
# transfer set-up (check/rows/kv_setup.py; the SWA layout a server registers names it).
ONE_SIDED_DRAFT = "DSV4G020"
SPECULATIVE_SETTINGS = "DSV4G021"
TRANSFER_BACKENDS = "DSV4G023"
SERVED_MODEL = "DSV4G024"
DSV4_KV_LAYOUT = "DSV4G025"
KV_SETUP_REFUSED = "DSV4G049"


# How a first-contact code is fixed when the guard meets it at run time (the line of
# ``fix_derivation`` ``explain`` adds for each code decode's first contact raises).
_RUNTIME = ("at run time (the guard on the decode server): decode's first contact raises "
            "SGLang's error with every mismatch under these codes, both servers' values by "
            "role (the prefill's from its /route answer); each fix names the server to "
            "change and the value it needs (the flag when the decode's release has it), "
            "derived as check derives it; the report says they are unproven there and that "
            "`check --fix` proves them on both launch lines")


@dataclass(frozen=True)
class CodeInfo:
    """One catalogue entry."""

    code: str
    title: str
    sglang_message: str | None
    meaning: str
    # How each fix is derived (``explain``'s "how the fix is derived" lines): prose about
    # the derivation, never the fixes themselves (those are derived from the values).
    fix_derivation: tuple[str, ...]
    # The SGLang releases whose code has the check this code stands for, as (first,
    # last) inclusive, ``None`` for open-ended; ``None`` altogether: every release.
    sglang_releases: tuple[str | None, str | None] | None = None
    # Its findings' severity (check and run time read it here); when lower (explain says).
    severity: Severity = Severity.ERROR
    milder: str = ""

    def applies_to(self, release: str) -> bool:
        """Whether ``release``'s SGLang code has this code's check (an unreadable
        release label: yes, nothing is ruled out by a label)."""
        if self.sglang_releases is None:
            return True
        first, last = self.sglang_releases
        try:
            version = Version(release)
            return ((first is None or version >= Version(first))
                    and (last is None or version <= Version(last)))
        except InvalidVersion:
            return True

    def releases_text(self) -> str:
        """The releases with this code's check, in words."""
        if self.sglang_releases is None:
            return "every supported release"
        first, last = self.sglang_releases
        if first and last:
            return first if first == last else f"{first} to {last}"
        return f"{first} and later" if first else f"up to {last}"


def docs_url(code: str) -> str:
    """Where ``code`` is documented: the offline ``explain`` command, wherever the guard is."""
    return f"sglang-dsv4-guard explain {code}"


CODES: dict[str, CodeInfo] = {
    info.code: info
    for info in (
        CodeInfo(
            "DSV4G001",
            "NextN draft pool is not SWA-only",
            "DSV4 draft state transfer expects SWA-only NextN layers",
            "Every layer of the DeepSeek-V4 NextN/MTP draft pool must have compression "
            "ratio 0 (sliding-window only): its state is shipped to the decode server "
            "through the SWA path, which cannot carry compressed (C4/C128) layers. "
            "Stock SGLang builds the draft pool with COMPRESS_RATIO_NEXTN_LAYER (0) "
            "for every layer, so a nonzero or empty list means a modified draft "
            "runner or a draft model that is not a NextN module.",
            (
                "derived: no flag sets the draft's ratios (KVCacheConfigurator gives a draft "
                "worker COMPRESS_RATIO_NEXTN_LAYER on every layer, 0.5.16 to 0.5.23), so the "
                "fix names the code path: pools passed in swapped order (named with the "
                "calling line when the target has a draft's all-zero ratios), a custom draft "
                "runner, a plug-in building the draft pool",
                "and, as a workaround, removing --speculative-algorithm on both servers",
            ),
            milder="a warning when compression_ratios is a one-shot iterator (not read)",
        ),
        CodeInfo(
            "DSV4G002",
            "target and draft pools use different unified-KV modes",
            "DSV4 target and draft pools must use the same unified-KV mode",
            "One pool keeps SWA in the unified KV ring (ROCm, "
            "SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton) and the other in paged "
            "SWA; their state cannot be described by one transfer layout.",
            (
                "derived: each pool reads SGLANG_HACK_FLASHMLA_BACKEND when it is built; the "
                "fix says the variable changed between the two builds or a pool was built "
                "elsewhere, with the value this process has now",
            ),
        ),
        CodeInfo(
            "DSV4G003",
            "SWA ring geometry differs (unified-KV mode)",
            "DSV4 target and draft pools must share SWA ring geometry: "
            "target=(...), draft=(...)",
            "In unified-KV mode the draft's SWA ring rows are addressed with the "
            "target's indices, so window, ring size and ring pages must be equal.",
            (
                "derived per differing field: window (each model's config.json), ring size "
                "(window + draft tokens - 1, one value per server), pages (from the ring); a "
                "field that follows another differing one gets no fix of its own",
            ),
        ),
        CodeInfo(
            "DSV4G004",
            "draft pool does not share the target's SWA index mapping",
            "DSV4 target and draft pools must share the SWA index mapping",
            "In paged mode the draft pool must hold the very tensor object the "
            "target's SWATokenToKVPoolAllocator registered (full_to_swa_index_mapping): "
            "SGLang tests identity, not equality, because the tensor is updated in "
            "place while serving.",
            (
                "derived: the from: lines say which line registered each mapping when the "
                "guard saw register_mapping (else what usually does); the fix registers the "
                "target allocator's tensor on the draft",
                "SGLANG_DSV4_GUARD_AUTOSHARE=1 is offered only when the auto-share rule would "
                "share (never without a tensor)",
            ),
            milder="a warning when neither pool has a mapping (SGLang accepts None is None)",
        ),
        CodeInfo(
            "DSV4G005",
            "paged SWA geometry differs",
            "DSV4 target and draft pools must share (paged) SWA geometry: "
            "target=(...), draft=(...)",
            "In paged mode both pools must use the same page size and sliding window "
            "(and, from SGLang 0.5.23, the target's request-window capacity must equal "
            "the draft's SWA ring size).",
            (
                "derived per differing field: page size (resolved by SGLang for DeepSeek-V4: no "
                "flag), sliding window (each model's config.json), request rows from 0.5.23 "
                "(no flag: SGLang rounds both the target's request window and the draft's SWA "
                "ring, sliding_window + draft tokens, up to whole SWA pages from one server's "
                "arguments, so a difference means pools of two servers, a plug-in or a custom "
                "runner)",
            ),
        ),
        CodeInfo(
            "DSV4G006",
            "MORI: prefill/decode attention TP mismatch for a non-MLA SWA model",
            "PD state transfer does not support TP-mismatched non-MLA SWA models "
            "(prefill_tp_size=<attn_tp>, decode_tp_size=<n>)",
            "The MORI connector cannot slice the 'swa' state component of a non-MLA "
            "model across different attention-TP sizes. SGLang finds this per request, "
            "in the transfer thread; the guard reports it when the decode peer registers.",
            (
                "derived from each server's layout (attention TP = --tp-size / (attention "
                "DP x attention CP)), the same in check and at run time: first a new "
                "attention-DP size, which keeps the server's GPU count (--attn-dp-size from "
                "0.5.22, --dp-size with --enable-dp-attention before), then a --tp-size "
                "edit, said to change it; at run time the decode's layout is unknown, so its "
                "fix names both forms without an edit; no release from 0.5.16 to 0.5.23 "
                "transfers the non-MLA 'swa' state across TP",
            ),
        ),
        CodeInfo(
            "DSV4G007",
            "auto-share rebound the draft pool's SWA index mapping",
            None,
            "SGLANG_DSV4_GUARD_AUTOSHARE=1 found the draft's mapping to be provably the "
            "same data as the target's and registered the target's tensor on the draft "
            "pool (draft_pool.register_mapping).",
            ("derived: nothing to do; the draft's former registration is named, and handing "
             "the draft worker the target's allocator makes the rebinding unnecessary",),
            severity=Severity.WARNING,
            milder="a note (info) when both mappings are already the same memory",
        ),
        CodeInfo(
            "DSV4G010",
            "pool object is incomplete",
            None,
            "A pool lacks an attribute the check reads (a half-built or foreign pool). "
            "SGLang raises AttributeError for it; the guard names the attribute.",
            ("derived: names the attribute, the pool's class and that "
             "DeepSeekV4TokenToKVPool.__init__ sets it (unified_swa_* in unified mode only)",),
        ),
        CodeInfo(
            "DSV4G020",
            "speculative decoding on one server of the PD pair only",
            None,
            "`sglang-dsv4-guard check`: one server was given --speculative-algorithm and the "
            "other not. The prefill server sends the draft's KV/state alongside the "
            "target's; a decode server without a draft has nowhere to put it, and one with "
            "a draft receives none (its draft starts cold or the transfer layouts disagree).",
            ("check derives two flag fixes from the two lines: give the server without "
             "speculative decoding every --speculative-* flag the other was given (as "
             "typed; offered only when the other server's own resolution accepted them and "
             "the edited line resolves), or remove them from the server that has them; "
             "each turns speculative decoding on or off on one server, so check --fix "
             "lists both, proven and with their cost, and applies neither: a warning's fix "
             "is applied only when it changes values and no feature",),
            severity=Severity.WARNING,
        ),
        CodeInfo(
            "DSV4G021",
            "prefill and decode use different speculative settings",
            None,
            "`sglang-dsv4-guard check`: both servers decode speculatively but with a "
            "different --speculative-algorithm or --speculative-num-draft-tokens. The "
            "prefill hands the decode a request whose draft state was produced under its "
            "own settings; the decode continues it under others (for DeepSeek-V4 the "
            "draft-token count also sizes the SWA ring, so the state sent does not fit "
            "the decode's layout).",
            ("check derives two flag fixes: the decode takes the prefill's --speculative-* "
             "flags (as typed; those the prefill was not given are removed), or the "
             "prefill takes the decode's; the draft-token counts shown are the release's "
             "resolution of those flags; a server whose own flags SGLang's resolution "
             "refused (DSV4G026) is never the one copied from",),
            severity=Severity.WARNING,
        ),
        CodeInfo(
            "DSV4G022",
            "prefill and decode use different KV page sizes",
            "Page size mismatch: prefill server has page_size=..., but decode server has "
            "page_size=.... Both servers must use the same --page-size value.",
            "`sglang-dsv4-guard check`: the servers' page sizes (--page-size, or the "
            "page size the release resolves for the model) differ. KV is transferred page "
            "by page: decode's first contact with the prefill (`try_ensure_parallel_info`, "
            "the first request that pairs them, every release 0.5.16+) raises this and the "
            "decode server exits (SGLang's message). Where a server's resolution did not "
            "complete, its page size is not known and the pair is not judged.",
            ("check derives a flag fix per server: --page-size set to the other server's "
             "resolved page size; never on a server whose resolution replaced a typed "
             "--page-size (the release sets that model's page size itself: DeepSeek-V4 "
             "resolves to 256 on GPU from 0.5.22)",
             _RUNTIME),
            milder="a warning when the page sizes differ on some GPU models only, a note on none",
        ),
        CodeInfo(
            "DSV4G023",
            "prefill and decode use different transfer backends",
            None,
            "`sglang-dsv4-guard check`: --disaggregation-transfer-backend differs between "
            "the servers. Both ends of a KV transfer must speak one engine: they cannot connect.",
            ("check derives a flag fix per server: --disaggregation-transfer-backend set "
             "to the other server's backend",),
        ),
        CodeInfo(
            "DSV4G024",
            "prefill and decode serve different models",
            None,
            "`sglang-dsv4-guard check`: --model-path (or the draft's "
            "--speculative-draft-model-path) differs between the servers, or the two "
            "config.json files describe different architectures. The decode server would "
            "continue a KV cache written by another model. Paths on two hosts may name the "
            "same checkpoint: then this is a reminder to make sure they do.",
            ("check derives a flag fix per server: --model-path (and "
             "--speculative-draft-model-path, when it differs) set to the other server's, "
             "when both checkpoints have one architecture; for different architectures "
             "the fix is advice with no edit (which model to serve is the operator's "
             "choice: check --fix never applies it); if the two paths name identical "
             "copies on their hosts, nothing needs to change",),
            severity=Severity.WARNING,
        ),
        CodeInfo(
            "DSV4G025",
            "prefill and decode use different DeepSeek-V4 KV layouts (unified vs paged)",
            None,
            "`sglang-dsv4-guard check`: on ROCm, SGLANG_HACK_FLASHMLA_BACKEND="
            "unified_kv_triton puts SWA in the unified KV ring; it is set for one server "
            "only. Within a server both pools read it once, so SGLang's own unified-mode "
            "check (DSV4G002) passes, but the two servers ship state in different layouts.",
            ("check derives an environment fix per server: SGLANG_HACK_FLASHMLA_BACKEND "
             "set to (or unset as) the other server's",),
            severity=Severity.WARNING,
        ),
        CodeInfo(
            "DSV4G026",
            "SGLang's own argument resolution refuses a server's flags",
            None,
            "`sglang-dsv4-guard check`: the installed release's ServerArgs resolution "
            "(model defaults and validations, run here as the line's --device, else cuda) "
            "raised for this "
            "server's flags, e.g. a speculative algorithm the "
            "model does not support. The server would stop at start-up. The check goes on "
            "with the flags as parsed. A refusal that is about the CPU device itself is "
            "this machine's, not the server's.",
            ("check derives flag fixes from SGLang's message: the flags it names (by option, "
             "by ServerArgs field, by the words of a flag with a value, or in a bare "
             "assert's condition) are set to the values it mentions or the other server's "
             "(a whole-number flag given no value: first the value the release chooses "
             "itself, its resolution of the line without that flag or, for a speculative "
             "count, its own speculative auto-choice for the model, then 1), or removed; "
             "each edited line is resolved again by the release (a new refusal extends the "
             "search, at most 24 resolutions; each fix says how many ran) and only lines it "
             "accepts are offered; none found: 'no flag change fixes this'",),
        ),
        CodeInfo(
            "DSV4G030",
            "prefill and decode use different KV cache dtypes",
            "KV cache dtype mismatch: prefill server has kv_cache_dtype=..., but decode "
            "server has kv_cache_dtype=.... Both servers must use the same --kv-cache-dtype "
            "value.",
            "Decode's first contact with the prefill (`try_ensure_parallel_info`, at the "
            "first request that pairs them) compares the two servers' KV cache dtype "
            "strings and raises from the decode scheduler loop: the decode server exits. "
            "0.5.17+ compare the string each target runner publishes, 0.5.16 the "
            "servers' --kv-cache-dtype as the model runner rewrites it at load: both the "
            "flag's, or the FP8 string a checkpoint's quantization config gives `auto` "
            "(check reads that config with the release's own quant-config class; when it "
            "cannot, the row is not judged for that server). They are compared as "
            "strings, so `auto` on one server and an explicit `bf16` or `bfloat16` on the "
            "other differ even when the memory layout is the same.",
            ("check derives a flag fix per server: --kv-cache-dtype set to the other "
             "server's published string, offered only when the edited line resolves",
             _RUNTIME),
        ),
        CodeInfo(
            "DSV4G031",
            "prefill and decode use different DeepSeek-V4 KV layouts",
            "KV layout mismatch: prefill server has kv_layout=..., but decode server has "
            "kv_layout=.... Both servers must use the same --dsv4-attn-backend and "
            "SGLANG_DSV4_KV_LAYOUT.",
            "0.5.23: decode's first contact compares the KV layout each server's "
            "DeepSeek-V4 pool publishes (`pd_kv_layout`: V4, V4.1 or trtllm's uniform "
            "FP8, from --dsv4-attn-backend, SGLANG_DSV4_KV_LAYOUT and "
            "SGLANG_DSV4_COMPRESSED_KV_LAYOUT): the decode server exits. The layout a "
            "server gets depends on the GPU (`v41` stops the server at start-up off "
            "SM100/SM103, `auto` is V4.1 there and V4 elsewhere), so from 0.5.21, when the "
            "two servers' layout variables differ, check runs SGLang's "
            "select_dsv4_kv_layout for each server as each GPU model and, where both start, "
            "the first contact on the layouts chosen: an error where the pair fails on every "
            "GPU model (a server stops at start-up, or the decode exits at first contact; "
            "0.5.21 - 0.5.22 compare no layout at first contact), the finding's "
            "observations holding the per-GPU table.",
            ("check derives an environment fix per server: the other server's "
             "SGLANG_DSV4_KV_LAYOUT / SGLANG_DSV4_COMPRESSED_KV_LAYOUT, or (layout "
             "variables that differ) the variables unset on the server that sets them; each "
             "kept where the edited pair fails on no GPU model or the two servers' variables "
             "are then equal",
             _RUNTIME),
            sglang_releases=("0.5.21", None),
            milder="a warning when the layout variables differ and the pair fails on some "
                   "GPU models only (named in its when:)",
        ),
        CodeInfo(
            "DSV4G032",
            "DeepSeek-V4.1 DSpark layouts or TP sizes differ",
            "DeepSeek-V4.1 DSpark PD layout mismatch (...): both servers must enable "
            "DSpark with the same block size and target/draft KV layout. Upgrade both "
            "servers together.",
            "0.5.21+: decode's first contact requires both servers to publish the same "
            "DSpark transfer layout (speculative algorithm DSPARK on a model with ratio-2 "
            "compression) and the same attention TP (0.5.22+: or, for MLA with prefill "
            "CP > 1 and decode CP 1, decode TP = prefill TP x CP: \"DeepSeek-V4.1 DSpark "
            "PD requires the same TP size on both servers (including prefill CP ranks for "
            "MLA)\"): the decode server exits. The layout is read from the built pools; "
            "where check cannot build it, its unknowns say so.",
            ("check derives the attention-TP fixes for the TP condition; a layout "
             "difference has no flag fix of its own (run DSPARK on both servers, one "
             "release)",
             _RUNTIME),
            sglang_releases=("0.5.21", None),
        ),
        CodeInfo(
            "DSV4G033",
            "different attention TP sizes with an MXFP8 KV cache",
            "PD Disaggregation does NOT support different attention TP sizes with MXFP8 "
            "KV cache: prefill attn_tp_size=..., decode attn_tp_size=..., state types "
            "[...].",
            "0.5.22+: the block scales of an MXFP8 KV cache are head-sharded; decode's "
            "first contact refuses a different attention TP for a non-MLA pool whose "
            "state types include block scales: the decode server exits. MXFP8 needs an "
            "SM100 GPU (ServerArgs refuses it on CPU), so check judges it only with the "
            "servers' state types known.",
            ("check derives the attention-TP fixes (the same attention TP on both "
             "servers)",
             _RUNTIME),
            sglang_releases=("0.5.22", None),
        ),
        CodeInfo(
            "DSV4G034",
            "the decode server's decode context parallelism does not fit the prefill",
            "PD decode DCP requires an MLA or hybrid-MLA KV pool. / PD decode DCP "
            "currently requires prefill attention CP=1, got ... / PD decode DCP does not "
            "support a prefill with --enable-kv-cache-sharding.",
            "0.5.17+: a decode server with DCP (--dcp-size > 1) needs an MLA or hybrid-MLA "
            "KV pool and a prefill with attention CP 1; 0.5.23 also a prefill without "
            "--enable-kv-cache-sharding. Decode's first contact raises the first that "
            "fails: the decode server exits. 0.5.16 has no DCP check.",
            ("check derives flag fixes from the condition: the decode without --dcp-size, "
             "the prefill without --attn-cp-size / --enable-kv-cache-sharding, each "
             "offered only when the edited line resolves",
             _RUNTIME),
            sglang_releases=("0.5.17", None),
        ),
        CodeInfo(
            "DSV4G035",
            "prefill and decode parallel layouts cannot be mapped onto each other",
            "('Decode pp size (...) should be equal to prefill pp size (...) or 1',)",
            "Decode's first contact maps its ranks onto the prefill's "
            "(`_resolve_rank_mapping`, every release): decode PP must equal the prefill's "
            "or be 1, decode attention CP must be 1, and (0.5.23) MLA KV cache sharding "
            "needs equal attention TP. They fail as bare assertions whose message is a "
            "tuple's repr: the decode server exits. A first-contact message check cannot "
            "map to a value is reported under this code as SGLang wrote it.",
            ("check derives flag fixes from the assertion: the decode's --pp-size set to "
             "the prefill's or removed (PP 1), each saying the decode's GPU count before "
             "and after, the decode without --attn-cp-size, the prefill without "
             "--enable-kv-cache-sharding, or the attention-TP fixes",
             _RUNTIME),
        ),
        CodeInfo(
            "DSV4G036",
            "the prefill and decode DCP ranks cannot be connected",
            "Unsupported PD DCP topology: ... -> ... / PD peers must connect matching DCP "
            "ranks, got prefill=..., decode=...",
            "0.5.17+: when a decode rank registers, the prefill decides whether KV needs a "
            "DCP relayout (`requires_dcp_relayout`): equal DCP sizes, or a prefill with "
            "DCP 1 and an MLA (or hybrid-MLA) pool, are accepted; anything else raises. On "
            "Mooncake and NIXL the prefill's bootstrap thread dies and every request to "
            "that rank times out; on MORI it is logged and each request then fails. "
            "0.5.16 has no relayout. check runs it for rank 0 of each server. At run time the "
            "guard reports it for NIXL and Mooncake when the registering rank meets it (with "
            "its DCP rank) and names the dead bootstrap thread's cause, once; for MORI from "
            "0.5.22 (its registration decides the relayout from then) when the rank registers.",
            ("check derives flag fixes: the server whose --dcp-size differs from 1 "
             "launched without it, or the other server launched with its DCP size where "
             "the release's relayout accepts the equal sizes; each offered only when the "
             "edited line resolves",),
            sglang_releases=("0.5.17", None),
        ),
        CodeInfo(
            "DSV4G037",
            "prefill and decode use different decode allocation policies",
            "Disaggregation decode allocation policy mismatch: prefill=..., decode=.... Set "
            "--disaggregation-decode-allocation-policy identically on both roles.",
            "0.5.22+: for every request the decode's receiver (`CommonKVReceiver.init`) "
            "compares the --disaggregation-decode-allocation-policy the prefill's bootstrap "
            "server published with its own, and with `prefill_complete` also needs the "
            "prefill's attention TP, CP and PP to be 1 (\"prefill_complete requires peer "
            "attention TP1/CP1/PP1\"). Each request then fails: the decode logs \"Decode "
            "handshake failed\" with the message and the client gets HTTP 500; both "
            "servers keep running. Releases before 0.5.22 have no such policy. check runs "
            "the release's own method on a bare receiver.",
            ("the same --disaggregation-decode-allocation-policy on both servers (check "
             "derives it: one server launched with the other's policy, offered only when "
             "the edited line resolves)",),
            sglang_releases=("0.5.22", None),
        ),
        CodeInfo(
            "DSV4G040",
            "different attention TP sizes for a non-MLA model's state the release cannot "
            "slice",
            "PD Disaggregation does NOT support PD different TP sizes for non-MLA {ST} "
            "hybrid models yet.",
            "The prefill's Mooncake or NIXL transfer (`maybe_send_extra`) sends each state "
            "type its KV pool registered, per request. For a non-MLA model with a different "
            "attention TP on the decode it refuses a state type it cannot slice by heads: SWA "
            "(gpt-oss and other sliding-window models) before 0.5.22; from 0.5.22 SWA is "
            "sliced, except with pipeline parallelism on the prefill (`... non-MLA SWA "
            "hybrid models with pipeline parallelism yet.`) or a prefill SWA KV cache not in "
            "the NHD layout (`Head-sliced PD transfer needs the NHD KV cache layout, got "
            "page_major`: the unified memory pool of --enable-unified-memory; a ROCm AITER "
            "layout is the hardware's and not predicted). MLA models are never refused. "
            "Mooncake: the transfer worker thread exits (\"Transfer thread failed ... "
            "Prefill instance ... is dead.\") and every request sharded to its queue hangs; "
            "NIXL: each request fails. MORI's own check is DSV4G006. At run time the guard reports "
            "it when the decode peer registers, before any request (once per distinct "
            "mismatch), and names the cause once when a Mooncake transfer worker dies of it.",
            ("check derives flag fixes: the same attention TP on both servers (by attention DP, keeping the "
             "GPU count, where the release's flags allow), --pp-size 1 on every server with "
             "more (a decode's PP must equal the prefill's or be 1), or the prefill without "
             "--enable-unified-memory",),
        ),
        CodeInfo(
            "DSV4G041",
            "different attention TP sizes with a MiniMax sparse model",
            "PD disagg: heterogeneous TP not supported for MiniMax sparse index yet.",
            "MiniMax sparse index state (0.5.21+: `... for MiniMax state yet.`, dense KV "
            "too) cannot be resliced by head: every release refuses a different attention TP "
            "per request in Mooncake's and NIXL's transfer; 0.5.23 refuses it already at "
            "decode's first contact (`MiniMax sparse PD requires matching attention TP "
            "sizes`), reported by that row. At run time (before 0.5.23) the guard reports it "
            "when the decode peer registers.",
            ("check derives flag fixes: the same attention TP on both servers",
             _RUNTIME),
        ),
        CodeInfo(
            "DSV4G042",
            "NIXL with HiSparse and decode-only speculative decoding",
            "NIXL PD transfer does not support HiSparse combined with decode-only "
            "speculative decoding.",
            "NIXL's registration of a decode peer (`_prepare_payload_xfer`) refuses a "
            "decode with HiSparse (KV in host memory) and a draft KV pool the prefill does "
            "not send (speculative decoding on the decode only): the prefill's bootstrap "
            "thread dies and every request to that rank times out. NIXL stores the peer "
            "before it raises, so the rank looks registered. At run time the guard reports it when "
            "the peer registers and names the dead bootstrap thread's cause, once.",
            ("check derives flag fixes: HiSparse off on the decode, or the Mooncake backend on "
             "both servers",),
        ),
        CodeInfo(
            "DSV4G043",
            "NIXL heterogeneous-TP transfer into decode host memory",
            "NIXL heterogeneous-TP direct-to-host KV transfer is not implemented safely yet",
            "NIXL's registration refuses a non-MLA pair with different attention TP whose "
            "decode receives its KV into host memory (HiSparse): the prefill's bootstrap "
            "thread dies and every request to that rank times out. At run time the guard reports "
            "it when the peer registers and names the dead bootstrap thread's cause, once.",
            ("check derives flag fixes: the same attention TP on both servers, or HiSparse off "
             "on the decode",),
        ),
        CodeInfo(
            "DSV4G044",
            "HiSparse on the decode needs the Mooncake transfer backend",
            "HiSparse device-only PD transfer currently requires the Mooncake backend",
            "The decode's first request (`pop_preallocated`) raises when HiSparse is on and "
            "the transfer backend is not Mooncake: for a DeepSeek-V4 pool from 0.5.17 (`DSV4 "
            "HiSparse direct PD transfer currently requires the Mooncake backend`), for a "
            "DeepSeek-V4 or a draft pool from 0.5.22. The decode server exits. A decode on "
            "the `fake` backend (decode-only) is exempt: its requests are fake transfers.",
            ("check derives flag fixes: --disaggregation-transfer-backend mooncake on both servers, or "
             "HiSparse off on the decode",),
            sglang_releases=("0.5.17", None),
        ),
        CodeInfo(
            "DSV4G045",
            "prefill and decode register different numbers of metadata buffers",
            "Decode ... registered N metadata buffers but this prefill has M; ...",
            "The two servers' metadata (aux) buffers pair up by position. "
            "SGLANG_ENABLE_DISAGG_SAMPLING_MASK read as true on one server only (read from "
            "0.5.20; a value SGLang's EnvBool refuses is read as false, with a warning), or "
            "in 0.5.16 to 0.5.19 SGLANG_DISAGGREGATION_SAMPLING_MASK_MAX_TOKENS above 0 on "
            "one server only (that release's MetadataBuffers reads it: it switches the "
            "sampling mask on and sizes it; 0.5.20+ refuse the variable at start-up), adds "
            "three buffers in the middle of the list: every later one (speculative top-k, "
            "hidden states, the bootstrap room) is read from the wrong slot, an error. "
            "--disaggregation-enable-kv-checksum on one server only (0.5.21+) adds the last "
            "buffer: harmless where the transfer stops at the shorter list (a warning). "
            "0.5.16 to 0.5.22's Mooncake and NIXL `send_aux` loop over the decode's buffers: "
            "a decode with more raises IndexError on the prefill, per request (Mooncake: "
            "the transfer worker exits; NIXL: each request fails), an error for either "
            "cause. The TCP paths (MORI's, Mooncake's SGLANG_MOONCAKE_SEND_AUX_TCP) send "
            "the prefill's buffers by index: before 0.5.23 a prefill with more makes the "
            "decode's receiving thread raise, an error. 0.5.23 logs the mismatch when a "
            "decode rank registers (`check_peer_aux_buffer_count`). At run time (Mooncake, NIXL, "
            "MORI, every release from 0.5.20) the guard reports it when the decode peer "
            "registers, and names the cause once when a Mooncake transfer worker dies of the "
            "IndexError.",
            ("check derives flag fixes: the variable or flag set (or unset) as on the other "
             "server; a value SGLang refuses is never copied: unset gives what SGLang reads "
             "from it",),
            sglang_releases=("0.5.16", None),
            milder="a warning when only the KV checksum's buffer differs and no transfer raises",
        ),
        CodeInfo(
            "DSV4G046",
            "NIXL with speculative decoding on the prefill only",
            "NIXL PD transfer: decode registered fewer KV regions (N) than prefill (M); "
            "unexpected geometry",
            "A prefill with a draft model registers its draft pool's KV regions after the "
            "target's; a decode without speculative decoding registers only the target's. "
            "NIXL's registration of that decode peer (`_prepare_payload_xfer`) raises: the "
            "prefill's bootstrap thread dies and every request to that rank times out. At run "
            "time the guard reports it when the peer registers and names the dead bootstrap "
            "thread's cause, once.",
            ("check derives flag fixes: the prefill's speculative flags on the decode, or "
             "speculative decoding off on the prefill",),
        ),
        CodeInfo(
            "DSV4G047",
            "SGLang refuses the server's SGLANG_DSV4_KV_LAYOUT on every machine",
            "unknown SGLANG_DSV4_KV_LAYOUT=...",
            "A DeepSeek-V4 server's KV pool layout is chosen by SGLang's "
            "`select_dsv4_kv_layout` from SGLANG_DSV4_KV_LAYOUT (and, with "
            "`--dsv4-attn-backend trtllm`, SGLANG_DSV4_COMPRESSED_KV_LAYOUT) when the server "
            "builds its KV pool. A value it asserts against before it looks at the GPU (a "
            "layout it does not know; a V4.1 layout with trtllm, 0.5.22+) stops the server at "
            "start-up with an AssertionError on every machine. A V4.1 layout that needs an "
            "SM100/SM103 GPU depends on the GPU and is not this code.",
            ("check derives environment fixes: the variable unset (the release's default), or "
             "the other server's value where SGLang's selection accepts it for this server",),
            sglang_releases=("0.5.21", None),
        ),
        CodeInfo(
            "DSV4G048",
            "prefill and decode metadata buffers have different row widths",
            None,
            "With SGLANG_ENABLE_DISAGG_SAMPLING_MASK on both servers, two metadata buffers "
            "(the sampling mask's token ids and logprobs) are --sampling-mask-max-tokens "
            "wide (0.5.20+); in 0.5.16 to 0.5.19 they are "
            "SGLANG_DISAGGREGATION_SAMPLING_MASK_MAX_TOKENS wide where it is above 0 on both "
            "servers. SGLang compares nothing: the counts agree, the rows do not. Mooncake's "
            "and NIXL's `send_aux` (and MORI's with SGLANG_MORI_SEND_AUX_RDMA) write each "
            "request's row at the prefill's stride and length into the decode's buffer, "
            "which the decode reads at its own: every request slot but the first reads other "
            "bytes, a wider prefill overwrites other requests' rows and hands the engine "
            "destinations past the decode's buffer. The TCP paths (MORI's default, "
            "Mooncake's SGLANG_MOONCAKE_SEND_AUX_TCP) write at the decode's stride: a wider "
            "prefill's rows overrun into the next request's row and, for the last slot, past "
            "the decode's buffer (an error); a narrower one stays correct (a warning). "
            "Nothing is logged.",
            ("check derives flag fixes: one server takes the other's --sampling-mask-max-tokens "
             "(a value that server's resolution accepted); in 0.5.16 to 0.5.19 environment "
             "fixes: one server takes the other's variable",),
            sglang_releases=("0.5.16", None),
            milder="a warning when every row lands in place (a narrower prefill, a TCP path)",
        ),
        CodeInfo(
            "DSV4G049",
            "SGLang refuses a server's KV pool when its KV transfer is set up",
            "PD-disaggregation KV transfer assumes NHD slot-row layout; HND KV cache "
            "(SGLANG_USE_HND_KVCACHE) is not supported with disagg yet.",
            "`sglang-dsv4-guard check`: a PD server builds its KV manager at start-up "
            "(`_init_kv_manager`), calling the release's `get_kv_transfer_buf_infos` (else "
            "the pool's `get_contiguous_buf_infos`) and `setup_state_kv_args` on its pool. "
            "Some pools are refused there on every machine: an MHA-based pool with "
            "SGLANG_USE_HND_KVCACHE set (the HND layout; every release), a MiniMax sparse "
            "pool with index-value sparse layers (`only K-only sparse layers are`). The "
            "server stops before serving. check runs those calls on the pool SGLang's "
            "constructor builds for the server, in its environment; a pool that cannot be "
            "built on this CPU is an `unknowns` line, not this finding.",
            ("check derives environment fixes: each variable of the server's line whose "
             "removal makes the same calls accept the pool, unset on that server (the "
             "edited line resolved by the release); none: a checkpoint SGLang's PD cannot "
             "serve (no flag fixes it)",),
        ),
        CodeInfo(
            "DSV4G050",
            "Mooncake rejects the decode peer's state layout",
            "Rejecting state transfers to decode session ...: ... item length mismatch for "
            "... entry ...: prefill=..., decode=...",
            "0.5.22+: when a decode rank registers with a Mooncake prefill rank, "
            "`MooncakeKVManager._validate_peer_state_layout` compares, for every generic "
            "state component the prefill's pool registered (SWA, DSA, QSA, ...), the item "
            "length (the stride the transfer writes the decode at) of each entry with the "
            "one the decode registered; 0.5.23 also rejects a CP/TP-sharing DFLASH pair of "
            "different physical TP. SGLang raises nothing: it logs \"Rejecting state "
            "transfers to decode session ...\" and every later request to that decode rank "
            "fails with the reason; both servers keep running. At run time the guard runs "
            "the release's own method (digested) on the registration's values and reports "
            "it when the decode peer registers, once per distinct mismatch. check does not "
            "predict it: the item lengths are the built pools', which check's miniature "
            "pools do not have.",
            ("the same model, attention TP and state-pool flags on both servers (the report "
             "names the state component and both servers' item lengths)",),
            sglang_releases=("0.5.22", None),
        ),
        CodeInfo(
            "DSV4G055",
            "NIXL rejects the decode's state layout",
            "NIXL state layout rejected for <peer>: NIXL prepared state component N (...) "
            "stride mismatch for peer ...",
            "0.5.23+: when a decode rank registers, NIXL's registration "
            "(`_prepare_state_xfer`, on CUDA with the UCX backend and PP, CP and DCP 1) "
            "plans the state components it prepares; a component transferred whole whose "
            "decode slot stride (`dst_state_item_lens`) differs from the prefill's has no "
            "correct transfer path. SGLang logs \"NIXL state layout rejected: peer=...\" "
            "and the bootstrap thread goes on; every request to that peer then fails in "
            "`maybe_send_extra`. At run time the guard reports it when the decode peer "
            "registers (once per distinct mismatch), with both servers' strides per "
            "component; it runs the release's own method on the registration's values. "
            "check does not predict it: the strides exist once the pools are allocated, "
            "not in the launch lines.",
            ("derived: the components whose strides differ, with both values; give both "
             "servers the same state pool geometry (the same model, state dtypes and "
             "state TP share)",),
            sglang_releases=("0.5.23", None),
        ),
        CodeInfo(
            "DSV4G056",
            "MORI: different TP sizes for QSA state",
            "PD disagg: heterogeneous TP not supported for qsa_pending yet.",
            "0.5.20+: MORI's state transfer (`_send_swa_dsa_state`) pairs QSA state "
            "(`qsa_pending`, `qsa_compressed`) whole, by the prefill's attention TP (0.5.20 "
            "to 0.5.22) or state TP (0.5.23); a decode "
            "that registered another TP size is refused for every request that carries "
            "it (the request fails; both servers keep running). At run time the guard "
            "reports it when the decode peer registers (once per distinct mismatch), by "
            "running the release's own method on the registration's values. check does "
            "not predict it (the prefill's state TP is known once it runs).",
            ("derived: the decode with the prefill's TP the release pairs by (found by its "
             "own check); when that is the attention TP, the attention-TP flag fixes",),
            sglang_releases=("0.5.20", None),
        ),
        CodeInfo(
            "DSV4G057",
            "MORI: prefill and decode register different numbers of state components",
            "PD state transfer failed: state component count mismatch (local=M, remote=N)",
            "MORI's state transfer (`send_state`) compares the number of state components "
            "the decode registered with the prefill's: when they differ, every request "
            "that carries state fails (both servers keep running). At run time the guard "
            "reports it when the decode peer registers (once per distinct mismatch), by "
            "running the release's own method on the registration's values. check does "
            "not predict it (the components exist once the pools are built).",
            ("derived: both counts; the same state pools on both servers (the same model "
             "and the flags that add state)",),
        ),
        CodeInfo(
            "DSV4G058",
            "NIXL/MORI: a replicated Mamba state cannot go to a decode of another TP",
            "Replicated Mamba PD state transfer currently requires matching prefill/decode "
            "attention TP sizes",
            "From 0.5.20 NIXL's maybe_send_extra and MORI's send_state slice a Mamba state "
            "by heads for a decode of another TP, but not a component the prefill holds "
            "replicated (a tensor whose TP-sharded dimension in "
            "kv_args.state_dim_per_tensor is 0): every request that carries Mamba state "
            "fails (both servers keep running). Both compare the decode's TP with the "
            "prefill's attention TP (0.5.20 - 0.5.22) or its state TP (0.5.23). At run time the "
            "guard reports it when the decode peer registers (once per distinct mismatch), "
            "by running the release's own method on the registration's values. check does "
            "not predict it (which tensors are replicated is known once the pools are "
            "built).",
            ("derived: the decode TP the release pairs the Mamba state by; for the "
             "prefill's attention TP, the flag edits that make both attention TP sizes "
             "equal",),
            sglang_releases=("0.5.20", None),
        ),
        CodeInfo(
            "DSV4G059",
            "Mooncake/NIXL/MORI: the Mamba state is sharded on one server and replicated on "
            "the other",
            "Mamba state replication metadata differs between prefill and decode",
            "From 0.5.20 (MORI from 0.5.22) the Mamba state transfer to a decode of another "
            "TP slices each state tensor by heads with SGLang's "
            "compute_mamba_state_slice_byte_blocks, which refuses a tensor the prefill "
            "holds sharded and the decode replicated (its TP-sharded dimension 0), or the "
            "other way round, and replicated tensors whose item lengths differ (\"Replicated "
            "Mamba state item lengths differ\"). Every request that carries Mamba state "
            "fails (both servers keep running). At run time the guard reports it when the "
            "decode peer registers (once per distinct mismatch), by running that function "
            "on the registration's values. check does not predict it (the per-tensor "
            "dimensions are known once the pools are built).",
            ("derived: equal attention TP sizes (where the transfer slices by attention "
             "TP: then whole items are copied); the same model and state-pool flags on "
             "both servers",),
            sglang_releases=("0.5.20", None),
        ),
        CodeInfo(
            "DSV4G090",
            "a guard plug-in failed",
            None,
            "A check, remediation or reporter plug-in raised, returned something that "
            "is not a list of findings, or could not be loaded. The guard carried on "
            "without it; SGLang's verdict is unchanged. Of a plug-in's findings, the first "
            "256 per call are kept: the ones past that cap are left out and counted.",
            ("derived: names the plug-in, its entry-point group and the stage that failed",),
            severity=Severity.WARNING,
        ),
        CodeInfo(
            "DSV4G099",
            "the guard disagrees with SGLang",
            None,
            "The guard's prediction of SGLang's verdict differs from what SGLang did. "
            "SGLang's verdict stands. Either a pool changed between the guard's read and "
            "SGLang's (a computed property, another thread), or this is a guard bug: "
            "please report it with the JSON report.",
            ("derived: env edits for the server that raised: SGLANG_DSV4_GUARD_LOG_FORMAT=json "
             "to report it, or SGLANG_DSV4_GUARD=0",),
            severity=Severity.WARNING,
        ),
    )
}
