"""Commands read as a shell (or Kubernetes) would run them, and the SGLang servers and
routers among them.

A command is a list of :class:`~.expand.Arg`: a container's ``command`` + ``args``, or a
simple command of a script. :func:`interpret` finds in it an SGLang server
(``python -m sglang.launch_server``, ``sglang serve``, ``python -m dynamo.sglang``, behind
``exec``, ``env A=B``, ``nohup`` or ``docker run -e A=B image``), a PD router
(``python -m sglang_router.launch_router --prefill URL [PORT] --decode URL``), or a script
to read in turn (``sh -c "..."``, or any quoted argument that holds a launcher, as
``ssh host "..."``). :func:`run_script` reads a script's commands in order, keeping its
variables (``A=B``, ``export A=B``, ``unset``) for the commands after them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sglang_dsv4_guard.check.inputs.expand import NAME, Arg, Scope, VarValue, expand_word
from sglang_dsv4_guard.check.inputs.model import (
    MAX_ARGS,
    MAX_NESTING,
    MAX_SERVERS,
    InputError,
    Invocation,
    Token,
)
from sglang_dsv4_guard.check.inputs.shell import LexError, Op, Word, WordPart, lex
from sglang_dsv4_guard.check.inputs.source import Region, Source

__all__ = ["MARKERS", "MODULES", "Context", "Draft", "Found", "RouterDraft", "interpret", "launched_in",
           "make_draft", "role_of", "run_script"]

MODULES = {"sglang.launch_server": "sglang.launch_server", "dynamo.sglang": "dynamo.sglang"}
ROUTER = "sglang_router.launch_router"
MARKERS = re.compile(r"sglang\.launch_server|dynamo\.sglang|\bsglang\s+serve\b|"
                      r"sglang_router\.launch_router")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh"})
_KEYWORDS = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{", "time",
                       "exec", "nohup", "setsid", "command"})
_ENVISH = ("SGLANG_", "SGL_", "MC_", "NCCL_", "NVSHMEM_", "CUDA_", "HF_", "TORCH_")


@dataclass
class Context:
    """Where commands are read: the file and what the manifest says of the server there."""

    source: Source
    where: str = ""  # e.g. "Deployment/x, container c" ("" in a script: its line)
    group: tuple[str, str] = ("", "")  # the first pairing group: key, label
    unit: str = ""  # the server's key ("" in a script: one per command)
    node: str | None = None
    gpu: str | None = None
    declared: str | None = None  # the role the manifest names (Dynamo's subComponentType)
    names: tuple[str, ...] = ()  # names a router's URL may use for this server
    unresolved: tuple[str, ...] = ()  # env entries without value (valueFrom, envFrom)
    image: str = ""


@dataclass(frozen=True)
class Draft:
    """An invocation before pairing, with what pairing needs."""

    invocation: Invocation
    group: tuple[str, str]
    declared: str | None
    names: tuple[str, ...]
    mode: str | None  # --disaggregation-mode's value as typed, None when absent

    @property
    def port(self) -> str | None:
        return _value_of(self.invocation.tokens, "--port")


@dataclass(frozen=True)
class RouterDraft:
    """A PD router and the servers its lists name (URL, line)."""

    file: str
    line: int
    where: str
    group: tuple[str, str]
    prefill: tuple[tuple[str, int], ...]
    decode: tuple[tuple[str, int], ...]


@dataclass
class Found:
    """What the readers found in the files."""

    drafts: list[Draft] = field(default_factory=list)
    routers: list[RouterDraft] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    units: set[tuple[str, str | None]] = field(default_factory=set)  # (unit, node) seen

    def add(self, draft: Draft) -> None:
        """Keep ``draft``: a second server in the same container or service is a server
        of its own (its unit gets its line)."""
        invocation = draft.invocation
        if len(self.drafts) >= MAX_SERVERS:
            raise InputError(f"{invocation.file}:{invocation.line}",
                             f"more than {MAX_SERVERS:,} SGLang servers to read; name fewer "
                             "files")
        if len(invocation.tokens) > MAX_ARGS:
            raise InputError(f"{invocation.file}:{invocation.line}",
                             f"{len(invocation.tokens):,} arguments for one server, more than "
                             f"{MAX_ARGS:,} (check's limit)")
        if (invocation.unit, invocation.node) in self.units:
            draft = replace(draft, invocation=replace(
                invocation, unit=f"{invocation.unit}@{invocation.line}"))
        self.units.add((draft.invocation.unit, draft.invocation.node))
        self.drafts.append(draft)


def _value_of(tokens: tuple[Token, ...], flag: str) -> str | None:
    value = None
    for i, token in enumerate(tokens):
        if token.text == flag and i + 1 < len(tokens):
            value = tokens[i + 1].text
        elif token.text.startswith(flag + "="):
            value = token.text[len(flag) + 1:]
    return value


def role_of(tokens: tuple[Token, ...]) -> tuple[str | None, str | None]:
    """``--disaggregation-mode``'s value as typed (None when absent) and the PD role."""
    mode = _value_of(tokens, "--disaggregation-mode")
    return mode, mode if mode in ("prefill", "decode") else None


def launched_in(texts: list[str]) -> tuple[int, int, str] | None:
    """Where a launcher stands in a command: its first word, the first argument after it,
    and its name (see ``model.LAUNCHERS``)."""
    for i, text in enumerate(texts):
        if text == "-m" and i + 1 < len(texts) and texts[i + 1] in (*MODULES, ROUTER):
            first = i - 1
            while first > 0 and texts[first].startswith("-"):  # python3 -u -m ...
                first -= 1
            return max(first, 0), i + 2, texts[i + 1]
        if os.path.basename(text) == "sglang" and texts[i + 1:i + 2] == ["serve"]:
            return i, i + 2, "sglang serve"
    return None


def _env_words(texts: list[str], stop: int) -> dict[str, str]:
    """``env A=B`` and ``docker run -e A=B`` before the launcher: the server's env."""
    found: dict[str, str] = {}
    after_env = False
    for i, text in enumerate(texts[:stop]):
        if os.path.basename(text) == "env":
            after_env = True
            continue
        if after_env and "=" in text and NAME.fullmatch(text.split("=", 1)[0]):
            found[text.split("=", 1)[0]] = text.split("=", 1)[1]
            continue
        after_env = False
        pair = None
        if text in ("-e", "--env") and i + 1 < stop:
            pair = texts[i + 1]
        elif text.startswith("--env="):
            pair = text[len("--env="):]
        if pair and "=" in pair and NAME.fullmatch(pair.split("=", 1)[0]):
            found[pair.split("=", 1)[0]] = pair.split("=", 1)[1]
    return found


def make_draft(ctx: Context, args: list[Arg], first: int, start: int, launcher: str,
               env: dict[str, str], extra: tuple[str, ...] = ()) -> Draft:
    """The invocation whose launcher is ``args[first:start]`` and arguments ``args[start:]``."""
    tokens = tuple(Token(a.text, a.typed, a.line, a.span) for a in args[start:])
    mode, role = role_of(tokens)
    notes = [n for a in args for n in a.unresolved] + list(extra) + list(ctx.unresolved)
    config = _value_of(tokens, "--config")
    if config is not None:
        at = next(t.line for t in reversed(tokens) if t.text.split("=")[0] == "--config")
        notes.append(f"--config {config} (line {at}): SGLang reads more arguments from this "
                     "file when it starts; not read here")
    line = args[first].line if first < len(args) else (tokens[0].line if tokens else 1)
    invocation = Invocation(
        file=ctx.source.path, line=line, where=ctx.where or f"command at line {line}",
        group=ctx.group[1], launcher=launcher, tokens=tokens, env=dict(env), role=role,
        gpu=ctx.gpu, unresolved=tuple(dict.fromkeys(notes)),
        unit=ctx.unit or f"{ctx.source.path}:{line}", node=ctx.node)
    return Draft(invocation, ctx.group, ctx.declared, ctx.names, mode)


def _router(ctx: Context, args: list[Arg], start: int, line: int) -> RouterDraft:
    lists: dict[str, list[tuple[str, int]]] = {"--prefill": [], "--decode": []}
    i = start
    while i < len(args):
        text = args[i].text
        flag, _, inline = text.partition("=")
        if flag in lists:
            url = inline if inline else (args[i + 1].text if i + 1 < len(args) else "")
            lists[flag].append((url, args[i].line))
            i += 1 if inline else 2
            if flag == "--prefill" and i < len(args) and (args[i].text.isdigit()
                                                          or args[i].text == "none"):
                i += 1  # the prefill's bootstrap port
            continue
        i += 1
    return RouterDraft(ctx.source.path, line, ctx.where or f"command at line {line}",
                       ctx.group, tuple(lists["--prefill"]), tuple(lists["--decode"]))


def _script_region(arg: Arg, source: Source) -> Region:
    """Where a script given as one argument is written: its span, else its region."""
    if arg.span is not None:
        return source.region(*arg.span)
    return arg.region.fresh() if arg.region is not None else source.everywhere()


def interpret(args: list[Arg], env: dict[str, str], scope: Scope, ctx: Context, found: Found,
              depth: int = 0, extra: tuple[str, ...] = ()) -> int:
    """Read one command; returns how many servers it started."""
    texts = [a.text for a in args]
    where = launched_in(texts)
    if where is not None:
        first, start, name = where
        env = {**env, **_env_words(texts, first)}
        if name == ROUTER:
            if "--pd-disaggregation" in texts[start:]:
                found.routers.append(_router(ctx, args, start, args[first].line))
            return 0
        found.add(make_draft(ctx, args, first, start, MODULES.get(name, name), env, extra))
        return 1
    count = 0
    shell_at = next((i for i, t in enumerate(texts) if os.path.basename(t) in _SHELLS), None)
    for i, arg in enumerate(args):
        text = arg.typed if arg.script is None else arg.script
        if not MARKERS.search(text):
            continue
        script = shell_at is not None and shell_at < i - 1 and \
            re.fullmatch(r"-[a-z]*c[a-z]*", texts[i - 1]) is not None
        if script or len(text.split()) > 1:  # sh -c "...", ssh host "...", ...
            child = scope.child()  # with this command's env (A=B sh -c, env A=B sh -c)
            for name, value in {**env, **_env_words(texts, i)}.items():
                if name not in child.vars or child.vars[name].text != value:
                    child.vars[name] = VarValue(value)
                child.exported.add(name)
            count += run_script(text, None, _script_region(arg, ctx.source), child, ctx,
                                found, depth + 1)
    return count


def _assignment(word: Word) -> tuple[str, Word] | None:
    """``NAME=value``: the name and the value as a word of its own."""
    first = word.parts[0] if word.parts else None
    if first is None or first.kind != "bare":
        return None
    match = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=", first.text)
    if not match:
        return None
    rest = (WordPart(first.text[match.end():], "bare"), *word.parts[1:])
    return match.group(1), Word(rest, word.start + match.end(), word.end)


def _assign(word: Word, scope: Scope, region: Region, exact: bool
            ) -> tuple[str, VarValue, tuple[str, ...]]:
    """``NAME=value``: the name, the value (placed where it is written) and what stayed
    unresolved. ``exact``: ``region`` is the word's own span, else it is searched."""
    name, value = _assignment(word)  # type: ignore[misc]
    source, skip = region.source, len(name) + 1
    if exact:
        here = Region(source, region.start + skip, region.end)
    else:
        _, span = region.place(word.typed)
        here = source.region(span[0] + skip, span[1]) if span else \
            Region(source, region.cursor, region.end)
    args = expand_word(value, scope, here.fresh())
    text = " ".join(a.text for a in args) if len(args) != 1 else args[0].text
    notes = tuple(n for a in args for n in a.unresolved)
    return name, VarValue(text, here.fresh()), notes


def run_script(text: str, base: int | None, region: Region, scope: Scope, ctx: Context,
               found: Found, depth: int = 0) -> int:
    """Read a script's commands in order. ``base`` is where ``text`` starts in the file
    when it is the file's text verbatim (a shell file); else its words are searched for
    in ``region`` in order. Returns how many servers it started."""
    if depth > MAX_NESTING:
        raise InputError(f"{ctx.source.path}:{region.line}",
                         f"scripts nested more than {MAX_NESTING} deep (sh -c in sh -c ...); "
                         "at most that many are read")
    try:
        items = lex(text)
    except LexError as exc:
        line = ctx.source.line_of(base + exc.offset) if base is not None else region.line
        raise InputError(f"{ctx.source.path}:{line}", f"shell syntax: {exc} (a quote, $( or "
                         "{{ opened and never closed); give a script sh can read") from None
    shared = region.fresh()

    def place(word: Word) -> tuple[Region, bool]:
        """Where ``word`` is written: its own span (exact) in a shell file, else the
        script's region, searched in order."""
        if base is not None:
            return ctx.source.region(base + word.start, base + word.end), True
        return shared, False

    started = 0
    command: list[Word] = []
    skip = False
    for item in [*items, Op("\n", len(text))]:
        if isinstance(item, Word):
            if not skip:
                command.append(item)
            skip = False
        elif item.redirect:
            skip = True
        else:
            started += _command(command, place, scope, ctx, found, depth)
            command = []
    return started


def _command(words: list[Word], place: Callable[[Word], tuple[Region, bool]], scope: Scope,
             ctx: Context, found: Found, depth: int) -> int:
    """One simple command: its assignments, exports, or what it runs."""
    while words and words[0].typed in _KEYWORDS and len(words[0].parts) == 1:
        words = words[1:]
    prefix: dict[str, VarValue] = {}
    notes: list[str] = []
    while words and _assignment(words[0]) is not None:
        name, value, more = _assign(words[0], scope, *place(words[0]))
        prefix[name] = value
        notes += more
        words = words[1:]
    if not words:  # NAME=value alone: a shell variable (exported if it was)
        scope.vars.update(prefix)
        return 0
    head = words[0].typed
    if head in ("export", "declare", "typeset", "readonly", "local", "unset"):
        exports = head == "export" or (head in ("declare", "typeset") and
                                       "-x" in [w.typed for w in words])
        for word in words[1:]:
            if _assignment(word) is not None:
                name, value, _ = _assign(word, scope, *place(word))
                scope.vars[name] = value
            elif NAME.fullmatch(word.typed):
                name = word.typed
                if head == "unset":
                    scope.vars.pop(name, None)
                    scope.exported.discard(name)
                    continue
            else:
                continue  # an option (-x, -r)
            if exports:
                scope.exported.add(name)
        return 0
    if not MARKERS.search(" ".join(w.typed for w in words)) and \
            not any(MARKERS.search(v.text) for v in scope.vars.values()):
        return 0  # no server, router or script that could start one: nothing to expand
    args = [a for word in words for a in expand_word(word, scope, place(word)[0])]
    env = {k: v.text for k, v in scope.vars.items() if k in scope.exported}
    env.update({k: v.text for k, v in prefix.items()})
    hidden = tuple(
        f"{name} (line {value.region.line if value.region else '?'}): set in the script "
        "without export; the server does not see it"
        for name, value in scope.vars.items()
        if name.startswith(_ENVISH) and name not in scope.exported and name not in prefix)
    return interpret(args, env, scope, ctx, found, depth, tuple(notes) + hidden)
