"""One server's launch arguments, read by the installed SGLang release's own parser.

``ServerArgs.add_cli_args(parser)`` is the release's flag table. Then the release's own
resolution runs (:func:`~.resolve.resolve_on`) as the server's device: the line's
``--device``, else ``cuda`` (a PD deployment runs on GPUs; resolving as ``cuda`` needs
none), with the server's environment, on what :func:`_resolving` leaves of the line, and
with what it reads of this machine answered for the server's host (:mod:`.machine`; each
answer is a note, said in ``unknowns``).

A refusal is the server's (``resolution_error``, :mod:`.refusal`'s finding) unless this
machine caused it (``machine_refusal``, :func:`machine_cause`, an ``unknowns`` line).
Either way the flags are then used as parsed, with only the release's rewrite of the
deprecated ``--dp-size N --enable-dp-attention`` applied, where the release has it
(``arg_groups.parallel_hook.handle_deprecated_dp_attention``).
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import re
import shlex
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from sglang_dsv4_guard.check.offline.causes import joined, machine_cause
from sglang_dsv4_guard.check.offline.config_limits import config_limit_error
from sglang_dsv4_guard.check.offline.machine import fact_line
from sglang_dsv4_guard.check.offline.probes import Device, devices_for
from sglang_dsv4_guard.check.offline.remote_code import missing_code
from sglang_dsv4_guard.check.offline.resolve import offline_env, resolve_on, resolving_view
from sglang_dsv4_guard.check.offline.standins import without_host_files

__all__ = ["MAX_ARGS_CHARS", "MAX_ARGS_TOKENS", "CheckInputError", "LaunchArgs",
           "machine_cause", "offline_env", "parse_env", "parse_launch", "parser_default",
           "release_parser", "resolve_as", "server_parser", "shell_settings", "strip_launcher",
           "without_shell_settings"]

# ServerArgs fields the check reads; a release without one reads as None.
FIELDS = (
    "model_path", "tp_size", "dp_size", "attn_dp_size", "attn_cp_size", "pp_size",
    "enable_dp_attention", "page_size", "disaggregation_mode",
    "disaggregation_transfer_backend", "speculative_algorithm",
    "speculative_draft_model_path", "speculative_num_draft_tokens",
    "speculative_num_steps", "disable_hybrid_swa_memory", "trust_remote_code",
)
# Positive integers, with the flag that sets each.
_POSITIVE = (("tp_size", "--tp-size"), ("dp_size", "--dp-size"),
             ("attn_dp_size", "--attn-dp-size"), ("attn_cp_size", "--attn-cp-size"),
             ("pp_size", "--pp-size"), ("page_size", "--page-size"),
             ("speculative_num_draft_tokens", "--speculative-num-draft-tokens"),
             ("speculative_num_steps", "--speculative-num-steps"))
# Past any real value of these (a server's GPU count, a page, draft tokens): a larger one is
# a typo, and SGLang's own arithmetic on it overflows (a C ssize_t) in the layout compare.
MAX_PARALLEL = 65_536


class CheckInputError(ValueError):
    """Input ``check`` cannot read: the argument at fault, its value and what is accepted."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {joined(message)}")
        self.argument = argument


@dataclass(frozen=True)
class LaunchArgs:
    """One server's flags: as typed (``typed``, the parser's namespace) and after the
    release's deprecated-spelling rewrite (``values``); its env and role."""

    role: str
    argv: tuple[str, ...]
    values: Mapping[str, Any]
    typed: Mapping[str, Any]
    env: Mapping[str, str]
    deprecated: tuple[str, ...]
    resolved_by: str
    resolution_error: str | None = None
    # The resolved ServerArgs (None when resolution did not complete) and the device it ran as.
    server_args: Any = None
    resolved_device: str = "cuda"
    # A refusal this machine caused (a missing package, the network, a GPU probe): an unknown.
    machine_refusal: str | None = None
    # What the check did not do for these flags (a ModelScope fetch), said in ``unknowns``.
    notes: tuple[str, ...] = ()
    # The GPU SGLang's device probes answered as during resolution (None: this machine's
    # answers), the GPU the server was named to run on (``check --gpu``).
    gpu: Device | None = None

    @property
    def devices(self) -> tuple[Device, ...]:
        """The GPUs this server may have: the one it was named to run on, else each one
        SGLang tells apart for its ``--device`` (:func:`~.probes.devices_for`)."""
        return (self.gpu,) if self.gpu is not None else devices_for(self.resolved_device)

    @property
    def resolved(self) -> bool:
        """Whether the release's full resolution completed for these flags."""
        return self.server_args is not None

    def get(self, name: str) -> Any:
        """A parsed field, ``None`` when the release has no such field."""
        return self.values.get(name)

    def resolved_field(self, name: str, default: Any = None) -> Any:
        """Any ``ServerArgs`` field as the release's resolution left it (read through its
        resolving view from 0.5.22, where a model override's value lives), ``default``
        when resolution did not complete or the release has no such field."""
        if self.server_args is None:
            return default
        return getattr(resolving_view(self.server_args), name, default)


class _Refused(Exception):
    """SGLang's parser refused a line (``parse_launch`` names the server)."""


class _Parser(argparse.ArgumentParser):
    """The release's flag table; an error raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise _Refused(f"SGLang's parser: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _Refused(message or "the parser asked to exit")


@functools.lru_cache(maxsize=4)
def release_parser(server_args: type) -> _Parser:
    """The parser ``server_args.add_cli_args`` builds, once per process and release: it is
    a third of a check's time, and ``check --fix`` parses many lines. Parsing reads the
    parser and never changes it (SGLang's actions keep no state of their own)."""
    parser = _Parser(prog="ARGS", add_help=False)
    server_args.add_cli_args(parser)  # type: ignore[attr-defined]
    return parser


# Bounds on one server's environment items: far past any real one, and each is printed.
MAX_ENV_ITEMS = 256
MAX_ENV_VALUE_CHARS = 16 * 1024
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env(option: str, items: Sequence[str]) -> dict[str, str]:
    """``K=V`` strings into a mapping; a malformed item names ``option`` and the item: a
    name that is not a shell variable's, a value with control characters or past
    :data:`MAX_ENV_VALUE_CHARS`, more than :data:`MAX_ENV_ITEMS` items."""
    if len(items) > MAX_ENV_ITEMS:
        raise CheckInputError(option, f"{len(items)} variables; at most {MAX_ENV_ITEMS} are read")
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        shown = item if len(item) <= 200 else item[:200] + "..."
        if not sep or not _ENV_NAME.fullmatch(key):
            raise CheckInputError(option, "expected K=V with a variable name K (letters, digits "
                                          f"and _, not first a digit) (got {shown!r})")
        if len(value) > MAX_ENV_VALUE_CHARS:
            raise CheckInputError(option, f"{key}: {len(value)} characters; at most "
                                          f"{MAX_ENV_VALUE_CHARS} are read")
        if any(unicodedata.category(c) == "Cc" for c in value):
            raise CheckInputError(option, f"{key}: a value with control characters (got "
                                          f"{shown!r}); give the value as the server has it")
        env[key] = value
    return env


# Bounds on one server's ARGS: splitting is quadratic in shlex, and no launch line is near.
MAX_ARGS_CHARS = 64 * 1024
MAX_ARGS_TOKENS = 4096
_PYTHON = re.compile(r"python[0-9.]*")
_LAUNCHERS = "python[3[.x]] -m sglang.launch_server, or sglang serve"


def strip_launcher(option: str, argv: list[str]) -> list[str]:
    """Drop a launcher prefix: ``[/path/]python[3[.x]] -m sglang.launch_server``,
    ``-m sglang.launch_server`` or ``[/path/]sglang serve``."""
    head = os.path.basename(argv[0])
    if _PYTHON.fullmatch(head):
        if argv[1:3] != ["-m", "sglang.launch_server"]:
            raise CheckInputError(option, f"starts with {argv[0]!r} but not with "
                                          f"'-m sglang.launch_server' after it; give the "
                                          f"server's arguments (a launcher prefix accepted: "
                                          f"{_LAUNCHERS})")
        return argv[3:]
    if argv[:2] == ["-m", "sglang.launch_server"]:
        return argv[2:]
    if head == "sglang" and argv[1:2] == ["serve"]:
        return argv[2:]
    return argv


def _split(option: str, text: str) -> list[str]:
    if len(text) > MAX_ARGS_CHARS:
        raise CheckInputError(option, f"{len(text)} characters; at most {MAX_ARGS_CHARS} are "
                                      "read (one server's launch arguments)")
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        shown = text if len(text) <= 200 else text[:200] + "..."
        raise CheckInputError(option, f"cannot split the command line: {exc} (got {shown!r})") \
            from None
    if len(argv) > MAX_ARGS_TOKENS:
        raise CheckInputError(option, f"{len(argv)} arguments; at most {MAX_ARGS_TOKENS} are "
                                      "read (one server's launch arguments)")
    if argv:
        argv = strip_launcher(option, argv)
    if not argv:
        raise CheckInputError(option, "empty; give the server's launch arguments")
    for token in argv:
        if token in ("-h", "--help"):
            raise CheckInputError(option, f"{token} is not a server setting")
        if token == "--config" or token.startswith("--config="):
            raise CheckInputError(option, "--config (a YAML file of flags) is not read by "
                                          "check; give the flags on the command line")
    return argv


def _deprecated(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[str, ...]:
    used = []
    for token in argv:
        flag = token.split("=", 1)[0]
        action = parser._option_string_actions.get(flag)
        if action is not None and type(action).__name__.startswith("Deprecated"):
            used.append(flag)
    return tuple(used)


def shell_settings() -> list[str]:
    """This process's ``SGLANG_*`` and ``SGL_*`` variables, which configure neither server:
    not the guard's own (``SGLANG_DSV4_GUARD_*``) nor ``SGLANG_CACHE_DIR`` (a location; the
    check process points it into its scratch directory)."""
    return sorted(n for n in os.environ if n.startswith(("SGLANG_", "SGL_")) and not
                  n.startswith("SGLANG_DSV4_GUARD_") and n != "SGLANG_CACHE_DIR")


@contextmanager
def without_shell_settings() -> Iterator[list[str]]:
    """The block without :func:`shell_settings` (their names yielded), restored after: a
    server's SGLang environment is its ``--prefill-env`` / ``--decode-env`` only."""
    names = shell_settings()
    saved = {name: os.environ.pop(name) for name in names}
    try:
        yield names
    finally:
        os.environ.update(saved)


_TRUE = ("1", "true", "yes", "on")


def _without_modelscope(namespace: argparse.Namespace, env: Mapping[str, str]
                        ) -> tuple[dict[str, str], tuple[str, ...]]:
    """``env`` for resolution, and notes: a path that is not on this machine, under
    ``SGLANG_USE_MODELSCOPE``, would be fetched from ModelScope (``snapshot_download``);
    check fetches nothing, so resolution runs without the variable and the note names it."""
    value = env.get("SGLANG_USE_MODELSCOPE", "")
    if value.strip().lower() not in _TRUE:
        return dict(env), ()
    remote = [(flag, path) for flag, path in (
        ("--model-path", getattr(namespace, "model_path", None)),
        ("--tokenizer-path", getattr(namespace, "tokenizer_path", None)),
        ("--speculative-draft-model-path",
         getattr(namespace, "speculative_draft_model_path", None)))
        if path and not os.path.exists(str(path))]
    if not remote:
        return dict(env), ()
    named = ", ".join(f"{flag} {path!r}" for flag, path in remote)
    return {**env, "SGLANG_USE_MODELSCOPE": "false"}, (
        f"{named} is not on this machine, and SGLANG_USE_MODELSCOPE={value} makes SGLang "
        "download it from ModelScope; check downloads nothing, so SGLang's resolution ran "
        "without SGLANG_USE_MODELSCOPE",)


def _resolve_deprecated_dp(namespace: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The release's own rewrite of ``--enable-dp-attention``, where it has one."""
    values = {name: getattr(namespace, name, None) for name in FIELDS}
    try:
        from sglang.srt.arg_groups.parallel_hook import handle_deprecated_dp_attention
    except ImportError:
        return values, "the release's parser (no deprecated-DP rewrite in this release)"
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs.from_cli_args(namespace)
    handle_deprecated_dp_attention(server_args)
    view = resolving_view(server_args)
    for name in ("tp_size", "dp_size", "attn_dp_size", "attn_cp_size",
                 "enable_dp_attention"):
        values[name] = getattr(view, name, values[name])
    return values, ("the release's parser and its parallel_hook."
                    "handle_deprecated_dp_attention")


def _validate(option: str, values: Mapping[str, Any]) -> None:
    for name, flag in _POSITIVE:
        value = values.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_PARALLEL):
            raise CheckInputError(option, f"{flag} must be a positive integer of at most "
                                          f"{MAX_PARALLEL:,} (got {value!r})")
    tp = values.get("tp_size") or 1
    attn_dp = values.get("attn_dp_size") or 1
    if values.get("enable_dp_attention") and attn_dp == 1:
        attn_dp = values.get("dp_size") or 1
    cp = values.get("attn_cp_size") or 1
    # Kept although resolution refuses this too: there it is a bare AssertionError with no
    # message (0.5.23), and attention TP cannot be computed from the flags as parsed.
    if tp % (attn_dp * cp):
        raise CheckInputError(option, f"--tp-size {tp} is not divisible by the attention DP "
                                      f"size {attn_dp} times the attention CP size {cp}")
    for name, flag in (("model_path", "--model-path"),
                       ("speculative_draft_model_path", "--speculative-draft-model-path")):
        path = values.get(name)
        if name == "model_path" and not path:
            raise CheckInputError(option, "--model-path is required (a local directory with "
                                          "config.json)")
        if path and not os.path.isfile(os.path.join(str(path), "config.json")):
            raise CheckInputError(option, f"{flag}: no config.json in {str(path)!r} (give a "
                                          "local directory; weights are not needed)")
        refused = config_limit_error(str(path)) if path else None
        if refused is not None:
            raise CheckInputError(option, f"{flag}: {refused}")


def _resolving(namespace: argparse.Namespace, env: Mapping[str, str]
               ) -> tuple[argparse.Namespace, dict[str, str], tuple[str, ...]]:
    """What SGLang's resolution runs on for these flags: the namespace (without
    ``--trust-remote-code`` when the code is not here: derive_server says so; without a
    flag whose file of the server's host is not here, :func:`~.standins.without_host_files`),
    the environment (without a ModelScope fetch) and the notes saying what was left out."""
    resolve_env, notes = _without_modelscope(namespace, env)
    if getattr(namespace, "trust_remote_code", False) and missing_code(
            str(getattr(namespace, "model_path", ""))):
        namespace = copy.copy(namespace)
        namespace.trust_remote_code = False
    namespace, left_out = without_host_files(namespace)
    return namespace, resolve_env, notes + tuple(map(fact_line, left_out))


def server_parser() -> argparse.ArgumentParser:
    """The installed release's flag table (:func:`release_parser` of its ``ServerArgs``)."""
    from sglang.srt.server_args import ServerArgs

    return release_parser(ServerArgs)


def parser_default(name: str) -> Any:
    """The release parser's default for the ``ServerArgs`` field ``name``."""
    from sglang.srt.server_args import ServerArgs

    return release_parser(ServerArgs).get_default(name)


def resolve_as(args: LaunchArgs, device: Device) -> Any | None:
    """``args`` resolved by the release as if its server had ``device``: the resolved
    ``ServerArgs`` as the release's resolving view shows them, or ``None`` when the
    release refuses the flags on that device. Only for flags SGLang resolved here."""
    from sglang.srt.server_args import ServerArgs

    namespace = release_parser(ServerArgs).parse_args(list(args.argv))
    resolving, env, _ = _resolving(namespace, args.env)
    server_args = resolve_on(resolving, env, args.resolved_device, device).server_args
    return None if server_args is None else resolving_view(server_args)


def _pd_role(option: str, role: str, parser: argparse.ArgumentParser, argv: list[str],
             mode: Any) -> None:
    """Refuse a line that is not the ``role`` server of a PD pair: its
    ``--disaggregation-mode`` (as the release's parser reads it, a prefix too) is not
    ``role``. Untyped is told from a typed ``null`` by parsing into a namespace that
    already holds a marker (argparse sets no default over it)."""
    if mode == role:
        return
    marker = object()
    seen = parser.parse_args(argv, argparse.Namespace(disaggregation_mode=marker))
    has = ("no --disaggregation-mode (the release's default 'null': not a prefill/decode "
           "server)" if seen.disaggregation_mode is marker
           else f"--disaggregation-mode is {mode!r}")
    raise CheckInputError(option, f"{has}; {option} takes the {role} server of the pair: "
                                  f"--disaggregation-mode {role}")


def parse_launch(role: str, text: str, env: Mapping[str, str],
                 gpu: Device | None = None) -> LaunchArgs:
    """Parse one server's launch arguments with the installed release's ``ServerArgs``;
    resolved with SGLang's device probes answering as ``gpu`` (the GPU the server was
    named to run on; this machine's answers when ``None``), which needs ``--device cuda``."""
    from sglang.srt.server_args import ServerArgs

    option = f"--{role}"
    argv = _split(option, text)
    parser = release_parser(ServerArgs)
    try:
        namespace = parser.parse_args(argv)
    except _Refused as exc:
        raise CheckInputError(option, str(exc)) from None
    typed = {name: getattr(namespace, name, None) for name in FIELDS}
    _validate(option, typed)
    _pd_role(option, role, parser, argv, typed["disaggregation_mode"])
    resolving, resolve_env, notes = _resolving(namespace, env)
    device = str(getattr(resolving, "device", None) or "cuda")
    if gpu is not None and device != "cuda":
        raise CheckInputError(option, f"--device {device}, and the server is named to run on "
                                      f"{gpu.name}, a GPU of --device cuda servers; give the "
                                      "GPU of a --device cuda server, or no GPU")
    resolution = resolve_on(resolving, resolve_env, device, gpu)
    server_args, refusal, cause = resolution.triple()
    notes += tuple(map(fact_line, resolution.reads))
    machine_refusal = None if cause is None else f"{refusal}: {cause}"
    if server_args is not None:
        view = resolving_view(server_args)
        values = {name: getattr(view, name, None) for name in FIELDS}
        resolved_by = (f"the release's parser and its full resolution (as --device {device}"
                       + (f", its GPU probes answering as {gpu.name})" if gpu else ")"))
    else:
        values, resolved_by = _resolve_deprecated_dp(namespace)
    _validate(option, values)
    return LaunchArgs(role, tuple(argv), values, typed, dict(env), _deprecated(parser, argv),
                      resolved_by, None if cause is not None else refusal, server_args,
                      device, machine_refusal, notes, gpu)
