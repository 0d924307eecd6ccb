"""Variables, and the arguments a word stands for once they are resolved.

A :class:`Scope` holds what is known when a word is read: shell variables (and which are
exported), a container's env for Kubernetes' ``$(VAR)``, and why a name has no value
(a ``valueFrom``, LeaderWorkerSet's run-time variables). :func:`expand_word` resolves a
shell word as sh would (``$VAR``, ``${VAR}``, ``${VAR:-default}``, unquoted results split
into several arguments); :func:`expand_kube` resolves ``$(VAR)`` in a Kubernetes
command or args item. What cannot be resolved is left as typed and said in one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sglang_dsv4_guard.check.inputs.shell import Word
from sglang_dsv4_guard.check.inputs.source import Region

__all__ = ["NAME", "Arg", "Scope", "VarValue", "expand_kube", "expand_word", "runtime_reason",
           "unresolved_line"]

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHELL = re.compile(
    r"\$\{(?P<braced>[^}]*)\}|\$\(\((?P<arith>.*?)\)\)|\$\((?P<sub>[^()]*(?:\([^()]*\)[^()]*)*)\)"
    r"|`(?P<tick>[^`]*)`|\$(?P<name>[A-Za-z_][A-Za-z0-9_]*)|\$(?P<special>[0-9@*#?$!-])"
    r"|(?P<helm>\{\{.*?\}\})", re.S)
_KUBE = re.compile(r"\$\$|\$\((?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)\)|(?P<helm>\{\{.*?\}\})",
                   re.S)
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-=+?])(?P<word>.*))?\Z",
                     re.S)
_HELM = "a Helm template, not rendered (render the chart with helm template first)"


def runtime_reason(name: str) -> str | None:
    """Why a variable set by the workload controller has no value in the manifest."""
    if name.startswith("LWS_"):
        return "LeaderWorkerSet sets it in each pod when the pod starts"
    if name.startswith("RBG_"):
        return "RoleBasedGroup sets it in each pod when the pod starts"
    return None


def unresolved_line(ref: str, line: int, why: str, left: str = "left as typed") -> str:
    """One ``unresolved`` line: the reference as typed, its line, why, and what was done."""
    return f"{ref} (line {line}): {why}; {left}"


@dataclass(frozen=True)
class VarValue:
    """A variable's value and where it is written (for placing the arguments it holds).
    A value longer than :data:`MAX_VALUE` (variables that expand into each other, which
    grow without bound) raises :class:`ValueTooLarge`."""

    text: str
    region: Region | None = None

    def __post_init__(self) -> None:
        if len(self.text) > MAX_VALUE:
            raise ValueTooLarge(len(self.text))


# The longest value a variable may expand to: a launch line's arguments are at most 64 KiB
# (check's own limit); variables that expand into each other grow past it in a few lines.
MAX_VALUE = 64 * 1024


class ValueTooLarge(Exception):
    """A variable's value expanded past :data:`MAX_VALUE` characters."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


@dataclass
class Scope:
    """What is known while a script or container is read."""

    vars: dict[str, VarValue] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)
    kube: dict[str, VarValue] | None = None  # a container's env, for Kubernetes' $(VAR)
    why: dict[str, str] = field(default_factory=dict)  # a name without value: why
    unset_why: str = "not set in the script or its environment"

    def child(self) -> Scope:
        """A copy for a nested script (sh -c): it sees the variables, changes stay in it."""
        return Scope(dict(self.vars), set(self.exported), self.kube, dict(self.why),
                     self.unset_why)

    def reason(self, name: str, kube: bool = False) -> str:
        known = self.why.get(name) or runtime_reason(name)
        if known:
            return known
        if kube:
            return f"the container has no env entry {name} (Kubernetes leaves it as typed)"
        return self.unset_why


@dataclass(frozen=True)
class Arg:
    """One argument after resolution, with where it is typed and what stayed unresolved."""

    text: str
    typed: str
    line: int
    span: tuple[int, int] | None
    unresolved: tuple[str, ...] = ()
    region: Region | None = None  # the word's place in the file (for a nested script)
    script: str | None = None  # what a shell given this argument reads, when not `typed`


class _Fields:
    """The fields a word expands to, each with the origins of its pieces."""

    def __init__(self) -> None:
        self.fields: list[list[tuple[str, Region | None]]] = [[]]
        self.quoted = [False]

    def add(self, text: str, origin: Region | None, quoted: bool) -> None:
        if text:
            self.fields[-1].append((text, origin))
        self.quoted[-1] = self.quoted[-1] or quoted

    def split(self, text: str, origin: Region | None) -> None:
        """An unquoted expansion's value: split at blanks into fields."""
        pieces = re.split(r"[ \t\n]+", text)
        for i, piece in enumerate(pieces):
            if i:
                self.fields.append([])
                self.quoted.append(False)
            if piece:
                self.fields[-1].append((piece, origin))

    def result(self) -> list[list[tuple[str, Region | None]]]:
        return [f for f, q in zip(self.fields, self.quoted, strict=True) if f or q]


def _braced(body: str, scope: Scope) -> tuple[str | None, Region | None, str]:
    """``${body}``: the value (None: unresolved), its origin, and why not. The default of
    ``${A:-word}`` may itself hold ``$B``/``${B}``."""
    match = _BRACED.match(body)
    if not match:
        return None, None, "an expansion this reader does not evaluate"
    name, op, word = match.group("name"), match.group("op"), match.group("word")
    value = scope.vars.get(name)
    if op is None:
        return (value.text, value.region, "") if value else (None, None, scope.reason(name))
    present = value is not None and not (op.startswith(":") and not value.text)
    if value is not None and present and not op.endswith("+"):
        return value.text, value.region, ""
    if op.endswith("?") or (op.endswith("+") and not present):
        return (None, None, scope.reason(name)) if op.endswith("?") else ("", None, "")
    inner = [_one(m, scope) for m in _SHELL.finditer(word)]
    missing = next((why for text, _, why in inner if text is None), None)
    if missing is not None:
        return None, None, f"its default or alternative holds a variable that is {missing}"
    resolved = _SHELL.sub(lambda m: _one(m, scope)[0] or "", word)
    if op.endswith("="):
        scope.vars[name] = VarValue(resolved)
    return resolved, None, ""


def _one(match: re.Match[str], scope: Scope) -> tuple[str | None, Region | None, str]:
    """One shell expansion: its value (None: unresolved), origin and why not."""
    kind = match.lastgroup
    body = match.group(kind or "") or ""
    if kind == "braced":
        return _braced(body, scope)
    if kind == "name":
        value = scope.vars.get(body)
        return (value.text, value.region, "") if value else (None, None, scope.reason(body))
    if kind == "sub" and scope.kube is not None and NAME.fullmatch(body):
        value = scope.kube.get(body)  # Kubernetes replaced $(VAR) before the shell ran
        return (value.text, value.region, "") if value else (None, None,
                                                              scope.reason(body, kube=True))
    if kind in ("sub", "tick"):
        return None, None, "a command substitution, not run"
    if kind == "arith":
        return None, None, "arithmetic, not evaluated"
    if kind == "helm":
        return None, None, _HELM
    return None, None, "a special or positional parameter of the script"


def expand_word(word: Word, scope: Scope, region: Region, expand: bool = True) -> list[Arg]:
    """The arguments ``word`` stands for: placed in ``region`` (the word's own span in a
    shell file, else a region searched in order); with ``expand`` false (a compose string
    command, split but never given to a shell) nothing is resolved."""
    here = Region(region.source, region.cursor, region.end)
    line0, span0 = region.place(word.typed)
    notes: list[str] = []
    fields = _Fields()
    for part in word.parts:
        if part.kind == "lit" or not expand:
            fields.add(part.text, None, part.kind != "bare")
            continue
        at = 0
        for match in _SHELL.finditer(part.text):
            fields.add(part.text[at:match.start()], None, part.kind == "dq")
            value, origin, why = _one(match, scope)
            if value is None:
                notes.append(unresolved_line(match.group(0), line0, why))
                fields.add(match.group(0), None, True)
            elif part.kind == "bare":
                fields.split(value, origin)
            else:
                fields.add(value, origin, True)
            at = match.end()
        fields.add(part.text[at:], None, part.kind == "dq")
    result = fields.result()
    if len(result) == 1:
        text = "".join(piece for piece, _ in result[0])
        return [Arg(text, word.typed, line0, span0, tuple(notes), here)]
    args: list[Arg] = []
    searched: dict[int, Region] = {}
    for pieces in result:
        text = "".join(piece for piece, _ in pieces)
        origins = {id(o): o for _, o in pieces}
        origin = next(iter(origins.values())) if len(origins) == 1 else None
        if origin is not None:  # written in a variable's assignment: place it there
            where = searched.setdefault(id(origin), origin.fresh())
            line, span = where.place(text)
        else:
            line, span = line0, None
        args.append(Arg(text, text, line, span, tuple(notes), here))
    return args


def expand_kube(typed: str, env: dict[str, VarValue], scope: Scope, region: Region) -> Arg:
    """A Kubernetes command or args item: ``$(VAR)`` from the container's ``env``
    (``$$`` is a literal ``$``), anything else as typed."""
    notes: list[str] = []
    here = region.fresh()
    line, span = region.place(typed)

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group("helm"):
            notes.append(unresolved_line(match.group(0), line, _HELM))
            return match.group(0)
        name = match.group("name")
        value = env.get(name)
        if value is None:
            notes.append(unresolved_line(match.group(0), line, scope.reason(name, kube=True)))
            return match.group(0)
        return value.text

    text = _KUBE.sub(one, typed)
    return Arg(text, typed, line, span, tuple(notes), here)
