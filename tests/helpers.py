"""Test helpers: a recording reporter and the unwrapped SGLang function."""

from __future__ import annotations

from typing import Any

import sglang.srt.disaggregation.utils as utils

from sglang_dsv4_guard import Report, hookimpl
from sglang_dsv4_guard.lifecycle import installation

# Captured at import, before any test installs the guard (conftest asserts it is unpatched).
# Kept inside a dict: the guard rebinds every *module global* that holds the original.
_RAW = {"setup_state_kv_args": utils.setup_state_kv_args}


def UNWRAPPED(*args: Any, **kwargs: Any) -> Any:
    """SGLang's own setup_state_kv_args, whatever the guard has patched."""
    return _RAW["setup_state_kv_args"](*args, **kwargs)


def raw_setup_state_kv_args() -> Any:
    """The original function object, for identity assertions."""
    return _RAW["setup_state_kv_args"]


class Recorder:
    """A third-party-style reporter that keeps every report it is handed."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    @hookimpl
    def sglang_dsv4_guard_report(self, report: Report) -> None:
        self.reports.append(report)

    @property
    def codes(self) -> list[str]:
        return [code for r in self.reports for code in r.codes]


def record() -> Recorder:
    """Register a Recorder on the installed guard."""
    current = installation()
    assert current is not None, "install the guard first"
    recorder = Recorder()
    current.runtime.plugins.pm.register(recorder, name=f"recorder-{id(recorder)}")
    return recorder


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """('ok', kv_args state) or ('raised', exception)."""
    from sglang_dsv4_guard.scenarios import new_kv_args

    kv = new_kv_args()
    try:
        fn(kv, *args, **kwargs)
    except Exception as exc:
        return "raised", exc
    return "ok", dict(vars(kv))
