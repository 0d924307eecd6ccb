"""The paths ``check -f`` is given: files, directories (walked) and ``-`` (stdin), each
read as YAML, a shell script or an args file.

A directory is walked in sorted order, hidden directories and files skipped, taking
``*.yaml``, ``*.yml``, ``*.json``, ``*.sh``, ``*.bash``, ``*.args``, ``*.txt`` and files
without an extension that start with ``#!``. A file named explicitly (or stdin) with
another extension is sniffed: ``#!`` is a script, a first line ``key:``, ``---`` or
``{`` is YAML, a first word ``--...`` an args file, anything else a script.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from sglang_dsv4_guard.check.inputs.commands import (
    MARKERS,
    Context,
    Found,
    launched_in,
    make_draft,
    run_script,
)
from sglang_dsv4_guard.check.inputs.expand import MAX_VALUE, Scope, ValueTooLarge, expand_word
from sglang_dsv4_guard.check.inputs.model import MAX_ARGS, MAX_FILE_BYTES, MAX_FILES, InputError
from sglang_dsv4_guard.check.inputs.shell import LexError, Word, WordLimit, lex
from sglang_dsv4_guard.check.inputs.source import Source
from sglang_dsv4_guard.check.inputs.yaml_manifests import read_yaml

__all__ = ["Entry", "entries", "read_entry"]

YAML_EXT = (".yaml", ".yml", ".json")
SHELL_EXT = (".sh", ".bash")
ARGS_EXT = (".args", ".txt")
STDIN = "<stdin>"
_ACCEPTED = ("give files (*.yaml, *.yml, *.json, *.sh, *.bash, *.args, *.txt, scripts "
             "starting with #!), directories or - for stdin")
_NOTHING = ("no SGLang server found (python -m sglang.launch_server, sglang serve, "
            "python -m dynamo.sglang)")


@dataclass(frozen=True)
class Entry:
    """One input: its path as given, the group of the files read with it, and whether
    it came from a directory walk."""

    path: str
    together: tuple[str, str]
    walked: bool


def _candidate(path: str, name: str) -> bool:
    if name.startswith("."):
        return False
    ext = os.path.splitext(name)[1].lower()
    if ext in YAML_EXT + SHELL_EXT + ARGS_EXT:
        return True
    if ext:
        return False
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def entries(paths: list[str]) -> list[Entry]:
    """Every file to read, in order; InputError for a path that is not there or too many."""
    found: list[Entry] = []
    named = ("named", "the files named together")
    for path in paths:
        if path == "-":
            found.append(Entry(STDIN, named, False))
        elif os.path.isdir(path):
            for top, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                here = (f"dir:{top}", f"directory {top}")
                found += [Entry(os.path.join(top, name), here, True) for name in sorted(files)
                          if _candidate(os.path.join(top, name), name)]
                if len(found) > MAX_FILES:
                    break
        elif os.path.exists(path):
            found.append(Entry(path, named, False))
        else:
            raise InputError(path, f"no such file or directory; {_ACCEPTED}")
        if len(found) > MAX_FILES:
            raise InputError(path, f"more than {MAX_FILES:,} files to read; name fewer "
                             "files or a narrower directory")
    return found


def _text(entry: Entry, stdin: TextIO | None) -> str:
    if entry.path == STDIN:
        if stdin is None:
            raise InputError("-", "no standard input to read")
        try:
            text = stdin.read(MAX_FILE_BYTES + 1)
        except UnicodeDecodeError as exc:
            raise InputError("-", f"standard input is not UTF-8 text (byte {exc.start}); "
                             f"{_ACCEPTED}") from None
        if len(text.encode("utf-8", "surrogateescape")) > MAX_FILE_BYTES:
            raise InputError("-", f"standard input is larger than {MAX_FILE_BYTES:,} bytes "
                             "(4 MiB); give at most that")
        return text
    try:
        if not stat.S_ISREG(os.stat(entry.path).st_mode):
            raise InputError(entry.path, f"not a regular file (a device, FIFO or socket); "
                             f"{_ACCEPTED}")
        size = os.path.getsize(entry.path)
        if size > MAX_FILE_BYTES:
            raise InputError(entry.path, f"{size:,} bytes, larger than {MAX_FILE_BYTES:,} "
                             "(4 MiB); deployment files are far smaller")
        with open(entry.path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise InputError(entry.path, f"not UTF-8 text (byte {exc.start}); {_ACCEPTED}") from None
    except OSError as exc:
        raise InputError(entry.path, f"cannot be read: {exc.strerror or exc}; "
                         f"{_ACCEPTED}") from None


def _sniff(path: str, text: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext in YAML_EXT:
        return "yaml"
    if ext in SHELL_EXT or text.startswith("#!"):
        return "shell"
    if ext in ARGS_EXT:
        return "args"
    first = next((line.strip() for line in text.splitlines()
                  if line.strip() and not line.lstrip().startswith("#")), "")
    if first.startswith(("---", "{")) or re.match(r"[\w.\-/\"']+:(\s|$)", first):
        return "yaml"
    return "args" if first.startswith("-") else "shell"


def _args_file(source: Source, found: Found) -> int:
    """An args file: the arguments of one server, its first word a ``--flag`` (a launcher
    in it makes it a script). Other text (prose in a ``.txt``) holds no server."""
    try:
        words = [w for w in lex(source.text, MAX_ARGS) if isinstance(w, Word)]
    except WordLimit as exc:
        raise InputError(f"{source.path}:{source.line_of(exc.offset)}",
                         f"more than {MAX_ARGS:,} arguments for one server (check's "
                         "limit)") from None
    except LexError as exc:
        if not MARKERS.search(source.text):
            return 0  # prose, not arguments
        raise InputError(f"{source.path}:{source.line_of(exc.offset)}",
                         f"shell syntax: {exc}; give a server's arguments as a shell "
                         "would split them") from None
    if launched_in([w.typed for w in words]) is not None:
        return _script(source, found)
    if not words or not words[0].typed.startswith("--"):
        return 0
    ctx = Context(source, "args file", (source.path, source.path), f"{source.path}:args")
    scope = Scope(unset_why="not set in the args file (no environment is read)")
    args = [a for w in words for a in expand_word(w, scope, source.region(w.start, w.end))]
    found.add(make_draft(ctx, args, 0, 0, "args", {}))
    return 1


def _script(source: Source, found: Found) -> int:
    if not MARKERS.search(source.text):
        return 0  # no server, router or script that starts one: not split at all
    ctx = Context(source, group=(source.path, source.path))
    scope = Scope(unset_why="not set in the script (the environment it runs in is not known)")
    return run_script(source.text, 0, source.everywhere(), scope, ctx, found)


def read_entry(entry: Entry, stdin: TextIO | None, found: Found,
               replaced: Mapping[str, str] | None = None) -> None:
    """Read one input into ``found`` (its text from ``replaced`` when that holds its path:
    ``check -f --fix`` reads its patched files so); a note when it holds no SGLang server."""
    text = replaced[entry.path] if replaced and entry.path in replaced else _text(entry, stdin)
    try:
        _read_text(entry, text, found)
    except ValueTooLarge as exc:
        raise InputError(entry.path, f"a variable's value expands to more than {MAX_VALUE:,} "
                         f"characters (at least {exc.size:,}: variables that expand into each "
                         "other); a launch line's arguments are at most 64 KiB") from None


def _read_text(entry: Entry, text: str, found: Found) -> None:
    source = Source(entry.path, text)
    before = len(found.drafts) + len(found.routers)
    kind = _sniff(entry.path, text)
    if kind == "yaml":
        if entry.path.lower().endswith(".json"):
            source.text = text.replace("\t", " ")  # JSON's tabs are blanks; YAML's are not
        try:
            read_yaml(source, found)
        except InputError as exc:
            if not (entry.walked and "{{" in text and "YAML syntax" in str(exc)):
                raise
            found.notes.append(f"{entry.path}: an unrendered Helm template (skipped; render "
                               "the chart with helm template first)")
            return
    elif kind == "args":
        _args_file(source, found)
    else:
        _script(source, found)
    if len(found.drafts) + len(found.routers) == before:
        found.notes.append(f"{entry.path}: {_NOTHING}")
