"""``check``'s transfer-time contract rows (DSV4G040, DSV4G041, DSV4G045) and the values
they read.

- DSV4G040/041: the prefill's Mooncake/NIXL ``maybe_send_extra`` on each state type its
  pool registers (:mod:`.state_types`), evaluated with SGLang's own conditions
  (:mod:`sglang_dsv4_guard.pd.send_extra`);
- DSV4G045: the two servers' metadata buffer counts, by SGLang's own ``MetadataBuffers``
  and (0.5.23) ``check_peer_aux_buffer_count`` (:mod:`sglang_dsv4_guard.pd.buffers`).
"""

from __future__ import annotations

from dataclasses import replace

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Severity
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.envs import env_reading
from sglang_dsv4_guard.host.flags import flag_for_field
from sglang_dsv4_guard.host.pd_digests import SITES, NotJudged, digest_pd_tree, locate, row_releases
from sglang_dsv4_guard.host.verdict import imported_package_dir
from sglang_dsv4_guard.launch import state_types as _state_types  # registers its contributor
from sglang_dsv4_guard.launch import swa_layout as _swa_layout  # registers its contributor
from sglang_dsv4_guard.launch.contract_run import ContractRun
from sglang_dsv4_guard.launch.derive import Side
from sglang_dsv4_guard.launch.endpoint_values import (
    CONTRIBUTORS,
    NotDerived,
    field_source,
    side_field,
)
from sglang_dsv4_guard.launch.flag_fixes import accepted_fix, attention_tp_fixes
from sglang_dsv4_guard.launch.parse import offline_env
from sglang_dsv4_guard.pd.buffers import aux_buffer_count, mask_env
from sglang_dsv4_guard.pd.endpoint import Value
from sglang_dsv4_guard.pd.nixl_payload import NixlVerdict, hisparse_backend_verdict, payload_verdict
from sglang_dsv4_guard.pd.send_extra import BACKENDS, StateVerdict, send_extra_verdicts
from sglang_dsv4_guard.pd.when import Phase, when_text

__all__ = ["SAMPLING_MASK", "hisparse_backend_row", "nixl_payload_row",
           "send_extra_row"]

del _state_types, _swa_layout
SAMPLING_MASK = "SGLANG_ENABLE_DISAGG_SAMPLING_MASK"


def _aux(side: Side) -> int:
    with offline_env(side.args.env):
        return aux_buffer_count(bool(side_field(side, "disaggregation_enable_kv_checksum")),
                                side_field(side, "sampling_mask_max_tokens"))


def _refused_width(side: Side) -> str | None:
    """Why SGLang would not start this server on its ``--sampling-mask-max-tokens``: a
    width of 0 or less is refused at resolution by 0.5.20+'s
    ``arg_groups/validation_hook.py`` ``validate_sampling_mask_max_tokens`` ("must be
    positive"); a resolved ``ServerArgs`` holds only a width it accepted."""
    width = side_field(side, "sampling_mask_max_tokens")
    if side.args.server_args is not None or width is None or int(width) > 0:
        return None
    flag = flag_for_field("sampling_mask_max_tokens")
    option = flag.option if flag is not None else "--sampling-mask-max-tokens"
    return (f"DSV4G045: not judged: {option} {width}: SGLang's "
            "validate_sampling_mask_max_tokens refuses it at start-up (it must be "
            "positive): the server would not start; its metadata buffers are not counted")


def _aux_values(side: Side, values: dict[str, Value]) -> dict[str, Value]:
    """The metadata buffer count (its own contributor: when it cannot be known, the
    other transfer values still are)."""
    del values
    refused = _refused_width(side)
    if refused:
        raise NotDerived(refused)
    name = mask_env()
    mask = side.args.env.get(name)
    try:
        count = _aux(side)
    except ValueError as exc:  # a width the class would read that is too wide to build
        raise NotDerived(f"DSV4G045: not judged: {exc}") from None
    return {"aux_buffer_count": Value(count, (
        "SGLang's MetadataBuffers(...).get_buf_infos() built on CPU with this server's "
        f"{name}" + (f"={mask}" if mask is not None else " (unset)")
        + " and " + field_source(side, "disaggregation_enable_kv_checksum",
                                 "--disaggregation-enable-kv-checksum")))}


def _mask_value(side: Side) -> Value:
    """The variable that switches the release's sampling-mask buffers on (:func:`mask_env`)
    as SGLang reads it, and what was typed."""
    name = mask_env()
    mask = side.args.env.get(name)
    read, refused = env_reading(name, mask)
    if mask is None:
        return Value(read, f"{name} not set (the release's default)")
    return Value(read, f"{name}={mask} in the server's environment"
                 + (f": {refused}" if refused else ""))


def _contribute(side: Side, values: dict[str, Value]) -> dict[str, Value]:
    del values
    return {
        "kv_checksum": Value(bool(side_field(side, "disaggregation_enable_kv_checksum")), field_source(
            side, "disaggregation_enable_kv_checksum", "--disaggregation-enable-kv-checksum")),
        "sampling_mask_env": _mask_value(side),
        "enable_hisparse": Value(bool(side_field(side, "enable_hisparse")),
                                 field_source(side, "enable_hisparse", "--enable-hisparse")),
    }


CONTRIBUTORS.extend((_contribute, _aux_values))


def _tp_fixes(run: ContractRun, pp: bool, layout: bool = False) -> tuple[Fix, ...]:
    if not run.derive:
        return ()
    sides = {"prefill": run.prefill_side, "decode": run.decode_side}
    found: list[Fix | None] = list(attention_tp_fixes(run.prefill_side, run.decode_side))
    unified = flag_for_field("enable_unified_memory")
    if layout and unified is not None and side_field(run.prefill_side, "enable_unified_memory"):
        # the plain SWAKVPool's SWA layout is NHD, which the head-sliced transfer takes
        found.insert(0, Fix(FixKind.FLAGS, "run the prefill without the unified memory pool "
                                           "(its page_major SWA layout cannot be head-sliced)",
                            field="swa_kv_cache_layout",
                            edits=(Edit("prefill", unified.option, remove=True),)))
    pp_flag = flag_for_field("pp_size")
    if pp and pp_flag is not None:
        # The head-sliced transfer needs the prefill's PP 1 (common/conn.py
        # CommonKVManager._get_mha_head_slice_blocks, 0.5.22+), and the decode's first
        # contact asserts its PP equal to the prefill's or 1 (common/conn.py
        # CommonKVManager._resolve_rank_mapping, 0.5.23): PP 1 on every server that has more.
        roles = [r for r, e in (("prefill", run.prefill), ("decode", run.decode))
                 if int(e.get("pp_size") or 1) > 1]
        found.insert(0, Fix(FixKind.FLAGS, "run " + " and ".join(f"the {r}" for r in roles)
                            + " without pipeline parallelism (head-sliced SWA transfer needs "
                            "the prefill's PP 1, and a decode's PP must equal it or be 1)",
                            field="pp_size",
                            edits=tuple(Edit(r, pp_flag.option, "1") for r in roles)))
    kept = [accepted_fix(f, sides) for f in found]
    return tuple(f for f in kept if f is not None)


def _send_extra_finding(run: ContractRun, backend: str, verdict: StateVerdict) -> Finding:
    p, d = run.prefill, run.decode
    pp = "pipeline parallelism" in verdict.message
    layout = "KV cache layout" in verdict.message
    info = CODES[verdict.code]
    names = ["attn_tp_size", "is_mla_backend", "state_types", *(["pp_size"] if pp else []),
             *(["swa_kv_cache_layout"] if layout else [])]
    return Finding(
        code=verdict.code, severity=Severity.ERROR, summary=info.title,
        subject=f"prefill -> decode {backend} transfer of the {verdict.state_type} state",
        observations=(*(p.observation(n) for n in names), d.observation("attn_tp_size"),
                      p.observation("transfer_backend"), d.observation("transfer_backend")),
        details=(f"SGLang's {verdict.function} raises it on the prefill for every request "
                 f"that carries {verdict.state_type} state: the prefill has attention TP "
                 f"{p.get('attn_tp_size')}, the decode {d.get('attn_tp_size')}",),
        fixes=_tp_fixes(run, pp, layout), docs=docs_url(verdict.code), host_message=verdict.message,
        when=when_text(Phase.PER_REQUEST, backend, run.prefill_side.args.env))


def _first_contact_minimax() -> bool:
    """Whether decode's first contact already refuses MiniMax with different attention TP
    (0.5.23: then pd-contact's row reports it, not this one)."""
    package = imported_package_dir()
    return package is not None and locate(package, SITES["first_contact.minimax"]) is not None


def send_extra_row(run: ContractRun) -> tuple[list[Finding], list[str]]:
    """DSV4G040/DSV4G041 for the pair."""
    p, d = run.prefill, run.decode
    backend = p.get("transfer_backend")
    if backend != d.get("transfer_backend") or backend not in BACKENDS:
        return [], []
    package = imported_package_dir()
    if package is None:
        return [], ["DSV4G040: not judged: the imported SGLang's source was not found"]
    if not p.has("state_types"):
        if p.get("attn_tp_size") != d.get("attn_tp_size") and not p.get("is_mla_backend"):
            return [], [f"DSV4G040 ({backend}): not judged: the state types of the prefill's "
                        "pool (a pool this check does not build) are not known, and attention "
                        f"TP differs ({p.get('attn_tp_size')} vs {d.get('attn_tp_size')})"]
        return [], []
    verdicts, unknowns = send_extra_verdicts(p, d, backend, package, p.get("state_types"))
    skip_minimax = _first_contact_minimax()
    # State types refused by one branch with one message (0.5.21+: MiniMax's index and
    # dense KV) are one refusal: the transfer raises at the first of them.
    merged: dict[tuple[str, str], StateVerdict] = {}
    for v in verdicts:
        key = (v.code, v.message)
        if key in merged:
            first = merged[key]
            merged[key] = replace(first, state_type=f"{first.state_type} and {v.state_type}")
        else:
            merged[key] = v
    findings = [_send_extra_finding(run, backend, v) for v in merged.values()
                if not (v.code == "DSV4G041" and skip_minimax)]
    return findings, unknowns


def _changed(keys: tuple[str, ...], code: str) -> str | None:
    """The unknowns line when the imported release's sites ``keys`` match no known one."""
    package = imported_package_dir()
    if package is None:
        return f"{code}: not judged: the imported SGLang's source was not found"
    if row_releases(digest_pd_tree(package), keys):
        return None
    targets = sorted({str(SITES[k].target) for k in keys})
    return (f"{code}: not judged: SGLang's {' / '.join(targets)} differs from every release "
            "this guard knows")


def _hisparse_fixes(run: ContractRun, tp: bool) -> tuple[Fix, ...]:
    if not run.derive:
        return ()
    sides = {"prefill": run.prefill_side, "decode": run.decode_side}
    found: list[Fix | None] = list(attention_tp_fixes(run.prefill_side, run.decode_side)
                                   if tp else [])
    hisparse, backend = flag_for_field("enable_hisparse"), flag_for_field(
        "disaggregation_transfer_backend")
    if hisparse is not None:
        found.append(Fix(FixKind.FLAGS, "run the decode without HiSparse", field="enable_hisparse",
                         edits=(Edit("decode", hisparse.option, remove=True),)))
    if backend is not None and not tp:
        found.append(Fix(FixKind.FLAGS, "use the Mooncake transfer backend on both servers",
                         field="transfer_backend", edits=tuple(
                             Edit(role, backend.option, "mooncake") for role in sides)))
    return tuple(f for f in (accepted_fix(f, sides) for f in found) if f is not None)


def _hisparse_details(run: ContractRun, verdict: NixlVerdict) -> str:
    d = run.decode
    if verdict.code == "DSV4G046":
        return (f"SGLang's {verdict.function} raises it: the prefill runs "
                f"{run.prefill.get('speculative_algorithm')} and registers its draft pool's "
                "KV regions after the target's (PrefillBootstrapQueue._init_kv_manager); the "
                "decode, without speculative decoding, registers only the target's")
    if verdict.code == "DSV4G044":
        # decode.py DecodePreallocQueue.pop_preallocated (0.5.17+; a draft pool from 0.5.22)
        pools = " and ".join(n for n, on in (("a DeepSeek-V4 KV pool", d.get("is_dsv4")), (
            "a draft KV pool", d.get("speculative_algorithm"))) if on)
        return (f"SGLang's {verdict.function} raises it: the decode runs HiSparse with "
                f"{pools or 'the pool the release tests'} on the "
                f"{d.get('transfer_backend')} backend, and its HiSparse transfer is "
                "Mooncake's only")
    draft = (", its draft's on the GPU" if d.get("speculative_algorithm") else "")
    return (f"SGLang's {verdict.function} raises it; the decode's HiSparse KV is in host "
            f"memory (DRAM){draft} (the memory kinds NIXL reads from the registration, as "
            "HiSparse allocates them)")


def _hisparse_finding(run: ContractRun, verdict: NixlVerdict, phase: Phase) -> Finding:
    p, d = run.prefill, run.decode
    info = CODES[verdict.code]
    names = (("transfer_backend", "speculative_algorithm") if verdict.code == "DSV4G046" else (
        "transfer_backend", "enable_hisparse", "speculative_algorithm", "is_dsv4",
        *(("attn_tp_size", "is_mla_backend") if verdict.code == "DSV4G043" else ())))
    return Finding(
        code=verdict.code, severity=Severity.ERROR, summary=info.title,
        subject=("decode peer's NIXL registration" if verdict.code == "DSV4G046"
                 else "decode server HiSparse transfer"), observations=tuple(
            e.observation(n) for n in names for e in (p, d)),
        details=(_hisparse_details(run, verdict),),
        # DSV4G046's fixes are the speculative flags' (remedy's derived_fixes)
        fixes=(() if verdict.code == "DSV4G046" else _hisparse_fixes(
            run, verdict.code == "DSV4G043")), docs=docs_url(verdict.code),
        host_message=verdict.message,
        when=when_text(phase, str(p.get("transfer_backend")), run.prefill_side.args.env))


def nixl_payload_row(run: ContractRun) -> tuple[list[Finding], list[str]]:
    """DSV4G042/DSV4G043/DSV4G046: NIXL's registration of the decode (both servers on
    NIXL)."""
    p, d = run.prefill, run.decode
    if not p.get("transfer_backend") == d.get("transfer_backend") == "nixl":
        return [], []
    if not all(e.has(n) for e in (p, d) for n in ("enable_hisparse", "dcp_size")):
        return [], []  # a value it reads was not derived: the endpoint's note says why
    changed = _changed(("nixl.hisparse_spec", "nixl.direct_to_host", "nixl.fewer_regions"),
                       "DSV4G042/DSV4G043/DSV4G046")
    if changed:
        return [], [changed]
    verdict = payload_verdict(p, d)
    return ([_hisparse_finding(run, verdict, Phase.REGISTRATION)] if verdict else []), []


def hisparse_backend_row(run: ContractRun) -> tuple[list[Finding], list[str]]:
    """DSV4G044: the decode's first request with HiSparse off Mooncake."""
    d = run.decode
    if not d.get("enable_hisparse") or d.get("transfer_backend") == "mooncake":
        return [], []
    changed = _changed(("decode.hisparse_mooncake",), "DSV4G044")
    package = imported_package_dir()
    if changed or package is None:
        return [], [changed or "DSV4G044: not judged"]
    try:
        verdict = hisparse_backend_verdict(d, package)
    except NotJudged as exc:
        return [], [f"DSV4G044: not judged: {exc}"]
    return ([_hisparse_finding(run, verdict, Phase.FIRST_REQUEST)] if verdict else []), []
