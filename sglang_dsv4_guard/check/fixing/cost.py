"""What a flag fix costs the operator (:class:`~sglang_dsv4_guard.fixes.Cost`), read
against the two launch lines as typed, and the flags a removal takes with it.

A feature is a switch (a flag that takes no value), ``--speculative-algorithm`` and
attention DP (``--attn-dp-size`` above 1, the release's spelling of the deprecated
``--enable-dp-attention``): setting one where the line has none turns it on, removing a
typed one turns it off (removing ``--enable-dp-attention`` while the same fix sets
``--attn-dp-size`` keeps DP attention, and is no change). A server's GPU count is its
``--tp-size`` x ``--pp-size``, times its ``--dp-size`` replicas where DP attention is off
(SGLang's data-parallel controller launches that many copies). The checkpoint is
``--model-path`` and ``--speculative-draft-model-path``. Any other typed value changed or
removed is a value change, and so is any variable set, changed or unset (a variable is a
mode the server reads, not a default); a flag set where the line has none changes nothing
typed.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import replace

from sglang_dsv4_guard.check.server.edit import apply_edits, apply_env, lookup, typed_flags
from sglang_dsv4_guard.findings import Finding, Severity
from sglang_dsv4_guard.fixes import Cost, Edit, Fix, FixKind
from sglang_dsv4_guard.host.flags import Flag

__all__ = ["CHECKPOINT_FIELDS", "gpu_count", "price", "priced", "priced_finding",
           "with_dependents"]

CHECKPOINT_FIELDS = ("model_path", "speculative_draft_model_path")
# Flags that mean nothing without another: removing the key removes them too.
_DEPENDS_ON = {"speculative_algorithm": "speculative_"}
_RESPELLED = {"enable_dp_attention": "attn_dp_size"}

Typed = Mapping[str, tuple[Flag, "str | None"]]


def _int(typed: Typed, field: str) -> int:
    try:
        return int(str(typed.get(field, (None, "1"))[1] or "1"))
    except ValueError:
        return 1


def gpu_count(typed: Typed) -> int:
    """The GPUs a server launched with ``typed`` flags takes (see the module docstring)."""
    replicas = 1 if "enable_dp_attention" in typed else _int(typed, "dp_size")
    return _int(typed, "tp_size") * _int(typed, "pp_size") * replicas


def _attention_dp(typed: Typed) -> bool:
    return "enable_dp_attention" in typed or _int(typed, "attn_dp_size") > 1


def _feature(found: Flag) -> bool:
    return not found.takes_value or found.field == "speculative_algorithm"


def price(edits: Iterable[Edit], lines: Mapping[str, str],
          envs: Mapping[str, Mapping[str, str]] | None = None) -> Cost:
    """What ``edits`` change against ``lines`` (role -> launch line) and ``envs`` (role ->
    environment), as :class:`Cost`."""
    edits = tuple(edits)
    off: list[str] = []
    on: list[str] = []
    values: list[str] = []
    gpus: list[str] = []
    checkpoints: list[str] = []
    for role in dict.fromkeys(e.server for e in edits):
        line = lines.get(role, "")
        before = typed_flags(shlex.split(line))
        after = typed_flags(shlex.split(apply_edits(line, edits, role)))
        mine = [e for e in edits if e.server == role]
        for edit in mine:
            if edit.env:  # a variable is a mode the server reads: set, changed or unset
                given = (envs or {}).get(role, {})
                if apply_env(given, [edit], role).get(edit.name) != given.get(edit.name):
                    values.append(f"{role} env: {edit.name}")
                continue
            found = lookup(edit.name)
            if found is None:
                continue
            typed = found.field in before
            if found.field in CHECKPOINT_FIELDS:
                # a draft dropped with speculative decoding is that feature turned off
                if before.get(found.field, (None, None))[1] != after.get(
                        found.field, (None, None))[1] and not (
                        found.field == "speculative_draft_model_path"
                        and "speculative_algorithm" not in after):
                    checkpoints.append(f"{role}: {found.option}")
            elif _feature(found) and typed == edit.remove:  # turned off, or on
                if edit.remove and (newer := _RESPELLED.get(found.field)) and newer in after:
                    continue  # the release's newer spelling keeps the feature
                (off if edit.remove else on).append(f"{role}: {found.option}")
            elif found.field == "attn_dp_size" and _attention_dp(before) != _attention_dp(after):
                (on if _attention_dp(after) else off).append(f"{role}: attention DP")
            elif typed and before[found.field][1] != after.get(found.field, (None, None))[1]:
                values.append(f"{role}: {found.option}")
        was, now = gpu_count(before), gpu_count(after)
        if was != now:
            gpus.append(f"{role}: {was} -> {now}")
    return Cost(tuple(dict.fromkeys(e.server for e in edits)), tuple(off), tuple(on),
                tuple(values), tuple(gpus), tuple(checkpoints), len(edits))


def priced(fix: Fix, lines: Mapping[str, str],
           envs: Mapping[str, Mapping[str, str]] | None = None) -> Fix:
    """``fix`` with its :class:`Cost` against ``lines`` (a ``FLAGS`` fix with edits only;
    others unchanged)."""
    if fix.kind is not FixKind.FLAGS or not fix.edits:
        return fix
    return replace(fix, cost=price(fix.edits, lines, envs))


def priced_finding(finding: Finding, lines: Mapping[str, str],
                   envs: Mapping[str, Mapping[str, str]] | None = None) -> Finding:
    """``finding`` with each flag fix priced (:func:`priced`); a fix of a finding that is
    not an error that would change a checkpoint becomes advice without edits: a warning
    never gets a checkpoint change."""
    fixes = []
    for fix in (priced(f, lines, envs) for f in finding.fixes):
        if fix.cost is not None and fix.cost.tier == 5 \
                and finding.severity is not Severity.ERROR:
            fix = replace(fix, kind=FixKind.ADVICE, edits=(), cost=None, proven=None,
                          text=f"{fix.text} ({', '.join(e.describe() for e in fix.edits)}; not "
                               "an edit check --fix applies: for a warning, which checkpoint "
                               "to serve is the operator's choice)")
        fixes.append(fix)
    return replace(finding, fixes=tuple(fixes))


def with_dependents(edits: Iterable[Edit], lines: Mapping[str, str]) -> tuple[Edit, ...]:
    """``edits`` plus the removal of every typed flag that means nothing once an edit
    removes the flag it depends on (``--speculative-num-steps`` and the rest of the
    ``--speculative-*`` family go with ``--speculative-algorithm``)."""
    out = list(edits)
    for edit in list(out):
        found = None if edit.env or not edit.remove else lookup(edit.name)
        prefix = None if found is None else _DEPENDS_ON.get(found.field)
        if found is None or prefix is None:
            continue
        typed = typed_flags(shlex.split(lines.get(edit.server, "")))
        for field, (flag, _) in typed.items():
            if field.startswith(prefix) and field != found.field and not any(
                    e.server == edit.server and not e.env and (x := lookup(e.name)) is not None
                    and x.field == field for e in out):
                out.append(Edit(edit.server, flag.option, remove=True))
    return tuple(out)
