"""``sglang-dsv4-guard check`` on input it cannot read: exit 2, the argument named, no
traceback: a DP size of 0 with DP attention (no division by zero), a TP size of 0 or -8,
a transfer backend in capitals."""

from __future__ import annotations

import os
import unittest
from unittest import mock

from check_helpers import DATA, GPT_OSS, LLAMA, check_json, codes, run_cli, server
from helpers import GuardTestCase, fresh_python
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.pd.buffers import mask_env

register_cpu_ci(est_time=38, suite="stage-a-test-cpu")


class TestBadInput(GuardTestCase):
    """Each bad input exits 2 with a message naming the argument and the value."""

    def bad(self, prefill: str, decode: str | None = None, *more: str) -> str:
        status, out, err = run_cli("check", "--prefill", prefill, "--decode",
                                   decode or server("decode", LLAMA), *more)
        self.assertEqual(status, 2, out + err)
        self.assertNotIn("Traceback", err)
        self.assertEqual(out, "")
        return err

    def test_dp_size_zero_with_dp_attention(self) -> None:
        """``--dp-size 0 --enable-dp-attention`` names --dp-size (no ZeroDivisionError)."""
        err = self.bad(server("prefill", LLAMA, "--tp-size 8 --dp-size 0 --enable-dp-attention"))
        self.assertIn("--prefill: --dp-size must be a positive integer of at most 65,536 "
                      "(got 0)", err)

    def test_tp_size_zero_negative_and_huge(self) -> None:
        """``--tp-size 0``, ``-8`` and one past any GPU count (SGLang's layout arithmetic
        would overflow on it) are refused, naming --tp-size and the accepted range."""
        for value in ("0", "-8", "99999999999999999999999"):
            with self.subTest(value=value):
                err = self.bad(server("prefill", LLAMA), server("decode", LLAMA,
                                                                f"--tp-size={value}"))
                self.assertIn("--decode: --tp-size must be a positive integer of at most "
                              f"65,536 (got {value})", err)

    def test_environment_items(self) -> None:
        """``--prefill-env`` items that are not a variable's (a name starting with a digit),
        carry control characters, run past the value cap or are too many: exit 2 naming
        --prefill-env, the variable and what is accepted; the value shown is cut."""
        from sglang_dsv4_guard.check.offline.parse import MAX_ENV_ITEMS, MAX_ENV_VALUE_CHARS

        big = "v" * (MAX_ENV_VALUE_CHARS + 1)
        cases = (
            (["1BAD=2"], "--prefill-env: expected K=V with a variable name K (letters, digits "
                         "and _, not first a digit) (got '1BAD=2')"),
            (["SGLANG_DSV4_KV_LAYOUT=v4\x1b[2J"], "--prefill-env: SGLANG_DSV4_KV_LAYOUT: a value "
                                                "with control characters"),
            ([f"SGLANG_DSV4_KV_LAYOUT={big}"], f"--prefill-env: SGLANG_DSV4_KV_LAYOUT: "
                                               f"{MAX_ENV_VALUE_CHARS + 1} characters; at most "
                                               f"{MAX_ENV_VALUE_CHARS} are read"),
            ([f"V{i}=1" for i in range(MAX_ENV_ITEMS + 1)],
             f"--prefill-env: {MAX_ENV_ITEMS + 1} variables; at most {MAX_ENV_ITEMS} are read"),
        )
        for items, message in cases:
            with self.subTest(first=items[0][:40], n=len(items)):
                flags = [arg for item in items for arg in ("--prefill-env", item)]
                err = self.bad(server("prefill", LLAMA), None, *flags)
                self.assertIn(message, err)
                self.assertLess(len(err), 2000)
                self.assertNotIn("\x1b", err)

    def test_check_timeout_out_of_range(self) -> None:
        """``SGLANG_DSV4_GUARD_CHECK_TIMEOUT`` past a day (the child's poll would overflow),
        0, ``inf`` or a word is refused naming the variable, the value and the range; a day
        is accepted."""
        from sglang_dsv4_guard.check.child import check_timeout
        from sglang_dsv4_guard.check.offline.parse import CheckInputError

        for value in ("1e10", "0", "inf", "soon"):
            with self.subTest(value=value), mock.patch.dict(
                    os.environ, {"SGLANG_DSV4_GUARD_CHECK_TIMEOUT": value}):
                with self.assertRaises(CheckInputError) as caught:
                    check_timeout()
                self.assertEqual(str(caught.exception),
                                 "SGLANG_DSV4_GUARD_CHECK_TIMEOUT: expected a number of "
                                 f"seconds above 0 and at most 86400 (got {value!r})")
        with mock.patch.dict(os.environ, {"SGLANG_DSV4_GUARD_CHECK_TIMEOUT": "86400"}):
            self.assertEqual(check_timeout(), 86400.0)

    def test_doctor_names_a_bad_check_timeout(self) -> None:
        """``doctor`` names a bad ``SGLANG_DSV4_GUARD_CHECK_TIMEOUT`` with the accepted range
        (check's own rule), exit 1; a good value: no line about it, exit 0."""
        for value, status in (("-5", 1), ("30", 0)):
            with self.subTest(value=value), mock.patch.dict(
                    os.environ, {"SGLANG_DSV4_GUARD_CHECK_TIMEOUT": value}):
                code, out, _ = run_cli("doctor")
            named = [line for line in out.splitlines() if "CHECK_TIMEOUT" in line]
            self.assertEqual((code, named), (status, [
                "problem: SGLANG_DSV4_GUARD_CHECK_TIMEOUT: expected a number of seconds above "
                "0 and at most 86400 (got '-5'); check exits 2 with it"] if status else []), out)

    def test_transfer_backend_in_capitals(self) -> None:
        """``MORI`` in capitals is refused by SGLang's own parser, naming the flag and the
        value (never "nothing to check")."""
        err = self.bad(server("prefill", GPT_OSS, backend="MORI"))
        self.assertIn("--prefill: SGLang's parser: argument --disaggregation-transfer-backend",
                      err)
        self.assertIn("'MORI'", err)

    def test_unknown_flag(self) -> None:
        """A flag the installed release does not know is named."""
        err = self.bad(server("prefill", LLAMA, "--no-such-flag 3"))
        self.assertIn("unrecognized arguments: --no-such-flag 3", err)

    def test_tp_not_divisible_by_attention_dp(self) -> None:
        """TP 6 with attention DP 4 cannot be split: named, not a traceback."""
        err = self.bad(server("prefill", LLAMA, "--tp-size 6 --dp-size 4 --enable-dp-attention"))
        self.assertIn("--tp-size 6 is not divisible", err)

    def test_huge_args_refused_quickly(self) -> None:
        """1 MB of ARGS (shlex is quadratic: ~70 s) is refused at once, naming the argument,
        the size and the cap; so are more tokens than the cap."""
        err = self.bad(server("prefill", LLAMA, "--tp-size 1 " * 90_000))
        self.assertIn("--prefill: ", err)
        self.assertIn("characters; at most 65536 are read", err)
        err = self.bad(server("prefill", LLAMA), "a " * 5000)
        self.assertIn("--decode: 5000 arguments; at most 4096 are read", err)

    def test_python_launcher_without_module(self) -> None:
        """``python3 --model-path ...`` (a launcher without ``-m sglang.launch_server``) is
        named, with the prefixes accepted."""
        err = self.bad("python3 " + server("prefill", LLAMA))
        self.assertIn("--prefill: starts with 'python3' but not with '-m "
                      "sglang.launch_server'", err)

    def test_model_without_config_json(self) -> None:
        """A model path without config.json is named with the path."""
        err = self.bad(server("prefill", DATA))
        self.assertIn(f"--prefill: --model-path: no config.json in {DATA!r}", err)

    def test_draft_model_without_config_json(self) -> None:
        """A draft model path without config.json is named with its flag."""
        err = self.bad(server("prefill", LLAMA, "--speculative-algorithm EAGLE "
                                                f"--speculative-draft-model-path {DATA}"))
        self.assertIn("--speculative-draft-model-path: no config.json", err)

    def test_missing_model_path(self) -> None:
        """Arguments without --model-path are refused."""
        err = self.bad("--disaggregation-mode prefill --tp-size 2")
        self.assertIn("--prefill: ", err)
        self.assertIn("--model-path", err)

    def test_wrong_disaggregation_mode(self) -> None:
        """A prefill command line that says ``--disaggregation-mode decode`` is refused."""
        err = self.bad(server("decode", LLAMA))
        self.assertIn("--prefill: --disaggregation-mode is 'decode'", err)

    def test_bad_env_item_and_bad_quoting(self) -> None:
        """``--decode-env`` without ``=`` and an unbalanced quote are named."""
        err = self.bad(server("prefill", LLAMA), None, "--decode-env", "NOVALUE")
        self.assertIn("--decode-env: expected K=V", err)
        err = self.bad(server("prefill", LLAMA, "--served-model-name 'x"))
        self.assertIn("--prefill: cannot split the command line", err)

    def test_no_traceback_in_a_fresh_process(self) -> None:
        """The installed command, in its own interpreter: exit 2, one message, no traceback."""
        proc = fresh_python("import sys; from sglang_dsv4_guard.cli import main; "
                            "sys.exit(main(sys.argv[1:]))", "check", "--prefill",
                            server("prefill", LLAMA, "--tp-size 0"), "--decode",
                            server("decode", LLAMA))
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertIn("--prefill: --tp-size must be a positive integer of at most 65,536 "
                      "(got 0)", proc.stderr)


MASK = mask_env()  # the release's name of the sampling-mask variable (pd/buffers.py)
SHELL_LINE = ("this shell's {} applies to neither server: check reads each server's "
              "environment from --prefill-env / --decode-env only")


class TestShellEnvironment(GuardTestCase):
    """Each server's SGLang environment is its ``--*-env`` only: the checking process's
    ``SGLANG_*``/``SGL_*`` variables apply to neither server and are named in ``unknowns``."""

    def mask_pair(self, shell: dict[str, str]) -> tuple[int, dict]:
        kept = {k: v for k, v in os.environ.items()
                if not k.startswith(("SGLANG_", "SGL_")) or k.startswith("SGLANG_DSV4_GUARD_")}
        with mock.patch.dict(os.environ, {**kept, **shell}, clear=True):
            found = check_json(server("prefill", LLAMA, backend="nixl"),
                               server("decode", LLAMA, backend="nixl"),
                               "--prefill-env", f"{MASK}=1")
            self.assertEqual({k: os.environ.get(k) for k in shell}, shell)  # restored
        return found

    def test_shell_variable_applies_to_neither_server(self) -> None:
        """The mask in the shell and in --prefill-env only: the decode lacks it (DSV4G045,
        exit 1); one ``unknowns`` line names the shell's variables, never their values."""
        status, doc = self.mask_pair({MASK: "1", "SGL_PROBE": "s3cr3t-value",
                                      "SGLANG_DSV4_GUARD_MODE": "warn"})
        self.assertEqual((status, codes(doc)), (1, ["DSV4G045"]))
        lines = [u for u in doc["unknowns"] if u.startswith("this shell's")]
        self.assertEqual(lines, [SHELL_LINE.format(f"{MASK}, SGL_PROBE")])
        self.assertNotIn("s3cr3t-value", str(doc))

    def test_no_shell_variable_no_line(self) -> None:
        """Without such variables: the same finding and no such ``unknowns`` line."""
        status, doc = self.mask_pair({})
        self.assertEqual((status, codes(doc)), (1, ["DSV4G045"]))
        self.assertEqual([u for u in doc["unknowns"] if "this shell" in u], [])

    def test_long_list_is_cut(self) -> None:
        """Past ten names the line says how many more."""
        from sglang_dsv4_guard.check.predict import _shell_lines

        names = [f"SGLANG_X{i:02}" for i in range(13)]
        shown = ", ".join(names[:10]) + " and 3 more"
        self.assertEqual(_shell_lines(names), [SHELL_LINE.format(shown)])
        self.assertEqual(_shell_lines([]), [])

    def test_left_out_for_the_check_and_restored(self) -> None:
        """The shell's variables are gone for the whole check, so a server's environment
        set in an outer block survives an inner one (a nested ``offline_env``), and they
        are back afterwards."""
        from sglang_dsv4_guard.check.offline.parse import offline_env, without_shell_settings

        with mock.patch.dict(os.environ, {"SGLANG_SHELL_ONLY": "1"}):
            with without_shell_settings() as names:
                self.assertIn("SGLANG_SHELL_ONLY", names)
                self.assertNotIn("SGLANG_SHELL_ONLY", os.environ)
                with offline_env({MASK: "1"}), offline_env():
                    self.assertEqual(os.environ.get(MASK), "1")
            self.assertEqual(os.environ.get("SGLANG_SHELL_ONLY"), "1")


if __name__ == "__main__":
    unittest.main()
