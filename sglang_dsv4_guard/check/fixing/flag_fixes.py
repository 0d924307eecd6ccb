"""The fixes of ``check``'s findings, derived from the two servers' differing values.

Each fix edits one server's line to take the other's value (both directions, the
decode's first), spelled as the installed release's parser spells the flag
(:func:`~sglang_dsv4_guard.host.flags.flag_for_field`); a flag the release does not
have is never suggested, nor an edit whose line the release's resolution refuses or
resolves to another number than the edit set (``--page-size`` on DeepSeek-V4 from 0.5.22,
whose page size the release sets for the model).
A refused server's fixes come from re-running the resolution (:mod:`.refusal`).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import replace

from sglang_dsv4_guard.check.fixing.refusal import CODE as REFUSAL_CODE
from sglang_dsv4_guard.check.fixing.refusal import refusal_fixes
from sglang_dsv4_guard.check.offline.parse import CheckInputError, LaunchArgs, parse_launch
from sglang_dsv4_guard.check.server.derive import (
    DerivedServer,
    attention_layout,
    page_size_source,
    typed_page,
)
from sglang_dsv4_guard.check.server.edit import apply_edits, apply_env, lookup, typed_flags
from sglang_dsv4_guard.codes import (
    DSV4_KV_LAYOUT,
    ONE_SIDED_DRAFT,
    SERVED_MODEL,
    SPECULATIVE_SETTINGS,
    TRANSFER_BACKENDS,
)
from sglang_dsv4_guard.findings import Finding
from sglang_dsv4_guard.fixes import Edit, Fix, FixKind, flag_fix
from sglang_dsv4_guard.host.flags import flag_edit
from sglang_dsv4_guard.host.targets import FLASHMLA_ENV
from sglang_dsv4_guard.mori.checks import CODE as MORI_TP_CODE
from sglang_dsv4_guard.pd.attention_tp import attention_tp_fixes
from sglang_dsv4_guard.pd.first_contact import PAGE_CODE
from sglang_dsv4_guard.pd.nixl_payload import PREFILL_DRAFT_CODE
from sglang_dsv4_guard.state.checks import PAGED_CODE

__all__ = ["accepted_fix", "accepted_fixes", "copy_pairs", "derived_fixes", "kept_fixes"]


def _speculative_flags(src: DerivedServer, dst: DerivedServer) -> tuple[Edit, ...]:
    """``dst``'s speculative flags made ``src``'s: each typed one copied, others removed."""
    have = typed_flags(list(src.args.argv))
    had = typed_flags(list(dst.args.argv))
    edits = [Edit(dst.role, f.option, value) for field, (f, value) in have.items()
             if field.startswith("speculative_")]
    edits += [Edit(dst.role, f.option, remove=True) for field, (f, _) in had.items()
              if field.startswith("speculative_") and field not in have]
    return tuple(edits)


def copy_pairs(p: DerivedServer, d: DerivedServer) -> tuple[tuple[DerivedServer, DerivedServer], ...]:
    """(source, destination), the decode taking the prefill's first; a server whose own
    flags the release's resolution refused (:mod:`.refusal`) is never a source: its values are
    not copied to the other server."""
    return tuple((src, dst) for src, dst in ((p, d), (d, p)) if src.args.resolution_error
                 is None)


def accepted_fix(fix: Fix | None, sides: dict[str, DerivedServer]) -> Fix | None:
    """``fix`` when the release's resolution accepts every line it edits (each resolved
    once, as ``check`` resolves a line), else ``None``: a copied value the destination's
    resolution refuses is never offered."""
    if fix is None or fix.kind is not FixKind.FLAGS:
        return fix
    for role in dict.fromkeys(e.server for e in fix.edits):
        side = sides.get(role)
        if side is None or side.args.resolution_error is not None:
            continue  # a refused server's own line: the refusal's fixes are resolved there
        edits = [e for e in fix.edits if e.server == role]
        try:
            edited = parse_launch(role, apply_edits(shlex.join(side.args.argv), edits, role),
                                  apply_env(side.args.env, edits, role), side.args.gpu)
        except (CheckInputError, ValueError):
            return None
        if edited.resolution_error is not None or _replaced(edited, edits):
            return None
    return fix


def kept_fixes(fixes: Iterable[Fix | None], prefill: DerivedServer, decode: DerivedServer
               ) -> tuple[Fix, ...]:
    """The ``fixes`` :func:`accepted_fix` keeps for the pair."""
    sides = {"prefill": prefill, "decode": decode}
    return tuple(f for f in (accepted_fix(x, sides) for x in fixes) if f is not None)


def accepted_fixes(finding: Finding, prefill: DerivedServer, decode: DerivedServer, derive: bool = True
                   ) -> Finding:
    """``finding`` with only the fixes :func:`accepted_fix` keeps (none when ``derive`` is off)."""
    return replace(finding, fixes=kept_fixes(finding.fixes, prefill, decode) if derive else ())


def _replaced(edited: LaunchArgs, edits: list[Edit]) -> bool:
    """Whether the release's resolution of ``edited`` gives a field a number other than
    the one an edit set (DeepSeek-V4's page size from 0.5.22, for instance): such an edit
    does not do what it says."""
    for edit in edits:
        found = None if edit.env or edit.remove else lookup(edit.name)
        resolved = None if found is None else edited.get(found.field)
        if resolved is None or isinstance(resolved, bool) or edit.value is None:
            continue
        try:
            if int(str(resolved)) != int(edit.value):
                return True
        except ValueError:  # not a count: compared only where both are numbers
            continue
    return False


def _g020(p: DerivedServer, d: DerivedServer) -> list[Fix | None]:
    spec, plain = (p, d) if p.speculative_algorithm else (d, p)
    inputs = (f"{spec.role}: --speculative-algorithm {spec.speculative_algorithm} typed",
              f"{plain.role}: no --speculative-algorithm")
    removed = tuple(replace(e, remove=True, value=None) for e in _speculative_flags(spec, spec))
    copy = None if spec.args.resolution_error is not None else Fix(
        FixKind.FLAGS, f"give the {plain.role} server the {spec.role}'s speculative flags",
        "speculative_algorithm", _speculative_flags(spec, plain), inputs)
    return [copy,
            Fix(FixKind.FLAGS, f"drop speculative decoding on the {spec.role} server",
                "speculative_algorithm", removed, inputs) if removed else None]


def _g021(p: DerivedServer, d: DerivedServer) -> list[Fix | None]:
    fields = [name for name, a, b in (
        ("speculative_algorithm", p.speculative_algorithm, d.speculative_algorithm),
        ("speculative_num_draft_tokens", p.num_draft_tokens, d.num_draft_tokens)) if a != b]
    inputs = tuple(f"{s.role}: --speculative-algorithm {s.speculative_algorithm}, "
                   f"{s.num_draft_tokens} draft tokens (SGLang's resolution of its "
                   "speculative flags)" for s in (p, d))
    return [Fix(FixKind.FLAGS, f"give the {dst.role} server the {src.role}'s speculative "
                               "flags", ", ".join(fields), _speculative_flags(src, dst), inputs)
            for src, dst in copy_pairs(p, d) if _speculative_flags(src, dst)]


def _g022(p: DerivedServer, d: DerivedServer) -> list[Fix | None]:
    inputs = tuple(f"{s.role}: page size {s.page_size} from {page_size_source(s)}"
                   for s in (p, d))
    # never to a server whose typed page size its resolution replaced (the release sets it)
    return [flag_fix(f"launch the {dst.role} server with the {src.role}'s page size",
                     "page_size", [flag_edit(dst.role, "page_size", src.page_size)], *inputs)
            for src, dst in copy_pairs(p, d) if src.page_size is not None and (
                typed_page(dst) in (None, dst.page_size) or not dst.args.resolved)]


def _g023(p: DerivedServer, d: DerivedServer) -> list[Fix | None]:
    field = "disaggregation_transfer_backend"
    inputs = tuple(f"{s.role}: --disaggregation-transfer-backend {s.transfer_backend}"
                   for s in (p, d))
    return [flag_fix(f"launch the {dst.role} server with the {src.role}'s transfer backend",
                     field, [flag_edit(dst.role, field, src.args.get(field))], *inputs)
            for src, dst in copy_pairs(p, d)]


def _g024(p: DerivedServer, d: DerivedServer) -> list[Fix | None]:
    # the draft's path only where the finding compares it: both servers decode speculatively
    names = ("model_path",) + (("speculative_draft_model_path",) if p.speculative_algorithm
                               and d.speculative_algorithm else ())
    fields = [name for name in names if p.args.get(name) != d.args.get(name)]
    inputs = tuple(f"{s.role}: --model-path {s.args.get('model_path')} "
                   f"({s.model.architecture}, config.json)" for s in (p, d))
    if p.model.architecture != d.model.architecture:  # another model: the operator decides
        return [Fix(FixKind.ADVICE, f"the two servers serve different architectures "
                                    f"({p.model.architecture} and {d.model.architecture}): "
                                    "serve one checkpoint on both (check --fix does not apply "
                                    "this itself: which model to serve is the operator's "
                                    "choice)", ", ".join(fields), inputs=inputs)]
    return [flag_fix(f"serve the {src.role}'s checkpoint on the {dst.role} server",
                 ", ".join(fields), [flag_edit(dst.role, name, src.args.get(name))
                                     for name in fields
                                     if src.args.get(name) is not None
                                     or name in typed_flags(list(dst.args.argv))], *inputs)
            for src, dst in copy_pairs(p, d)]


def _g025(p: DerivedServer, d: DerivedServer) -> list[Fix | None]:
    inputs = tuple(f"{s.role} env: {FLASHMLA_ENV}="
                   f"{s.args.env.get(FLASHMLA_ENV, '(unset)')}" for s in (p, d))
    return [Fix(FixKind.FLAGS, f"give the {dst.role} server the {src.role}'s {FLASHMLA_ENV}",
                FLASHMLA_ENV, (Edit(dst.role, FLASHMLA_ENV, src.args.env.get(FLASHMLA_ENV),
                                    remove=FLASHMLA_ENV not in src.args.env, env=True),), inputs)
            for src, dst in copy_pairs(p, d)]


def _own_draft(finding: Finding, p: DerivedServer, d: DerivedServer) -> tuple[Fix, ...]:
    """The paged geometry (:data:`PAGED_CODE`) on a server whose
    --speculative-draft-model-path has another window than its target: serve the target's
    own MTP layers (drop that flag)."""
    side = p if finding.subject.startswith("prefill") else d
    if side.draft is None or side.draft.sliding_window == side.model.sliding_window \
            or not side.args.typed.get("speculative_draft_model_path"):
        return ()
    fix = flag_fix(f"serve the target's own MTP layers as the {side.role} server's draft",
               "sliding_window", [flag_edit(side.role, "speculative_draft_model_path", None)],
               f"{side.role}: target sliding_window {side.model.sliding_window} "
               f"({side.model.path}/config.json)",
               f"{side.role}: draft sliding_window {side.draft.sliding_window} "
               f"({side.draft.path}/config.json, --speculative-draft-model-path)")
    return (replace(fix, need="sliding_window"),) if fix is not None else ()


_DERIVERS: dict[str, Callable[[DerivedServer, DerivedServer], list[Fix | None]]] = {
             ONE_SIDED_DRAFT: _g020, SPECULATIVE_SETTINGS: _g021, PAGE_CODE: _g022,
             TRANSFER_BACKENDS: _g023, SERVED_MODEL: _g024, DSV4_KV_LAYOUT: _g025,
             # the attention-TP family's fixes have one home: pd/attention_tp.py
             MORI_TP_CODE: lambda p, d: list(attention_tp_fixes(attention_layout(p),
                                                                attention_layout(d))),
             # NIXL's registration refusing a prefill-only draft: a one-sided draft's fixes
             PREFILL_DRAFT_CODE: _g020}


def derived_fixes(finding: Finding, p: DerivedServer, d: DerivedServer) -> Finding:
    """``finding`` with the fixes derived from ``p`` and ``d`` (unchanged for a code whose
    fixes are not derived here)."""
    if finding.code == REFUSAL_CODE:
        side, other = (p, d) if finding.subject.startswith("prefill") else (d, p)
        return replace(finding, fixes=refusal_fixes(
            side.role, side.args.argv, side.args.env, str(side.args.resolution_error),
            other.args.argv, side.args.gpu))
    if finding.code == PAGED_CODE:  # SGLang's own check on the pools; fixes of both lines
        return replace(finding, fixes=_own_draft(finding, p, d) + finding.fixes)
    derive = _DERIVERS.get(finding.code)
    if derive is None:
        return finding
    fixes = kept_fixes(derive(p, d), p, d)
    refused = [s.role for s in (p, d) if s.args.resolution_error is not None]
    if not fixes and refused:
        fixes = (Fix(FixKind.ADVICE, f"fix the {' and '.join(refused)} server's flags first "
                                     f"({REFUSAL_CODE}): a value SGLang's resolution refused "
                                     "is never copied to the other server, and this finding's fixes "
                                     "are derived from accepted flags"),)
    if not fixes:
        fixes = (Fix(FixKind.NO_FLAG_FIX, "no flag change fixes this: the installed "
                                          "release's parser has no flag for the value that "
                                          "differs"),)
    return replace(finding, fixes=fixes)
