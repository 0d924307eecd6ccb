"""docker-compose files: each service's ``entrypoint`` + ``command`` (a list, or a string
compose splits as a shell would but never gives to a shell) and its ``environment`` (a
mapping or a list of ``K=V``).

Compose fills ``${VAR}`` and ``$VAR`` in the file from the shell or ``.env`` when it reads
it (``${VAR:-default}`` gives the default, ``$$`` is a literal ``$`` the container sees):
this reader has neither, so such a variable is left as typed and said. A
``bash -c "..."`` command is then read as a script with the service's environment.
"""

from __future__ import annotations

import re

import yaml

from sglang_dsv4_guard.check.inputs.commands import Context, Found, interpret
from sglang_dsv4_guard.check.inputs.expand import Arg, Scope, VarValue, expand_word, unresolved_line
from sglang_dsv4_guard.check.inputs.nodes import Budget, get, items, pairs, region, scalar
from sglang_dsv4_guard.check.inputs.shell import LexError, Word, lex
from sglang_dsv4_guard.check.inputs.source import Source

__all__ = ["read_compose"]

_INTERPOLATION = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)"
                            r"(?P<default>[^}]*))?(?P<rest>[^}]*)\}|\$(?P<bare>[A-Za-z_]\w*)")
_FROM_SHELL = "compose takes it from the shell or .env when it reads the file"


def _interpolated(text: str, line: int, notes: list[str]) -> str:
    """``text`` as compose reads it, without the shell's variables or ``.env``."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group("op"):
            return match.group("default")
        notes.append(unresolved_line(match.group(0), line, _FROM_SHELL))
        return match.group(0)

    return _INTERPOLATION.sub(one, text)


def _environment(source: Source, node: yaml.Node | None, notes: list[str]) -> dict[str, VarValue]:
    env: dict[str, VarValue] = {}
    if isinstance(node, yaml.MappingNode):
        entries = [(k, v, v) for k, v in pairs(node)]
    else:
        entries = []
        for item in items(node):
            name, _, _ = (scalar(item) or "").partition("=")
            entries.append((name, item, item))
    for name, value_node, at in entries:
        line = at.start_mark.line + 1
        raw = scalar(value_node)
        if isinstance(node, yaml.SequenceNode):
            raw = raw.partition("=")[2] if raw and "=" in raw else None
        if raw is None:
            notes.append(unresolved_line(name, line, _FROM_SHELL, "not in env"))
            continue
        env[name] = VarValue(_interpolated(raw, line, notes), region(source, at))
    return env


def _split(source: Source, node: yaml.Node, notes: list[str]) -> list[Arg]:
    """A compose ``command``/``entrypoint``: list items as they are, a string split as a
    shell would (quotes removed, nothing expanded); compose's interpolation applied."""
    place = region(source, node)
    if isinstance(node, yaml.SequenceNode):
        args = []
        for item in node.value:
            here = region(source, item)
            typed = scalar(item) or ""
            text = _interpolated(typed, here.line, notes)
            line, span = here.fresh().place(typed)
            args.append(Arg(text, typed, line, span, (), here, script=text))
        return args
    raw = scalar(node) or ""
    try:
        words = [w for w in lex(raw) if isinstance(w, Word)]
    except LexError:
        text = _interpolated(raw, place.line, notes)
        return [Arg(text, raw, place.line, None, (), place, script=text)]
    shared = place.fresh()
    args = []
    for word in words:
        arg = expand_word(word, Scope(), shared, expand=False)[0]
        text = _interpolated(arg.typed, arg.line, notes)
        args.append(Arg(text, arg.typed, arg.line, arg.span, (), arg.region, script=text))
    return args


def read_compose(source: Source, document: yaml.Node, index: int, found: Found,
                 budget: Budget) -> None:
    """Every service of a compose document."""
    group = (f"{source.path}#{index}", source.path)
    for name, service in pairs(get(document, "services")):
        budget.spend(service)
        notes: list[str] = []
        env = _environment(source, get(service, "environment"), notes)
        for env_file in items(get(service, "env_file")):
            notes.append(unresolved_line(f"env_file {scalar(env_file) or '?'}",
                                         env_file.start_mark.line + 1, "not read by this reader",
                                         "its variables are not in env"))
        args: list[Arg] = []
        for key in ("entrypoint", "command"):
            node = get(service, key)
            if node is not None:
                args += _split(source, node, notes)
        if not args:
            continue
        ctx = Context(source, f"service {name}", group, f"{source.path}:service {name}",
                      names=(name,), unresolved=tuple(notes),
                      image=scalar(get(service, "image")) or "")
        scope = Scope(vars=dict(env), exported=set(env),
                      unset_why="not set in the script or the service's environment")
        interpret(args, {k: v.text for k, v in env.items()}, scope, ctx, found)

