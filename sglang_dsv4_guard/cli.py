"""``sglang-dsv4-guard``: doctor, explain, demo, preflight.

- ``doctor``: the installed SGLang release and whether it is supported, the settings
  read from the environment (and what is wrong with them), the SGLang entry point,
  the patch targets, the guard's plug-ins. Exit 1 when something would stop the guard.
- ``explain CODE``: what a code means and how to fix it.
- ``demo``: SGLang's real ``setup_state_kv_args`` on a built-in pair with several
  mismatches, unguarded, then guarded, then a passing pair.
- ``preflight``: SGLang's MORI TP check (DSV4G006) on a planned deployment, before
  any GPU is allocated.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import sys
from collections.abc import Sequence

from sglang_dsv4_guard.codes import CODES

__all__ = ["main"]


def _release_line() -> tuple[str, bool]:
    """``SGLang: 0.5.20 (supported; range 0.5.16 to 0.5.23)`` and whether the guard can run.

    Judged by the imported code (``host.py``): what it matches or what changed."""
    from sglang_dsv4_guard.host import judge_imported
    from sglang_dsv4_guard.releases import SUPPORTED_MAX, SUPPORTED_MIN

    host = judge_imported()
    usable = host.behaves_as is not None
    if usable and not host.message:
        state = "supported"
    else:
        state = (f"guarded as {host.behaves_as}" if usable else "NOT supported") + \
            (f": {host.message}" if host.message else "")
    return (f"SGLang: {host.version or 'not installed'} ({state}; range {SUPPORTED_MIN} to "
            f"{SUPPORTED_MAX})"), usable


def _doctor(_: argparse.Namespace) -> int:
    from sglang_dsv4_guard.plugins import build_plugins
    from sglang_dsv4_guard.settings import settings_from_env

    line, ok = _release_line()
    print(line)
    settings, problems = settings_from_env()
    for name in ("mode", "autoshare", "log_format"):
        setting = getattr(settings, name)
        value = getattr(setting.value, "value", setting.value)
        print(f"setting {name}: {value} (from {setting.source})")
    for problem in problems:
        ok = False
        print(f"problem: {problem}")
    eps = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")
           if ep.name == "dsv4_guard"]
    print(f"SGLang entry point dsv4_guard: {eps[0].value if eps else 'MISSING'}")
    ok &= bool(eps)
    state = importlib.util.find_spec("sglang.srt.disaggregation.utils") is not None
    print(f"target setup_state_kv_args: {'found' if state else 'MISSING'}")
    mori = importlib.util.find_spec("mori") is not None
    where = ("MORI installed; wrapped when SGLang imports it" if mori else
             "MORI not installed (only needed with --disaggregation-transfer-backend mori)")
    print(f"target MoriKVManager._send_swa_dsa_state: {where}")
    plugins = build_plugins()
    print(f"guard plug-ins: {', '.join(plugins.names())}")
    for failure in plugins.load_problems:
        ok = False
        print(f"problem: {failure.summary}: {'; '.join(failure.details)}")
    print("doctor: OK" if ok else "doctor: problems found")
    return 0 if ok else 1


def _explain(args: argparse.Namespace) -> int:
    code = args.code.upper()
    info = CODES.get(code)
    if info is None:
        print(f"unknown code {args.code!r}; known codes: {', '.join(CODES)}", file=sys.stderr)
        return 2
    print(f"{info.code}: {info.title}")
    if info.sglang_message:
        print(f"SGLang's message: {info.sglang_message}")
    print(f"\n{info.meaning}\n")
    for fix in info.fixes:
        print(f"fix: {fix}")
    print("docs: the README's table of codes, section 'Codes'")
    return 0


def _demo(_: argparse.Namespace) -> int:
    from sglang_dsv4_guard.demo import run_demo

    return run_demo()


def _preflight(args: argparse.Namespace) -> int:
    from sglang_dsv4_guard.findings import Report
    from sglang_dsv4_guard.mori.snapshot import SendContext, SendSnapshot
    from sglang_dsv4_guard.plugins import build_plugins
    from sglang_dsv4_guard.releases import SUPPORTED_MAX, installed_sglang_version, profile_for
    from sglang_dsv4_guard.render import render_report

    def attn_tp(tp: int, dp: int, dp_attention: bool) -> int:
        return tp // dp if dp_attention else tp

    prefill = attn_tp(args.prefill_tp, args.prefill_dp, args.prefill_dp_attention)
    decode = attn_tp(args.decode_tp, args.decode_dp, args.decode_dp_attention)
    if args.transfer_backend != "mori":
        print(f"preflight: nothing to check for transfer backend {args.transfer_backend}")
        return 0
    # Planning on a machine without SGLang: the newest supported release's checks.
    profile = profile_for(installed_sglang_version() or SUPPORTED_MAX)
    snap = SendSnapshot(state_type="swa" if args.swa_state else "none",
                        is_mla_backend=args.mla, attn_tp_size=prefill, decode_tp_size=decode,
                        tp_size=args.prefill_tp, dp_size=args.prefill_dp,
                        enable_dp_attention=args.prefill_dp_attention)
    # Through the plug-in manager, so third-party send checks run here too.
    findings = build_plugins().collect("sglang_dsv4_guard_check_send",
                                       {"transfer": snap,
                                        "context": SendContext(profile, "on", "register")})
    report = Report.of(findings, {"function": "MoriKVManager._send_swa_dsa_state",
                                  "peer": "planned decode server"})
    print(render_report(report) or f"preflight: OK (prefill attention TP {prefill}, decode "
                                    f"attention TP {decode}, MLA={args.mla})")
    return 1 if findings else 0


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
    pre = sub.add_parser("preflight", help="check a planned MORI prefill/decode layout")
    pre.add_argument("--transfer-backend", default="mori")
    for role in ("prefill", "decode"):
        pre.add_argument(f"--{role}-tp", type=int, required=True)
        pre.add_argument(f"--{role}-dp", type=int, default=1)
        pre.add_argument(f"--{role}-dp-attention", action="store_true")
    pre.add_argument("--mla", action="store_true", help="the model uses an MLA KV pool")
    pre.add_argument("--no-swa-state", dest="swa_state", action="store_false",
                     help="the model registers no 'swa' state component")
    pre.set_defaults(run=_preflight)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sglang-dsv4-guard`` command."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        from sglang_dsv4_guard import __version__

        line, supported = _release_line()
        print(f"sglang-dsv4-guard {__version__}; {line}")
        return 0 if supported else 1
    if args.command is None:
        parser.error("a command is required: doctor, explain, demo or preflight")
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
