"""Records, per test, the functions the test ran in SGLang and in the guard.

``tools/matrix.py`` runs the base release's tests with this module as a pytest plug-in
(``-p trace_drives``) and a directory named in ``DSV4_GUARD_DRIVES_DIR``. For every test
the plug-in writes one JSON line to ``tests.jsonl`` there: the test's node id, its file,
the functions (file and qualified name) whose code ran during its set-up, call and
tear-down, split into SGLang's (files under the imported ``sglang`` package, relative
to it) and the guard's (under ``sglang_dsv4_guard``), and the processes it started.
``tools/selection.py`` reads the directory.

How code is seen: :class:`cProfile.Profile` (C, a small cost per Python call; built-ins
are not profiled) on the thread that runs the test, and a plain profile function, which
records each code object once, on every thread started meanwhile
(``threading.setprofile``). Function code counts, and SGLang's statements the guard
compiles to evaluate them (code called from the guard's code that is not a function, by
line). What runs while a module is imported does not: the pytest process imports before
its tests. Processes started are counted by their audit events (``sys.addaudithook``:
``subprocess.Popen``, ``os.fork``, ...): a Python interpreter, another program, or a
fork. Children are not traced: a test that starts interpreters is a process test and
declares what its children drive (``PROCESS_TESTS`` in ``tools/suite.py``). Threads
that were already running when a test started are not seen.

Nothing a test sees is changed: no function is wrapped or replaced, the profile
functions only record code objects, and the audit hook only counts.
"""

from __future__ import annotations

import cProfile
import inspect
import json
import os
import sys
import threading
from collections.abc import Generator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

DIR_VARIABLE = "DSV4_GUARD_DRIVES_DIR"
TESTS_FILE = "tests.jsonl"
# The audit events of starting a process, and where each names its program and argv:
# a Python interpreter ("python"), another program ("program"), or a fork of this one.
_ARGS = {"subprocess.Popen": (0, 1), "os.posix_spawn": (0, 1), "os.exec": (0, 1)}
_recording: list[dict[str, int]] = []  # the process starts of the recorders running now
_LAUNCHERS = {"sh", "bash", "dash", "env", "unshare", "nohup", "timeout"}
# multiprocessing starts a spawn or forkserver child through a built-in that raises no
# audit event: its Python function that does so is seen in the profile instead.
_SPAWNS = {("multiprocessing/util.py", "spawnv_passfds")}


def _kind(event: str, args: tuple[Any, ...]) -> str | None:
    if event in ("os.fork", "os.forkpty"):
        return "fork"
    if event == "os.system":
        return "program"
    if event not in _ARGS:
        return None
    program, argv = (args[i] if i < len(args) else None for i in _ARGS[event])
    if program is None and argv:
        program = argv[0] if isinstance(argv, (list, tuple)) else argv
    path = os.fsdecode(program or "")
    python = os.path.basename(path).startswith("python") or \
        os.path.realpath(path) == os.path.realpath(sys.executable)
    if not python and os.path.basename(path) in _LAUNCHERS:  # sh -c "python ...", env python
        words = argv if isinstance(argv, (list, tuple)) else [argv]
        python = any("python" in os.fsdecode(w) for w in words if isinstance(w, (str, bytes)))
    return "python" if python else "program"


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Count a process start; never raise (an audit hook's error would be the test's)."""
    if _recording and event.startswith(("os.", "subprocess.")):
        try:
            kind = _kind(event, args)
        except Exception:  # arguments of a shape not foreseen: taken as an interpreter
            kind = "python"
        if kind is not None:
            for starts in _recording:  # every recorder running (one may hold another)
                starts[kind] = starts.get(kind, 0) + 1


def _roots() -> tuple[str, str]:
    """The directories of the ``sglang`` and ``sglang_dsv4_guard`` packages on ``sys.path``
    (found, not imported)."""
    import importlib.util

    roots = []
    for name in ("sglang", "sglang_dsv4_guard"):
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec and spec.origin else ""
        roots.append(str(Path(origin).resolve().parent) + os.sep if origin else "\0")
    return roots[0], roots[1]


class Recorder:
    """The function code run on this thread (cProfile) and on the threads started meanwhile."""

    def __init__(self) -> None:
        self._profile: cProfile.Profile | None = None
        self._threads: set[CodeType] = set()
        self._snippets: set[CodeType] = set()
        self._starts: dict[str, int] = {}
        self._outer: object = None
        self._outer_threads: object = None
        self.roots = _roots()

    def _thread_hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_flags & inspect.CO_OPTIMIZED:
                self._threads.add(code)
            elif frame.f_back is not None and \
                    frame.f_back.f_code.co_filename.startswith(self.roots[1]):
                self._snippets.add(code)  # SGLang's statements the guard compiled and ran

    def start(self) -> None:
        if not _AUDITING:
            sys.addaudithook(_audit)  # once per process: a hook cannot be removed
            _AUDITING.append(True)
        self._threads = set()
        self._snippets = set()
        self._starts = {}
        _recording.append(self._starts)
        self._outer = sys.getprofile()  # a recorder around this one (a test of this module)
        self._outer_threads = threading.getprofile()
        self._profile = cProfile.Profile(builtins=False)  # Python code is what counts
        threading.setprofile(self._thread_hook)
        self._profile.enable()

    def stop(self) -> dict[str, Any]:
        """What ran since :meth:`start`: ``{"sglang": [[file, qualname], ...], "guard":
        [...], "starts": {"python": n, "program": n, "fork": n}}``
        (processes started, by kind), and
        ``"untraced"`` with the reason where another profiler took the thread meanwhile."""
        assert self._profile is not None
        displaced = sys.getprofile() is not self._profile  # type: ignore[comparison-overlap]
        self._profile.disable()
        threading.setprofile(self._outer_threads)  # type: ignore[arg-type]
        stats = self._profile.getstats()
        self._profile = None
        if _recording and _recording[-1] is self._starts:
            _recording.pop()
        if isinstance(self._outer, cProfile.Profile):  # give the thread back to it
            self._outer.enable()
        spawned = sum(entry.callcount for entry in stats if isinstance(entry.code, CodeType)
                      and ("/".join(Path(entry.code.co_filename).parts[-2:]),
                           entry.code.co_qualname) in _SPAWNS)
        if spawned:
            self._starts["python"] = self._starts.get("python", 0) + spawned
        codes = {entry.code for entry in stats if isinstance(entry.code, CodeType)
                 and entry.code.co_flags & inspect.CO_OPTIMIZED} - _import_only(stats)
        codes |= self._threads
        snippets = {call.code for entry in stats if isinstance(entry.code, CodeType)
                    and entry.code.co_filename.startswith(self.roots[1])
                    for call in entry.calls or () if isinstance(call.code, CodeType)
                    and not call.code.co_flags & inspect.CO_OPTIMIZED} | self._snippets
        found: dict[str, Any] = {"starts": dict(self._starts)}
        if displaced:  # another profiler took the thread: what ran meanwhile is unseen
            found["untraced"] = "another profiler took the test's thread"
        for key, root in zip(("sglang", "guard"), self.roots, strict=True):
            names = {(c.co_filename[len(root):], c.co_qualname) for c in codes
                     if c.co_filename.startswith(root)}
            names |= {(c.co_filename[len(root):], _line(c)) for c in snippets
                      if c.co_filename.startswith(root)}
            found[key] = sorted([path, name] for path, name in names)
        return found


_AUDITING: list[bool] = []


def _import_only(stats: list[Any]) -> set[CodeType]:
    """The functions that ran only as part of importing a module: called from a module's
    body, or only from such functions (a registry filled at import time). A test whose
    modules were imported before it started did not run them either. A module body
    counts when the import system ran it: SGLang's statements the guard compiles and
    runs are not imports."""
    callers: dict[CodeType, set[object]] = {}
    for entry in stats:
        for call in entry.calls or ():
            if isinstance(call.code, CodeType):
                callers.setdefault(call.code, set()).add(entry.code)
    imported: set[object] = {
        code for code, by in callers.items() if code.co_name == "<module>" and any(
            isinstance(c, CodeType) and c.co_filename.startswith("<frozen importlib")
            for c in by)}  # a module's body run by the import system, not a script's
    changed = True
    while changed:
        changed = False
        for code, by in callers.items():
            if code not in imported and by <= imported:
                imported.add(code)
                changed = True
    return {code for code in imported if isinstance(code, CodeType)
            and code.co_flags & inspect.CO_OPTIMIZED}


def _line(code: CodeType) -> str:
    """A statement of SGLang's that the guard compiled from its source and ran
    (``host/pd_digests.py``), as ``@<line>``: ``tools/selection.py`` maps the line to the
    function that holds it."""
    return f"@{min((line for _, _, line in code.co_lines() if line), default=0)}"


def _append(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, written at once."""
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


try:
    import pytest
except ImportError:  # imported without pytest (tests of the Recorder under SGLang's runner)
    pytest = None  # type: ignore[assignment]


class TraceDrives:
    """The plug-in: one JSON line per test in ``<DSV4_GUARD_DRIVES_DIR>/tests.jsonl``."""

    def __init__(self, where: Path) -> None:
        self.out = where / TESTS_FILE
        self.recorder = Recorder()

    if pytest is not None:
        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None
                                    ) -> Generator[None, object, object]:
            record: dict[str, Any] = {"test": item.nodeid, "file": item.location[0]}
            if sys.getprofile() is not None:  # another profiler: do not take its place
                _append(self.out, {**record, "untraced": "another profiler was active"})
                return (yield)
            self.recorder.start()
            try:
                return (yield)
            finally:
                _append(self.out, {**record, **self.recorder.stop()})


def pytest_configure(config: Any) -> None:
    where = os.environ.get(DIR_VARIABLE)
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        config.pluginmanager.register(TraceDrives(Path(where)), "trace_drives_recorder")
