"""``check`` prints its own report, not SGLang's chatter: SGLang's warnings, log records
and prints while it imports and resolves are kept per server (``import`` for the rest),
shown with ``--verbose`` and always in JSON (``sglang_output``); a resolution line that
explains a value the report shows is quoted beside that value."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import unittest
import warnings
from collections.abc import Iterator

from check_helpers import DSV4, GPT_OSS, LLAMA, check_json, run_cli, server
from helpers import GuardTestCase, fresh_python
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=65, suite="stage-a-test-cpu")

# SGLang's own resolution line for Mooncake without --disaggregation-ib-device (a warning
# of its logger in every release of the matrix).
NO_IB = "No IB devices specified"
# DeepSeek-V4 with --page-size 128 typed on both servers (the release sets its own).
DSV4_PAIR = (server("prefill", DSV4, "--page-size 128", backend="mooncake"),
             server("decode", DSV4, "--page-size 128", backend="mooncake"))


@contextlib.contextmanager
def root_records() -> Iterator[list[logging.LogRecord]]:
    """The log records that reach the root logger's handlers inside the block (what a
    program with logging configured, or Python's last-resort handler, would print)."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep(logging.DEBUG)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield seen
    finally:
        root.removeHandler(handler)


def sglang_said(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.name.split(".")[0] in ("sglang", "transformers")]


class TestChatterNotPrinted(GuardTestCase):
    """None of SGLang's output reaches check's stdout or stderr by default."""

    def test_resolution_log_lines_not_printed(self) -> None:
        """A Mooncake pair: SGLang's "No IB devices specified" warning, logged while it
        resolves each server's flags, is neither on stdout nor on stderr."""
        with root_records() as records:
            status, out, err = run_cli("check", "--prefill", DSV4_PAIR[0], "--decode",
                                       DSV4_PAIR[1])
        self.assertEqual(status, 0, err)
        self.assertEqual(sglang_said(records), [])
        self.assertNotIn(NO_IB, out)
        self.assertNotIn(NO_IB, err)
        self.assertTrue(out.startswith("sglang-dsv4-guard check (SGLang "), out[:200])

    def test_fix_reruns_print_no_chatter(self) -> None:
        """``check --fix`` re-runs SGLang's resolution on edited lines: none of what it logs
        is printed either."""
        with root_records() as records:
            _, out, err = run_cli(
                "check", "--prefill", server("prefill", LLAMA, "--page-size 16",
                                             backend="mooncake"),
                "--decode", server("decode", LLAMA, "--page-size 32", backend="mooncake"),
                "--fix")
        self.assertEqual(sglang_said(records), [])
        self.assertIn("check --fix:", out)
        self.assertNotIn(NO_IB, out + err)
        self.assertEqual(err, "")


class TestChatterKept(GuardTestCase):
    """What SGLang said is kept per server, in order, in JSON and with --verbose."""

    def test_json_keeps_lines_per_server(self) -> None:
        """``--format json`` has ``sglang_output`` with SGLang's resolution warning under
        each server that logged it, and the existing keys unchanged."""
        _, doc = check_json(*DSV4_PAIR)
        output = doc["sglang_output"]
        self.assertEqual(set(output), {"import", "prefill", "decode"})
        for role in ("prefill", "decode"):
            self.assertTrue(any(NO_IB in line for line in output[role]), output[role])
        self.assertIn("derived", doc)
        self.assertIn("findings", doc)

    def test_probe_pools_say_nothing_of_the_servers(self) -> None:
        """What SGLang's pool classes log while check builds its miniature probe pools
        ("KV Cache is allocated ... #tokens: 64") is in no section: the server never builds
        that pool, and the probe is cached, so only a process's first check would say it:
        a first and a second check log the same. What the server's environment makes
        SGLang warn while the probe runs is still the server's (in the first check: a
        warning of a cached probe, like any warning Python shows once per place, is said
        once per process; the command runs each check in a fresh child)."""
        from sglang_dsv4_guard.check.server.state_types import registered_state
        from sglang_dsv4_guard.check.server.swa_layout import registered_layout

        registered_state.cache_clear()  # built once per process: this check builds them
        registered_layout.cache_clear()
        pair = (server("prefill", GPT_OSS, backend="mooncake"),
                server("decode", GPT_OSS, backend="mooncake"))
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # whatever this process showed before
            _, first = check_json(*pair, "--prefill-env", "SGLANG_USE_HND_KVCACHE=on")
            _, second = check_json(*pair, "--prefill-env", "SGLANG_USE_HND_KVCACHE=on")
        said = [line for lines in first["sglang_output"].values() for line in lines]
        self.assertFalse([line for line in said if "KV Cache is allocated" in line], said)
        self.assertTrue(any(NO_IB in line for line in first["sglang_output"]["prefill"]), said)
        self.assertTrue(any("SGLANG_USE_HND_KVCACHE" in line
                            for line in first["sglang_output"]["prefill"]), said)
        logged = [{role: [line for line in lines if "Warning: " not in line]
                   for role, lines in doc["sglang_output"].items()} for doc in (first, second)]
        self.assertEqual(logged[0], logged[1])

    def test_an_inner_recorder_hands_back_to_the_outer_one(self) -> None:
        """A recording nested in another (both still empty when the inner one ends) gives
        later lines back to the outer recorder, not to the finished inner one."""
        from sglang_dsv4_guard.check.offline.chatter import capturing, recording, section

        logger = logging.getLogger("sglang.srt.test_check_output")
        with capturing(), recording() as outer, section("prefill"):
            with recording() as inner:
                pass
            logger.warning("after the inner recording")
        self.assertEqual(outer.output().to_dict()["prefill"],
                         ["WARNING sglang.srt.test_check_output: after the inner recording"])
        self.assertEqual([line for lines in inner.output().to_dict().values() for line in lines],
                         [])

    def test_logged_exception_keeps_its_traceback(self) -> None:
        """A record logged with its exception (``logger.exception``) is kept with the
        exception's traceback lines, the last one naming the exception."""
        from sglang_dsv4_guard.check.offline.chatter import capturing, recording, section

        logger = logging.getLogger("sglang.srt.test_check_output")
        with capturing(), recording() as kept, section("prefill"):
            try:
                raise ZeroDivisionError("division by zero, on purpose")
            except ZeroDivisionError:
                logger.exception("boom happened")
        lines = kept.output().to_dict()["prefill"]
        self.assertEqual(lines[0], "ERROR sglang.srt.test_check_output: boom happened")
        self.assertIn("Traceback (most recent call last):", lines[1])
        self.assertTrue(lines[-1].endswith("ZeroDivisionError: division by zero, on purpose"),
                        lines)

    def test_logged_traceback_is_bounded(self) -> None:
        """A record's traceback of many frames keeps at most TRACE_LINES of its lines (the
        last ones, the exception's own line among them) and says how many it left out."""
        from sglang_dsv4_guard.check.offline.chatter import TRACE_LINES, capturing, recording, section

        def deep(n: int) -> None:  # each level's exception is the cause of the next
            try:
                if n == 0:
                    raise KeyError("the first cause")
                deep(n - 1)
            except Exception as exc:
                raise RecursionError(f"deep on purpose, level {n}") from exc

        logger = logging.getLogger("sglang.srt.test_check_output")
        with capturing(), recording() as kept, section("decode"):
            try:
                deep(60)
            except RecursionError:
                logger.exception("deep failure")
        lines = kept.output().to_dict()["decode"]
        self.assertLessEqual(len(lines), TRACE_LINES + 2, lines)
        self.assertIn("traceback line(s) not kept", lines[1])
        self.assertTrue(lines[-1].endswith("RecursionError: deep on purpose, level 60"), lines)

    def test_verbose_prints_lines_after_the_report(self) -> None:
        """``--verbose`` prints the captured lines, per server, after the verdict line."""
        status, out, _ = run_cli("check", "--prefill", DSV4_PAIR[0], "--decode", DSV4_PAIR[1],
                                 "--verbose")
        self.assertEqual(status, 0)
        verdict = out.index("check: OK")
        self.assertIn(NO_IB, out[verdict:])
        self.assertLess(out.index("decode:", verdict), out.rindex(NO_IB))


class TestResolutionExplainsValue(GuardTestCase):
    """A value SGLang's resolution chose is shown with SGLang's own line about it."""

    def test_dsv4_page_size_quotes_sglang(self) -> None:
        """DeepSeek-V4 typed with ``--page-size 128``: the page size SGLang resolved is shown
        with the line SGLang logged when it set it (it names page_size and the value)."""
        _, doc = check_json(*DSV4_PAIR)
        page = doc["derived"]["decode"]["page_size"]
        _, out, _ = run_cli("check", "--prefill", DSV4_PAIR[0], "--decode", DSV4_PAIR[1])
        block = out.split("\n\n")[2]
        self.assertTrue(block.startswith("decode:"), block)
        said = [line for line in block.splitlines() if "SGLang said" in line]
        self.assertTrue(said, block)
        self.assertIn("page_size", said[0])
        self.assertIn(str(page), said[0])
        self.assertIn(said[0].split('"')[1], "\n".join(doc["sglang_output"]["decode"]))

    def test_observation_from_quotes_sglang(self) -> None:
        """A finding's value that SGLang's resolution chose (DeepSeek-V4's page size against
        a Llama decode's typed one) says, in its ``from:``, SGLang's line about it."""
        _, doc = check_json(DSV4_PAIR[0], server("decode", LLAMA, "--page-size 16",
                                                 backend="mooncake"))
        pages = [o for f in doc["findings"] for o in f["observations"]
                 if o["name"] == "page_size"]
        self.assertTrue(pages, doc["findings"])
        prefill = [o for o in pages if o["role"] == "prefill"]
        decode = [o for o in pages if o["role"] == "decode"]
        self.assertIn('SGLang said "', prefill[0]["source"])
        self.assertIn(f"page_size to {prefill[0]['value']}", prefill[0]["source"])
        self.assertNotIn("SGLang said", decode[0]["source"])

    def test_typed_value_kept_has_no_quote(self) -> None:
        """A page size as typed (Llama, ``--page-size 16`` kept by SGLang) is not quoted
        (the attention backend SGLang chose for it is)."""
        _, doc = check_json(server("prefill", LLAMA, "--page-size 16"),
                            server("decode", LLAMA, "--page-size 16"))
        fields = [said["field"] for said in doc["sglang_said"]["decode"]]
        self.assertNotIn("page_size", fields)
        self.assertIn("attention_backend", fields)


class TestCaptureKeepsSGLangBehaviour(GuardTestCase):
    """Capturing changes nothing SGLang does with warnings."""

    def test_warning_made_an_error_still_raises(self) -> None:
        """A warning category the warnings filters turn into an error still raises while
        check captures output."""
        from sglang_dsv4_guard.check.offline.chatter import capturing

        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            with capturing(), self.assertRaises(UserWarning):
                warnings.warn("made an error", UserWarning, stacklevel=1)

    def test_refusal_still_dsv4g026(self) -> None:
        """A line SGLang's resolution refuses is still DSV4G026 with SGLang's message."""
        status, doc = check_json(
            server("prefill", DSV4, "--speculative-algorithm NEXTN", backend="mooncake"),
            DSV4_PAIR[1])
        self.assertEqual(status, 1)
        refused = [f for f in doc["findings"] if f["code"] == "DSV4G026"]
        self.assertTrue(refused)
        self.assertTrue(refused[0]["observations"][0]["value"])


class TestCaptureIsBoundedAndUndone(GuardTestCase):
    """The capture keeps a bounded number of lines and leaves nothing patched."""

    def test_section_past_the_cap_counts_the_rest(self) -> None:
        """Past CAP lines in one section, the rest are counted in a last line."""
        from sglang_dsv4_guard.check.offline.chatter import CAP, capturing, recording, section

        logger = logging.getLogger("sglang.srt.test_check_output")
        with capturing(), recording() as kept, section("decode"):
            for i in range(CAP + 7):
                logger.warning("line %d", i)
        lines = kept.output().to_dict()["decode"]
        self.assertEqual(len(lines), CAP + 1)
        self.assertEqual(lines[0], "WARNING sglang.srt.test_check_output: line 0")
        self.assertIn("7 more line(s) not kept", lines[-1])

    def test_everything_put_back(self) -> None:
        """After the capture, showwarning, sys.stdout/stderr, the loggers' handlers,
        propagation and levels and Python's last-resort handler are as before."""
        import sys

        from sglang_dsv4_guard.check.offline.chatter import LOGGERS, capturing

        def state() -> list[object]:
            loggers = [logging.getLogger(n) for n in LOGGERS]
            return [warnings.showwarning, sys.stdout, sys.stderr, logging.lastResort,
                    *[(list(lg.handlers), lg.propagate, lg.level) for lg in loggers]]

        before = state()
        with capturing():
            self.assertNotEqual(state(), before)
        self.assertEqual(state(), before)


_ANSWER = """
import json, sys
from sglang_dsv4_guard.check.child import answer
reply = answer({"prefill": sys.argv[1], "decode": sys.argv[2]})
sys.__stdout__.write(json.dumps(reply))
"""


class TestImportWarningsInAFreshProcess(GuardTestCase):
    """SGLang's import warnings (emitted once per process) are kept under ``import``."""

    def test_import_warnings_kept_not_printed(self) -> None:
        """In a fresh interpreter, the check's work prints none of the ``UserWarning`` s
        SGLang's import emits; the ``import`` section of ``sglang_output`` holds them."""
        done = fresh_python(_ANSWER, *DSV4_PAIR)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        reply = json.loads(done.stdout)
        self.assertNotIn("UserWarning", done.stderr)
        self.assertNotIn(NO_IB, done.stderr)
        imported = reply["document"]["sglang_output"]["import"]
        self.assertTrue(any("UserWarning" in line for line in imported), imported)


# In every Python process it starts (the command and its check child): the second time a
# record saying NO_IB is logged (the decode server's resolution, the prefill's line already
# said), the process ends at once, as a crash in SGLang would end it: no answer, no exit
# handlers.
_DIE_SITECUSTOMIZE = f"""
import logging, os
_handle = logging.Logger.handle
_seen = []


def handle(self, record):
    if {NO_IB!r} in str(record.msg):
        _seen.append(record)
        if len(_seen) == 2:
            os._exit(3)
    return _handle(self, record)


logging.Logger.handle = handle
"""
_COMMAND = "import sys; from sglang_dsv4_guard.cli import main; sys.exit(main(sys.argv[1:]))"


class TestChildDiedKeepsOutput(GuardTestCase):
    """The check process dies after SGLang said something: what it said is not lost."""

    def died(self, *more: str) -> tuple[int, str, str]:
        """The command in a fresh interpreter whose check child dies mid-resolution."""
        hook = tempfile.mkdtemp(prefix="dsv4-check-dies-")
        self.addCleanup(shutil.rmtree, hook, True)
        with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
            f.write(_DIE_SITECUSTOMIZE)
        done = fresh_python(_COMMAND, "check", "--prefill", DSV4_PAIR[0], "--decode",
                            DSV4_PAIR[1], *more, path_first=hook)
        return done.returncode, done.stdout, done.stderr

    def test_error_line_names_the_last_captured_line(self) -> None:
        """Without ``--verbose``: exit 2, one line on stderr, with the status and the last
        line SGLang said before the process ended, and how to see more."""
        status, out, err = self.died()
        self.assertEqual((status, out), (2, ""), err)
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn("ended with status 3 without an answer", err)
        self.assertIn("SGLang's last line before it ended (decode): ", err)
        self.assertIn("--verbose", err)

    def test_verbose_prints_the_captured_tail(self) -> None:
        """With ``--verbose``: after the error line, SGLang's last captured lines by server,
        the prefill's NO_IB warning among them; no Python traceback."""
        status, out, err = self.died("--verbose")
        self.assertEqual((status, out), (2, ""), err)
        first, *rest = err.splitlines()
        self.assertIn("without an answer", first)
        self.assertTrue(any(line.startswith("  prefill: ") and NO_IB in line for line in rest),
                        err)
        self.assertNotIn("Traceback", err)


if __name__ == "__main__":
    unittest.main()
