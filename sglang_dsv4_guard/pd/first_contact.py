"""Decode's first contact with the prefill, run as SGLang runs it.

The release's own ``CommonKVManager.try_ensure_parallel_info`` (and the
``_resolve_rank_mapping`` it calls) runs on a bare manager (``object.__new__``: its
constructor binds sockets and starts threads) whose attributes are the decode server's
values; the bootstrap server's ``/route`` answer is the prefill's values as its ranks
publish them, built as the release's ``PrefillServerInfo`` fields, serialised as JSON
and handed back by a local answerer that replaces the ``requests`` the conn module uses
for the duration of the call (no socket is opened).

SGLang stops at its first mismatch. To report every one, the condition that fired is
identified by its message (kept as SGLang wrote it), neutralised on the copies (the
decode takes the prefill's value for that field, or the prefill's answer the value the
condition needs) and the real function called again, at most :data:`MAX_CALLS` times.
The pair is an error exactly when SGLang's first call raises.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sglang_dsv4_guard.findings import Finding, Phase, Severity
from sglang_dsv4_guard.host.targets import (
    PD_BASE_MODULE,
    PD_COMMON_MANAGER,
    PD_COMMON_MODULE,
    PD_FAKE_MANAGER,
    PD_FIRST_CONTACT,
    PD_SERVER_INFO,
    PD_STATE_TYPE,
)
from sglang_dsv4_guard.patching import WRAPPER_MARK
from sglang_dsv4_guard.pd.contact_fixes import contact_fixes
from sglang_dsv4_guard.pd.endpoint import Endpoint, pair_finding
from sglang_dsv4_guard.pd.send_extra import MINIMAX_CODE
from sglang_dsv4_guard.pd.when import when_of

__all__ = ["BOOTSTRAP_ADDRESS", "DSPARK_CODE", "DTYPE_CODE", "LAYOUT_CODE", "MAX_CALLS",
           "PAGE_CODE", "Contact", "Raised", "contact_findings", "first_contact", "route_answer",
           "rule_for"]

MAX_CALLS = 12
# The codes of its conditions (the modules that name one import it from here).
PAGE_CODE, DTYPE_CODE, LAYOUT_CODE, DSPARK_CODE, MXFP8_CODE, DCP_CODE, CP_CODE = (
    "DSV4G022", "DSV4G030", "DSV4G031", "DSV4G032", "DSV4G033", "DSV4G034", "DSV4G035")
UNMAPPED_CODE = CP_CODE
# Per code, the only server whose neutral value (1 / off) the condition reads.
_READS = {DCP_CODE: {"dcp_size": "decode", "attn_cp_size": "prefill",
                     "enable_kv_cache_sharding": "prefill"},
          CP_CODE: {"attn_cp_size": "decode", "enable_kv_cache_sharding": "prefill"}}
#: The prefill's bootstrap address the decode's copies name; never resolved (answered locally).
BOOTSTRAP_ADDRESS = "prefill-bootstrap.check.invalid:8998"
# Values a running server always has as numbers: ``None`` here means not derived.
_NUMBERS = ("page_size", "attn_tp_size", "attn_cp_size", "attn_dp_size", "pp_size", "dcp_size")


@dataclass(frozen=True)
class Raised:
    """One condition SGLang's first contact raised: its code, the endpoint values that
    decide it, SGLang's exact message and exception type."""

    code: str
    fields: tuple[str, ...]
    message: str
    kind: str


@dataclass(frozen=True)
class Contact:
    """What the real first contact did on the pair: the conditions it raised, in order
    (the first is SGLang's own verdict), what could not be judged, and how many calls ran."""

    raised: tuple[Raised, ...]
    unknowns: tuple[str, ...]
    calls: int

    @property
    def first(self) -> Raised | None:
        """SGLang's own first raise, ``None`` when the first contact succeeds."""
        return self.raised[0] if self.raised else None


Neutraliser = Callable[[Any, dict[str, Any]], None]


def _decode_answered(name: str) -> Neutraliser:
    def apply(manager: Any, data: dict[str, Any]) -> None:
        setattr(manager, name, data.get(name))
    return apply


def _decode_value(name: str, value: Any) -> Neutraliser:
    def apply(manager: Any, data: dict[str, Any]) -> None:
        setattr(manager, name, value)
    return apply


def _page(manager: Any, data: dict[str, Any]) -> None:
    manager.kv_args.page_size = data.get("page_size")


def _dtype(manager: Any, data: dict[str, Any]) -> None:
    manager.kv_cache_dtype_str = data.get("kv_cache_dtype")
    manager.server_args.kv_cache_dtype = data.get("kv_cache_dtype")


def _drop_states(*values: str) -> Neutraliser:
    def apply(manager: Any, data: dict[str, Any]) -> None:
        manager.kv_args.state_types = [s for s in manager.kv_args.state_types
                                       if getattr(s, "value", s) not in values]
    return apply


def _no_dspark(manager: Any, data: dict[str, Any]) -> None:
    manager.dsv41_spec_layout = None
    data.pop("dsv41_spec_layout", None)


def _answer(key: str, value: Any) -> Neutraliser:
    def apply(manager: Any, data: dict[str, Any]) -> None:
        data[key] = value
    return apply


# (words of SGLang's message, code, the endpoint values that decide it, neutraliser).
_RULES: tuple[tuple[str, str, tuple[str, ...], Neutraliser], ...] = (
    ("Page size mismatch", PAGE_CODE, ("page_size",), _page),
    ("KV cache dtype mismatch", DTYPE_CODE, ("kv_cache_dtype_str",), _dtype),
    ("MiniMax sparse PD requires matching attention TP", MINIMAX_CODE,
     ("attn_tp_size", "state_types"), _drop_states("minimax_index_k")),
    ("KV layout mismatch", LAYOUT_CODE, ("kv_layout",), _decode_answered("kv_layout")),
    ("DSpark PD layout mismatch", DSPARK_CODE, ("dsv41_spec_layout",),
     _decode_answered("dsv41_spec_layout")),
    ("DSpark PD requires the same TP size", DSPARK_CODE, ("attn_tp_size", "attn_cp_size"),
     _no_dspark),
    ("different attention TP sizes with MXFP8", MXFP8_CODE, ("attn_tp_size", "state_types"),
     _drop_states("block_scale", "block_scale_swa")),
    ("PD decode DCP requires an MLA or hybrid-MLA KV pool", DCP_CODE,
     ("dcp_size", "is_mla_backend"), _decode_value("is_hybrid_mla_backend", True)),
    ("PD decode DCP currently requires prefill attention CP", DCP_CODE,
     ("dcp_size", "attn_cp_size"), _answer("attn_cp_size", 1)),
    # the decode without DCP: the prefill's sharding still counts
    ("PD decode DCP does not support a prefill with --enable-kv-cache-sharding", DCP_CODE,
     ("dcp_size", "enable_kv_cache_sharding"), _decode_value("dcp_size", 1)),
    ("MLA KV cache sharding requires equal", CP_CODE,
     ("attn_tp_size", "enable_kv_cache_sharding"), _answer("enable_kv_cache_sharding", False)),
    ("Decode cp size", CP_CODE, ("attn_cp_size",), _decode_value("attn_cp_size", 1)),
    ("When prefill cp size is 1", CP_CODE, ("attn_cp_size",), _decode_value("attn_cp_size", 1)),
    ("Decode pp size", CP_CODE, ("pp_size",), _decode_answered("pp_size")),
)


def _rule(message: str) -> tuple[str, tuple[str, ...], Neutraliser | None]:
    for words, code, fields, neutralise in _RULES:
        if words in message:
            return code, fields, neutralise
    return UNMAPPED_CODE, (), None


def rule_for(message: str) -> tuple[str, tuple[str, ...]]:
    """The code and the endpoint values that decide the condition SGLang's first contact
    raised with ``message`` (:data:`UNMAPPED_CODE` and none for a message not mapped)."""
    return _rule(message)[:2]


class _LocalBootstrap:
    """Stands for ``requests`` in the conn module: a GET answers ``data`` as JSON."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def get(self, url: str, *args: Any, **kwargs: Any) -> SimpleNamespace:
        body = json.dumps(self.data)
        return SimpleNamespace(status_code=200, text="", json=lambda: json.loads(body))

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"requests.{name} (check answers only the bootstrap GET locally)")


@contextmanager
def _answered(module: Any, data: dict[str, Any]) -> Iterator[None]:
    saved, module.requests = module.requests, _LocalBootstrap(data)
    try:
        yield
    finally:
        module.requests = saved


def _state_types(endpoint: Endpoint, state_type: Any) -> list[Any]:
    out = []
    for item in endpoint.get("state_types", ()) or ():
        value = getattr(item, "value", item)
        try:
            out.append(state_type(value))
        except ValueError:
            out.append(value)  # a state type this release does not name: kept as read
    return out


def _value(endpoint: Endpoint, other: Endpoint, name: str, default: Any,
           missing: list[str]) -> Any:
    """``endpoint``'s value, else the other server's (a value not derived never makes a
    mismatch; the unknowns say so), else ``default``."""
    if endpoint.has(name) and (endpoint.get(name) is not None or name not in _NUMBERS):
        return endpoint.get(name)
    if not endpoint.explained(name):  # else its unknowns line is said once, for the server
        missing.append(f"{endpoint.role} {name}")
    return other.get(name, default)


def _manager(cls: Any, decode: Endpoint, prefill: Endpoint, state_type: Any,
             missing: list[str]) -> Any:
    def value(name: str, default: Any) -> Any:
        return _value(decode, prefill, name, default, missing)

    manager = object.__new__(cls)
    dtype = value("kv_cache_dtype_str", "auto")
    values = {
        "prefill_info_table": {},
        "kv_args": SimpleNamespace(page_size=value("page_size", None), engine_rank=0,
                                   pp_rank=0, system_dp_rank=0,
                                   state_types=_state_types(decode, state_type)),
        "kv_cache_dtype_str": dtype,
        "server_args": SimpleNamespace(kv_cache_dtype=dtype),
        "attn_tp_size": value("attn_tp_size", 1), "attn_tp_rank": 0,
        "attn_cp_size": value("attn_cp_size", 1), "attn_cp_rank": 0,
        "attn_dp_size": value("attn_dp_size", 1), "attn_dp_rank": 0,
        "pp_size": value("pp_size", 1), "pp_rank": 0,
        "dcp_size": value("dcp_size", 1), "dcp_rank": 0,
        "is_mla_backend": bool(value("is_mla_backend", False)),
        "is_hybrid_mla_backend": bool(value("is_hybrid_mla_backend", False)),
        "kv_layout": value("kv_layout", None),
        "dsv41_spec_layout": value("dsv41_spec_layout", None),
        "enable_all_cp_ranks_for_transfer": bool(
            decode.get("enable_all_cp_ranks_for_transfer", False)),
    }
    for name, item in values.items():
        setattr(manager, name, item)
    return manager


def route_answer(prefill: Endpoint, decode: Endpoint, info_cls: Any,
                 missing: list[str]) -> dict[str, Any]:
    """The bootstrap server's ``/route`` answer to decode's first GET: the release's
    ``PrefillServerInfo`` fields, valued as the prefill's rank 0 registered them."""
    def value(name: str, default: Any) -> Any:
        return _value(prefill, decode, name, default, missing)

    known: dict[str, Any] = {
        "attn_tp_size": value("attn_tp_size", 1), "attn_cp_size": value("attn_cp_size", 1),
        "dp_size": value("attn_dp_size", 1), "pp_size": value("pp_size", 1),
        "page_size": value("page_size", None),
        "kv_cache_dtype": value("kv_cache_dtype_str", "auto"),
        "follow_bootstrap_room": bool(prefill.get("follow_bootstrap_room", True)),
        "enable_dsa_cache_layer_split": bool(value("enable_dsa_cache_layer_split", False)),
        "dsv41_spec_layout": value("dsv41_spec_layout", None),
        "kv_layout": value("kv_layout", None),
        "decode_allocation_policy": prefill.get("decode_allocation_policy", "early"),
        "enable_kv_cache_sharding": bool(value("enable_kv_cache_sharding", False)),
        "prefill_http_port": None,
    }
    data: dict[str, Any] = {}
    for field in dataclasses.fields(info_cls):
        if field.name in known:
            data[field.name] = known[field.name]
        elif field.default is dataclasses.MISSING and \
                field.default_factory is dataclasses.MISSING:
            raise LookupError(f"the release's {PD_SERVER_INFO} requires {field.name!r}, "
                              "which this check does not derive")
    answer: dict[str, Any] = json.loads(json.dumps(data))  # as the HTTP answer carries it
    return answer


def first_contact(prefill: Endpoint, decode: Endpoint, release: str) -> Contact:
    """The release's real first contact of ``decode`` with ``prefill``, repeated with each
    raised condition neutralised so that every mismatch is found."""
    module = importlib.import_module(PD_COMMON_MODULE)  # unscanned: SGLang
    cls = getattr(module, PD_COMMON_MANAGER)
    # SGLang's own function, also when the guard wraps it (run time: the failure path
    # runs this on copies, never through the wrapper again).
    function = getattr(cls, PD_FIRST_CONTACT.attr)
    function = getattr(function, WRAPPER_MARK, function)
    state_type = getattr(importlib.import_module(  # unscanned: SGLang
        PD_BASE_MODULE), PD_STATE_TYPE)
    missing: list[str] = []
    unknowns: list[str] = []
    try:
        data = route_answer(prefill, decode, getattr(module, PD_SERVER_INFO), missing)
    except LookupError as exc:
        return Contact((), (f"decode's first contact ({release}): not judged: {exc}",), 0)
    manager = _manager(cls, decode, prefill, state_type, missing)
    if not decode.has("state_types"):
        unknowns.append(f"decode's first contact ({release}): the decode's state types are "
                        f"not derived, so its MXFP8 and MiniMax conditions ({MXFP8_CODE}, "
                        f"{MINIMAX_CODE}) ran as if it had none")
    raised: list[Raised] = []
    calls = 0
    with _answered(module, data):
        while calls < MAX_CALLS:
            calls += 1
            manager.prefill_info_table = {}
            try:
                accepted = function(manager, BOOTSTRAP_ADDRESS)
            except (AttributeError, TypeError) as exc:
                unknowns.append(f"decode's first contact ({release}): not judged further: "
                                f"SGLang's {PD_FIRST_CONTACT.qualname} read what this check "
                                f"does not set ({type(exc).__name__}: {exc})")
                break
            except Exception as exc:
                message = str(exc)
                code, fields, neutralise = _rule(message)
                repeated = any(r.message == message for r in raised)
                if not repeated:
                    raised.append(Raised(code, fields, message, type(exc).__name__))
                if neutralise is None or repeated:
                    if neutralise is None:
                        unknowns.append(f"decode's first contact ({release}): SGLang "
                                        f"raised a condition this check does not map to a "
                                        f"value ({message!r}); the conditions after it "
                                        "were not run")
                    break
                neutralise(manager, data)
                continue
            if not accepted:
                unknowns.append(f"decode's first contact ({release}): not judged: SGLang's "
                                f"{PD_FIRST_CONTACT.qualname} did not accept check's local "
                                "bootstrap answer (its log line says why)")
            break
    if missing:
        unknowns.append(f"decode's first contact ({release}): "
                        f"{', '.join(dict.fromkeys(missing))} not derived; those conditions "
                        "ran with the other server's value")
    return Contact(tuple(raised), tuple(unknowns), calls)


def _finding(raised: Raised, index: int, prefill: Endpoint, decode: Endpoint) -> Finding:
    order = ("SGLang raises this first: its message is the one the decode server logs"
             if index == 0 else
             "SGLang would raise this once the conditions before it are fixed (it stops "
             "at its first mismatch)")
    return pair_finding(
        raised.code, "decode's first contact with the prefill", (prefill, decode),
        raised.fields,
        (order, f"SGLang's own {PD_FIRST_CONTACT.qualname} raised {raised.kind} on the values "
                "both launch lines imply (the prefill's as its bootstrap server answers them)"),
        contact_fixes(_READS.get(raised.code, {}), raised.fields, prefill, decode),
        raised.message, when_of(Phase.FIRST_CONTACT, str(decode.get("transfer_backend", "?"))),
        Severity.ERROR, unknown_too=True)


def contact_findings(prefill: Endpoint, decode: Endpoint, release: str
                     ) -> tuple[list[Finding], list[str]]:
    """The first contact's findings (one per condition SGLang raises) and unknowns."""
    fake = PD_FAKE_MANAGER  # the fake backend's manager lacks the first-contact method
    cls = (getattr(importlib.import_module(fake.module), fake.qualname, None)  # unscanned: SGLang
           if str(decode.get("transfer_backend", "?")) == "fake" else None)
    if cls is not None and not hasattr(cls, PD_FIRST_CONTACT.attr):
        return [], [f"decode: its transfer backend's manager ({fake}) has no "
                    f"{PD_FIRST_CONTACT.attr}: it makes no first contact with the prefill, "
                    f"so the first-contact conditions "
                    f"({', '.join(dict.fromkeys(rule[1] for rule in _RULES))}) are not judged"]
    contact = first_contact(prefill, decode, release)
    return ([_finding(r, i, prefill, decode) for i, r in enumerate(contact.raised)],
            list(contact.unknowns))
