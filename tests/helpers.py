"""Test helpers: the base test case, the unwrapped SGLang function, release facts.

Every test file runs two ways: under pytest, and as SGLang's CI runs it
(``python3 <file> -f`` from ``sglang.test.ci.ci_utils.run_unittest_files``), where no
conftest runs. So everything a test needs around it lives here, in :class:`GuardTestCase`
and at import: the hypothesis profiles, the clean-state checks, the retry isolation.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import subprocess
import sys
import unittest
from collections.abc import Callable, Iterator
from typing import Any
from unittest import SkipTest, TestResult

import produced_codes
import sglang.srt.disaggregation.decode as decode
import sglang.srt.disaggregation.prefill as prefill
import sglang.srt.disaggregation.utils as utils
from hypothesis import HealthCheck, settings
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang.version import __version__ as sglang_version_label

import sglang_dsv4_guard
from sglang_dsv4_guard.hook_registry import StateHook
from sglang_dsv4_guard.host import targets
from sglang_dsv4_guard.log import silenced
from sglang_dsv4_guard.patching import WRAPPER_MARK, PostImportHooks
from sglang_dsv4_guard.testing import reset

# Everything imported so far (torch, SGLang: millions of objects) lives as long as the
# process. Frozen, the cyclic collector no longer walks it at each full collection: those
# were ~75% of the CPU of code that allocates while SGLang is loaded (check's probes),
# and one full collection took 0.6 s. Reference counting frees as before; objects made
# from here on are collected as before.
gc.freeze()

# SGLang's run_suite.py collects every *.py next to the tests and requires a registry in
# each; a disabled one marks a helper module (listed as skipped, never run).
register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")

# Under SGLang's harness (no pytest, no conftest) the codes passing tests produce are
# recorded through unittest's result; under pytest conftest.py records them first.
produced_codes.under_unittest()

# Hypothesis profiles, registered on import so a file run on its own uses them too.
settings.register_profile("dev", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=2000, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
settings.load_profile(PROFILE)


def fixed_examples(ci: int, profile: str = PROFILE) -> int:
    """The examples a property test whose every example is costly draws: ``ci`` (its
    count in tools/suite.py's ``FIXED_EXAMPLES``, which judges runs by the same rule)
    under the ci profile, and a quarter of it, at least two, under dev: ``make
    check-fast``, in ``make test`` the releases after the first whose code the test drives
    differently, and in ``make matrix`` the releases its property tests draw dev on."""
    return ci if profile == "ci" else max(2, ci // 4)


# Captured at import, before any test installs the guard (GuardTestCase.setUp asserts that
# nothing is patched). Kept inside a dict: the guard rebinds every *module global* that
# holds the original.
_RAW = {"setup_state_kv_args": getattr(utils.setup_state_kv_args, WRAPPER_MARK,
                                       utils.setup_state_kv_args)}
MORI_CONN = targets.MORI_MODULE
MORI_METHODS = tuple(target.attr for target in targets.MORI_TARGETS)
CONTACT = targets.PD_FIRST_CONTACT.attr


def leftovers() -> list[str]:
    """Everything of the guard's still in place in this process, in words (empty: clean)."""
    left = []
    if sglang_dsv4_guard.is_installed():
        left.append("the guard is installed")
    for module in (utils, prefill, decode):
        if module.setup_state_kv_args is not _RAW["setup_state_kv_args"]:
            left.append(f"{module.__name__}.setup_state_kv_args is not SGLang's function")
    conn = sys.modules.get(MORI_CONN)
    if conn is not None:
        for name in MORI_METHODS:
            if hasattr(vars(conn.MoriKVManager)[name], WRAPPER_MARK):
                left.append(f"MoriKVManager.{name} is still wrapped")
    common = sys.modules.get(targets.PD_COMMON_MODULE)
    if common is not None and hasattr(vars(common.CommonKVManager)[CONTACT], WRAPPER_MARK):
        left.append(f"CommonKVManager.{CONTACT} is still wrapped")
    pool_cls = _pool_class()
    if pool_cls is not None and hasattr(vars(pool_cls)[targets.POOL_REGISTER], WRAPPER_MARK):
        left.append(f"{targets.POOL_REGISTER_TARGET} is still wrapped")
    finders = [f for f in sys.meta_path if isinstance(f, PostImportHooks)]
    if finders:
        left.append(f"{len(finders)} import hook(s) of the guard in sys.meta_path")
    registry = _host_registry()
    if registry is not None:
        ours = [t for t, entries in registry._hooks.items()
                for _, hook, _ in entries if isinstance(hook, StateHook)]
        if ours:
            left.append(f"{len(ours)} hook(s) of the guard in SGLang's HookRegistry")
        if _guard_apply_hooks(registry) is not None:
            left.append("HookRegistry.apply_hooks is the guard's one-shot wrapper")
    return left


def _guard_apply_hooks(registry: Any) -> Any:
    """The guard's one-shot ``apply_hooks`` wrapper on ``registry``, or ``None``."""
    func = getattr(vars(registry).get("apply_hooks"), "__func__", None)
    return func if getattr(func, "__module__", None) == "sglang_dsv4_guard.hook_registry" else None


def _pool_class() -> Any:
    module = sys.modules.get(targets.DSV4_POOL.module)
    return getattr(module, targets.DSV4_POOL.qualname, None)


def _host_registry() -> Any:
    module = sys.modules.get("sglang.srt.plugins.hook_registry")
    return getattr(module, "HookRegistry", None)


def reset_guard() -> None:
    """Put SGLang back as it was, whatever a failed test left behind."""
    sglang_dsv4_guard.uninstall()
    for module in (utils, prefill, decode):
        module.setup_state_kv_args = _RAW["setup_state_kv_args"]
    conn = sys.modules.get(MORI_CONN)
    if conn is not None:
        for name in MORI_METHODS:
            method = vars(conn.MoriKVManager)[name]
            setattr(conn.MoriKVManager, name, getattr(method, WRAPPER_MARK, method))
    common = sys.modules.get(targets.PD_COMMON_MODULE)
    if common is not None:
        method = vars(common.CommonKVManager)[CONTACT]
        setattr(common.CommonKVManager, CONTACT, getattr(method, WRAPPER_MARK, method))
    pool_cls = _pool_class()
    if pool_cls is not None:
        method = vars(pool_cls)[targets.POOL_REGISTER]
        setattr(pool_cls, targets.POOL_REGISTER, getattr(method, WRAPPER_MARK, method))
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, PostImportHooks)]
    registry = _host_registry()
    if registry is not None:
        for target, entries in list(registry._hooks.items()):
            entries[:] = [e for e in entries if not isinstance(e[1], StateHook)]
            if not entries:
                del registry._hooks[target]
        wrapper = _guard_apply_hooks(registry)
        if wrapper is not None:  # put back the registry's own method, held in "own"
            cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or (),
                             strict=False))
            registry.apply_hooks = cells["own"].cell_contents


def in_ci() -> bool:
    """Whether this runs in CI (``CI`` set, as GitHub Actions and SGLang's runners set it)."""
    return bool(os.environ.get("CI"))


def _skipped_in_ci(reason: str) -> AssertionError:
    return AssertionError(f"skipped in CI, which counts as a failure: {reason}")


def _fail_skips_in_ci(setup: Any) -> Any:
    """``setUpClass`` whose ``SkipTest`` is a failure in CI."""
    def setUpClass(klass: type) -> None:
        try:
            setup(klass)
        except SkipTest as skip:
            if in_ci():
                raise _skipped_in_ci(str(skip)) from skip
            raise
    setUpClass._safe_setup_wrapped = getattr(setup, "_safe_setup_wrapped", False)  # type: ignore[attr-defined]
    setUpClass._dsv4_no_skip = True  # type: ignore[attr-defined]
    return setUpClass


class GuardTestCase(CustomTestCase):
    """The base of every test: SGLang's ``CustomTestCase`` plus the guard's hygiene.

    - ``setUp`` asserts that the test starts with nothing of the guard in place, then
      runs :func:`sglang_dsv4_guard.testing.reset`: no warning already given, no verdict
      memoised by an earlier test, so what a test sees never depends on test order.
    - After the test and its own clean-ups, it asserts first that nothing is left (SGLang's
      functions are the originals, no import hook of ours in ``sys.meta_path``, the guard
      uninstalled) and only then resets (both ways), so a leak fails the test that leaked.
    - ``CustomTestCase`` retries a failed test method once in SGLang's CI, without running
      ``setUp`` again. Here every retried attempt first runs the clean-ups of the failed
      one and ``setUp`` again, so no state is carried from one attempt to the next.
    - :meth:`install_guard` installs and registers the matching uninstall.
    - In CI (``CI`` set) a skip is a failure, also where no conftest runs (SGLang's runner,
      ``python3 <file>``): a skipped method, a skipped class, a ``setUpClass`` that skips.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        setup = vars(cls).get("setUpClass")
        func = getattr(setup, "__func__", None)
        if func is not None and not getattr(func, "_dsv4_no_skip", False):
            cls.setUpClass = classmethod(_fail_skips_in_ci(func))  # type: ignore[assignment]

    def run(self, result: TestResult | None = None) -> TestResult | None:
        """``unittest``'s run; in CI every skip it reports is recorded as a failure."""
        if result is None or not in_ci():
            return super().run(result)
        add_skip = result.addSkip

        def skip_fails(test: unittest.TestCase, reason: str) -> None:
            try:
                raise _skipped_in_ci(reason)
            except AssertionError:
                result.addFailure(test, sys.exc_info())

        result.addSkip = skip_fails  # type: ignore[method-assign]
        try:
            return super().run(result)
        finally:
            result.addSkip = add_skip  # type: ignore[method-assign]

    def setUp(self) -> None:
        super().setUp()
        left = leftovers()
        if left:
            reset_guard()
        self.assertEqual(left, [], "an earlier test left the guard in place")
        reset()
        self.addCleanup(self._assert_left_clean)  # registered first, so it runs last

    def _assert_left_clean(self) -> None:
        left = leftovers()
        if left:
            reset_guard()
        reset()
        self.assertEqual(left, [], "the test left the guard in place")

    def install_guard(self, *args: Any, **kwargs: Any) -> Callable[[], bool]:
        """``sglang_dsv4_guard.install(...)``, uninstalled again when the test ends."""
        undo = sglang_dsv4_guard.install(*args, **kwargs)
        self.addCleanup(sglang_dsv4_guard.uninstall)
        return undo

    def _callTestMethod(self, method: Callable[[], object]) -> None:
        attempts = 0

        def attempt() -> object:
            nonlocal attempts
            attempts += 1
            if attempts > 1:  # a retry: undo the failed attempt, then set up afresh
                self.doCleanups()
                produced_codes.test_started()  # a failed attempt's codes are not its
                self.setUp()
            return method()

        super()._callTestMethod(attempt)


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
# sglang_dsv4_guard.host.releases, so the matrix checks that module rather than trusting it.
def sglang_release() -> Version:
    """The SGLang release this test process imports, as SGLang itself reads it."""
    return Version(sglang_version_label)


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
    """Silence the guard's logger for a block that fails on purpose many times (as it
    was after: :func:`sglang_dsv4_guard.log.silenced`)."""
    with silenced():
        yield


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
