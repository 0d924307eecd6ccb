"""Decode's first contact at run time: the guard around SGLang's real
``CommonKVManager.try_ensure_parallel_info``, on a bare decode manager whose prefill
bootstrap server is a real HTTP server on 127.0.0.1 (SGLang's own ``requests`` code
runs). A refused pair raises SGLang's type and first line with the report of every
mismatch, under ``check``'s codes; anything else is exactly what SGLang does."""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import tempfile
import textwrap
import unittest
from collections import UserDict
from pathlib import Path
from types import CodeType
from typing import Any

import pd_real
from helpers import GuardTestCase, fixed_examples, sglang_release
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version
from sglang.srt.disaggregation.common import conn
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import (
    ContactContext,
    ContactSnapshot,
    DSV4GuardError,
    Finding,
    Phase,
    Severity,
)
from sglang_dsv4_guard.assembly import standalone_runtime
from sglang_dsv4_guard.contact import wrapper as contact_wrapper
from sglang_dsv4_guard.contact.cached import CACHED_SITE, answers_cached, cached_digest
from sglang_dsv4_guard.hookspecs import hookimpl
from sglang_dsv4_guard.host.pd_digests import known_releases
from sglang_dsv4_guard.host.targets import PD_FIRST_CONTACT
from sglang_dsv4_guard.patching import WRAPPER_MARK
from sglang_dsv4_guard.pd.endpoint import Endpoint, Value
from sglang_dsv4_guard.pd.first_contact import contact_findings
from sglang_dsv4_guard.testing import record, register

register_cpu_ci(est_time=59, suite="stage-a-test-cpu")

NAME = PD_FIRST_CONTACT.attr
RAW = vars(conn.CommonKVManager)[NAME]
RAW = getattr(RAW, WRAPPER_MARK, RAW)  # SGLang's own function, whatever is installed
DCP = sglang_release() >= Version("0.5.17")  # the first release with DCP conditions

PREFILL = dict(attn_tp_size=4, attn_cp_size=1, pp_size=2, page_size=64,
               kv_cache_dtype_str="bf16", enable_kv_cache_sharding=False)
DECODE = dict(attn_tp_size=4, attn_cp_size=1, pp_size=2, page_size=64,
              kv_cache_dtype_str="bf16", dcp_size=1, is_mla_backend=True)


def outcome(fn: Any, decode: dict[str, Any], addr: str) -> tuple[str, Any]:
    """('returned', value) or ('raised', exception) of ``fn`` on a fresh manager."""
    try:
        return "returned", fn(pd_real.decode_manager(decode), addr)
    except Exception as exc:
        return "raised", exc


def first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0]


class TestFirstContactReport(GuardTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.server = self.enterContext(pd_real.bootstrap_server(pd_real.route_answer(PREFILL)))

    def guarded(self, decode: dict[str, Any]) -> tuple[str, Any]:
        return outcome(conn.CommonKVManager.try_ensure_parallel_info, decode, self.server.addr)

    def test_every_mismatch_in_one_error(self) -> None:
        """Page size, KV cache dtype and decode PP all differ: SGLang names the page size
        only; the guard raises SGLang's type and first line, with DSV4G022, DSV4G030 and
        DSV4G035, both servers' values by role and where each came from, and fixes."""
        decode = {**DECODE, "page_size": 32, "kv_cache_dtype_str": "auto", "pp_size": 4}
        kind, sglang_error = outcome(RAW, decode, self.server.addr)
        self.install_guard("on", load_entry_points=False)
        kind, error = self.guarded(decode)
        self.assertEqual(kind, "raised")
        self.assertIsInstance(error, DSV4GuardError)
        self.assertIsInstance(error, type(sglang_error))
        self.assertEqual(first_line(error), str(sglang_error))
        self.assertEqual(error.report.codes, ("DSV4G022", "DSV4G030", "DSV4G035"))
        page = error.findings[0]
        self.assertEqual({(o.role, o.value) for o in page.observations},
                         {("prefill", 64), ("decode", 32)})
        sources = {o.role: o.source for o in page.observations}
        self.assertIn(self.server.addr, sources["prefill"])
        self.assertIn("this decode server", sources["decode"])
        self.assertIs(page.when.phase, Phase.FIRST_CONTACT)
        self.assertIn("first contact", page.when.effect)
        self.assertIn(("decode", "--page-size", "64"),
                      {(e.server, e.name, e.value) for f in page.fixes for e in f.edits})
        # the fixes are the pair condition's (pd/contact_fixes.py); unproven here, as said
        self.assertTrue([d for d in page.details if "unproven" in d and "--fix" in d])
        self.assertEqual(error.report.context["peer"], f"prefill bootstrap {self.server.addr}")
        self.assertIs(error.__cause__, error.host_error)

    def test_assertion_keeps_its_type_with_a_note(self) -> None:
        """A decode PP the rank mapping cannot take is SGLang's bare AssertionError: the
        very exception rises, unchanged, with the report as a note and an attribute."""
        decode = {**DECODE, "pp_size": 4}
        _, sglang_error = outcome(RAW, decode, self.server.addr)
        self.install_guard("on", load_entry_points=False)
        _kind, error = self.guarded(decode)
        self.assertIs(type(error), AssertionError)
        self.assertEqual(str(error), str(sglang_error))
        self.assertEqual(error.dsv4_guard_report.codes, ("DSV4G035",))
        self.assertIn("DSV4G035", "\n".join(error.__notes__))

    def test_accepted_pair_unchanged(self) -> None:
        """A pair SGLang accepts returns True, caches the prefill's info, reports nothing;
        the cached call returns at once without a request."""
        self.install_guard("on", load_entry_points=False)
        recorder = record()
        manager = pd_real.decode_manager(DECODE)
        with self.assertNoLogs("sglang_dsv4_guard", logging.WARNING):
            self.assertIs(conn.CommonKVManager.try_ensure_parallel_info(
                manager, self.server.addr), True)
            self.assertIs(manager.try_ensure_parallel_info(self.server.addr), True)
        self.assertIn(self.server.addr, manager.prefill_info_table)
        self.assertEqual((len(self.server.asked), recorder.reports), (1, []))

    def test_not_ready_unchanged(self) -> None:
        """A bootstrap server answering 503 (not ready): False, as SGLang returns."""
        self.server.status = 503
        self.install_guard("on", load_entry_points=False)
        recorder = record()
        self.assertEqual(self.guarded(DECODE), ("returned", False))
        self.assertEqual(recorder.reports, [])

    def test_plugins_add_and_fail_at_the_boundary(self) -> None:
        """A third-party first-contact check adds its finding (it sees both servers'
        values); one that raises is DSV4G090 in the report; the built-in findings and
        SGLang's first line stay."""
        class Broken:
            @hookimpl
            def sglang_dsv4_guard_check_first_contact(self, contact: Any, context: Any) -> Any:
                raise ValueError("plug-in bug")

        class Policy:
            @hookimpl
            def sglang_dsv4_guard_check_first_contact(
                    self, contact: ContactSnapshot, context: ContactContext) -> list[Finding]:
                page = contact.prefill["page_size"][0] if contact.prefill else None
                return [Finding("ACME001", Severity.WARNING, f"prefill page {page}",
                                subject=contact.bootstrap_addr)]

        self.install_guard("on", load_entry_points=False)
        register(Broken())
        register(Policy())
        _, error = self.guarded({**DECODE, "page_size": 32})
        self.assertIsInstance(error, DSV4GuardError)
        self.assertTrue(first_line(error).startswith("Page size mismatch"))
        self.assertEqual(set(error.report.codes), {"DSV4G022", "ACME001", "DSV4G090"})
        self.assertIn("prefill page 64", {f.summary for f in error.findings})

    def test_our_bug_leaves_sglang_error(self) -> None:
        """A bug of ours while reporting: SGLang's own RuntimeError rises unchanged, and
        one WARNING names the internal error."""
        self.install_guard("on", load_entry_points=False)
        saved = contact_wrapper.snapshot_contact

        def broken(*args: Any) -> Any:
            raise KeyError("guard bug")

        contact_wrapper.snapshot_contact = broken  # type: ignore[assignment]
        self.addCleanup(setattr, contact_wrapper, "snapshot_contact", saved)
        with self.assertLogs("sglang_dsv4_guard", logging.WARNING) as logs:
            _kind, error = self.guarded({**DECODE, "page_size": 32})
        self.assertIs(type(error), RuntimeError)
        self.assertTrue(str(error).startswith("Page size mismatch"))
        self.assertEqual(len([r for r in logs.records if "internal error" in r.getMessage()]),
                         1, logs.output)

    def test_second_rank_gets_a_pointer(self) -> None:
        """Two decode ranks (managers) meeting the same prefill with the same mismatch: the
        first error carries the full report, the second one line naming its fingerprint;
        both keep SGLang's first line and the report as data."""
        self.install_guard("on", load_entry_points=False)
        decode = {**DECODE, "page_size": 32, "kv_cache_dtype_str": "auto"}
        _, first = self.guarded(decode)
        _, second = self.guarded(decode)
        self.assertIn("[DSV4G030] error", str(first))
        self.assertEqual(first_line(second), first_line(first))
        self.assertEqual(len(str(second).splitlines()), 2, str(second))
        self.assertIn("same report as printed in full earlier", str(second))
        self.assertEqual(second.report.codes, first.report.codes)

    def test_uninstall_restores(self) -> None:
        """install() wraps the method where CommonKVManager defines it; uninstall() puts
        SGLang's function back."""
        self.install_guard("on", load_entry_points=False)
        self.assertIs(getattr(vars(conn.CommonKVManager)[NAME], WRAPPER_MARK), RAW)
        sglang_dsv4_guard.uninstall()
        self.assertIs(vars(conn.CommonKVManager)[NAME], RAW)


def calls_into(fn: Any, code: CodeType) -> tuple[Any, bool]:
    """``fn()``'s result, and whether a frame of ``code`` ran (Python's profiler hook)."""
    seen: list[bool] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            seen.append(True)

    sys.setprofile(profile)
    try:
        return fn(), bool(seen)
    finally:
        sys.setprofile(None)


def changed_source(first: str, replacement: str) -> Any:
    """SGLang's own ``try_ensure_parallel_info`` with its text ``first`` replaced, compiled
    from a file of its own (so its source can be read) in the module's globals."""
    text = textwrap.dedent(inspect.getsource(RAW.__code__))
    assert first in text, first
    path = Path(tempfile.mkdtemp()) / "changed_conn.py"
    path.write_text(text.replace(first, replacement, 1))
    scope = dict(vars(conn))
    exec(compile(path.read_text(), str(path), "exec"), scope)
    return scope[NAME]


class Counting(UserDict):  # type: ignore[type-arg]
    """A prefill table that is not a dict: counts the membership tests run on it."""

    tests = 0

    def __contains__(self, key: object) -> bool:
        type(self).tests += 1
        return super().__contains__(key)


class TestCachedFastPath(GuardTestCase):
    """The wrapper answers the cached case itself only where SGLang's first statement is a
    known release's (digest), and then exactly as SGLang does."""

    def setUp(self) -> None:
        super().setUp()
        self.server = self.enterContext(pd_real.bootstrap_server(pd_real.route_answer(PREFILL)))

    def test_known_release_answers_without_sglang(self) -> None:
        """This release's first statement has the digest stored for it; once a call has
        seen the manager's table, the installed wrapper returns True for a cached address
        without entering SGLang's function, and enters it for an address not cached
        (returning SGLang's fetch result)."""
        stored = known_releases()[str(sglang_release())][CACHED_SITE.key]
        self.assertEqual(cached_digest(RAW), stored)
        # the statement the wrapper runs is that very statement (the same digest)
        self.assertEqual(cached_digest(contact_wrapper._answers_cached_first), stored)
        self.install_guard("on", load_entry_points=False)
        guarded = conn.CommonKVManager.try_ensure_parallel_info
        manager = pd_real.decode_manager(DECODE)
        manager.prefill_info_table[self.server.addr] = object()
        for _ in range(2):
            self.assertEqual(calls_into(lambda: guarded(manager, self.server.addr),
                                        RAW.__code__), (True, False))
        fresh = pd_real.decode_manager(DECODE)  # not cached: SGLang fetches
        self.assertEqual(calls_into(lambda: guarded(fresh, self.server.addr), RAW.__code__),
                         (True, True))
        self.assertEqual(len(self.server.asked), 1)

    def test_changed_source_keeps_the_plain_wrapper(self) -> None:
        """A first statement no known release has, or another plug-in's wrapper around
        SGLang's function: the cached call goes through that function."""
        changed = changed_source("return True", "return bool(self.prefill_info_table)")
        outer = functools.wraps(RAW)(lambda *a: RAW(*a))
        self.assertTrue(answers_cached(RAW))
        guard = contact_wrapper.ContactGuard(standalone_runtime())
        make = contact_wrapper.make_contact_wrapper(guard)
        for original in (changed, outer):
            self.assertFalse(answers_cached(original))
            manager = pd_real.decode_manager(DECODE)
            manager.prefill_info_table["prefill:1"] = object()
            wrapped = make(original)
            self.assertEqual(calls_into(functools.partial(wrapped, manager, "prefill:1"),
                                        original.__code__), (True, True))

    def test_other_tables_and_errors_as_sglangs(self) -> None:
        """A table that is not a dict: the same answers; on a miss SGLang's statement runs
        once more (the wrapper's, then SGLang's own), never on a hit. No table: the same
        exception, type and message, as SGLang's own statement raises."""
        self.install_guard("on", load_entry_points=False)
        guarded = conn.CommonKVManager.try_ensure_parallel_info
        # the same bootstrap server under a second name: a miss, then cached
        other = self.server.addr.replace("127.0.0.1", "localhost")
        for cached in (True, False):
            counts = []
            for fn in (RAW, guarded):
                manager = pd_real.decode_manager(DECODE)
                manager.prefill_info_table = Counting()
                if cached:
                    manager.prefill_info_table[self.server.addr] = object()
                Counting.tests = 0
                for addr in (self.server.addr, other, other):
                    self.assertIs(fn(manager, addr), True)
                counts.append(Counting.tests)
            misses = 1 if cached else 2  # other's first call; and addr's when not cached
            self.assertEqual(counts[1], counts[0] + misses, (cached, counts))
        errors = []
        for fn in (RAW, guarded):
            manager = pd_real.decode_manager(DECODE)
            del manager.prefill_info_table
            try:
                fn(manager, self.server.addr)
            except AttributeError as error:  # unittest's assertRaises drops the traceback
                errors.append(error)
        self.assertEqual(len(errors), 2)
        self.assertEqual(str(errors[0]), str(errors[1]))


def _endpoint(role: str, values: dict[str, Any]) -> Endpoint:
    return Endpoint(role, {k: Value(v, "drawn") for k, v in values.items()})


@st.composite
def pairs(draw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    def side(decode: bool) -> dict[str, Any]:
        out = dict(attn_tp_size=draw(st.sampled_from([1, 2, 4])),
                   attn_cp_size=draw(st.sampled_from([1, 1, 2])),
                   pp_size=draw(st.sampled_from([1, 2, 4])),
                   page_size=draw(st.sampled_from([32, 64])),
                   kv_cache_dtype_str=draw(st.sampled_from(["auto", "bf16"])),
                   enable_kv_cache_sharding=draw(st.booleans()))
        if decode:
            out.update(dcp_size=draw(st.sampled_from([1, 2])) if DCP else 1,
                       is_mla_backend=draw(st.booleans()))
        return out
    return side(False), side(True)


class TestFirstContactParity(GuardTestCase):
    @settings(max_examples=fixed_examples(25), deadline=None, derandomize=True)
    @given(pairs())
    def test_parity(self, pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
        """On drawn servers SGLang's outcome (return value, or exception type and first
        line) is the same wrapped in every mode as unwrapped, and the report's codes are
        exactly the ones check's first-contact row gives on the same values."""
        prefill, decode = pair
        with pd_real.bootstrap_server(pd_real.route_answer(prefill)) as server:
            want = outcome(RAW, decode, server.addr)
            expected = {f.code for f in contact_findings(
                _endpoint("prefill", prefill), _endpoint("decode", decode),
                str(sglang_release()))[0]}
            try:
                for mode in ("on", "strict"):
                    sglang_dsv4_guard.install(mode, load_entry_points=False)
                    got = outcome(conn.CommonKVManager.try_ensure_parallel_info, decode,
                                  server.addr)
                    self.assertEqual(got[0], want[0])
                    if want[0] == "returned":
                        self.assertEqual(got[1], want[1])
                        self.assertEqual(expected, set())
                        continue
                    self.assertIsInstance(got[1], type(want[1]))
                    self.assertEqual(first_line(got[1]), first_line(want[1]))
                    report = getattr(got[1], "report", None) or got[1].dsv4_guard_report
                    self.assertEqual(set(report.codes), expected)
            finally:
                sglang_dsv4_guard.uninstall()


if __name__ == "__main__":
    unittest.main()
