"""``check``'s run: both servers parsed with the release's own parser (:mod:`.parse`) and
derived with its own ``ModelConfig`` and attention-TP function (:mod:`.derive`), then:

- DeepSeek-V4 with a draft: SGLang's real ``setup_state_kv_args`` on miniature real
  pools of each server, under the guard's state wrapper (:mod:`.pools`);
- MORI: the guard's ``check_send`` hooks (the built-in TP check and any plug-in's) on the
  transfer the two servers imply, as when the decode peer registers;
- the prefill/decode contract rows and the pair conditions (:mod:`.contract`);
- what cannot be known from flags, said in ``unknowns``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sglang_dsv4_guard.assembly import build_plugins
from sglang_dsv4_guard.boundary import is_builtin
from sglang_dsv4_guard.check.fixing.cost import priced_finding
from sglang_dsv4_guard.check.fixing.flag_fixes import derived_fixes
from sglang_dsv4_guard.check.fixing.refusal import refusal_finding
from sglang_dsv4_guard.check.offline.chatter import Output, capturing, recording, section
from sglang_dsv4_guard.check.offline.parse import (
    CheckInputError,
    parse_launch,
    without_shell_settings,
)
from sglang_dsv4_guard.check.rows.contract import contract_findings
from sglang_dsv4_guard.check.server.derive import DerivedServer, derive_server
from sglang_dsv4_guard.check.server.edit import typed_flags
from sglang_dsv4_guard.check.server.gpu_models import named_gpus
from sglang_dsv4_guard.check.server.pools import PoolRun, draft_ratio, run_state_check
from sglang_dsv4_guard.check.server.said import Said, said_about
from sglang_dsv4_guard.codes import ONE_SIDED_DRAFT
from sglang_dsv4_guard.findings import Finding, Observation, Report, Severity
from sglang_dsv4_guard.host.judgement import judge_imported
from sglang_dsv4_guard.host.releases import SUPPORTED_MAX, SUPPORTED_MIN
from sglang_dsv4_guard.mori.snapshot import SendContext, SendSnapshot
from sglang_dsv4_guard.pd.nixl_payload import PREFILL_DRAFT_CODE
from sglang_dsv4_guard.state.checks import MAPPING_CODE, MODES_CODE, RATIOS_CODE, RING_CODE

if TYPE_CHECKING:
    from sglang_dsv4_guard.host.releases import HostProfile

__all__ = ["CheckResult", "run_check"]

@dataclass(frozen=True)
class CheckResult:
    """Both sides as derived, every finding, and what the flags cannot tell."""

    release: str
    prefill: DerivedServer
    decode: DerivedServer
    report: Report
    pool_runs: tuple[PoolRun, ...]
    unknowns: tuple[str, ...]
    # What SGLang said during this check (captured, not printed), per server.
    sglang_output: Output = field(default_factory=Output)

    @property
    def exit_status(self) -> int:
        """0 without error findings, 1 with."""
        return 1 if self.report.by_severity(Severity.ERROR) else 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON document ``check --format json`` prints."""
        return {
            "sglang": self.release,
            "exit_status": self.exit_status,
            "findings": [f.to_dict() for f in self.report.findings],
            "derived": {"prefill": self.prefill.to_dict(), "decode": self.decode.to_dict()},
            "state_check_runs": [
                {"server": r.role, "target_compress_ratios": list(r.target_ratios),
                 "draft_compress_ratios": list(r.draft_ratios),
                 "online_mtp_max_draft_tokens": r.online_mtp_max_draft_tokens,
                 "sglang_error": r.host_error, "pool_build_error": r.build_error}
                for r in self.pool_runs],
            "unknowns": list(self.unknowns),
            "sglang_output": self.sglang_output.to_dict(),
            "sglang_said": {s.role: [said.to_dict() for said in self.said(s)]
                            for s in (self.prefill, self.decode)},
        }

    def said(self, side: DerivedServer) -> tuple[Said, ...]:
        """The values SGLang chose for ``side`` with its own line about each."""
        return said_about(side, self.sglang_output.lines(side.role))


def _mori(prefill: DerivedServer, decode: DerivedServer, profile: HostProfile) -> list[Finding]:
    """The guard's send checks on the transfer the two servers imply (place ``check``)."""
    a = prefill.args
    snap = SendSnapshot(
        state_type="swa" if prefill.swa_state else "none",
        is_mla_backend=prefill.model.uses_mla_pool, attn_tp_size=prefill.attn_tp_size,
        decode_tp_size=decode.attn_tp_size,
        state_types=("swa",) if prefill.swa_state else (), tp_size=a.get("tp_size"),
        dp_size=a.typed.get("dp_size"), enable_dp_attention=a.typed.get("enable_dp_attention"),
        attn_cp_size=a.get("attn_cp_size"),
        pp_size=a.get("pp_size"), engine_key="planned decode server",
        decode_tp=decode.args.get("tp_size"), decode_dp_size=decode.args.typed.get("dp_size"),
        decode_enable_dp_attention=decode.args.typed.get("enable_dp_attention"),
        typed=frozenset(typed_flags(list(a.argv))))
    return build_plugins().collect("sglang_dsv4_guard_check_send", {
        "transfer": snap, "context": SendContext(profile, "on", "check")})


def _unknowns(prefill: DerivedServer, decode: DerivedServer, runs: list[PoolRun]) -> list[str]:
    notes = []
    if any(s.model.is_dsv4 and s.draft is not None for s in (prefill, decode)):
        notes.append(f"{MAPPING_CODE}: whether each server's draft pool is handed the target's "
                     "SWA index mapping object is decided when the draft worker is built, "
                     "not by flags; the miniature pools share one tensor, as a correct "
                     "deployment does")
        _, source = draft_ratio()
        notes.append(f"{RATIOS_CODE}: the draft pool's compression ratios are the release's, not "
                     f"the draft config's: every draft layer gets {source}; a modified "
                     "draft runner that builds its pool otherwise is not visible in flags")
    for side in (prefill, decode):
        if side.unified_kv and side.draft is not None:
            notes.append(f"{RING_CODE} ({side.role}): the unified-KV pool (ROCm) cannot be built "
                         "on this machine; its ring geometry is not predicted (target window "
                         f"{side.model.sliding_window}, draft window "
                         f"{side.draft.sliding_window})")
    for side in (prefill, decode):
        if side.args.env.get("SGLANG_HACK_FLASHMLA_BACKEND") == "unified_kv_triton" \
                and not side.unified_kv and side.model.is_dsv4:
            notes.append(f"{side.role}: SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton selects "
                         "the unified-KV pool on ROCm only; with the "
                         f"{side.transfer_backend} transfer backend this check cannot tell "
                         "whether the server runs on ROCm, so it built paged pools: if it "
                         "does, the unified-KV layout and its ring geometry are not predicted")
    for run in runs:
        if run.build_error:
            notes.append(f"{run.role}: SGLang's DeepSeekV4TokenToKVPool refused the values the "
                         f"flags imply, so its state check was not run: {run.build_error}")
    for side in (prefill, decode):
        if side.args.machine_refusal is not None:
            notes.append(f"{side.role}: SGLang's resolution of these flags failed on this "
                         f"machine, not on the server's ({side.args.machine_refusal}); the "
                         "flags are used as parsed, without SGLang's model defaults and "
                         "validations")
        notes.extend(f"{side.role}: {note}" for note in side.notes)
    notes.append("the model paths are compared as typed; whether they hold the same "
                 "checkpoint on their hosts is not known here")
    notes += _gpu_lines(prefill, decode)
    if prefill.unified_kv or decode.unified_kv:
        notes.append(f"{MODES_CODE} (target and draft pools in different unified-KV modes) cannot "
                     "come from the environment: both pools of one server read "
                     "SGLANG_HACK_FLASHMLA_BACKEND once")
    return notes


def _gpu_lines(prefill: DerivedServer, decode: DerivedServer) -> list[str]:
    """What SGLang's resolution knew of each server's GPU: this machine's answers, or the
    GPU the server was named to run on (an AMD one is not answered: ROCm is not modelled)."""
    sides = (prefill, decode)
    devices = " and ".join(sorted({s.args.resolved_device for s in sides}))
    notes = []
    for side in sides:
        named = side.gpu
        if named is not None and named.device is None:
            notes.append(
                f"{side.role}: {named.model.name} ({named.source}) is an AMD GPU "
                f"({named.model.arch}, ROCm): SGLang takes its ROCm branches by "
                "torch.version.hip, read when its modules are imported, which this check "
                f"cannot answer; the {side.role} server was resolved as this machine "
                "answers, so what SGLang decides on ROCm alone (its attention backends and "
                "their page sizes, the DeepSeek-V4 KV layout, the unified-KV pool) is not "
                "settled, and the findings judged per GPU model name NVIDIA GPUs; its flags, "
                "model, attention TP and the transfer and first-contact rows on values not "
                "chosen by the GPU are checked")
    answered = [f"{s.args.gpu.name} for the {s.role}" for s in sides if s.args.gpu is not None]
    if not answered:
        return [
            *notes, "both servers are assumed to run the SGLang release installed here; "
            f"SGLang's resolution ran as --device {devices} (the line's --device, else "
            "cuda), without that device present: what SGLang reads from the GPU itself (its "
            "memory, its compute capability) is not known here"]
    others = [s.role for s in sides if s.args.gpu is None]
    rest = f", and as this machine answers for the {others[0]}" if others else ""
    return [
        *notes, "both servers are assumed to run the SGLang release installed here; SGLang's "
        f"resolution ran as --device {devices} with its GPU probes (compute capability, "
        f"SM100/SM90 and the like) answering as {' and '.join(answered)} (the GPUs named)"
        f"{rest}, without a GPU present: what SGLang reads from the GPU itself beyond its "
        "model (its memory, its driver) is not known here"]


def _refused_lines(refused: tuple[str, ...]) -> list[str]:
    if not refused:
        return []
    shown = "; ".join(refused[:8]) + (f"; ... ({len(refused)} in all)" if len(refused) > 8
                                      else "")
    return [f"this check refused what SGLang tried while it ran ({shown}): check makes no "
            "network call and writes nothing; the servers will do these themselves"]


def _shell_lines(names: list[str]) -> list[str]:
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return [f"this shell's {shown} applies to neither server: check reads each server's "
            "environment from --prefill-env / --decode-env only"] if names else []


def run_check(prefill_args: str, decode_args: str,
              prefill_env: Mapping[str, str] | None = None,
              decode_env: Mapping[str, str] | None = None,
              refusals: Callable[[], tuple[str, ...]] = tuple,
              derive: bool = True, gpus: Mapping[str, str | None] | None = None,
              gpu_sources: Mapping[str, str] | None = None) -> CheckResult:
    """Predict what the two servers will do. Raises :class:`CheckInputError` on bad input.

    ``gpus`` names the GPU model each server runs on (keys ``prefill`` and ``decode``,
    :func:`~.server.gpu_models.gpu_model` names; ``None`` or absent: not known), and
    ``gpu_sources`` where each name came from (``--gpu``): a named NVIDIA GPU's server is
    resolved with SGLang's device probes answering as that GPU, and what is judged per
    GPU model is judged on it alone.
    ``refusals`` gives what the child's walls refused (:mod:`.sandbox`), read at the end.
    ``derive=False`` leaves the findings' fixes underived (``check --fix``'s re-runs read
    only which findings remain). What SGLang says meanwhile (its warnings, log records
    and prints) is captured, not printed (:mod:`.chatter`): ``sglang_output``."""
    named = named_gpus(gpus, gpu_sources)
    with without_shell_settings() as shell, capturing(), recording() as said:
        host = judge_imported()  # by the imported code, as install() judges it, not the label
        if host.behaves_as is None:
            raise CheckInputError("sglang", f"the imported SGLang ({host.version or 'absent'}) "
                                            f"has checks this guard does not know ({host.message}); "
                                            f"check supports {SUPPORTED_MIN} to {SUPPORTED_MAX} "
                                            "and releases with the same checks")
        profile = host.profile()
        version = host.name
        sides = {}
        for role, line, env in (("prefill", prefill_args, prefill_env),
                                ("decode", decode_args, decode_env)):
            gpu = named[role]
            with section(role):
                args = parse_launch(role, line, env or {}, None if gpu is None else gpu.device)
            if gpu is not None and args.resolved_device != "cuda":  # ROCm's is cuda too
                raise CheckInputError(gpu.source, f"{gpu.model.name} is a GPU of --device "
                                                  f"cuda servers, and the {role} line has "
                                                  f"--device {args.resolved_device}")
            with section(role):
                sides[role] = derive_server(args, gpu)
        prefill, decode = sides["prefill"], sides["decode"]
        findings: list[Finding] = [refusal_finding(s.args, o.args) for s, o in (
            (prefill, decode), (decode, prefill)) if s.args.resolution_error is not None]
        runs = []
        for side in (prefill, decode):
            with section(side.role):
                run = run_state_check(side)
            if run:
                runs.append(run)
                findings.extend(run.findings)
        if prefill.transfer_backend == decode.transfer_backend == "mori":
            findings.extend(_mori(prefill, decode, profile))
        contract, contract_unknowns = contract_findings(prefill, decode, version, derive, profile)
        findings.extend(contract)
        # the built-in rules apply to built-in findings only: a plug-in's finding under a
        # built-in code keeps its own fixes and removes nothing
        if any(f.code == PREFILL_DRAFT_CODE and is_builtin(f.origin) for f in contract):
            findings = [f for f in findings  # NIXL's registration refuses it: an error
                        if not (f.code == ONE_SIDED_DRAFT and is_builtin(f.origin))]
        if derive:
            findings = [derived_fixes(f, prefill, decode) if is_builtin(f.origin) else f
                        for f in findings]
            lines = {"prefill": prefill_args, "decode": decode_args}
            envs = {"prefill": prefill_env or {}, "decode": decode_env or {}}
            findings = [priced_finding(f, lines, envs) for f in findings]
        report = Report.of(findings, {"function": "sglang-dsv4-guard check", "sglang": version})
        result = CheckResult(version, prefill, decode, report, tuple(runs),
                             tuple(_unknowns(prefill, decode, runs) + contract_unknowns
                                   + _refused_lines(refusals()) + _shell_lines(shell)))
    return _quoting(replace(result, sglang_output=said.output()))


def _quoting(result: CheckResult) -> CheckResult:
    """Each finding's value that SGLang's resolution chose for a server (its field and
    value, :mod:`.said`) has SGLang's own line about it in its source (``from:``)."""
    lines = {(said.field, s.role, repr(said.value)): said.line
             for s in (result.prefill, result.decode) for said in result.said(s)}
    if not lines:
        return result

    def quoted(o: Observation) -> Observation:
        line = lines.get((o.name, o.role, repr(o.value)))
        return o if line is None else replace(o, source=f'{o.source}; SGLang said "{line}"')

    findings = tuple(replace(f, observations=tuple(map(quoted, f.observations)))
                     for f in result.report.findings)
    return replace(result, report=replace(result.report, findings=findings))
