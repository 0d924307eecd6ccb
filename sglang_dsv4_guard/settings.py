"""Settings from the environment or from ``install()``, each with the place it came from."""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from sglang_dsv4_guard.errors import SettingError

__all__ = ["ENV_AUTOSHARE", "ENV_LOG_FORMAT", "ENV_METRICS", "ENV_MODE", "LOG_FORMATS",
           "METRICS_CHOICES", "MODE_ACCEPTED", "Mode", "Setting", "Settings", "parse_mode",
           "settings_for", "settings_from_env"]

ENV_MODE = "SGLANG_DSV4_GUARD"
ENV_AUTOSHARE = "SGLANG_DSV4_GUARD_AUTOSHARE"
ENV_LOG_FORMAT = "SGLANG_DSV4_GUARD_LOG_FORMAT"
ENV_METRICS = "SGLANG_DSV4_GUARD_METRICS"

T = TypeVar("T")


class Mode(str, enum.Enum):
    """``off``: inert. ``on``: report, never change SGLang's verdict. ``strict``: also fail."""

    OFF = "off"
    ON = "on"
    STRICT = "strict"


_MODE_WORDS = {
    "": Mode.OFF, "0": Mode.OFF, "off": Mode.OFF, "false": Mode.OFF,
    "1": Mode.ON, "on": Mode.ON, "true": Mode.ON,
    "strict": Mode.STRICT,
}
_BOOL_WORDS = {"": False, "0": False, "off": False, "false": False,
               "1": True, "on": True, "true": True}
LOG_FORMATS = ("text", "json")
#: ``SGLANG_DSV4_GUARD_METRICS``: ``auto`` (the default) exports the guard's counts where the
#: server runs with SGLang's ``--enable-metrics``; ``on`` wherever SGLang's multiprocess
#: directory is set; ``off`` never (:mod:`sglang_dsv4_guard.metrics`).
METRICS_CHOICES = ("auto", "on", "off")
_METRICS_WORDS = {"": "auto", "auto": "auto", "1": "on", "on": "on", "true": "on",
                  "0": "off", "off": "off", "false": "off"}
# What a "must be one of" message lists: the tables' words, the empty one shown as unset.
MODE_ACCEPTED = tuple(word or "unset" for word in _MODE_WORDS)
_BOOL_ACCEPTED = tuple(word or "unset" for word in _BOOL_WORDS)


@dataclass(frozen=True)
class Setting(Generic[T]):
    """A value and where it came from ("environment variable X='v'", "default", ...)."""

    value: T
    source: str


@dataclass(frozen=True)
class Settings:
    """The guard's configuration."""

    mode: Setting[Mode]
    autoshare: Setting[bool]
    log_format: Setting[str]
    metrics: Setting[str] = Setting("auto", "default")


def parse_mode(value: str, variable: str = ENV_MODE) -> Mode:
    """``value`` as a mode; raises :class:`SettingError` naming ``variable``."""
    try:
        return _MODE_WORDS[value.strip().lower()]
    except KeyError:
        raise SettingError(variable, value, MODE_ACCEPTED, "the guard stays inert") from None


def _from_env(environ: Mapping[str, str], variable: str, table: Mapping[str, T], default: T,
              accepted: tuple[str, ...], consequence: str,
              problems: list[SettingError]) -> Setting[T]:
    raw = environ.get(variable)
    if raw is None:
        return Setting(default, "default")
    source = f"environment variable {variable}={raw!r}"
    try:
        return Setting(table[raw.strip().lower()], source)
    except KeyError:
        problems.append(SettingError(variable, raw, accepted, consequence))
        return Setting(default, f"default ({source} is not accepted)")


def settings_from_env(environ: Mapping[str, str] | None = None
                      ) -> tuple[Settings, list[SettingError]]:
    """Read all settings; bad values fall back to safe defaults and are returned as errors."""
    env = os.environ if environ is None else environ
    problems: list[SettingError] = []
    mode = _from_env(env, ENV_MODE, _MODE_WORDS, Mode.OFF, MODE_ACCEPTED,
                     "the guard stays inert", problems)
    autoshare = _from_env(env, ENV_AUTOSHARE, _BOOL_WORDS, False, _BOOL_ACCEPTED,
                          "auto-share stays off", problems)
    log_format = _from_env(env, ENV_LOG_FORMAT, {f: f for f in LOG_FORMATS}, "text",
                           ("unset", *LOG_FORMATS), "reports are logged as text", problems)
    metrics = _from_env(env, ENV_METRICS, _METRICS_WORDS, "auto",
                        tuple(word or "unset" for word in _METRICS_WORDS),
                        "the guard's metrics follow SGLang's --enable-metrics", problems)
    return Settings(mode, autoshare, log_format, metrics), problems


def settings_for(mode: str | Mode, autoshare: bool, log_format: str,
                 settings: Settings | None, metrics: str = "auto") -> Settings:
    """``settings`` if given, else ``install()``'s keywords checked (a
    :class:`SettingError` names a bad one and says nothing was installed)."""
    if settings is not None:
        return settings
    if metrics not in METRICS_CHOICES:
        raise SettingError("install(metrics=...)", metrics, METRICS_CHOICES,
                           "nothing was installed")
    chosen = parse_mode(mode.value if isinstance(mode, Mode) else str(mode), "install(mode=...)")
    if not isinstance(autoshare, bool):
        raise SettingError("install(autoshare=...)", autoshare, ("True", "False"),
                           "nothing was installed")
    if log_format not in LOG_FORMATS:
        raise SettingError("install(log_format=...)", log_format, LOG_FORMATS,
                           "nothing was installed")
    return Settings(Setting(chosen, f"install(mode={mode!r})"),
                    Setting(autoshare, f"install(autoshare={autoshare!r})"),
                    Setting(log_format, f"install(log_format={log_format!r})"),
                    Setting(metrics, f"install(metrics={metrics!r})"))
