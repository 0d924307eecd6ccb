"""``check``'s transfer-time contract row of HiSparse off Mooncake at the decode's first
request (:mod:`sglang_dsv4_guard.pd.nixl_payload`) and the transfer values of each server
that the pair conditions read: the state types its pool registers (:mod:`.state_types`, for
:mod:`sglang_dsv4_guard.pd.send_extra`), its SWA layout (:mod:`.swa_layout`)
and its metadata buffer count (:mod:`sglang_dsv4_guard.pd.aux_count`).
"""

from __future__ import annotations

from sglang_dsv4_guard.check.fixing.flag_fixes import accepted_fixes
from sglang_dsv4_guard.check.offline.parse import offline_env
from sglang_dsv4_guard.check.rows.contract_run import ContractRun
from sglang_dsv4_guard.check.server import state_types as _state_types  # registers its contributor
from sglang_dsv4_guard.check.server import swa_layout as _swa_layout  # registers its contributor
from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.check.server.endpoint_values import CONTRIBUTORS, NotDerived, field_source, raw_field
from sglang_dsv4_guard.findings import Finding, Phase
from sglang_dsv4_guard.host.envs import env_reading
from sglang_dsv4_guard.host.flags import flag_for_field
from sglang_dsv4_guard.host.judgement import imported_package_dir
from sglang_dsv4_guard.host.pd_digests import NotJudged, unjudged_sites
from sglang_dsv4_guard.pd.aux_count import CODE as AUX_CODE
from sglang_dsv4_guard.pd.buffers import aux_buffer_count, mask_env
from sglang_dsv4_guard.pd.endpoint import Value
from sglang_dsv4_guard.pd.nixl_payload import HISPARSE_CODE, hisparse_backend_refusal, payload_finding

__all__ = ["hisparse_backend_row"]

del _state_types, _swa_layout


def _refused_width(side: DerivedServer) -> str | None:
    """Why SGLang would not start this server on its ``--sampling-mask-max-tokens``: a
    width of 0 or less is refused at resolution by 0.5.20+'s
    ``arg_groups/validation_hook.py`` ``validate_sampling_mask_max_tokens`` ("must be
    positive"); a resolved ``ServerArgs`` holds only a width it accepted."""
    width = raw_field(side, "sampling_mask_max_tokens")
    if side.args.server_args is not None or width is None or int(width) > 0:
        return None
    flag = flag_for_field("sampling_mask_max_tokens")
    option = flag.option if flag is not None else "--sampling-mask-max-tokens"
    return (f"{AUX_CODE}: not judged: {option} {width}: SGLang's "
            "validate_sampling_mask_max_tokens refuses it at start-up (it must be "
            "positive): the server would not start; its metadata buffers are not counted")


def _aux_values(side: DerivedServer, values: dict[str, Value]) -> dict[str, Value]:
    """The metadata buffer count (its own contributor: when it cannot be known, the
    other transfer values still are)."""
    refused = _refused_width(side)
    if refused:
        raise NotDerived(refused)
    name = mask_env()
    mask = side.args.env.get(name)
    try:
        with offline_env(side.args.env):
            count = aux_buffer_count(bool(raw_field(side, "disaggregation_enable_kv_checksum")),
                                     raw_field(side, "sampling_mask_max_tokens"))
    except ValueError as exc:  # a width the class would read that is too wide to build
        raise NotDerived(f"{AUX_CODE}: not judged: {exc}") from None
    return {"aux_buffer_count": Value(count, (
        "SGLang's MetadataBuffers(...).get_buf_infos() built on CPU with this server's "
        f"{name}" + (f"={mask}" if mask is not None else " (unset)")
        + " and " + field_source(side, "disaggregation_enable_kv_checksum")))}


def _mask_value(side: DerivedServer) -> Value:
    """The variable that switches the release's sampling-mask buffers on (:func:`mask_env`)
    as SGLang reads it, and what was typed."""
    name = mask_env()
    mask = side.args.env.get(name)
    read, refused = env_reading(name, mask)
    if mask is None:
        return Value(read, f"{name} not set (the release's default)")
    return Value(read, f"{name}={mask} in the server's environment"
                 + (f": {refused}" if refused else ""))


def _contribute(side: DerivedServer, values: dict[str, Value]) -> dict[str, Value]:
    return {
        "kv_checksum": Value(bool(raw_field(side, "disaggregation_enable_kv_checksum")),
                             field_source(side, "disaggregation_enable_kv_checksum")),
        "sampling_mask_env": _mask_value(side),
        "enable_hisparse": Value(bool(raw_field(side, "enable_hisparse")),
                                 field_source(side, "enable_hisparse")),
    }


CONTRIBUTORS.extend((_contribute, _aux_values))


def hisparse_backend_row(run: ContractRun) -> tuple[list[Finding], list[str]]:
    """The decode's first request with HiSparse off Mooncake (only ``check``
    sees it: no run-time place precedes the decode's first request)."""
    d = run.decode
    if not d.get("enable_hisparse") or d.get("transfer_backend") == "mooncake":
        return [], []
    package = imported_package_dir()
    changed = unjudged_sites(package, ("decode.hisparse_mooncake",), HISPARSE_CODE)
    if changed or package is None:
        return [], [changed or f"{HISPARSE_CODE}: not judged"]
    try:
        refusal = hisparse_backend_refusal(d, package)
    except NotJudged as exc:
        return [], [f"{HISPARSE_CODE}: not judged: {exc}"]
    if refusal is None:
        return [], []
    return [accepted_fixes(payload_finding(run.prefill, d, refusal, Phase.FIRST_REQUEST),
                           run.prefill_side, run.decode_side, run.derive)], []
