"""``check``'s transfer-time contract rows (NIXL's registration payload, DSV4G042/043/046;
HiSparse off Mooncake, DSV4G044) and the transfer values of each server that the pair
conditions read: the state types its pool registers (:mod:`.state_types`, for
DSV4G040/041, :mod:`sglang_dsv4_guard.pd.send_extra`), its SWA layout (:mod:`.swa_layout`)
and its metadata buffer count (DSV4G045, :mod:`sglang_dsv4_guard.pd.aux_count`).
"""

from __future__ import annotations

from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Severity
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.envs import env_reading
from sglang_dsv4_guard.host.flags import flag_for_field
from sglang_dsv4_guard.host.pd_digests import SITES, NotJudged, digest_pd_tree, row_releases
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
from sglang_dsv4_guard.pd.when import Phase, when_text

__all__ = ["SAMPLING_MASK", "hisparse_backend_row", "nixl_payload_row"]

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
