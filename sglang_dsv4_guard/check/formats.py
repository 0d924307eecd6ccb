"""``check``'s outputs for people and for CI, from the pairs' answers (pure: each returns text).

- :func:`render_text`: each pair's own report, under its name, then one summary table;
- :func:`render_quiet`: one line per pair (``--quiet``);
- :func:`render_json`: one document for every pair;
- :func:`render_sarif`: SARIF 2.1.0, each finding at the file and line of its flag;
- :func:`render_github`: GitHub Actions workflow commands (``::error file=...,line=...::``).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from sglang_dsv4_guard.check.outcome import FAIL_ON, Checked, exit_status, failing, where
from sglang_dsv4_guard.codes import CODES

__all__ = ["FORMATS", "render", "render_github", "render_json", "render_patch",
           "render_quiet", "render_sarif", "render_text"]

FORMATS = ("text", "json", "sarif", "github", "patch")
_SARIF_LEVEL = {"error": "error", "warning": "warning"}  # anything else is a note
_SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _counts(checked: Checked) -> str:
    if checked.error is not None:
        return f"not checked: {checked.error}"
    codes = ", ".join(dict.fromkeys(str(f.get("code")) for f in checked.findings))
    errors, warnings = checked.count("error"), checked.count("warning")
    if not errors and not warnings:
        return "no findings" if not codes else f"notes only ({codes})"
    return f"{errors} error(s), {warnings} warning(s) ({codes})"


def _mark(checked: Checked, fail_on: str) -> str:
    if checked.error is not None:
        return "ERROR"
    return "FAIL" if failing(checked, fail_on) else "OK"


def render_quiet(pairs: Sequence[Checked], fail_on: str) -> str:
    """One line per pair: ``OK``, ``FAIL`` (a finding ``--fail-on`` counts) or ``ERROR``
    (not checked), its name, and its counts and codes."""
    return "\n".join(f"{_mark(c, fail_on)} {c.name}: {_counts(c)}" for c in pairs)


def _table(pairs: Sequence[Checked], fail_on: str, unpaired: Sequence[str]) -> str:
    failed = sum(1 for c in pairs if _mark(c, fail_on) != "OK")
    lines = [f"check: {len(pairs)} pair(s), {failed} failing (--fail-on {fail_on}); exit "
             f"{exit_status(pairs, fail_on, unreadable=False)}"]
    width = max((len(_mark(c, fail_on)) for c in pairs), default=2)
    lines += [f"    {_mark(c, fail_on).ljust(width)}  {c.name}: {_counts(c)}" for c in pairs]
    lines += [f"    not paired: {line}" for line in unpaired]
    return "\n".join(lines)


def render_text(pairs: Sequence[Checked], fail_on: str, unpaired: Sequence[str] = (),
                notes: Sequence[str] = ()) -> str:
    """A pair typed as two lines: its report as before. Pairs read from files: each
    pair's report under a ``== name ==`` heading, with where its servers are written
    and what the reader could not resolve, then the summary table."""
    if len(pairs) == 1 and pairs[0].prefill is None and not unpaired and not notes:
        only = pairs[0]
        return only.error if only.error is not None else str(only.reply.get("text", ""))
    parts = []
    for c in pairs:
        head = [f"== {c.name} =="]
        for role in ("prefill", "decode"):
            invocation = c.invocation(role)
            if invocation is not None:
                head.append(f"{role}: {invocation.file}:{invocation.line} ({invocation.where})")
        head += [f"unresolved: {note}" for note in c.notes]
        body = (f"sglang-dsv4-guard check: error: {c.error}" if c.error is not None
                else str(c.reply.get("text", "")))
        parts.append("\n".join(head) + "\n\n" + body)
    parts += [f"note: {note}" for note in notes]
    parts.append(_table(pairs, fail_on, unpaired))
    return "\n\n".join(parts)


def _server(checked: Checked, role: str) -> dict[str, Any] | None:
    invocation = checked.invocation(role)
    if invocation is None:
        return None
    return {"file": invocation.file, "line": invocation.line, "where": invocation.where,
            "argv": list(invocation.argv)}


def render_json(pairs: Sequence[Checked], fail_on: str, unpaired: Sequence[str] = (),
                notes: Sequence[str] = ()) -> str:
    """A pair typed as two lines: its document as before. Pairs read from files: one
    object with ``pairs`` (each: ``name``, ``prefill`` and ``decode`` (file, line, where,
    argv), ``unresolved``, ``failing``, and ``document`` or ``error``), ``not_paired``,
    ``notes``, ``fail_on`` and ``exit_status``."""
    if len(pairs) == 1 and pairs[0].prefill is None and not unpaired and not notes:
        return json.dumps(pairs[0].reply.get("document"), indent=2)
    doc = {"fail_on": fail_on, "exit_status": exit_status(pairs, fail_on),
           "pairs": [{"name": c.name, "prefill": _server(c, "prefill"),
                      "decode": _server(c, "decode"), "unresolved": list(c.notes),
                      "failing": failing(c, fail_on), "error": c.error,
                      "document": c.reply.get("document")} for c in pairs],
           "not_paired": list(unpaired), "notes": list(notes)}
    return json.dumps(doc, indent=2)


def _message(checked: Checked, finding: Mapping[str, Any]) -> str:
    """A finding in one paragraph: its code, pair, summary, when, and first fix."""
    text = f"{finding.get('code')} ({checked.name}): {finding.get('summary')}"
    if finding.get("when"):
        text += f"\nwhen: {finding['when']}"
    fixes = [f for f in finding.get("fixes") or () if f.get("text")]
    if fixes:
        text += f"\nfix: {fixes[0]['text']}"
    return text


def render_sarif(pairs: Sequence[Checked], version: str) -> str:
    """SARIF 2.1.0: one run, a rule per code seen, a result per finding at its flag's file
    and line (no location for a pair typed as two lines); a pair that could not be
    checked is a tool notification, and makes the run unsuccessful."""
    rules: dict[str, dict[str, Any]] = {}
    results = []
    notifications = []
    for c in pairs:
        if c.error is not None:
            notifications.append({"level": "error",
                                  "message": {"text": f"{c.name}: not checked: {c.error}"}})
        for finding in c.findings:
            code = str(finding.get("code"))
            info = CODES.get(code)
            rules.setdefault(code, {
                "id": code,
                "shortDescription": {"text": info.title if info else str(finding.get("summary"))},
                "help": {"text": f"sglang-dsv4-guard explain {code}"},
                "properties": {"origin": finding.get("origin")}})
            result: dict[str, Any] = {
                "ruleId": code,
                "level": _SARIF_LEVEL.get(str(finding.get("severity")), "note"),
                "message": {"text": _message(c, finding)},
                "properties": {"pair": c.name, "phase": finding.get("phase")}}
            location = where(c, finding)
            if location is not None:
                result["locations"] = [{"physicalLocation": {
                    "artifactLocation": {"uri": urllib.parse.quote(location.file.replace("\\", "/"))},
                    "region": {"startLine": location.line}}}]
            results.append(result)
    run = {"tool": {"driver": {"name": "sglang-dsv4-guard", "version": version,
                               "rules": list(rules.values())}},
           "results": results,
           "invocations": [{"executionSuccessful": not notifications,
                            "toolExecutionNotifications": notifications}]}
    return json.dumps({"$schema": _SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(pairs: Sequence[Checked], fail_on: str) -> str:
    """GitHub Actions workflow commands: ``::error``/``::warning``/``::notice`` per finding
    with ``file`` and ``line`` where the pair was read from a file, one ``::error`` per pair
    that could not be checked, then the one-line-per-pair summary."""
    lines = []
    for c in pairs:
        if c.error is not None:
            lines.append(f"::error title={_escape_property('check: ' + c.name)}::"
                         f"{_escape_data('not checked: ' + c.error)}")
        for finding in c.findings:
            severity = str(finding.get("severity"))
            command = {"error": "error", "warning": "warning"}.get(severity, "notice")
            props = []
            location = where(c, finding)
            if location is not None:
                props += [f"file={_escape_property(location.file)}", f"line={location.line}"]
            props.append(f"title={_escape_property(str(finding.get('code')))}")
            lines.append(f"::{command} {','.join(props)}::{_escape_data(_message(c, finding))}")
    # a plain log line each, escaped: a name holding a newline must not start a command
    lines += [_escape_data(f"{_mark(c, fail_on)} {c.name}: {_counts(c)}") for c in pairs]
    return "\n".join(lines)


def render_patch(patch: tuple[str, Sequence[str]]) -> str:
    """``check -f --fix``'s patch for the files, and what it leaves out."""
    diff, left = patch
    lines = ["check --fix: the files, patched with the corrected lines (git apply reads "
             "this; --format patch prints it alone):" if diff else
             "check --fix: no file to patch"]
    if diff:
        lines.append(diff.rstrip("\n"))
    lines += [f"not in the patch: {note}" for note in left]
    return "\n".join(lines)


def render(output_format: str, pairs: Sequence[Checked], fail_on: str, version: str,
           quiet: bool = False, unpaired: Sequence[str] = (), notes: Sequence[str] = (),
           patch: tuple[str, Sequence[str]] | None = None) -> str:
    """The command's output in ``output_format`` (:data:`FORMATS`); ``quiet`` makes text one
    line per pair; ``patch`` (``check -f --fix``): the files' diff and what it leaves out."""
    if fail_on not in FAIL_ON:
        raise ValueError(f"fail_on must be one of {', '.join(FAIL_ON)} (got {fail_on!r})")
    if output_format == "json":
        doc = json.loads(render_json(pairs, fail_on, unpaired, notes))
        if patch is not None and isinstance(doc, dict):
            doc["patch"] = {"diff": patch[0], "not_in_patch": list(patch[1])}
        return json.dumps(doc, indent=2)
    if output_format == "sarif":
        return render_sarif(pairs, version)
    if output_format == "github":
        return render_github(pairs, fail_on)
    text = render_quiet(pairs, fail_on) if quiet else render_text(pairs, fail_on, unpaired, notes)
    return text if patch is None else f"{text}\n\n{render_patch(patch)}"
