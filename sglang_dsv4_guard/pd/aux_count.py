"""DSV4G045: the two servers register different numbers of metadata (aux) buffers.

The counts come from SGLang's own ``MetadataBuffers`` (:mod:`.buffers`), what the
transfer then does from each backend's own ``send_aux`` run on miniature buffers
(:mod:`.aux_send`). The caller runs this in the prefill's environment (``check`` applies
the launch line's; at run time it is the process's own): both read it.
"""

from __future__ import annotations

from pathlib import Path

from sglang_dsv4_guard.findings import Finding, Phase, Severity
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind
from sglang_dsv4_guard.host.envs import env_copy
from sglang_dsv4_guard.host.flags import flag_for_field
from sglang_dsv4_guard.host.pd_digests import NotJudged
from sglang_dsv4_guard.pd.aux_send import AUX_BACKENDS, aux_details, aux_send
from sglang_dsv4_guard.pd.buffers import aux_buffer_count, mask_env, peer_count_log
from sglang_dsv4_guard.pd.endpoint import Endpoint, pair_finding
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["CODE", "aux_count_findings"]

CODE = "DSV4G045"
_CHECKSUM = "disaggregation_enable_kv_checksum"
_OBSERVED = ("aux_buffer_count", "sampling_mask_env", "kv_checksum")


def aux_count_findings(prefill: Endpoint, decode: Endpoint, package: Path | None
                       ) -> tuple[list[Finding], list[str]]:
    """DSV4G045 for the pair, and what could not be judged.

    An error where the prefill's backend's ``send_aux`` raises (0.5.16 - 0.5.22's
    Mooncake and NIXL loop over the decode's buffers; the TCP paths send the prefill's
    by index) or where the buffers land misaligned; a warning where only the KV
    checksum's buffer, the last, is left out. ``package`` is the imported SGLang's
    source directory (``None``: not found, not judged)."""
    if not (prefill.has("aux_buffer_count") and decode.has("aux_buffer_count")):
        return [], []  # the endpoint's note says why a count is not known
    local, remote = int(prefill.get("aux_buffer_count")), int(decode.get("aux_buffer_count"))
    if local == remote:
        return [], []
    backend = str(prefill.get("transfer_backend"))
    if package is None:
        return [], [f"{CODE}: not judged: the imported SGLang's source was not found"]
    if backend not in AUX_BACKENDS:
        return [], [f"{CODE}: not judged: prefill {local} and decode {remote} metadata "
                    f"buffers, and the {backend} transfer's send_aux is not one this guard runs"]
    try:
        sent = aux_send(backend, package, local, remote)
    except NotJudged as exc:
        return [], [f"{CODE} ({backend}): not judged: {exc}"]
    try:
        logged = peer_count_log(local, remote)
    except AttributeError:  # a release without the check: nothing is logged
        logged = None
    only = checksum_only(prefill, decode)
    fails = bool(sent.prefill_raised or sent.decode_raised)
    env = prefill.env or {}
    when = (when_of(Phase.PER_REQUEST, backend, env, receiver=not sent.prefill_raised)
            if fails else when_of(Phase.SILENT, backend, env, logged=logged is not None,
                                  aligned=only))
    return [pair_finding(
        CODE, f"prefill -> decode {backend} transfer of the metadata buffers", (prefill, decode),
        _OBSERVED, aux_details(local, remote, only, sent), _fixes(prefill, decode, only),
        logged or sent.prefill_raised or sent.decode_raised, when,
        Severity.WARNING if only and not fails else Severity.ERROR)], []


def checksum_only(prefill: Endpoint, decode: Endpoint) -> bool:
    """Whether the counts differ by the KV checksum's buffer alone, on the side the
    prefill's own flag says (0.5.21+; before, the checksum adds no buffer): the count
    difference is that buffer's, and the decode's flag, where known, is the other way."""
    extra = aux_buffer_count(True, None) - aux_buffer_count(False, None)
    if extra <= 0 or not prefill.has("kv_checksum"):
        return False
    on = bool(prefill.get("kv_checksum"))
    if decode.has("kv_checksum") and bool(decode.get("kv_checksum")) == on:
        return False
    local, remote = int(prefill.get("aux_buffer_count")), int(decode.get("aux_buffer_count"))
    return local - remote == (extra if on else -extra)


def _fixes(prefill: Endpoint, decode: Endpoint, only: bool) -> list[Fix]:
    """Each server taking the other's setting of what decides the count: the variable
    that switches the sampling-mask buffers on (not when only the checksum differs) and
    the KV checksum flag. Copied only from a server whose value is known, to a server
    whose own value differs; where that value is not known (the decode, at run time),
    to the setting the counts show differs: the checksum when its buffer alone makes
    the difference, else the variable."""
    name = mask_env()
    flag = flag_for_field(_CHECKSUM)
    found: list[Fix] = []
    for src, dst in ((prefill, decode), (decode, prefill)):
        if not only and src.env is not None and (
                dst.env is None or src.env.get(name) != dst.env.get(name)):
            found.append(Fix(FixKind.FLAGS, f"give the {dst.role} server the {src.role}'s "
                             f"{name}", field="sampling_mask_env", need="sampling_mask_env",
                             edits=(env_copy(dst.role, name, src.env.get(name)),)))
        if flag is None or not src.has("kv_checksum"):
            continue
        on = bool(src.get("kv_checksum"))
        if (bool(dst.get("kv_checksum")) != on) if dst.has("kv_checksum") else only:
            found.append(Fix(FixKind.FLAGS, f"give the {dst.role} server the {src.role}'s KV "
                             "checksum setting", field="kv_checksum", need="kv_checksum",
                             edits=(Edit(dst.role, flag.option, remove=not on),)))
    return found
