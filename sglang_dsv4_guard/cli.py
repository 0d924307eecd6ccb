"""``sglang-dsv4-guard``: doctor, explain, demo, check, patches.

- ``doctor``: the installed SGLang release and whether it is supported, the settings
  read from the environment (and what is wrong with them), the SGLang entry point and
  whether SGLang's ``load_plugins()`` will run it (``SGLANG_PLUGINS``), the release's
  scheduler entry points that never call ``load_plugins()``, the patch targets, the
  guard's plug-ins. Exit 1 when something would stop the guard.
- ``explain CODE``: what a code means and how to fix it.
- ``demo``: SGLang's real ``setup_state_kv_args`` on a built-in pair with several
  mismatches, unguarded, then guarded, then a passing pair.
- ``check``: a PD deployment's failures predicted from the two servers' launch flags,
  with the installed release's own parser, model config and checks (``check/``).
- ``patches``: the SGLang patch series for the installed release, and for each patch
  whether SGLang carries it, would take it, or why not (:mod:`sglang_dsv4_guard.host.patchset`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import io
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sglang_dsv4_guard.codes import CODES
from sglang_dsv4_guard.findings import short_repr
from sglang_dsv4_guard.host.targets import MORI_SEND, REGISTRY_MODULE, STATE
from sglang_dsv4_guard.log import silenced

# Each command imports what it needs inside its function (deferred on purpose, for
# start-up cost): ``explain`` and ``--help`` import neither SGLang nor torch nor the
# plug-in manager, and only ``check`` loads the release's parser and model config.
if TYPE_CHECKING:
    from sglang_dsv4_guard.plugins import GuardPlugins

__all__ = ["main"]


def _importable(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it. A module already in
    ``sys.modules`` without a spec (a stub, an injected module) makes ``find_spec`` raise
    ``ValueError``: it is importable, since it is there."""
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:
        return name in sys.modules
    except ImportError:  # a parent package that cannot be imported
        return False


def _release_line() -> tuple[str, bool]:
    """``SGLang: 0.5.20 (supported; range 0.5.16 to 0.5.23)`` and whether the guard can run.

    Judged by the imported code (:mod:`sglang_dsv4_guard.host.judgement`): what it matches
    or what changed."""
    # deferred: doctor only; each command loads only what it uses (start-up cost, see above)
    from sglang_dsv4_guard.host.judgement import judge_imported
    from sglang_dsv4_guard.host.releases import SUPPORTED_MAX, SUPPORTED_MIN

    host = judge_imported()
    usable = host.behaves_as is not None
    if usable and not host.message:
        state = "supported"
    else:
        state = (f"guarded as {host.behaves_as}" if usable else "NOT supported") + \
            (f": {host.message}" if host.message else "")
    name = host.name if host.version or host.behaves_as else "not installed"
    return f"SGLang: {name} ({state}; range {SUPPORTED_MIN} to {SUPPORTED_MAX})", usable


def _doctor(_: argparse.Namespace) -> int:
    # deferred: doctor only; each command loads only what it uses (start-up cost, see
    # above); check's time limit is read by check's own rule (check exits 2 on a bad value)
    from sglang_dsv4_guard.check.child import check_timeout
    from sglang_dsv4_guard.check.offline.parse import CheckInputError
    from sglang_dsv4_guard.host.patchset import summary_line
    from sglang_dsv4_guard.settings import Mode, settings_from_env

    line, ok = _release_line()
    print(line)
    settings, problems = settings_from_env()
    for name in ("mode", "autoshare", "log_format", "metrics"):
        setting = getattr(settings, name)
        value = getattr(setting.value, "value", setting.value)
        print(f"setting {name}: {value} (from {setting.source})")
    for problem in problems:
        ok = False
        print(f"problem: {problem}")
    ok &= _metrics(settings.metrics.value, settings.mode.value is not Mode.OFF, ok)
    try:
        check_timeout()
    except CheckInputError as exc:
        ok = False
        print(f"problem: {exc}; check exits 2 with it")
    ok &= _sglang_loader(settings.mode.value is not Mode.OFF)
    state = _importable(STATE.module)
    print(f"target {STATE.qualname}: {'found' if state else 'MISSING'}")
    mori = _importable("mori")
    where = ("MORI installed; wrapped when SGLang imports it" if mori else
             "MORI not installed (only needed with --disaggregation-transfer-backend mori)")
    print(f"target {MORI_SEND.qualname}: {where}")
    ok &= _other_plugins_hooks()
    plugins, output = _load_plugins_quietly()
    print(f"guard plug-ins: {', '.join(plugins.names())}")
    for failure in plugins.load_problems:
        ok = False
        print(f"problem: {failure.summary}: {'; '.join(failure.details)}")
    print(summary_line())
    last = output.strip().splitlines()[-1][:300] if output.strip() else ""
    if last:  # what plug-ins printed while loading: theirs, shown as theirs
        print(f"note: guard plug-ins printed while loading (last line): {last}")
    print("doctor: OK" if ok else "doctor: problems found")
    return 0 if ok else 1


def _metrics(setting: str, guard_on: bool, usable: bool) -> bool:
    """Print whether the guard's counts will be on SGLang's ``/metrics``, and where; False
    when they cannot be where they are asked for (``usable``: the guard can run on this
    SGLang)."""
    # deferred: doctor only; each command loads only what it uses (start-up cost, see above)
    from sglang_dsv4_guard.metrics import DIRECTORY_VARIABLE, METRICS
    from sglang_dsv4_guard.settings import ENV_METRICS

    names = ", ".join(name for name, _, _, _ in METRICS)
    if not guard_on or setting == "off" or not usable:
        why = ("the guard is off" if not guard_on else f"{ENV_METRICS}=off" if setting == "off"
               else "the guard stays inert on this SGLang")
        print(f"metrics: not exported ({why})")
        return True
    try:
        client = importlib.metadata.version("prometheus_client")
    except importlib.metadata.PackageNotFoundError:
        client = None
    if client is None or importlib.util.find_spec("prometheus_client") is None:
        print(f"{'problem' if setting == 'on' else 'note'}: metrics: prometheus_client is not "
              "installed, so nothing will be exported (SGLang's --enable-metrics needs it too: "
              "pip install prometheus-client)")
        return setting != "on"
    directory = os.environ.get(DIRECTORY_VARIABLE)
    if directory and not os.path.isdir(directory):
        print(f"problem: metrics: {DIRECTORY_VARIABLE}={directory!r} is not a directory: "
              "SGLang's --enable-metrics makes its directory inside it, and nothing would be "
              "exported")
        return False
    if setting == "auto":
        print("metrics: exported by the schedulers of a prefill or decode server launched with "
              "--enable-metrics, on that server's own /metrics (its --port), through the "
              f"directory SGLang puts in {DIRECTORY_VARIABLE}: {names} (prometheus_client {client}); without "
              f"--enable-metrics nothing is imported or written ({ENV_METRICS}=on exports "
              "anyway, wherever the directory is set)")
        return True
    if directory:
        print(f"metrics: exported by every guarded scheduler, under {DIRECTORY_VARIABLE}="
              f"{directory} (what /metrics reads when SGLang set it, or your own collector): "
              f"{names} (prometheus_client {client})")
    else:
        print(f"metrics: exported by every guarded scheduler where {DIRECTORY_VARIABLE} is "
              "set (SGLang sets it in its launcher with --enable-metrics; it is unset here, "
              f"where nothing would be exported): {names} (prometheus_client {client})")
    return True


def _sglang_loader(guard_on: bool) -> bool:
    """Print whether SGLang's ``load_plugins()`` runs the guard's entry point here, and
    which of the release's scheduler entry points call it; False when the guard is asked
    for and SGLang will not run it."""
    # deferred: doctor only; each command loads only what it uses (start-up cost, see above)
    from sglang_dsv4_guard.host.judgement import imported_package_dir
    from sglang_dsv4_guard.host.loader import loader_judgement, scheduler_entry_points
    from sglang_dsv4_guard.host.targets import PLUGIN_GROUP

    loader = loader_judgement()
    eps = [ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP) if ep.name == loader.name]
    print(f"SGLang entry point {loader.name or '(none)'}: "
          f"{eps[0].value if eps and loader.name else 'MISSING'}")
    ok = bool(eps and loader.name)
    if loader.runs:
        which = f"SGLANG_PLUGINS={loader.plugins!r} names it" if loader.plugins else \
            "SGLANG_PLUGINS unset: every plug-in"
        print(f"SGLang's load_plugins() runs {loader.name} ({which})")
    else:
        off = "" if guard_on else " (SGLANG_DSV4_GUARD leaves the guard off: nothing lost)"
        print(f"{'problem' if guard_on else 'note'}: SGLang's load_plugins() will not run "
              f"{loader.name or 'the guard'}: {loader.reason}{off}")
        if loader.fix:
            print(f"fix: {loader.fix}")
        ok &= not guard_on
    package = imported_package_dir()
    entries = scheduler_entry_points(package) if package is not None else []
    loading = [entry.where for entry in entries if entry.loads_plugins]
    if loading:
        print(f"scheduler entry points calling load_plugins() first: {', '.join(loading)}")
    for entry in entries:
        if not entry.loads_plugins:
            print(f"note: {entry.where} constructs SGLang's Scheduler without calling "
                  f"load_plugins() first: the guard never runs in the schedulers it starts")
    if package is not None and not entries:
        print("note: doctor found no function of SGLang that constructs its Scheduler")
    return ok


def _load_plugins_quietly() -> tuple[GuardPlugins, str]:
    """Build the plug-in manager with what plug-ins print captured and our log silenced.

    A plug-in that calls argparse at import prints its usage and raises ``SystemExit``:
    the loader turns that into a plug-in failure finding (one never stops anything),
    doctor prints the problem, and the plug-in's own output is shown as its own, not as
    doctor's. ``KeyboardInterrupt`` is the operator's and propagates.
    """
    # deferred: doctor only; each command loads only what it uses (start-up cost, see above)
    from sglang_dsv4_guard.assembly import build_plugins

    captured = io.StringIO()
    with silenced(), contextlib.redirect_stdout(captured), \
            contextlib.redirect_stderr(captured):  # doctor prints the problems
        return build_plugins(), captured.getvalue()


def _other_plugins_hooks() -> bool:
    """Print every other SGLang plug-in's hook on the guard's targets; False on a problem."""
    if not _importable(REGISTRY_MODULE):
        return True
    # deferred: doctor only, with SGLang's registry; each command loads only what it uses
    from sglang_dsv4_guard.hook_registry import effect, other_plugins_hooks

    records, failures = other_plugins_hooks()
    ok = True
    for record in records:
        what, problem = effect(record)
        ok &= not problem
        print(f"{'problem' if problem else 'note'}: other plug-in hook: {record.describe()}: {what}")
    if not records:
        print("other SGLang plug-ins' hooks on the guard's targets: none")
    for failure in failures:
        print(f"note: {failure}")
    return ok


def _explain(args: argparse.Namespace) -> int:
    code = args.code.strip().upper()  # as typed or pasted: any case, spaces around
    info = CODES.get(code)
    if info is None:
        print(f"unknown code {short_repr(args.code)}; known codes: {', '.join(CODES)}",
              file=sys.stderr)
        return 2
    print(f"{info.code}: {info.title}")
    if info.sglang_message:
        print(f"SGLang's message: {info.sglang_message}")
    print(f"\n{info.meaning}\n")
    print(f"severity: {info.severity.value}" + (f" ({info.milder})" if info.milder else ""))
    if info.sglang_releases is not None:
        print(f"SGLang releases with this check: {info.releases_text()}")
    # A report's fixes are derived from what differs; explain says how, per code.
    for line in info.fix_derivation:
        print(f"how the fix is derived: {line}")
    return 0


def _demo(_: argparse.Namespace) -> int:
    # deferred: demo only; each command loads only what it uses (start-up cost, see above)
    from sglang_dsv4_guard.demo import run_demo

    return run_demo()


def _check(args: argparse.Namespace) -> int:
    # SGLang is imported only in the child, started with the environment check controls.
    # deferred: check only; each command loads only what it uses (start-up cost, see above)
    from sglang_dsv4_guard.check.command import run_command

    try:
        return run_command(args)
    except Exception as exc:  # a bug of ours: one line and exit 2 (never 1, which is findings)
        print(f"sglang-dsv4-guard check: error: the check failed ({type(exc).__name__}: "
              f"{short_repr(str(exc))}); nothing was judged: this is a bug of "
              "sglang-dsv4-guard", file=sys.stderr)
        return 2


def _patches(_: argparse.Namespace) -> int:
    # deferred: patches only; each command loads only what it uses (start-up cost, see above)
    from sglang_dsv4_guard.host.patchset import status_report

    lines, ok = status_report()
    print("\n".join(lines))
    return 0 if ok else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-dsv4-guard", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="store_true",
                        help="print this guard's version and the installed SGLang release")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("doctor", help="check the installation and settings").set_defaults(
        run=_doctor)
    explain = sub.add_parser("explain", help="explain a finding code")
    explain.add_argument("code")
    explain.set_defaults(run=_explain)
    sub.add_parser("demo", help="run SGLang's check on a built-in scenario").set_defaults(
        run=_demo)
    check = sub.add_parser(
        "check", help="predict a PD deployment's failures from its launch lines or files",
        description="Parse both servers' launch arguments with the installed SGLang's own "
                    "parser and configs, and predict what will fail. Exit 0: no finding "
                    "--fail-on counts; 1: a pair has one; 2: input that cannot be read or a "
                    "pair that could not be checked.")
    check.add_argument("--prefill", metavar="ARGS",
                       help="the prefill server's arguments, as typed after "
                            "'python -m sglang.launch_server' (one quoted string, at most "
                            "64 KiB); a leading '[/path/]python[3[.x]] -m "
                            "sglang.launch_server' or 'sglang serve' is dropped")
    check.add_argument("--decode", metavar="ARGS",
                       help="the decode server's arguments (one quoted string)")
    check.add_argument("-f", "--file", action="extend", nargs="+", metavar="PATH",
                       help="read the pairs from deployment files instead: Kubernetes "
                            "manifests, compose files, shell scripts, args files; a "
                            "directory is read whole; '-' is stdin")
    check.add_argument("paths", nargs="*", metavar="PATH",
                       help="deployment files or directories, as -f takes them (what "
                            "pre-commit passes)")
    check.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                       help="with -f: the value of a variable the files leave without one "
                            "(repeatable)")
    check.add_argument("--model-path-map", action="append", default=[], metavar="PATH=DIR",
                       help="with -f or --*-server-info: a model path as the deployment or "
                            "the running server has it, and the local directory holding its "
                            "config.json (repeatable)")
    for role in ("prefill", "decode"):
        check.add_argument(f"--{role}-server-info", metavar="FILE|URL",
                           help=f"instead of --{role}: the running {role} server's "
                                "/get_server_info answer, saved to a file or fetched from an "
                                "http:// URL on a loopback address; its resolved arguments "
                                "are read as its launch line")
    check.add_argument("--prefill-bootstrap", metavar="HOST:PORT",
                       help="instead of --prefill: the running prefill's bootstrap server "
                            "(loopback only); the decode is checked against its /route "
                            "answer as its first contact reads it")
    for role in ("prefill", "decode"):
        check.add_argument(f"--{role}-env", action="append", default=[], metavar="K=V",
                           help=f"an environment variable of the {role} server (repeatable)")
    check.add_argument("--gpu", metavar="MODEL",
                       help="the GPU model both servers run on (H100, B200, MI300X, ... or a "
                            "nvidia.com/gpu.product label): GPU-dependent findings are "
                            "judged on it alone")
    for role in ("prefill", "decode"):
        check.add_argument(f"--{role}-gpu", metavar="MODEL",
                           help=f"the {role} server's GPU model (overrides --gpu)")
    check.add_argument("--format", choices=("text", "json", "sarif", "github", "patch"),
                       default="text",
                       help="text (default), json, sarif (SARIF 2.1.0), github (GitHub "
                            "Actions annotations): sarif and github point at the file and "
                            "line of each finding's flag; patch (with -f: --fix's proven "
                            "patch for the files alone, for git apply)")
    check.add_argument("--fail-on", choices=("error", "warning"), default="error",
                       help="the findings that make the exit status 1 (default: error)")
    check.add_argument("--quiet", action="store_true",
                       help="one line per pair (text format)")
    check.add_argument("--fix", action="store_true",
                       help="prove each flag fix by re-running the check on the edited lines, "
                            "and print the corrected prefill and decode lines")
    check.add_argument("--keep", choices=("prefill", "decode"),
                       help="with --fix: the server whose settings are the intended ones; "
                            "the corrected lines change only the other")
    check.add_argument("--verbose", action="store_true",
                       help="also print what SGLang itself printed, warned or logged while "
                            "the check ran, per server (always in --format json)")
    check.set_defaults(run=_check)
    sub.add_parser("patches", help="list the SGLang patch series for the installed release "
                   "and whether each patch applies (read-only)").set_defaults(run=_patches)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sglang-dsv4-guard`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        from sglang_dsv4_guard import __version__

        line, supported = _release_line()
        print(f"sglang-dsv4-guard {__version__}; {line}")
        return 0 if supported else 1
    if args.command is None:
        parser.error("a command is required: doctor, explain, demo, check or patches")
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
