"""Test helpers: a recording reporter and the unwrapped SGLang function."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import sglang.srt.disaggregation.utils as utils
from packaging.version import Version

from sglang_dsv4_guard.releases import installed_sglang_version

# Captured at import, before any test installs the guard (conftest asserts it is unpatched).
# Kept inside a dict: the guard rebinds every *module global* that holds the original.
_RAW = {"setup_state_kv_args": utils.setup_state_kv_args}


def UNWRAPPED(*args: Any, **kwargs: Any) -> Any:
    """SGLang's own setup_state_kv_args, whatever the guard has patched."""
    return _RAW["setup_state_kv_args"](*args, **kwargs)


def raw_setup_state_kv_args() -> Any:
    """The original function object, for identity assertions."""
    return _RAW["setup_state_kv_args"]


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """('ok', kv_args state) or ('raised', exception)."""
    from sglang_dsv4_guard.testing import new_kv_args

    kv = new_kv_args()
    try:
        fn(kv, *args, **kwargs)
    except Exception as exc:
        return "raised", exc
    return "ok", dict(vars(kv))


def fresh_python(code: str, *argv: str, env: dict[str, str] | None = None,
                 path_first: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter. The guard's and SGLang's plug-in variables are
    cleared, then ``env`` is applied; ``path_first`` goes first on ``PYTHONPATH``."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SGLANG_DSV4_GUARD", "SGLANG_PLUGINS"))}
    clean.update(env or {})
    if path_first is not None:
        clean["PYTHONPATH"] = os.pathsep.join(filter(None, [path_first,
                                                            clean.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code, *argv], env=clean, capture_output=True,
                          text=True, timeout=300, check=False)


# What each SGLang release does, written down from its sources independently of
# sglang_dsv4_guard.releases, so the matrix checks that module rather than trusting it.
def sglang_release() -> Version:
    """The SGLang release this test process imports."""
    version = installed_sglang_version()
    assert version is not None, "SGLang is not installed"
    return version


def checks_request_rows() -> bool:
    """0.5.23 added the target request window / draft SWA ring size to the geometry."""
    return sglang_release() >= Version("0.5.23")


def geometry_prefix() -> str:
    """The first words of SGLang's paged-geometry error on this release."""
    if checks_request_rows():
        return "DSV4 target and draft pools must share SWA geometry: "
    return "DSV4 target and draft pools must share paged SWA geometry: "


def skips_draft_block_on_npu() -> bool:
    """0.5.16 and 0.5.17 run the DSV4 draft block only when ``not is_npu()``."""
    return sglang_release() < Version("0.5.18")


def mapping_set_in_init() -> bool:
    """From 0.5.22 ``__init__`` sets ``full_to_swa_index_mapping = None``."""
    return sglang_release() >= Version("0.5.22")


def mori_send_parameters() -> int:
    """``MoriKVManager._send_swa_dsa_state``'s parameters, ``self`` included."""
    return 11 if sglang_release() >= Version("0.5.22") else 8


@contextlib.contextmanager
def guard_logs_off() -> Iterator[None]:
    """Silence the guard's logger for a block that fails on purpose many times."""
    logger = logging.getLogger("sglang_dsv4_guard")
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = False


class JsonLineFormatter(logging.Formatter):
    """An operator's JSON formatter (as python-json-logger does it): one JSON object per
    record, the message as text and every ``extra`` field as data."""

    _STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"level": record.levelname, "logger": record.name,
                               "message": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in self._STANDARD})
        return json.dumps(out, default=repr)


def fresh_install(mode: str, **kwargs: Any) -> None:
    """Install the guard from scratch, so a retried attempt (``CustomTestCase`` retries
    without ``setUp``) starts without the failed attempt's counts."""
    import sglang_dsv4_guard

    sglang_dsv4_guard.uninstall()
    sglang_dsv4_guard.install(mode, **kwargs)
