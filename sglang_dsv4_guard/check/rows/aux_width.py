"""``check``'s row for metadata buffers whose rows have different widths on the two
servers (DSV4G048): ``--sampling-mask-max-tokens`` differs while
``SGLANG_ENABLE_DISAGG_SAMPLING_MASK`` is on for both (0.5.20+), or
``SGLANG_DISAGGREGATION_SAMPLING_MASK_MAX_TOKENS`` is positive on both with different values
(0.5.16 - 0.5.19, whose ``MetadataBuffers`` reads that variable when the scheduler passes it
no width: it both switches the buffers on and sizes them).

The buffer counts agree (:mod:`sglang_dsv4_guard.pd.aux_count` judges the counts), but two buffers
(``output_token_sampling_mask_idx``, ``output_token_sampling_logprobs``) are as wide as the
flag. Each server's buffers are SGLang's own (:func:`_widths`); the prefill's backend's
``send_aux`` is run on miniature buffers of those widths (:func:`..pd.aux_send.aux_rows`),
and where the bytes land is what the finding says (:func:`_where`). SGLang itself compares
nothing here (its ``--sampling-mask-max-tokens`` help asks for the same value on both).
"""

from __future__ import annotations

from sglang_dsv4_guard.check.fixing.flag_fixes import copy_pairs, kept_fixes
from sglang_dsv4_guard.check.offline.parse import offline_env
from sglang_dsv4_guard.check.rows.contract_run import ContractRun
from sglang_dsv4_guard.check.server.derive import DerivedServer
from sglang_dsv4_guard.check.server.endpoint_values import CONTRIBUTORS, field_source, raw_field
from sglang_dsv4_guard.codes import CODES, docs_url
from sglang_dsv4_guard.findings import Finding, Phase, Severity, When
from sglang_dsv4_guard.fixes import Fix, FixKind, flag_fix
from sglang_dsv4_guard.host.envs import env_copy, env_reading
from sglang_dsv4_guard.host.flags import flag_edit, flag_for_field
from sglang_dsv4_guard.host.judgement import imported_package_dir
from sglang_dsv4_guard.host.pd_digests import NotJudged
from sglang_dsv4_guard.pd.aux_send import AUX_BACKENDS, RowLanding, aux_rows
from sglang_dsv4_guard.pd.buffers import MASK_WIDTH_ENV, aux_row_widths
from sglang_dsv4_guard.pd.endpoint import Value
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["aux_width_row"]

CODE = "DSV4G048"
_FIELD = "sampling_mask_max_tokens"


def _option() -> str:
    """What sets the width: the flag, or (a release without it) the variable."""
    flag = flag_for_field(_FIELD)
    return flag.option if flag is not None else MASK_WIDTH_ENV


def _widths(side: DerivedServer, values: dict[str, Value]) -> dict[str, Value]:
    """The server's metadata buffers' names and row widths, by SGLang's own class (none on
    a release whose class needs a width the server lacks, or a width SGLang refuses: the
    counts' row says that server would not start). On a release without the flag the class
    is built with no width in the server's environment, as its scheduler builds it."""
    width = raw_field(side, _FIELD)
    if width is not None and int(width) <= 0:
        return {}
    checksum = bool(raw_field(side, "disaggregation_enable_kv_checksum"))
    if width is None:
        typed = side.args.env.get(MASK_WIDTH_ENV)
        width = env_reading(MASK_WIDTH_ENV, typed)[0]
        source = (f"{MASK_WIDTH_ENV}={typed} in the server's environment" if typed is not None
                  else f"{MASK_WIDTH_ENV} not set (the release's default)")
    else:
        source = field_source(side, _FIELD, _option())
    try:
        with offline_env(side.args.env):
            rows = aux_row_widths(checksum, None if flag_for_field(_FIELD) is None
                                  else int(width))
    except TypeError:  # the class and the server disagree on who gives the width
        return {}
    except ValueError as exc:  # wider than this check builds: the row says so if it differs
        return {_FIELD: Value(int(width), source), "aux_row_widths_unbuilt": Value(str(exc), source)}
    return {"aux_row_widths": Value(tuple(rows), (
        "SGLang's MetadataBuffers(...).get_buf_infos() item_lens, built on CPU with this "
        f"server's {source} and its environment")),
        _FIELD: Value(int(width), source)}


CONTRIBUTORS.append(_widths)


def _where(landing: RowLanding, names: list[str], local: list[int],
           remote: list[int]) -> list[str]:
    """What the miniature saw, in words."""
    bufs = ", ".join(f"{names[b]} ({local[b]} bytes a row on the prefill, {remote[b]} on "
                     "the decode)" for b in landing.buffers)
    said = [f"the rows of {bufs} differ in width; SGLang's {landing.function} ran once per "
            f"request slot of a {landing.rows}-slot miniature of both servers' buffers"]
    if landing.raised:
        return [*said, f"it raised {landing.raised}"]
    stride = ("the decode's receiving thread (AuxDataCodec.deserialize_data_to_buffer) "
              "writes each row the prefill sends, at the prefill's length, at the decode's "
              "stride" if landing.by_index else
              "it writes each request's row at the prefill's stride and length into the "
              "decode's buffer, which the decode reads at its own stride")
    seen = []
    if landing.misplaced:
        seen.append(f"the decode reads other bytes than the prefill's row for request slots "
                    f"{list(landing.misplaced)} (only slot 0 lines up)")
    if landing.spilled:
        seen.append(f"a request in slots {list(landing.spilled)} overwrites part of another "
                    "request's row")
    if landing.past_end:
        seen.append(f"a request in slots {list(landing.past_end)} reaches past the end of "
                    "the decode's buffer" + (
                        " (into memory the decode's buffer does not own)" if landing.by_index
                        else " (the engine is handed a destination outside the decode's "
                        "registered buffer; what the engine does with it is not run here)"))
    if not seen:
        return [*said, stride + ": every row the decode reads is the prefill's (a sampling "
                "mask is at most the prefill's width), so transfers stay correct (a warning, "
                "not an error)"]
    return [*said, stride + ": " + "; ".join(seen)]


def _when(landing: RowLanding, backend: str) -> When:
    if landing.raised:
        return When(Phase.PER_REQUEST, f"per request, in the {backend} transfer of the "
                    "metadata buffers: SGLang raises")
    if not (landing.misplaced or landing.spilled or landing.past_end):
        return when_of(Phase.SILENT, backend, aligned=True)
    return When(Phase.SILENT, "never reported (no error, no log line): per request, the "
                "sampling mask a request returns (return_sampling_mask) is read from the "
                "wrong bytes on the decode, and another request's row or memory past the "
                "decode's buffer is overwritten")


def _fixes(run: ContractRun) -> tuple[Fix, ...]:
    """One server takes the other's width (only a server whose resolution accepted its
    flags is a source; the edited line must resolve)."""
    found: list[Fix | None] = []
    for src, dst in copy_pairs(run.prefill_side, run.decode_side):
        if flag_for_field(_FIELD) is None:  # the variable sets it: an environment edit
            typed = src.args.env.get(MASK_WIDTH_ENV)
            found.append(Fix(FixKind.FLAGS, f"give the {dst.role} server the {src.role}'s "
                             f"{MASK_WIDTH_ENV}", field="sampling_mask_env",
                             edits=(env_copy(dst.role, MASK_WIDTH_ENV, typed),)))
            continue
        width = raw_field(src, _FIELD)
        found.append(flag_fix(f"give the {dst.role} server the {src.role}'s {_option()} {width}",
                          _FIELD, [flag_edit(dst.role, _FIELD, width)]))
    return kept_fixes(found, run.prefill_side, run.decode_side)


def aux_width_row(run: ContractRun) -> tuple[list[Finding], list[str]]:
    """DSV4G048 for the pair: as many metadata buffers on both servers, some of different
    row widths, with what the prefill's backend's ``send_aux`` then does to them."""
    p, d = run.prefill, run.decode
    unbuilt = [str(e.get("aux_row_widths_unbuilt")) for e in (p, d)
               if e.has("aux_row_widths_unbuilt")]
    if unbuilt and p.has(_FIELD) and d.has(_FIELD) and p.get(_FIELD) != d.get(_FIELD):
        return [], [f"{CODE}: not judged: {unbuilt[0]} ({_option()} {p.get(_FIELD)} vs "
                    f"{d.get(_FIELD)})"]
    if not (p.has("aux_row_widths") and d.has("aux_row_widths")):
        return [], []
    local = [n for _, n in p.get("aux_row_widths")]
    remote = [n for _, n in d.get("aux_row_widths")]
    if len(local) != len(remote) or local == remote:
        return [], []  # equal widths, or different counts (pd/aux_count.py's)
    backend = str(p.get("transfer_backend"))
    if backend != d.get("transfer_backend"):
        return [], []  # two backends cannot connect (asymmetry.BACKEND_CODE)
    package = imported_package_dir()
    if backend not in AUX_BACKENDS or package is None:
        return [], [f"{CODE}: not judged: the metadata buffers' row widths differ "
                    f"({_option()} {p.get(_FIELD)} vs {d.get(_FIELD)}) and the {backend} "
                    "transfer's send_aux is not one this guard runs" if package is not None
                    else f"{CODE}: not judged: the imported SGLang's source was not found"]
    try:
        with offline_env(run.prefill_side.args.env):
            landing = aux_rows(backend, package, local, remote)
    except NotJudged as exc:
        return [], [f"{CODE} ({backend}): not judged: {exc}"]
    broken = bool(landing.raised or landing.misplaced or landing.spilled or landing.past_end)
    names = [n for n, _ in p.get("aux_row_widths")]
    return [Finding(
        code=CODE, severity=Severity.ERROR if broken else Severity.WARNING,
        summary=CODES[CODE].title,
        subject=f"prefill -> decode {backend} transfer of the metadata buffers",
        observations=tuple(e.observation(n) for n in (
            (_FIELD, "sampling_mask_env") if flag_for_field(_FIELD) is not None
            else ("sampling_mask_env",)) for e in (p, d)),
        details=tuple(_where(landing, names, local, remote)),
        fixes=_fixes(run) if run.derive else (), docs=docs_url(CODE),
        host_message=landing.raised, when=_when(landing, backend))], []
