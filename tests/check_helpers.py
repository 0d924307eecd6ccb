"""Shared by the ``check`` tests: the hand-written configs and a way to run the command."""

from __future__ import annotations

import contextlib
import io
import json
import os
from typing import Any

from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.child import answer
from sglang_dsv4_guard.check.command import run_command
from sglang_dsv4_guard.cli import _parser, main

# SGLang's run_suite.py collects every *.py next to the tests and requires a registry in
# each; a disabled one marks a helper module (listed as skipped, never run).
register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")

DATA = os.path.join(os.path.dirname(__file__), "data")
DSV4 = os.path.join(DATA, "deepseek_v4")
DSV4_WINDOW64 = os.path.join(DATA, "deepseek_v4_window64")
DSV3 = os.path.join(DATA, "deepseek_v3")
GPT_OSS = os.path.join(DATA, "gpt_oss")
LLAMA = os.path.join(DATA, "llama")


def server(role: str, model: str, extra: str = "", backend: str = "mori") -> str:
    """One server's launch arguments."""
    return (f"--model-path {model} --disaggregation-mode {role} "
            f"--disaggregation-transfer-backend {backend} {extra}").strip()


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``sglang-dsv4-guard argv...`` in this process: exit status, stdout, stderr.

    ``check`` does its child's work (``check.child.answer``, the same code) here, so the
    installed release's answers are tested in-process on every release; the child process
    itself (environment, walls, no network, no writes) is tested by test_check_process.py."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = _check_here(list(argv)) if argv[:1] == ("check",) else main(list(argv))
    return status, out.getvalue(), err.getvalue()


def _check_here(argv: list[str]) -> int:
    return run_command(_parser().parse_args(argv), answer)


def check_json(prefill: str, decode: str, *more: str) -> tuple[int, dict[str, Any]]:
    """``check --format json``: the exit status and the parsed document."""
    status, out, err = run_cli("check", "--prefill", prefill, "--decode", decode,
                               "--format", "json", *more)
    assert status in (0, 1), f"exit {status}: {err}"
    return status, json.loads(out)


def codes(doc: dict[str, Any]) -> list[str]:
    """The finding codes of a ``check`` JSON document, in order."""
    return [f["code"] for f in doc["findings"]]
