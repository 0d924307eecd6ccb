"""``sglang-dsv4-guard check`` as the installed command, in fresh interpreters: it makes no
network call and writes nothing, in its own process and in the child it starts, on
hostile inputs; its input errors are one line.

Every Python process the command starts gets an audit hook (a ``sitecustomize`` put
first on ``PYTHONPATH``) that records each socket look-up or connection, and each
write outside the run's private temporary directory, into a file the test reads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unittest
from pathlib import Path

from check_helpers import LLAMA, server
from helpers import GuardTestCase, fresh_python
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=119, suite="stage-a-test-cpu")

# Recorded, never refused: the test sees what the command tried, before any wall of ours.
_SITECUSTOMIZE = '''
import os, sys

_LOG = os.environ["DSV4_TEST_AUDIT_LOG"]
_TMP = os.path.realpath(os.environ["TMPDIR"])
_NET = {"socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
        "socket.gethostbyaddr", "socket.sendto"}
# Event: ((path index, dir_fd index or None), ...).
_PATHS = {"os.mkdir": ((0, 2),), "os.rename": ((0, 2), (1, 3)), "os.remove": ((0, 1),),
          "os.rmdir": ((0, 1),), "os.symlink": ((1, 2),), "os.link": ((1, 3),),
          "os.truncate": ((0, None),)}
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def _outside(value, dir_fd=None):
    if isinstance(value, int) or value is None:
        return False
    path = os.fsdecode(os.fspath(value))
    if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(path):
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    path = os.path.realpath(os.path.abspath(path))
    # Python's own bytecode cache of the installed packages is the interpreter's, not the
    # command's.
    return (path not in (_LOG, os.devnull) and not path.startswith(_TMP + os.sep)
            and "__pycache__" not in path)


# Opened once, before any other hook: recording later opens nothing, so a wall that
# refuses opens cannot silence the record.
_FD = os.open(_LOG, os.O_WRONLY | os.O_APPEND)


def _record(line):
    os.write(_FD, f"{os.getpid()} {line}\\n".encode())


def _hook(event, args):
    if event in _NET:
        _record(f"{event} {args[:2]!r}")
    elif event == "open" and len(args) > 2 and isinstance(args[2], int) and args[2] & _WRITE:
        if _outside(args[0]):
            _record(f"write {args[0]!r}")
    elif event in _PATHS:
        for index, fd_index in _PATHS[event]:
            dir_fd = args[fd_index] if fd_index is not None and len(args) > fd_index else None
            if len(args) > index and _outside(args[index], dir_fd):
                _record(f"{event} {args[index]!r}")


sys.addaudithook(_hook)
'''
_MAIN = "import sys; from sglang_dsv4_guard.cli import main; sys.exit(main(sys.argv[1:]))"
# As the installed console script starts: the working directory not on sys.path.
_SCRIPT = "import sys; sys.path.pop(0); " + _MAIN


class _AuditedCommand(GuardTestCase):
    """The command and its child in a fresh interpreter, audited from outside (no tests of
    its own: the classes below are keyed in tools/matrix.py by the SGLang code they drive)."""

    def setUp(self) -> None:
        super().setUp()
        self.root = Path(tempfile.mkdtemp(prefix="dsv4-check-process-"))
        self.addCleanup(shutil.rmtree, self.root, True)
        for name in ("hook", "home", "tmp", "cwd", "dumps"):
            (self.root / name).mkdir()
        (self.root / "hook" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        self.log = self.root / "audit.log"
        self.log.touch()

    def run_command(self, *argv: str, code: str = _MAIN,
                    more_env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """The installed command in a fresh interpreter, audited; cwd, HOME and TMPDIR are
        the test's own empty directories."""
        env = {"DSV4_TEST_AUDIT_LOG": str(self.log), "HOME": str(self.root / "home"),
               "TMPDIR": str(self.root / "tmp"), **(more_env or {})}
        cwd = os.getcwd()
        os.chdir(self.root / "cwd")
        try:
            proc = fresh_python(code, *argv, env=env, path_first=str(self.root / "hook"))
        finally:
            os.chdir(cwd)
        return proc.returncode, proc.stdout, proc.stderr

    def remote_code_model(self) -> str:
        """Llama's config.json with an ``auto_map`` naming code in a Hub repository."""
        config = json.loads((Path(LLAMA) / "config.json").read_text())
        config["auto_map"] = {"AutoConfig": "someorg/remote-model--configuration_x.XConfig"}
        model = self.root / "remote_model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(config))
        return str(model)

    def created(self) -> list[str]:
        """Every file or directory left in the test's cwd, HOME, TMPDIR and dump folder."""
        return sorted(str(p) for name in ("home", "tmp", "cwd", "dumps")
                      for p in (self.root / name).rglob("*"))



class TestCheckProcessTouchesNothing(_AuditedCommand):
    """SGLang's resolution inside the check child fetches nothing and writes nothing (what
    it might fetch or write is the release's ServerArgs and ModelConfig: every release)."""

    def test_check_fetches_nothing_and_writes_nothing_on_hostile_inputs(self) -> None:
        """One check run (it costs two SGLang imports, on every release) on hostile inputs:
        ``--trust-remote-code`` with an ``auto_map`` naming a Hub repository,
        ``SGLANG_USE_MODELSCOPE=1`` with a Hub-style ``--tokenizer-path``, and
        ``--crash-dump-folder X`` (SGLang's resolution creates ``X/<hostname>``) on both
        servers. No socket look-up or connection in any process; each fetch is an
        ``unknowns`` line naming its flag; nothing is left in the command's cwd, HOME,
        TMPDIR or X; the only writes any process tried are under X, each refused and named
        in ``unknowns`` (the fetching inputs try none)."""
        dumps = str(self.root / "dumps")
        prefill = server("prefill", self.remote_code_model(),
                         f"--trust-remote-code --tokenizer-path someorg/tok "
                         f"--crash-dump-folder {dumps}", "mooncake")
        status, out, err = self.run_command(
            "check", "--prefill", prefill,
            "--decode", server("decode", LLAMA, f"--crash-dump-folder {dumps}", "mooncake"),
            "--format", "json", "--prefill-env", "SGLANG_USE_MODELSCOPE=1")
        self.assertEqual(status, 0, err)
        audit = self.log.read_text().splitlines()
        self.assertEqual([line for line in audit if " socket." in line], [])
        unknowns = json.loads(out)["unknowns"]
        for flag in ("--trust-remote-code", "--tokenizer-path"):
            with self.subTest(flag=flag):
                notes = [u for u in unknowns if u.startswith(f"prefill: {flag}")]
                self.assertEqual(len(notes), 1, out)
        self.assertEqual(self.created(), [])
        refused = [u for u in unknowns if u.startswith("this check refused")]
        self.assertEqual(len(refused), 1, out)
        self.assertIn(f"mkdir {dumps}{os.sep}", refused[0])
        # Every write any process tried outside TMPDIR is under X, refused and named.
        tried = [line.split(" ", 2)[2].strip("'") for line in audit]
        self.assertNotEqual(tried, [])
        for path in tried:
            self.assertTrue(path.startswith(dumps + os.sep), audit)
            self.assertIn(path, refused[0])

    def test_model_config_error_is_one_line(self) -> None:
        """A config.json whose ``model_type`` transformers does not know (its message spans
        three lines): exit 2, one line on stderr naming the server and the path, nothing on
        stdout."""
        model = self.root / "unknown_type"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(
            {"architectures": ["LlamaForCausalLM"], "model_type": "no_such_type"}))
        status, out, err = self.run_command(
            "check", "--prefill", server("prefill", str(model), backend="mooncake"),
            "--decode", server("decode", LLAMA, backend="mooncake"))
        self.assertEqual((status, out), (2, ""))
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertTrue(err.startswith(f"sglang-dsv4-guard check: error: --prefill: SGLang's "
                                       f"ModelConfig cannot read {model}/config.json"), err)
        self.assertIn("no_such_type", err)


class TestDoctorProcessTouchesNothing(_AuditedCommand):
    """``doctor`` reads SGLang's plug-in loader and its sources, nothing from the network."""

    def test_doctor_makes_no_network_call(self) -> None:
        """``doctor`` makes no socket look-up or connection."""
        self.run_command("doctor")
        self.assertEqual([line for line in self.log.read_text().splitlines()
                          if " socket." in line], [])


class TestCheckChildLifecycle(_AuditedCommand):
    """The guard's own child machinery: which SGLang it imports, its time limit, SIGTERM."""

    def test_child_imports_the_commands_sglang(self) -> None:
        """A package named ``sglang`` in the working directory (which the command itself
        does not import): the check judges the installed SGLang, exit 0."""
        shadow = self.root / "cwd" / "sglang"
        shadow.mkdir()
        (shadow / "__init__.py").write_text('raise SystemExit("SHADOW")\n')
        status, out, err = self.run_command(
            "check", "--prefill", server("prefill", LLAMA, backend="mooncake"),
            "--decode", server("decode", LLAMA, backend="mooncake"), "--format", "json",
            code=_SCRIPT)
        self.assertNotIn("SHADOW", err)
        self.assertEqual(status, 0, err)
        self.assertEqual(json.loads(out)["findings"], [])

    def test_child_out_of_time_is_stopped(self) -> None:
        """``SGLANG_DSV4_GUARD_CHECK_TIMEOUT=0.5`` (the child imports SGLang for longer):
        exit 2, one line naming the limit and the variable, and no scratch directory left."""
        status, out, err = self.run_command(
            "check", "--prefill", server("prefill", LLAMA, backend="mooncake"),
            "--decode", server("decode", LLAMA, backend="mooncake"),
            more_env={"SGLANG_DSV4_GUARD_CHECK_TIMEOUT": "0.5"})
        self.assertEqual((status, out), (2, ""), err)
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn("did not answer within 0.5 s", err)
        self.assertIn("SGLANG_DSV4_GUARD_CHECK_TIMEOUT", err)
        self.assertEqual(self.created(), [])

    def test_sigterm_removes_the_scratch_directory(self) -> None:
        """SIGTERM to the command while its child runs: the command ends by the signal,
        and its scratch directory and child are gone."""
        import signal
        import subprocess
        import sys
        import time

        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DSV4_GUARD")}
        env.update(HOME=str(self.root / "home"), TMPDIR=str(self.root / "tmp"))
        proc = subprocess.Popen(
            [sys.executable, "-c", _MAIN, "check", "--prefill",
             server("prefill", LLAMA, backend="mooncake"), "--decode",
             server("decode", LLAMA, backend="mooncake")],
            cwd=self.root / "cwd", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(proc.kill)
        deadline = time.monotonic() + 60
        while not list((self.root / "tmp").glob("sglang-dsv4-guard-check-*")):
            self.assertLess(time.monotonic(), deadline, "no scratch directory appeared")
            self.assertIsNone(proc.poll(), "the command ended before its child started")
            time.sleep(0.05)
        time.sleep(0.5)  # the child is importing SGLang
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, -signal.SIGTERM)
        self.assertEqual(self.created(), [])


if __name__ == "__main__":
    unittest.main()
