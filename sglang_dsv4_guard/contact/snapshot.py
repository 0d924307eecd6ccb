"""Plain values of decode's first contact, read once SGLang has raised.

The only module of :mod:`sglang_dsv4_guard.contact` that reads SGLang's objects: the live
decode manager (``self`` of ``CommonKVManager.try_ensure_parallel_info``) and the
``PrefillServerInfo`` SGLang built from the prefill's ``/route`` answer, which is the
local ``info`` of SGLang's own frame on the raised exception's traceback: exactly what
SGLang compared, without a second request. A release whose frame holds no such local
gives ``prefill=None`` (the prefill's values are then unknown, and the report says so).
Checks see :class:`ContactSnapshot`, never a manager.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from sglang_dsv4_guard.host import server
from sglang_dsv4_guard.host.releases import HostProfile
from sglang_dsv4_guard.host.targets import (
    CONTACT_INFO_FIELDS,
    CONTACT_MANAGER_ATTRS,
    PD_COMMON_MODULE,
    PD_FIRST_CONTACT,
)
from sglang_dsv4_guard.peers.snapshot import state_names

__all__ = ["ContactContext", "ContactSnapshot", "Seen", "prefill_info", "snapshot_contact"]

#: One server's values: endpoint name -> (value, where it comes from).
Seen = Mapping[str, tuple[Any, str]]
_MISSING = object()
# The decode-side flag behind each manager value, quoted with this server's resolved
# value (host/server.py) where SGLang published it.
_FIELDS = {"page_size": "page_size", "kv_cache_dtype_str": "kv_cache_dtype",
           "pp_size": "pp_size", "dcp_size": "dcp_size", "attn_cp_size": "attn_cp_size"}
# A release whose manager lacks one of these compares no such value: its neutral one.
_ABSENT = {"dcp_size": 1, "attn_dp_size": 1, "is_hybrid_mla_backend": False,
           "kv_layout": None, "dsv41_spec_layout": None,
           "enable_all_cp_ranks_for_transfer": False}


@dataclass(frozen=True)
class ContactSnapshot:
    """Both servers at decode's first contact, and what SGLang raised.

    ``prefill`` is ``None`` when the prefill's values could not be read from SGLang's
    frame. ``message`` and ``kind`` are SGLang's error; ``bootstrap_addr`` the prefill's
    bootstrap address the decode asked."""

    bootstrap_addr: str
    decode: Seen
    prefill: Seen | None
    message: str
    kind: str


@dataclass(frozen=True)
class ContactContext:
    """The decode server's side: its release profile, mode and transfer backend."""

    profile: HostProfile
    mode: str = "on"
    transfer_backend: str = "?"

    def describe(self, bootstrap_addr: str) -> dict[str, str]:
        """The context as strings, for reports."""
        return {"function": PD_FIRST_CONTACT.qualname, "role": "decode",
                "caller": "decode server (its scheduler's first contact with a prefill)",
                "peer": f"prefill bootstrap {bootstrap_addr}",
                "sglang": self.profile.name, "mode": self.mode}


def _read(obj: object, dotted: str) -> Any:
    value: Any = obj
    for part in dotted.split("."):
        value = getattr(value, part, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


def _decode_source(name: str, dotted: str) -> str:
    where = f"this decode server: {PD_FIRST_CONTACT.qualname.split('.')[0]}.{dotted}"
    field = _FIELDS.get(name)
    if field is None:
        return where
    resolved = server.server_value(field)
    flag = "--" + field.replace("_", "-")
    return where + (f" ({flag} resolved to {resolved!r} in this process)"
                    if resolved is not None else f" ({flag}, as this server resolved it)")


def _decode(manager: object) -> dict[str, tuple[Any, str]]:
    out: dict[str, tuple[Any, str]] = {}
    for name, dotted in CONTACT_MANAGER_ATTRS:
        value = _read(manager, dotted)
        if value is _MISSING and name == "kv_cache_dtype_str":  # 0.5.16 compares this
            dotted = "server_args.kv_cache_dtype"
            value = _read(manager, dotted)
        if value is _MISSING:
            if name in _ABSENT:
                out[name] = (_ABSENT[name], "this release's manager has no "
                             f"{dotted}: it compares no such value")
            continue
        if name == "state_types":
            value = state_names(value)
        out[name] = (value, _decode_source(name, dotted))
    return out


def prefill_info(traceback: TracebackType | None) -> object | None:
    """The ``PrefillServerInfo`` SGLang built in the raising call: the local ``info`` of
    SGLang's ``try_ensure_parallel_info`` frame on ``traceback``, or ``None``."""
    while traceback is not None:
        frame = traceback.tb_frame
        if (frame.f_code.co_name == PD_FIRST_CONTACT.attr
                and frame.f_globals.get("__name__") == PD_COMMON_MODULE):
            info = frame.f_locals.get("info")
            if info is not None and dataclasses.is_dataclass(info):
                return info
        traceback = traceback.tb_next
    return None


def _prefill(info: object, addr: str) -> dict[str, tuple[Any, str]]:
    names = {f.name for f in dataclasses.fields(info)}  # type: ignore[arg-type]
    return {name: (getattr(info, field),
                   f"the prefill's bootstrap server {addr} (/route answer: "
                   f"PrefillServerInfo.{field}, as the prefill's ranks registered it)")
            for name, field in CONTACT_INFO_FIELDS if field in names}


def snapshot_contact(manager: object, bootstrap_addr: str, error: BaseException
                     ) -> ContactSnapshot:
    """Both servers' values at the failed first contact (see the module docstring)."""
    info = prefill_info(error.__traceback__)
    return ContactSnapshot(
        bootstrap_addr=str(bootstrap_addr), decode=_decode(manager),
        prefill=None if info is None else _prefill(info, str(bootstrap_addr)),
        message=str(error) or type(error).__name__, kind=type(error).__name__)
