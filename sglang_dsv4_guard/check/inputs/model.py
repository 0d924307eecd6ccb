"""What ``check -f`` reads from deployment files: each SGLang server's arguments with the
line (and character span) every argument came from, the pairs they form, and the limits
on what is read.

Pure values: frozen dataclasses, no I/O. The readers (:mod:`.files` and the modules it
calls) build them; :mod:`.pairing` groups the invocations into pairs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sglang_dsv4_guard.check.offline.parse import MAX_ARGS_TOKENS, CheckInputError

__all__ = ["LAUNCHERS", "MAX_ARGS", "MAX_DEPTH", "MAX_DOCUMENTS", "MAX_FILES", "MAX_FILE_BYTES",
           "MAX_NESTING", "MAX_NODES", "MAX_PAIRS", "MAX_SERVERS", "InputError", "Inputs",
           "Invocation", "Pair", "Token"]

# What starts an SGLang server, by the name ``Invocation.launcher`` gives it. "args" is a
# plain args file (no launcher typed); "entrypoint" a container with no command whose
# image is SGLang's (its entrypoint runs the server).
LAUNCHERS = ("sglang.launch_server", "sglang serve", "dynamo.sglang", "args", "entrypoint")

# Bounds on what is read: a file of more bytes, more files, YAML documents in one file,
# YAML nodes visited in one file (aliases count each time they are used: an alias bomb
# stops here), collections nested deeper, scripts nested deeper (sh -c in sh -c ...),
# more arguments for one server (check's own limit), more servers, or more pairs (several
# shapes pair each with each) are refused with an InputError naming the file.
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_FILES = 1_000
MAX_DOCUMENTS = 1_000
MAX_NODES = 200_000
MAX_DEPTH = 64
MAX_NESTING = 8
MAX_ARGS = MAX_ARGS_TOKENS
MAX_SERVERS = 1_000
MAX_PAIRS = 1_000


class InputError(CheckInputError):
    """A deployment file ``check -f`` cannot read: ``argument`` is the file (and line),
    the message says what is wrong with it, the value and what is accepted."""


@dataclass(frozen=True)
class Token:
    """One argument of a server as the deployment gives it."""

    text: str  # the argv token after resolution
    typed: str  # as written in the file (before variable resolution)
    line: int  # 1-based line in the invocation's file
    span: tuple[int, int] | None  # [start, end) character offsets of `typed` in the file text


@dataclass(frozen=True)
class Invocation:
    """One SGLang server found in a file: its arguments (the launcher dropped), its
    environment, and where it is."""

    file: str  # the path as given ("<stdin>" for -)
    line: int  # 1-based line of the invocation (its launcher, else its first argument)
    where: str  # e.g. "DisaggregatedSet/dsv4 role prefill, container sglang"
    group: str  # the pairing group it was paired (or left unpaired) in
    launcher: str  # one of LAUNCHERS
    tokens: tuple[Token, ...]  # SGLang's arguments only
    env: Mapping[str, str] = field(hash=False)  # resolved environment (entries with values)
    role: str | None  # "prefill" | "decode" | None, from --disaggregation-mode
    gpu: str | None  # the GPU product the manifest states (raw), if any
    unresolved: tuple[str, ...]  # one line each: what could not be resolved, and why
    # The server this invocation is part of: the nodes of one multi-node server (an LWS
    # leader and its workers, OME's leader and worker) share it; the first is the server.
    unit: str = ""
    node: str | None = None  # "leader" | "worker" of a multi-node server, else None

    @property
    def argv(self) -> tuple[str, ...]:
        """The arguments after resolution, as SGLang's parser gets them."""
        return tuple(token.text for token in self.tokens)

    def line_of(self, flag: str) -> int:
        """The line of ``flag`` (``--flag`` or ``--flag=...``; the last one, which
        SGLang's parser keeps), else the invocation's line."""
        for token in reversed(self.tokens):
            if token.text == flag or token.text.startswith(flag + "="):
                return token.line
        return self.line


@dataclass(frozen=True)
class Pair:
    """A prefill and a decode server found in the same group."""

    name: str  # e.g. "examples/deployments/llmd.yaml: DisaggregatedSet/dsv4"
    prefill: Invocation
    decode: Invocation
    note: str = ""  # set when the group held several shapes of a role (each paired)


@dataclass(frozen=True)
class Inputs:
    """Everything read from the files: the pairs, the servers left unpaired and why, and
    what was skipped."""

    pairs: tuple[Pair, ...]
    unpaired: tuple[tuple[Invocation, str], ...]  # invocation, why it was not paired
    notes: tuple[str, ...]  # files skipped, workers unlike their leader, roles named twice
    invocations: tuple[Invocation, ...] = ()  # every invocation found, in file order
