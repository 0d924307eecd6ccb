"""SGLang's own resolution line beside a value it chose for a server.

When the release's ``ServerArgs`` resolution replaced or chose a value ``check`` shows
(DeepSeek-V4's page size 256 although the line typed ``--page-size 128``, the KV cache
dtype, the attention backend), the line SGLang logged about it while resolving that
server explains the value: matched by field and value (:func:`.chatter.explaining`), never
by a release's wording.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sglang_dsv4_guard.check.offline.chatter import explaining
from sglang_dsv4_guard.check.server.edit import typed_flags

if TYPE_CHECKING:
    from sglang_dsv4_guard.check.server.derive import DerivedServer

__all__ = ["FIELDS", "Said", "said_about"]

# ServerArgs field, how the report names it, how SGLang's lines name it.
FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("page_size", "page size", ("page_size", "page size")),
    ("kv_cache_dtype", "KV cache dtype", ("kv_cache_dtype", "kv cache dtype")),
    ("attention_backend", "attention backend", ("attention_backend", "attention backend")),
    ("speculative_num_draft_tokens", "draft tokens",
     ("speculative_num_draft_tokens", "num_draft_tokens", "draft tokens")),
)
# The logger's "LEVEL name: " the capture puts before a log record's message.
_RECORD_HEAD = re.compile(r"^[A-Z]+ [\w.]+: ")


@dataclass(frozen=True)
class Said:
    """One value SGLang chose for a server and its own line about it."""

    field: str
    label: str
    value: Any
    typed: str | None  # the value the line typed, when it typed one
    option: str  # the flag that types it (``--page-size``)
    line: str  # SGLang's message, without the capture's level and logger

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "value": self.value, "typed": self.typed,
                "flag": self.option, "sglang_said": self.line}


def _resolved(side: DerivedServer, name: str) -> Any:
    """The field as the release resolved it."""
    if name == "page_size":
        return side.page_size
    if name == "speculative_num_draft_tokens":
        return side.num_draft_tokens
    return side.args.resolved_field(name)


def said_about(side: DerivedServer, lines: Sequence[str]) -> tuple[Said, ...]:
    """Each field of :data:`FIELDS` whose value SGLang's resolution chose (not typed as
    that value) and that one of ``lines`` (the server's captured lines) explains."""
    if not side.args.resolved:
        return ()
    typed = typed_flags(list(side.args.argv))
    found = []
    for name, label, names in FIELDS:
        value = _resolved(side, name)
        flag, as_typed = typed.get(name, (None, None))
        if value is None or (as_typed is not None and as_typed == str(value)):
            continue
        line = explaining(lines, names, value)
        if line is not None:
            found.append(Said(name, label, value, as_typed,
                              flag.option if flag else "--" + name.replace("_", "-"),
                              _RECORD_HEAD.sub("", line, 1)))
    return tuple(found)
