"""install() keeps its promises under faults: reconfigure cleanly, own undo, all or nothing."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import logging
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import mori_stub
import sglang.srt.disaggregation.utils as utils
from helpers import GuardTestCase, guard_logs_off, outcome, raw_setup_state_kv_args
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError, DSV4GuardStartupRefused
from sglang_dsv4_guard.entry import activate
from sglang_dsv4_guard.testing import PoolSpec, build_pair

register_cpu_ci(est_time=34, suite="stage-a-test-cpu")

mori_stub.install_stub()
import sglang.srt.disaggregation.mori.conn as conn  # noqa: E402 - needs the stub first

_RAW = {name: vars(conn.MoriKVManager)[name] for name in ("_send_swa_dsa_state",
                                                           "_add_remote_peer")}
STATE_TYPES = ("swa", "dsa", "qsa_pending", "qsa_compressed", "swa_ring", "c128_state",
               "minimax_index_k", "minimax_dense_kv")


def send(fn: Any, mgr: Any, peer: Any, state_type: str) -> tuple[str, str]:
    """('ok', repr of the result) or ('raised', the first line of the error)."""
    try:
        return "ok", repr(fn(mgr, *mori_stub.send_args(conn, peer, state_type)))
    except Exception as exc:
        return "raised", str(exc).splitlines()[0]


def guarded_send(mgr: Any, peer: Any, state_type: str) -> tuple[str, str]:
    return send(conn.MoriKVManager._send_swa_dsa_state, mgr, peer, state_type)


class TestReconfigure(GuardTestCase):
    """Items 1-3: a new install() leaves nothing of the earlier one behind."""

    def test_on_after_strict_lets_every_transfer_reach_sglang(self) -> None:
        """install("strict"), a mismatched peer registers (blocked), then install("on"):
        every transfer to that peer has SGLang's own outcome and first line."""
        mgr = mori_stub.manager(conn, attn_tp=8)
        peer = mori_stub.peer(conn, "decode-x", decode_tp=4)
        expected = {s: send(_RAW["_send_swa_dsa_state"], mgr, peer, s) for s in STATE_TYPES}
        with guard_logs_off():
            self.install_guard("strict", load_entry_points=False)
            mgr._add_remote_peer(peer)
            self.assertIn("transfer not attempted", guarded_send(mgr, peer, "swa")[1])
            self.install_guard("on", load_entry_points=False)
            actual = {s: guarded_send(mgr, peer, s) for s in STATE_TYPES}
        self.assertEqual(actual, expected)

    def test_old_strict_block_ends_when_another_wrapper_holds_ours(self) -> None:
        """Another plug-in wraps our send wrapper (so uninstall cannot restore it): after
        install("on"), and after uninstall(), the old strict-mode block refuses nothing;
        every transfer has SGLang's own outcome."""
        mgr = mori_stub.manager(conn, attn_tp=8)
        peer = mori_stub.peer(conn, "decode-held", decode_tp=4)
        expected = {s: send(_RAW["_send_swa_dsa_state"], mgr, peer, s) for s in STATE_TYPES}
        self.addCleanup(setattr, conn.MoriKVManager, "_send_swa_dsa_state",
                        _RAW["_send_swa_dsa_state"])
        with guard_logs_off():
            self.install_guard("strict", load_entry_points=False)
            mgr._add_remote_peer(peer)
            ours = vars(conn.MoriKVManager)["_send_swa_dsa_state"]

            def other(self: Any, *args: Any, **kwargs: Any) -> Any:
                return ours(self, *args, **kwargs)

            other.__signature__ = inspect.signature(ours)  # type: ignore[attr-defined]
            conn.MoriKVManager._send_swa_dsa_state = other  # type: ignore[method-assign]
            self.assertIn("transfer not attempted", guarded_send(mgr, peer, "swa")[1])
            self.install_guard("on", load_entry_points=False)
            after_on = {s: guarded_send(mgr, peer, s) for s in STATE_TYPES}
            sglang_dsv4_guard.uninstall()
            after_uninstall = {s: guarded_send(mgr, peer, s) for s in STATE_TYPES}
        self.assertEqual(after_on, expected)
        self.assertEqual(after_uninstall, expected)

    def test_strict_blocks_only_the_state_type_sglang_rejects(self) -> None:
        """Strict mode, a mismatched peer registered: only ``swa`` is refused early; every
        other state type gets SGLang's own outcome."""
        mgr = mori_stub.manager(conn, attn_tp=8)
        peer = mori_stub.peer(conn, "decode-y", decode_tp=4)
        expected = {s: send(_RAW["_send_swa_dsa_state"], mgr, peer, s)
                    for s in STATE_TYPES if s != "swa"}
        with guard_logs_off():
            self.install_guard("strict", load_entry_points=False)
            mgr._add_remote_peer(peer)
            actual = {s: guarded_send(mgr, peer, s) for s in STATE_TYPES if s != "swa"}
        self.assertEqual(actual, expected)

    def test_json_over_text_install_logs_json(self) -> None:
        """install(log_format="json") over a text install: the next report is on the record
        as JSON-ready data (the message stays readable text)."""
        pair = build_pair(draft=PoolSpec(compression_ratios=(4,)))
        self.install_guard("on", load_entry_points=False)
        self.install_guard("on", load_entry_points=False, log_format="json")
        with self.assertLogs("sglang_dsv4_guard", level=logging.ERROR) as logs:
            kind, _ = outcome(utils.setup_state_kv_args, *pair)
        self.assertEqual(kind, "raised")
        data = getattr(logs.records[0], "sglang_dsv4_guard", None)
        self.assertIsNotNone(data, "a text install's record carries no structured report")
        document = json.loads(json.dumps(data["report"]))
        self.assertEqual(document["findings"][0]["code"], "DSV4G001")

    def test_each_install_returns_its_own_undo(self) -> None:
        """An old undo does nothing once a newer install replaced it; the newer undo
        uninstalls; an identical repeat install returns the same undo."""
        first = self.install_guard("on", load_entry_points=False)
        self.assertIs(sglang_dsv4_guard.install("on", load_entry_points=False), first)
        second = self.install_guard("strict", load_entry_points=False)
        self.assertFalse(first())
        self.assertTrue(sglang_dsv4_guard.is_installed())
        self.assertTrue(second())
        self.assertFalse(sglang_dsv4_guard.is_installed())
        self.assertFalse(second())

    def test_reinstall_over_another_plugins_functools_wraps_wrapper(self) -> None:
        """Another plug-in wraps our setup_state_kv_args with functools.wraps (which copies
        our marker attribute): a reconfiguring install() still installs, over that
        wrapper, and uninstall() puts that wrapper back."""
        self.addCleanup(setattr, utils, "setup_state_kv_args", raw_setup_state_kv_args())
        with guard_logs_off():
            self.install_guard("on", load_entry_points=False)
            ours = utils.setup_state_kv_args

            @functools.wraps(ours)
            def other(*args: Any, **kwargs: Any) -> Any:
                return ours(*args, **kwargs)

            utils.setup_state_kv_args = other
            self.install_guard("strict", load_entry_points=False)
            self.assertTrue(sglang_dsv4_guard.is_installed())
            self.assertIsNot(utils.setup_state_kv_args, other)
            self.assertTrue(sglang_dsv4_guard.uninstall())
        self.assertIs(utils.setup_state_kv_args, other)

    def test_plugin_calling_install_at_import_is_refused_and_named(self) -> None:
        """A third-party entry point whose import calls install("strict") while the
        operator's install("on") loads plug-ins: the operator's install stands (mode on),
        and the nested call is a DSV4G090 load problem naming that plug-in."""
        site = tempfile.TemporaryDirectory()
        self.addCleanup(site.cleanup)
        module = "acme_reenter"
        with open(os.path.join(site.name, f"{module}.py"), "w") as handle:
            handle.write("import sglang_dsv4_guard\n"
                         "sglang_dsv4_guard.install('strict', load_entry_points=False)\n")
        dist = os.path.join(site.name, f"{module}-0.1.dist-info")
        os.mkdir(dist)
        with open(os.path.join(dist, "METADATA"), "w") as handle:
            handle.write(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        with open(os.path.join(dist, "entry_points.txt"), "w") as handle:
            handle.write(f"[sglang_dsv4_guard]\n{module} = {module}\n")
        sys.path.insert(0, site.name)
        self.addCleanup(sys.path.remove, site.name)
        self.addCleanup(sys.modules.pop, module, None)
        with guard_logs_off():
            self.install_guard("on")
        current = sglang_dsv4_guard.lifecycle.installation()
        assert current is not None
        self.assertEqual(current.runtime.settings.mode.value.value, "on")
        problems = [f for f in current.runtime.plugins.load_problems if f.origin == module]
        self.assertEqual([f.code for f in problems], ["DSV4G090"])
        self.assertIn("install() was called while the guard is installing",
                      " ".join(problems[0].details))


@contextmanager
def connector_without_register() -> Iterator[type]:
    """SGLang's imported MORI connector with a copy of ``MoriKVManager`` that lacks
    ``_add_remote_peer`` (the eager-path target missing); the real class is put back."""
    real = conn.MoriKVManager
    namespace = {k: v for k, v in vars(real).items()
                 if k not in ("_add_remote_peer", "__dict__", "__weakref__")}
    copy = type(real.__name__, real.__bases__, namespace)
    conn.MoriKVManager = copy  # type: ignore[misc]
    try:
        yield copy
    finally:
        conn.MoriKVManager = real  # type: ignore[misc]


class TestAllOrNothing(GuardTestCase):
    """Item 4: a failure while installing rolls back every applied patch."""

    def test_missing_mori_target_rolls_back_every_patch_in_mode_on(self) -> None:
        """Mode on, ``_add_remote_peer`` missing: a warning, nothing installed, the send
        method and setup_state_kv_args are SGLang's own, uninstall() has nothing to do."""
        with connector_without_register() as copy:
            with self.assertLogs("sglang_dsv4_guard", level=logging.WARNING) as logs:
                undo = self.install_guard("on", load_entry_points=False)
            self.assertFalse(sglang_dsv4_guard.is_installed())
            self.assertIs(vars(copy)["_send_swa_dsa_state"], _RAW["_send_swa_dsa_state"])
            self.assertIs(utils.setup_state_kv_args, raw_setup_state_kv_args())
            self.assertFalse(sglang_dsv4_guard.uninstall())
            self.assertFalse(undo())
        self.assertTrue(any("rolled back" in r.getMessage() and "_add_remote_peer" in
                            r.getMessage() for r in logs.records))

    def test_missing_mori_target_in_strict_refuses_sglang_startup(self) -> None:
        """Strict mode through SGLang's entry point: DSV4GuardStartupRefused, and SGLang is
        left exactly as it was."""
        with connector_without_register() as copy, \
                mock.patch.dict(os.environ, {"SGLANG_DSV4_GUARD": "strict"}):
            with self.assertRaises(DSV4GuardStartupRefused) as caught:
                activate()
            self.assertIs(vars(copy)["_send_swa_dsa_state"], _RAW["_send_swa_dsa_state"])
        self.assertIn("_add_remote_peer", str(caught.exception))
        self.assertFalse(sglang_dsv4_guard.is_installed())
        self.assertIs(utils.setup_state_kv_args, raw_setup_state_kv_args())

    def test_base_exception_in_binding_scan_leaves_sglang_as_it_was(self) -> None:
        """A BaseException raised while the stale-binding scan reads a module in
        sys.modules rises out of install() and leaves nothing patched, not installed."""

        class Boom(BaseException):
            pass

        class Odd(types.ModuleType):
            @property  # type: ignore[misc]
            def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
                raise Boom("the module's __dict__")

        odd = {"dsv4_odd_module": Odd("dsv4_odd_module")}
        with mock.patch.dict(sys.modules, odd), self.assertRaises(Boom):
            sglang_dsv4_guard.install("on", load_entry_points=False)
        self.assertFalse(sglang_dsv4_guard.is_installed())
        self.assertIs(utils.setup_state_kv_args, raw_setup_state_kv_args())

    def test_base_exception_after_a_patch_rolls_it_back(self) -> None:
        """A KeyboardInterrupt while the MORI connector is wrapped, after
        setup_state_kv_args was patched, rolls that patch back and rises unchanged."""
        with mock.patch("sglang_dsv4_guard.lifecycle.patch_module",
                        side_effect=KeyboardInterrupt), self.assertRaises(KeyboardInterrupt):
            sglang_dsv4_guard.install("on", load_entry_points=False)
        self.assertFalse(sglang_dsv4_guard.is_installed())
        self.assertIs(utils.setup_state_kv_args, raw_setup_state_kv_args())


@contextmanager
def lazy_modules() -> Iterator[dict[str, types.ModuleType]]:
    """Two modules in ``sys.modules`` behind ``importlib.util.LazyLoader``: one healthy
    (it records its own execution), one whose import fails. Removed afterwards."""
    with tempfile.TemporaryDirectory() as root:
        sources = {"dsv4_lazy_ok": "import sys\nsys.dsv4_lazy_ran = True\n",
                   "dsv4_lazy_broken": "raise ImportError('a lazy module that cannot load')\n"}
        modules = {}
        for name, source in sources.items():
            path = os.path.join(root, f"{name}.py")
            with open(path, "w") as handle:
                handle.write(source)
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            spec.loader = importlib.util.LazyLoader(spec.loader)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            modules[name] = module
        try:
            yield modules
        finally:
            for name in sources:
                sys.modules.pop(name, None)
            sys.__dict__.pop("dsv4_lazy_ran", None)


class TestBindingScan(GuardTestCase):
    """Item 4: the stale-binding scan never forces a lazy module to load."""

    def test_scan_leaves_lazy_modules_unloaded(self) -> None:
        """install()/uninstall() with a healthy and a broken lazy module in sys.modules:
        both stay unloaded and install() guards as usual."""
        with lazy_modules() as modules:
            self.install_guard("on", load_entry_points=False)
            self.assertTrue(sglang_dsv4_guard.is_installed())
            self.assertTrue(sglang_dsv4_guard.uninstall())
            for module in modules.values():
                self.assertIs(type(module), importlib.util._LazyModule)  # type: ignore[attr-defined]
            self.assertNotIn("dsv4_lazy_ran", sys.__dict__)

    def test_guarded_call_still_reports_with_lazy_modules_present(self) -> None:
        """With a broken lazy module present, the guard still turns SGLang's error into
        its report."""
        pair = build_pair(draft=PoolSpec(compression_ratios=(4,)))
        with lazy_modules():
            self.install_guard("on", load_entry_points=False)
            with guard_logs_off():
                kind, error = outcome(utils.setup_state_kv_args, *pair)
        self.assertEqual(kind, "raised")
        self.assertIsInstance(error, DSV4GuardError)



class _Proxy:
    """Another plug-in's proxy of a descriptor, as wrapt's FunctionWrapper is: it answers
    ``isinstance`` as what it wraps and logs each call it binds."""

    def __init__(self, wrapped: Any, log: list[str]) -> None:
        self.__wrapped__, self.log = wrapped, log

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self.__wrapped__)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __get__(self, instance: Any, owner: Any) -> Any:
        bound = self.__wrapped__.__get__(instance, owner)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.log.append("proxy ran")
            return bound(*args, **kwargs)
        return call


class TestDescriptorTargets(GuardTestCase):
    """patching wraps a classmethod or staticmethod as the same kind, keeps another
    plug-in's proxy of one in the chain, restores each by identity, and names what it
    cannot wrap."""

    @staticmethod
    def _module(value: Any) -> tuple[types.ModuleType, type]:
        module = types.ModuleType("sglang.guard_descriptor_probe")
        owner = type("Owner", (), {"f": value})
        module.Owner = owner  # type: ignore[attr-defined]
        return module, owner

    @staticmethod
    def _tracing(seen: list[tuple[Any, ...]]) -> Any:
        def make(original: Any) -> Any:
            @functools.wraps(original)
            def wrapper(*args: Any) -> Any:
                seen.append(args)
                return original(*args)
            return wrapper
        return make

    def test_each_kind_binds_as_before_and_is_restored(self) -> None:
        """A classmethod, a staticmethod and a proxy of a classmethod, called through the
        class and an instance (and a subclass for the classmethod): the same results as
        unwrapped, our wrapper saw the same arguments, and restore puts the owner's
        object back."""
        from sglang_dsv4_guard.host.targets import PatchTarget
        from sglang_dsv4_guard.patching import apply, is_ours, restore

        target = PatchTarget("sglang.guard_descriptor_probe", "Owner.f")
        log: list[str] = []
        for value in (classmethod(lambda cls, x: (cls.__name__, x)),
                      staticmethod(lambda x: ("static", x)),
                      _Proxy(classmethod(lambda cls, x: (cls.__name__, x)), log)):
            module, owner = self._module(value)
            sub = type("Sub", (owner,), {})
            calls = (lambda o=owner: o.f(1), lambda o=owner: o().f(2), lambda s=sub: s.f(3))
            before = [c() for c in calls]
            seen: list[tuple[Any, ...]] = []
            patch = apply(target, module, self._tracing(seen))
            held = vars(owner)["f"]
            with self.subTest(kind=type(value).__name__):
                self.assertIs(type(held), classmethod if isinstance(value, classmethod)
                              else staticmethod)
                self.assertTrue(is_ours(held))
                self.assertEqual([c() for c in calls], before)
                self.assertEqual(len(seen), 3)
                self.assertEqual(restore(patch), [])
                self.assertIs(vars(owner)["f"], value)
                self.assertEqual([c() for c in calls], before)
        self.assertEqual(log.count("proxy ran"), 3 + 3 + 3)  # before, wrapped, restored

    def test_what_cannot_be_wrapped_is_named(self) -> None:
        """A property and a classmethod of a number: the install error names the kind
        found, not "does not exist"."""
        from sglang_dsv4_guard.errors import DSV4GuardInstallError
        from sglang_dsv4_guard.host.targets import PatchTarget
        from sglang_dsv4_guard.patching import apply

        target = PatchTarget("sglang.guard_descriptor_probe", "Owner.f")
        for value, kind in ((property(lambda self: 1), "property"),
                            (classmethod(5), "classmethod")):  # type: ignore[arg-type]
            module, owner = self._module(value)
            with self.assertRaises(DSV4GuardInstallError) as caught:
                apply(target, module, self._tracing([]))
            self.assertIn(f"is not a function, classmethod or staticmethod in the installed "
                          f"SGLang (found {kind})", str(caught.exception))
            self.assertIs(vars(owner)["f"], value)


if __name__ == "__main__":
    import unittest

    unittest.main()
