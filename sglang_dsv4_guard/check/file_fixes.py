"""``check -f --fix``: the proven corrected lines carried back into the deployment files,
as one unified diff that changes each flag where it stands (pure: text in, text out).

The check process proves a pair's corrected lines (:mod:`.prove`); here the difference
between the arguments it was sent and the corrected ones (a token diff) becomes edits of
the file text at each argument's span (:class:`~.inputs.Token`), in the file's own shape:
a YAML list item per argument (``- --flag=value``, quoted as its neighbours are), a flow
list, or a shell line (a script, ``sh -c``, a compose command, an args file). A removed
argument takes its list item, or its place on a continued line, with it. What cannot be
edited in place (an argument the file sets through a variable, an environment change)
is said in ``problems``, and that file gets no hunk from that pair.

:func:`verify` proves the diff: the patched text, read again by the same reader, gives
each server the corrected arguments.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sglang_dsv4_guard.check.inputs import Inputs, Invocation, read_inputs
from sglang_dsv4_guard.check.outcome import ROLES

if TYPE_CHECKING:
    from sglang_dsv4_guard.check.outcome import Checked

__all__ = ["FileEdit", "fix_files", "patched", "token_edits", "unified_diff"]


@dataclass(frozen=True)
class FileEdit:
    """Replace ``[start, end)`` of ``file``'s text with ``text``."""

    file: str
    start: int
    end: int
    text: str


_ITEM = re.compile(r"^(\s*-\s+)(['\"]?)$")  # a YAML block-list item up to the token
# A plain YAML scalar that is not read as the same string: indicators, or a number, a
# boolean or null of YAML 1.1 / 1.2 (``16``, ``0x1f``, ``1e3``, ``yes``, ``~``).
_YAML_PLAIN_NOT_STR = re.compile(
    r"[:#{}\[\],&*?|>'\"%@`]|^[-?]\s|^\s|\s$|"
    r"^[-+]?(\d[\d_]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?$|^0[xXoObB][\da-fA-F_]+$|"
    r"^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$|"
    r"^(y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF|"
    r"null|Null|NULL|~)$")


def _line_bounds(text: str, offset: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return start, len(text) if end < 0 else end


def _quote_of(text: str, span: tuple[int, int]) -> str:
    """The quote around the token at ``span`` (``'``, ``"``) or ``""``."""
    start, end = span
    before = text[start - 1] if start > 0 else ""
    after = text[end] if end < len(text) else ""
    return before if before in "'\"" and before == after else ""


def _kind(text: str, span: tuple[int, int]) -> str:
    """``item`` (its own YAML block-list item), ``flow`` (an item of ``[..., ...]``) or
    ``shell`` (a word of a command line)."""
    line_start, _ = _line_bounds(text, span[0])
    head = text[line_start:span[0]]
    if _ITEM.match(head):
        return "item"
    quote = _quote_of(text, span)
    before = text[:span[0] - len(quote)].rstrip()
    opened = text.rfind("[", 0, span[0]) > text.rfind("]", 0, span[0])  # inside [ ... ]
    if opened and before.endswith(("[", ",")):
        return "flow"
    return "shell"


def _render(token: str, kind: str, quote: str) -> str:
    """``token`` as written in a place of ``kind`` quoted by ``quote``."""
    if kind == "shell" and not quote:
        return shlex.quote(token)
    if quote == '"':
        return json.dumps(token)[1:-1]
    if quote == "'":
        return token.replace("'", "''") if kind != "shell" else token.replace("'", "'\\''")
    if kind in ("item", "flow") and (not token or _YAML_PLAIN_NOT_STR.search(token)):
        return json.dumps(token)  # quoted, so YAML reads a string (Kubernetes needs strings)
    return token


def _joined(sent: Sequence[str], fixed: Sequence[str]) -> list[str]:
    """``fixed`` with ``--flag value`` joined as ``--flag=value`` where ``sent`` wrote that
    flag in the ``=`` form (the corrected lines spell a set flag apart)."""
    eq_form = {t.split("=", 1)[0] for t in sent if t.startswith("--") and "=" in t}
    out: list[str] = []
    i = 0
    while i < len(fixed):
        token = fixed[i]
        if token in eq_form and i + 1 < len(fixed) and not fixed[i + 1].startswith("--"):
            out.append(f"{token}={fixed[i + 1]}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def token_edits(file: str, text: str, spans: Sequence[tuple[int, int] | None],
                sent: Sequence[str], fixed: Sequence[str],
                typed: Sequence[str] | None = None,
                own: Sequence[bool] | None = None) -> tuple[list[FileEdit], list[str]]:
    """The edits of ``text`` that turn one server's arguments ``sent`` (each written at
    ``spans``, ``None`` where not verbatim, as ``typed``) into ``fixed``; and what cannot
    be edited in place (then no edits). A flag is added only after an argument written in
    the server's own command (``own``; not one a shared variable holds)."""
    fixed = _joined(sent, fixed)
    edits: list[FileEdit] = []
    problems: list[str] = []
    ops = difflib.SequenceMatcher(a=list(sent), b=list(fixed), autojunk=False).get_opcodes()
    for op, i1, i2, j1, j2 in ops:
        if op == "equal":
            continue
        olds = list(range(i1, i2))
        hidden = [i for i in olds if spans[i] is None]
        if hidden:
            shown = ", ".join(f"{sent[i]!r}" + (f" (written {typed[i]!r})" if typed else "")
                              for i in hidden)
            problems.append(f"{shown} would change to {' '.join(fixed[j1:j2]) or 'nothing'}: "
                            "written through a variable or an escape, not verbatim: change "
                            "it where it is set")
            continue
        if op == "replace" and i2 - i1 == j2 - j1:
            for i, new in zip(olds, fixed[j1:j2], strict=True):
                span = spans[i]
                assert span is not None
                edits.append(FileEdit(file, *span, _render(
                    new, _kind(text, span), _quote_of(text, span))))
            continue
        edits += [_removal(file, text, spans[i]) for i in olds if spans[i] is not None]
        if j2 > j1:
            anchor = next((spans[i] for i in range(i1 - 1, -1, -1)
                           if spans[i] is not None and (own is None or own[i])), None)
            if anchor is None:
                problems.append(f"{' '.join(fixed[j1:j2])}: no argument before it is "
                                "written verbatim to add it after")
                continue
            edits.append(_insertion(file, text, anchor, fixed[j1:j2]))
    return ([], problems) if problems else (edits, [])


def _removal(file: str, text: str, span: tuple[int, int] | None) -> FileEdit:
    assert span is not None
    kind, quote = _kind(text, span), _quote_of(text, span)
    start, end = span[0] - len(quote), span[1] + len(quote)
    if kind == "item":
        line_start, line_end = _line_bounds(text, span[0])
        return FileEdit(file, line_start, min(line_end + 1, len(text)), "")
    if kind == "flow":
        before = text.rfind(",", 0, start)
        if before >= 0 and not text[before + 1:start].strip():  # the item's own comma
            return FileEdit(file, before, end, "")
        after = re.match(r"\s*,\s*", text[end:])
        return FileEdit(file, start, end + (after.end() if after else 0), "")
    while start > 0 and text[start - 1] in " \t":
        start -= 1
    return FileEdit(file, start, end, "")


def _insertion(file: str, text: str, anchor: tuple[int, int], tokens: Sequence[str]
               ) -> FileEdit:
    kind, quote = _kind(text, anchor), _quote_of(text, anchor)
    if kind == "item":
        line_start, line_end = _line_bounds(text, anchor[0])
        head = _ITEM.match(text[line_start:anchor[0]])
        assert head is not None
        items = "".join(f"\n{head.group(1)}{quote}{_render(t, kind, quote)}{quote}"
                        for t in tokens)
        return FileEdit(file, line_end, line_end, items)
    end = anchor[1] + len(quote)
    if kind == "flow":
        items = "".join(f", {quote}{_render(t, kind, quote)}{quote}" for t in tokens)
        return FileEdit(file, end, end, items)
    words = "".join(f" {_render(t, kind, '')}" for t in tokens)  # new words of the line
    return FileEdit(file, end, end, words)


def _emptied(text: str, points: Sequence[int]) -> str:
    """``text`` without the lines at ``points`` (where arguments were removed) that hold
    nothing else now (blank, or only a continuation backslash): a blank line would end a
    YAML folded scalar's line or a shell command."""
    lines: dict[int, int] = {}
    for point in points:
        start, end = _line_bounds(text, point)
        if text[start:end].strip() in ("", "\\"):
            lines[start] = end
    for start in sorted(lines, reverse=True):
        end = lines[start]
        continued = text[start:end].strip() == "\\"
        text = text[:start] + text[end + 1:] if end < len(text) else text[:max(start - 1, 0)]
        if not continued and start > 0:  # the command ended on the emptied line: the line
            prev_start, prev_end = _line_bounds(text, start - 1)  # before now ends it
            previous = text[prev_start:prev_end]
            if previous.rstrip().endswith("\\"):
                kept = previous.rstrip()[:-1].rstrip()
                text = text[:prev_start] + kept + text[prev_end:]
    return text


def patched(text: str, edits: Sequence[FileEdit]) -> str | None:
    """``text`` with ``edits`` applied (identical edits once); ``None`` when two overlap."""
    unique = sorted(set(edits), key=lambda e: (e.start, e.end))
    for a, b in itertools.pairwise(unique):
        if b.start < a.end or (a.start == b.start and a.end == b.end):
            return None
    out, shift, removed = [], 0, []
    last = 0
    for edit in unique:
        out += [text[last:edit.start], edit.text]
        if not edit.text and text[edit.end - 1] != "\n":  # a removal within a line: where
            removed.append(edit.start + shift)             # it is, in the new text
        shift += len(edit.text) - (edit.end - edit.start)
        last = edit.end
    out.append(text[last:])
    return _emptied("".join(out), removed)


def _lines(text: str) -> list[str]:
    """``text``'s lines as git counts them: split at ``\\n`` only (never at the other line
    breaks ``str.splitlines`` knows), each with its end."""
    return re.findall(r"[^\n]*\n|[^\n]+", text)


def _shown(file: str) -> str:
    """``file`` as a diff names it: relative to the working directory when under it."""
    absolute = os.path.abspath(file)
    here = os.getcwd()
    inside = os.path.commonpath([absolute, here]) == here
    return os.path.relpath(absolute, here) if inside else absolute.lstrip("/")


def unified_diff(texts: Mapping[str, tuple[str, str]]) -> str:
    """One unified diff (``git apply`` reads it) of every file whose text changed:
    ``{file: (before, after)}``."""
    parts = []
    for file, (before, after) in texts.items():
        if before == after:
            continue
        name = _shown(file).replace(os.sep, "/")
        parts.append(f"diff --git a/{name} b/{name}\n")
        for line in difflib.unified_diff(_lines(before), _lines(after), f"a/{name}",
                                         f"b/{name}"):
            parts.append(line if line.endswith("\n") else
                         line + "\n\\ No newline at end of file\n")
    return "".join(parts)




def _unmapped(argv: Sequence[str], models: Mapping[str, str]) -> list[str]:
    """``argv`` with each local model directory put back as the deployment's path."""
    back = {local: path for path, local in models.items()}
    out = []
    for token in argv:
        flag, eq, value = token.partition("=")
        out.append(back.get(token, f"{flag}={back[value]}" if eq and value in back else token))
    return out


def nodes_of(inputs: Inputs, invocation: Invocation) -> list[Invocation]:
    """The other nodes of ``invocation``'s server (a multi-node server's workers), in file
    order: a fix edits each."""
    return [inv for inv in inputs.invocations
            if inv.unit and inv.unit == invocation.unit and inv is not invocation]


def _env_notes(name: str, role: str, request: Mapping[str, Any], fixed: Mapping[str, Any]
               ) -> list[str]:
    sent = dict(request.get(f"{role}_env") or {})
    now = dict(fixed.get(f"{role}_env") or {})
    changes = [f"{k}={v}" for k, v in now.items() if sent.get(k) != v]
    changes += [f"unset {k}" for k in fixed.get(f"{role}_unset") or ()]
    return [f"{name}: the {role}'s environment also changes ({', '.join(changes)}): "
            "edit its env entries by hand"] if changes else []


def fix_files(paths: Sequence[str], inputs: Inputs, checked: Sequence[Checked],
              requests: Sequence[Mapping[str, Any]], models: Mapping[str, str],
              prepare: Callable[[Sequence[str]], list[str]]) -> tuple[str, list[str]]:
    """One unified diff that carries every corrected pair's proven lines into its files,
    and a note for each change not made (and why). The diff is proven: the patched files,
    read again, give each edited server the corrected arguments (each server's arguments
    as the check was sent them: ``prepare`` makes them so from what the reader gives)."""
    texts: dict[str, str] = {}
    edits: dict[str, list[FileEdit]] = {}
    expected: dict[tuple[str, str], tuple[str, list[str]]] = {}
    notes: list[str] = []
    for c, request in zip(checked, requests, strict=True):
        doc = c.reply.get("document") or {}
        status = doc.get("fix_status")
        if status != "corrected":
            if status in ("partial", "not_proven"):
                notes.append(f"{c.name}: no proven correction ({status}): its files are "
                             "not edited")
            continue
        fixed, nodes = doc.get("fixed") or {}, doc.get("fixed_nodes") or {}
        for role in ROLES:
            leader = c.invocation(role)
            if leader is None:
                continue
            notes += _env_notes(c.name, role, request, fixed)
            members = [leader, *nodes_of(inputs, leader)]
            sent_lines = [request[role], *(request.get("nodes") or {}).get(role, ())]
            new_lines = [fixed[role], *nodes.get(role, ())]
            for inv, sent, new in zip(members, sent_lines, new_lines, strict=False):
                if inv.file == "<stdin>":
                    notes.append(f"{c.name}: the {role} was read from stdin: no file to edit")
                    break
                if inv.file not in texts:
                    with open(inv.file, encoding="utf-8", newline="") as handle:
                        texts[inv.file] = handle.read()
                sent_argv = _unmapped(shlex.split(sent), models)
                new_argv = _unmapped(shlex.split(new), models)
                spans = [t.span if t.typed == t.text else None for t in inv.tokens]
                found, problems = token_edits(inv.file, texts[inv.file], spans, sent_argv,
                                              new_argv, [t.typed for t in inv.tokens],
                                              [t.line >= inv.line for t in inv.tokens])
                notes += [f"{inv.file}:{inv.line} ({role}): {p}" for p in problems]
                if problems:
                    continue
                edits.setdefault(inv.file, []).extend(found)
                expected[(inv.file, f"{inv.line}:{role}")] = (
                    c.name, _joined(shlex.split(sent), shlex.split(new)))
    after: dict[str, str] = {}
    for file, changes in edits.items():
        done = patched(texts[file], changes)
        if done is None:
            notes.append(f"{file}: two pairs change the same argument differently: not edited")
            continue
        after[file] = done
    after = _verified(paths, after, expected, prepare, notes)
    return unified_diff({f: (texts[f], after[f]) for f in after}), list(dict.fromkeys(notes))


def _verified(paths: Sequence[str], after: dict[str, str],
              expected: Mapping[tuple[str, str], tuple[str, list[str]]],
              prepare: Callable[[Sequence[str]], list[str]], notes: list[str]
              ) -> dict[str, str]:
    """``after`` without the files whose patched text, read again, does not give each
    edited server its corrected arguments (each such file a note)."""
    if not after:
        return after
    again = read_inputs(list(paths), None, after)
    got: dict[str, list[list[str]]] = {}
    for inv in again.invocations:
        got.setdefault(inv.file, []).append(prepare(inv.argv))
    kept = {}
    for file, text in after.items():
        wanted = [(name, argv) for (f, _), (name, argv) in expected.items() if f == file]
        have = got.get(file, [])
        missing = [name for name, argv in wanted if argv not in have]
        if missing:
            notes.append(f"{file}: the patched file, read again, does not give "
                         f"{', '.join(dict.fromkeys(missing))} the corrected arguments: "
                         "not edited")
            continue
        kept[file] = text
    return kept
