"""What a flag fix costs the operator (:class:`~sglang_dsv4_guard.fixes.Cost`), read
against the two launch lines as typed, and the flags a removal takes with it.

A server's features (:func:`features`) are its switches, speculative decoding, attention
DP (``--attn-dp-size`` above 1, or the deprecated ``--dp-size N --enable-dp-attention``)
and the context-parallel sizes above 1 (``--dcp-size``, ``--attn-cp-size``); a fix turns
on what the edited line has and the typed one had not, and off the reverse (a
``--disable-*`` switch removed turns its feature on). A server's GPU count is its
``--tp-size`` x ``--pp-size``, times its ``--dp-size`` replicas unless that is the
deprecated attention-DP spelling (SGLang's data-parallel controller launches that many
copies). The checkpoint is the model and draft paths and revisions (a draft dropped with
speculative decoding is not counted twice). Any other typed value changed, or removed, is
a value change, and so is any variable set, changed or unset (a variable is a mode the
server reads, not a default); a flag set where the line has none changes nothing typed.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import replace

from sglang_dsv4_guard.check.server.edit import apply_edits, apply_env, lookup, typed_flags
from sglang_dsv4_guard.findings import Finding, Severity
from sglang_dsv4_guard.fixes import Cost, Edit, Fix, FixKind
from sglang_dsv4_guard.host.flags import Flag

__all__ = ["CHECKPOINT_FIELDS", "features", "gpu_count", "price", "priced",
           "priced_finding", "with_dependents"]

CHECKPOINT_FIELDS = ("model_path", "speculative_draft_model_path",
                     "speculative_draft_model_revision", "revision")
# Flags that mean nothing without another: removing the key removes them too.
_DEPENDS_ON = {"speculative_algorithm": "speculative_"}
# Sizes above 1 that are a parallel feature the operator turned on.
_SIZED = {"dcp_size": "decode context parallel (--dcp-size)",
          "attn_cp_size": "attention context parallel (--attn-cp-size)"}

Typed = Mapping[str, tuple[Flag, "str | None"]]


def _int(typed: Typed, field: str) -> int:
    try:
        return int(str(typed.get(field, (None, "1"))[1] or "1"))
    except ValueError:
        return 1


def _deprecated_dp(typed: Typed) -> bool:
    """``--dp-size N --enable-dp-attention`` without ``--attn-dp-size``: attention DP N
    (0.5.22+ rewrite it so; before, the only spelling), no replicas."""
    return "enable_dp_attention" in typed and "attn_dp_size" not in typed


def gpu_count(typed: Typed) -> int:
    """The GPUs a server launched with ``typed`` flags takes (see the module docstring)."""
    replicas = 1 if _deprecated_dp(typed) else _int(typed, "dp_size")
    return _int(typed, "tp_size") * _int(typed, "pp_size") * replicas


def features(typed: Typed) -> set[str]:
    """The features ``typed`` turns on, by name: every switch (a ``--disable-*`` switch is
    its feature turned off, named as the switch), speculative decoding, attention DP, and
    the context-parallel sizes above 1."""
    found = {flag.option for flag, _ in typed.values() if not flag.takes_value
             and flag.field != "enable_dp_attention"}
    if "speculative_algorithm" in typed:
        found.add("speculative decoding")
    if (_deprecated_dp(typed) and _int(typed, "dp_size") > 1) or _int(typed, "attn_dp_size") > 1:
        found.add("attention DP")
    found.update(label for field, label in _SIZED.items()
                 if field in typed and _int(typed, field) > 1)
    return found


def _feature_fields(typed: Typed) -> set[str]:
    """The fields :func:`features` reads (their changes are not also value changes)."""
    fields = {f for f, (flag, _) in typed.items() if not flag.takes_value}
    return fields | {"speculative_algorithm", "attn_dp_size", "dp_size", *_SIZED}


def price(edits: Iterable[Edit], lines: Mapping[str, str],
          envs: Mapping[str, Mapping[str, str]] | None = None) -> Cost:
    """What ``edits`` change against ``lines`` (role -> launch line) and ``envs`` (role ->
    environment), as :class:`Cost`: the features each server has before and after (a
    removed ``--disable-*`` switch turns its feature on), its GPU count before and after,
    its checkpoint flags, and every other typed value or variable changed."""
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
        had, has = features(before), features(after)
        for name in had - has:
            (on if name.startswith("--disable-") else off).append(
                f"{role}: {name}" + (" removed" if name.startswith("--disable-") else ""))
        for name in has - had:
            (off if name.startswith("--disable-") else on).append(f"{role}: {name}")
        read = _feature_fields(before) | _feature_fields(after)
        for field in dict.fromkeys([*before, *after]):
            was, now = before.get(field, (None, None)), after.get(field, (None, None))
            if was[1] == now[1] and (was[0] is None) == (now[0] is None):
                continue
            option = (was[0] or now[0]).option  # type: ignore[union-attr]
            if any(field.startswith(prefix) and key in before and key not in after
                   for key, prefix in _DEPENDS_ON.items()):
                continue  # goes with a feature turned off, said once
            if field in CHECKPOINT_FIELDS:
                checkpoints.append(f"{role}: {option}")
            elif was[0] is not None and ((now[0] is not None and was[0].takes_value)
                                         or field not in read):
                values.append(f"{role}: {option}")  # changed, or removed (not a feature)
        given = (envs or {}).get(role, {})
        changed = apply_env(given, edits, role)
        values += [f"{role} env: {name}" for name in dict.fromkeys([*given, *changed])
                   if given.get(name) != changed.get(name)]
        was_gpus, now_gpus = gpu_count(before), gpu_count(after)
        if was_gpus != now_gpus:
            gpus.append(f"{role}: {was_gpus} -> {now_gpus}")
    return Cost(tuple(dict.fromkeys(e.server for e in edits)), tuple(sorted(off)),
                tuple(sorted(on)), tuple(values), tuple(gpus), tuple(checkpoints), len(edits))


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
