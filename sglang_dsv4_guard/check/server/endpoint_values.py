"""A derived server (:class:`~.derive.DerivedServer`) as the PD contract's :class:`Endpoint`.

The values shared by every row are set here; each row's own values (the KV cache dtype
string a decode compares, the state types a transfer sends ...) are added by the
function its module registers in :data:`CONTRIBUTORS`, so a value is derived in one
place only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sglang_dsv4_guard.check.offline.parse import parser_default
from sglang_dsv4_guard.check.server.derive import DerivedServer, attention_layout, page_size_source
from sglang_dsv4_guard.check.server.edit import typed_flags
from sglang_dsv4_guard.log import LOGGER_NAME
from sglang_dsv4_guard.pd.attention_tp import TYPED
from sglang_dsv4_guard.pd.endpoint import REFUSED, UNKNOWN, Endpoint, Value

__all__ = ["CONTRIBUTORS", "NotDerived", "endpoint_of", "field_source", "raw_field", "resolved_value",
           "typed_source", "typed_value"]

log = logging.getLogger(LOGGER_NAME)


class NotDerived(Exception):
    """Raised by a contributor whose values cannot be known for this server (the message,
    naming the flag or variable and its value, becomes an ``unknowns`` line as it is)."""

# Each takes a side and the values derived so far (no built-in one reads them) and returns
# values to add.
CONTRIBUTORS: list[Callable[[DerivedServer, dict[str, Value]], dict[str, Value]]] = []


def typed_value(side: DerivedServer, name: str) -> Any:
    """The field ``name`` as the line typed it (``True`` for a switch), ``None`` when the
    line does not type it."""
    typed = typed_flags(list(side.args.argv)).get(name)
    return None if typed is None else (typed[1] if typed[1] is not None else True)


def raw_field(side: DerivedServer, name: str) -> Any:
    """A field the contract's parse does not keep: the resolved ``ServerArgs``' own
    attribute (not its resolving view), else (resolution did not complete) its
    :func:`typed_value`."""
    if side.args.server_args is not None:
        return getattr(side.args.server_args, name, None)
    return typed_value(side, name)


def resolved_value(side: DerivedServer, name: str, default: Any) -> Any:
    """The field ``name`` through the resolved ``ServerArgs``' resolving view (a model
    override's value), else its :func:`typed_value`, else the release parser's default
    for it (``default`` when that is ``None``)."""
    if side.args.server_args is not None:
        return side.args.resolved_field(name, default)
    typed = typed_value(side, name)
    if typed is not None:
        return typed
    found = parser_default(name)
    return default if found is None else found


def field_source(side: DerivedServer, field: str, option: str | None = None) -> str:
    """``server flag OPTION V`` when the line typed it, else the release's resolution;
    ``option`` is the field's own spelling (``--tp-size`` for ``tp_size``) unless given."""
    option = option or "--" + field.replace("_", "-")
    typed = side.args.typed.get(field)
    if field in typed_flags(list(side.args.argv)):
        return f"server flag {option} {typed}" if typed is not None else f"server flag {option}"
    if side.args.resolved:
        return f"SGLang's resolution (no {option} typed: the release's default)"
    return f"the parser's default (no {option} typed; resolution did not complete)"


def typed_source(side: DerivedServer, field: str, option: str | None = None) -> str:
    """:func:`field_source`, with the value as the line typed it."""
    typed = typed_flags(list(side.args.argv)).get(field)
    if typed is not None and typed[1] is not None:
        return f"server flag {typed[0].option} {typed[1]}"
    return field_source(side, field, option)


def _tokens_source(side: DerivedServer) -> str:
    """Where ``side``'s number of draft tokens comes from: typed, or SGLang's resolution."""
    typed = side.args.typed.get("speculative_num_draft_tokens")
    if typed is not None and typed == side.num_draft_tokens:
        return f"server flag --speculative-num-draft-tokens {typed}"
    if not side.args.resolved:
        return "server flag --speculative-num-draft-tokens (not typed: None, as parsed)"
    return ("SGLang's resolution of the speculative flags" + (
        f" (--speculative-num-draft-tokens {typed} typed)" if typed is not None else
        " (--speculative-num-draft-tokens not typed)"))


def _base(side: DerivedServer) -> dict[str, Value]:
    a = side.args
    tp_source = field_source(side, "tp_size")
    layout = attention_layout(side)
    return {
        "transfer_backend": Value(side.transfer_backend,
                                  field_source(side, "disaggregation_transfer_backend")),
        "attn_tp_size": Value(side.attn_tp_size, "the release's compute_dp_attention_world_info "
                              f"on --tp-size/--dp-size/--attn-*-size ({tp_source})"),
        "attn_dp_size": Value(side.attn_dp_size, "the release's compute_dp_attention_world_info"),
        "attn_cp_size": Value(a.get("attn_cp_size") or 1, field_source(side, "attn_cp_size")),
        "pp_size": Value(a.get("pp_size") or 1, field_source(side, "pp_size")),
        "tp_size": Value(a.get("tp_size") or 1, tp_source),
        "dp_size": Value(layout.dp_size, field_source(side, "dp_size")),
        "enable_dp_attention": Value(layout.dp_attention, field_source(side, "enable_dp_attention")),
        TYPED: Value(frozenset(typed_flags(list(a.argv))), "the launch line"),
        REFUSED: Value(a.resolution_error is not None, "SGLang's resolution of the line"),
        "enable_unified_memory": Value(bool(raw_field(side, "enable_unified_memory")),
                                       field_source(side, "enable_unified_memory")),
        "page_size": Value(side.page_size, page_size_source(side)),
        "is_mla_backend": Value(side.model.uses_mla_pool,
                                f"{side.model.path}/config.json: attention "
                                f"{side.model.attention_arch}"
                                + (" (DeepSeek-V4 counts as MLA)" if side.model.is_dsv4 else "")),
        "architecture": Value(side.model.architecture,
                              f"{side.model.path}/config.json architectures"),
        "is_hybrid_swa": Value(side.model.is_hybrid_swa,
                               f"SGLang's ModelConfig on {side.model.path}/config.json"),
        "is_dsv4": Value(side.model.is_dsv4, f"{side.model.path}/config.json"),
        "speculative_algorithm": Value(side.speculative_algorithm,
                                       field_source(side, "speculative_algorithm")),
        "speculative_num_draft_tokens": Value(side.num_draft_tokens, _tokens_source(side)),
        "model_path": Value(str(a.get("model_path")), field_source(side, "model_path")),
        "draft_model_path": Value(
            str(a.get("speculative_draft_model_path") or a.get("model_path"))
            if side.speculative_algorithm else None,
            "server flag --speculative-draft-model-path (the target's path when not given)"),
        "unified_kv": Value(side.unified_kv, "the server's environment"),
    }


def endpoint_of(side: DerivedServer) -> Endpoint:
    """The PD contract's view of ``side``: shared values, then every contributor's.

    Each contributor runs on its own: one that raises adds none of its values (the rows
    that read them find them not known and say so) and a note naming it and its error,
    never the end of ``check``."""
    values = _base(side)
    notes: list[str] = []
    for contribute in CONTRIBUTORS:
        try:
            values.update(contribute(side, dict(values)))
        except NotDerived as exc:
            notes.append(f"{side.role}: {exc}")
        except Exception as exc:  # our bug: its values are unknown, the others still come
            name = f"{contribute.__module__}.{contribute.__qualname__}"
            log.warning("check: the endpoint contributor %s failed on the %s server (a guard "
                        "bug; please report it): %s: %s", name, side.role,
                        type(exc).__name__, exc, exc_info=True)
            notes.append(f"{side.role}: the values of {name} were not derived "
                         f"({type(exc).__name__}: {exc}); the rows that read them are not "
                         "judged (a guard bug, please report it)")
    for name in values.get(UNKNOWN, Value((), "")).value:  # not known: left out
        values.pop(name, None)
    return Endpoint(side.role, values, tuple(notes), dict(side.args.env))
