"""A broken or hostile plug-in is isolated: it never costs the report, the order or the verdict."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import sglang.srt.disaggregation.utils as utils
from check_helpers import GPT_OSS, server
from helpers import UNWRAPPED, GuardTestCase, guard_logs_off, outcome
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard import DSV4GuardError, Finding, Observation, Severity, hookimpl
from sglang_dsv4_guard.assembly import build_plugins
from sglang_dsv4_guard.cli import main as cli_main
from sglang_dsv4_guard.lifecycle import installation
from sglang_dsv4_guard.plugins import GuardPlugins, add_plugin
from sglang_dsv4_guard.render import render_report
from sglang_dsv4_guard.testing import PoolSpec, build_pair, check_pools, record, register

register_cpu_ci(est_time=43, suite="stage-a-test-cpu")


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr exploded")


GOOD = Finding("ACME001", Severity.WARNING, "site policy", "draft pool")
BAD_FINDINGS = (
    Finding("ACME002", "warning", "severity is a plain string", "x"),  # type: ignore[arg-type]
    Finding("ACME003", Severity.WARNING, "observation is a string", "x",
            observations=("draft pool page_size=64",)),  # type: ignore[arg-type]
    Finding("ACME004", Severity.WARNING, "value whose repr raises", "x",
            observations=(Observation("draft pool", "page_size", _BadRepr(), "a flag"),)),
)


class BadFields:
    """Returns one good finding and three that pass ``isinstance`` but have a bad field."""

    @hookimpl
    def sglang_dsv4_guard_check_state(self) -> list[Finding]:
        return [GOOD, *BAD_FINDINGS]

    @hookimpl
    def sglang_dsv4_guard_check_send(self) -> list[Finding]:
        return [GOOD, *BAD_FINDINGS]


@contextlib.contextmanager
def entry_point_plugin(name: str, source: str) -> Iterator[str]:
    """Install a module ``name`` as a real ``sglang_dsv4_guard`` entry point (a dist-info
    directory on ``sys.path``, found by ``importlib.metadata``); remove it afterwards."""
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, f"{name}.py"), "w") as module:
            module.write(textwrap.dedent(source))
        info = os.path.join(root, f"{name}-0.1.dist-info")
        os.mkdir(info)
        with open(os.path.join(info, "METADATA"), "w") as meta:
            meta.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as eps:
            eps.write(f"[sglang_dsv4_guard]\n{name} = {name}\n")
        sys.path.insert(0, root)
        try:
            yield name
        finally:
            sys.path.remove(root)
            sys.modules.pop(name, None)


def manager(*named: tuple[str, object], load_entry_points: bool = False) -> GuardPlugins:
    """The guard's real plug-in manager with ``named`` plug-ins added as a server adds them."""
    plugins = build_plugins(load_entry_points)
    for name, plugin in named:
        assert add_plugin(plugins, plugin, name) is None, name
    return plugins


def rejected_pair_guarded(test: GuardTestCase, mode: str, plugin: object
                          ) -> tuple[Exception, Any]:
    """SGLang's error on a pair it rejects (a compressed draft layer), and what the guard
    raises for it in ``mode`` with ``plugin`` registered (uninstalled when ``test`` ends)."""
    pair = build_pair(draft=PoolSpec(compression_ratios=(4,)))
    _, host = outcome(UNWRAPPED, *pair)
    test.install_guard(mode, load_entry_points=False)
    register(plugin)
    with guard_logs_off():
        _, guarded = outcome(utils.setup_state_kv_args, *pair)
    return host, guarded


def g090(findings: Any, plugin: str) -> list[Finding]:
    """The DSV4G090 findings naming ``plugin``."""
    return [f for f in findings if f.code == "DSV4G090" and f.origin == plugin]


class FixQuietly:
    """A remediation that fixes the draft's page size and says nothing (or raises)."""

    raises = False

    @hookimpl
    def sglang_dsv4_guard_remediate_state(self, target_pool: Any,
                                          draft_pool: Any) -> None:
        draft_pool.page_size = target_pool.page_size
        if self.raises:
            raise ValueError("done, then failed")


class Exits:
    @hookimpl
    def sglang_dsv4_guard_check_state(self) -> None:
        sys.exit(3)


class Interrupts:
    @hookimpl
    def sglang_dsv4_guard_check_state(self) -> None:
        raise KeyboardInterrupt


class SiteRule:
    @hookimpl
    def sglang_dsv4_guard_check_state(self) -> list[Finding]:
        return [Finding("ACME009", Severity.ERROR, "site forbids this", "pools",
                        host_message="ACME forbids this layout")]


class TestBadFindings(GuardTestCase):
    """Item 6: every third-party finding is validated at the plug-in boundary."""

    def assert_isolated(self, findings: Any, plugin: str) -> None:
        codes = [f.code for f in findings]
        self.assertIn("ACME001", codes)
        for bad in ("ACME002", "ACME003", "ACME004"):
            self.assertNotIn(bad, codes)
        problems = [f.details[0] for f in g090(findings, plugin)]
        self.assertEqual(len(problems), 3, problems)
        self.assertIn("severity must be a sglang_dsv4_guard.Severity (got str 'warning')",
                      problems[0])
        self.assertIn("observations[0] must be an Observation (got str", problems[1])
        self.assertIn("repr raised RuntimeError: repr exploded", problems[2])

    def test_g090_bad_finding_fields_keep_the_report_in_mode_on(self) -> None:
        """Mode on, a pair SGLang rejects: SGLang's line leads, DSV4G001 and the good
        third-party finding survive, each bad finding is a DSV4G090 naming the plug-in."""
        host, guarded = rejected_pair_guarded(self, "on", BadFields())
        self.assertIsInstance(guarded, DSV4GuardError)
        self.assertEqual(str(guarded).splitlines()[0], str(host))
        self.assertIn("DSV4G001", [f.code for f in guarded.findings])
        self.assert_isolated(guarded.findings, "BadFields")

    def test_g090_bad_finding_fields_in_strict_mode_keep_sglang_message(self) -> None:
        """Strict mode, a pair SGLang rejects: SGLang's own message, never "failed
        internally"."""
        host, guarded = rejected_pair_guarded(self, "strict", BadFields())
        self.assertEqual(str(guarded).splitlines()[0], str(host))
        self.assertNotIn("failed internally", str(guarded))
        self.assert_isolated(guarded.findings, "BadFields")

    def test_g090_bad_finding_fields_in_check_pools(self) -> None:
        """``testing.check_pools`` returns a report that renders, bad findings as DSV4G090."""
        report = check_pools(*build_pair(), BadFields())
        self.assert_isolated(report.findings, "BadFields")
        self.assertIn("[ACME001]", render_report(report) or "")

    def test_a_flood_of_findings_is_capped_and_said(self) -> None:
        """A plug-in returning 20,000 findings (each would be checked, kept and printed, in
        SGLang's bootstrap thread at registration): the first MAX_FINDINGS are kept, and one
        DSV4G090 says how many came."""
        from sglang_dsv4_guard.plugins import MAX_FINDINGS

        class Flood:
            @hookimpl
            def sglang_dsv4_guard_check_state(self) -> list[Finding]:
                return [Finding(f"ACME{i:05}", Severity.WARNING, "many", "x")
                        for i in range(20_000)]

        report = check_pools(*build_pair(), Flood())
        ours = [f for f in report.findings if f.code.startswith("ACME")]
        self.assertEqual([f.code for f in ours], [f"ACME{i:05}" for i in range(MAX_FINDINGS)])
        excess = [f for f in report.findings if f.code == "DSV4G090"]
        self.assertEqual(len(excess), 1)
        self.assertIn(f"returned 20000 findings; the first {MAX_FINDINGS} are kept",
                      excess[0].details[0])
        self.assertEqual(excess[0].summary, f"guard plug-in {excess[0].origin!r} returned "
                                            f"20000 findings; the first {MAX_FINDINGS} are kept")
        said = " ".join((excess[0].summary, excess[0].when.effect, *excess[0].details,
                         excess[0].fixes[0].text))
        self.assertNotIn("without it", said)
        self.assertNotIn("without the plug-in", said)

    def test_explain_g090_mentions_the_cap(self) -> None:
        """``explain DSV4G090`` says a plug-in's findings past the cap are left out."""
        from sglang_dsv4_guard.plugins import MAX_FINDINGS

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(cli_main(["explain", "DSV4G090"]), 0)
        self.assertIn(f"the first {MAX_FINDINGS} per call are kept: the ones past that cap are "
                      "left out and counted", " ".join(out.getvalue().split()))

    def test_g090_bad_finding_fields_in_check_command(self) -> None:
        """``check`` with a bad plug-in installed through a real entry point prints the
        report, no traceback."""
        source = """
            from sglang_dsv4_guard import Finding, Observation, Severity, hookimpl
            class _BadRepr:
                def __repr__(self):
                    raise RuntimeError("repr exploded")
            @hookimpl
            def sglang_dsv4_guard_check_send(transfer):
                return [Finding("ACME001", Severity.WARNING, "site policy", "draft pool"),
                        Finding("ACME004", Severity.WARNING, "bad", "x", observations=(
                            Observation("decode", "tp", _BadRepr(), "a flag"),))]
        """
        out = io.StringIO()
        with entry_point_plugin("acme_bad_preflight", source), guard_logs_off(), \
                contextlib.redirect_stdout(out):
            code = cli_main(["check", "--prefill", server("prefill", GPT_OSS, "--tp-size 8"),
                             "--decode", server("decode", GPT_OSS, "--tp-size 4")])
        self.assertEqual(code, 1)
        self.assertIn("[DSV4G006]", out.getvalue())
        self.assertIn("[ACME001]", out.getvalue())
        self.assertIn("repr raised RuntimeError: repr exploded", out.getvalue())


class _Flood:
    """A plug-in whose one finding has 1000 observations, 10,000 details and fixes, and
    million-character strings."""

    @hookimpl
    def sglang_dsv4_guard_check_state(self, pair: Any, context: Any) -> list[Finding]:
        big = "x" * 1_000_000
        return [Finding(
            "ACME100", Severity.WARNING, big, big,
            observations=tuple(Observation(big, big, i, big) for i in range(1000)),
            details=(big,) * 10_000, fixes=(big,) * 10_000, docs=big)]


class TestThirdPartyFindingsAreCapped(GuardTestCase):
    """Item 15: a plug-in's finding is capped at the plug-in boundary and in rendering."""

    def test_flooding_finding_renders_a_bounded_message(self) -> None:
        """Mode on, a pair SGLang rejects: the flooding finding keeps its first 16
        observations, details and fixes plus a count, every string cut to 4 KiB, so the
        message and the JSON report stay well under a megabyte."""
        _, guarded = rejected_pair_guarded(self, "on", _Flood())
        self.assertIsInstance(guarded, DSV4GuardError)
        [flood] = [f for f in guarded.findings if f.code == "ACME100"]
        self.assertEqual(len(flood.observations), 16)
        self.assertEqual(len(flood.fixes), 17)
        self.assertIn("... +9984 more (10000 in all)", flood.fixes[-1].text)
        self.assertIn("+984 more observations (1000 in all)", flood.details[0])
        self.assertLessEqual(max(len(flood.summary), len(flood.docs)), 4096 + 40)
        self.assertLess(len(str(guarded)), 400_000)
        self.assertLess(len(guarded.report.to_json()), 400_000)


class TestRemediationChangeToken(GuardTestCase):
    """The token compared around each remediation plug-in follows SGLang's values, not
    the objects that carry them."""

    def test_fresh_equal_tuples_keep_the_token(self) -> None:
        """A ratios property that builds a new, equal tuple on every read (0.5.16's pools
        do) gives the same change token every time, so a plug-in that changed nothing is
        never taken for one that changed the pool."""
        from sglang_dsv4_guard.state.snapshot import change_token

        _, draft = build_pair()
        built: list[tuple[int, ...]] = []  # every tuple stays alive: ids cannot be reused

        def ratios(pool: Any) -> tuple[int, ...]:
            built.append(tuple(pool.layer_ratios))
            return built[-1]

        draft.layer_ratios = [0] * 1_000_000
        draft.__class__ = type("FreshRatiosPool", (type(draft),),
                               {"compression_ratios": property(ratios)})
        first = change_token(draft)
        self.assertEqual(change_token(draft), first)
        self.assertIsNot(built[0], built[1])

    def test_a_ratio_changed_in_place_changes_the_token(self) -> None:
        """One of a million ratios changed in SGLang's own list, in place (same list, same
        length): the token changes, so the pair is snapshotted again."""
        from sglang_dsv4_guard.state.snapshot import change_token

        _, draft = build_pair()
        draft.compression_ratios = [0] * 1_000_000
        before = change_token(draft)
        draft.compression_ratios[500_000] = 4
        self.assertNotEqual(change_token(draft), before)


class FormatBoom(str):
    def __format__(self, spec: str) -> str:
        raise ValueError("format boom")


class StrBoom(str):
    def __str__(self) -> str:
        raise ValueError("str boom")


class LenBoom(str):
    def __len__(self) -> int:
        raise ValueError("len boom")


class FlakyRepr:
    """Its repr works once, then raises."""

    calls = 0

    def __repr__(self) -> str:
        FlakyRepr.calls += 1
        if FlakyRepr.calls > 1:
            raise RuntimeError("second repr")
        return "flaky-ok"


class StrSubclassFields:
    """Findings whose text fields are ``str`` subclasses that break formatting, and values
    whose ``str`` or later ``repr`` raise."""

    @hookimpl
    def sglang_dsv4_guard_check_state(self) -> list[Finding]:
        return [
            Finding(FormatBoom("ACME010"), Severity.WARNING, FormatBoom("fmt summary"), "x",
                    details=(FormatBoom("fmt detail"),), fixes=(StrBoom("str fix"),)),
            Finding("ACME011", Severity.WARNING, "odd observations", StrBoom("subject"),
                    observations=(
                        Observation(LenBoom("draft pool"), "a", StrBoom("str value"), "src"),
                        Observation("draft pool", FormatBoom("b"), FlakyRepr(), "src"),
                    )),
        ]


class TestStrSubclassFields(GuardTestCase):
    """Item 4 of the review: the boundary stores exact ``str`` and shown values, so a
    plug-in's ``str`` subclass or flaky ``repr`` cannot break rendering later."""

    def setUp(self) -> None:
        super().setUp()
        FlakyRepr.calls = 0

    def test_g090_str_subclass_fields_keep_the_report_in_mode_on(self) -> None:
        """Mode on, a pair SGLang rejects: SGLang's line leads, DSV4G001 and both plug-in
        findings are in the report, every text field an exact str, rendered."""
        host, guarded = rejected_pair_guarded(self, "on", StrSubclassFields())
        self.assertIsInstance(guarded, DSV4GuardError)
        self.assertEqual(str(guarded).splitlines()[0], str(host))
        codes = [f.code for f in guarded.findings]
        self.assertIn("DSV4G001", codes)
        self.assertIn("ACME010", codes)
        self.assertIn("ACME011", codes)
        for f in guarded.findings:
            texts = [f.code, f.summary, f.subject, *f.details, *(x.text for x in f.fixes)]
            texts += [t for o in f.observations for t in (o.role, o.name, o.source)]
            self.assertEqual({type(t) for t in texts}, {str}, f.code)
        rendered = render_report(guarded.report) or ""
        self.assertIn("fmt summary", rendered)
        self.assertIn("flaky-ok", rendered)

    def test_str_subclass_fields_in_strict_are_the_plugins_findings(self) -> None:
        """Strict mode, a pair SGLang accepts: strict escalates the plug-in's warnings as
        its findings, never as the guard "failing internally"."""
        self.install_guard("strict", load_entry_points=False)
        register(StrSubclassFields())
        with guard_logs_off():
            kind, result = outcome(utils.setup_state_kv_args, *build_pair())
        self.assertEqual(kind, "raised")
        self.assertNotIn("failed internally", str(result))
        self.assertEqual(str(result).splitlines()[0],
                         "sglang-dsv4-guard (strict mode): [ACME010] fmt summary")


class TestRemediationChangesPools(GuardTestCase):
    """Item 7: a remediation that changes a pool silently is re-read and named."""

    def test_silent_remediation_is_named_not_blamed_on_the_guard(self) -> None:
        """A remediation that fixes the draft's page size and returns nothing (or raises
        after fixing it): SGLang accepts, the checks see the fixed pools (no DSV4G005, no
        DSV4G099), and a DSV4G090 names the plug-in that changed them."""

        for raises in (False, True):
            with self.subTest(raises=raises):
                pair = build_pair(draft=PoolSpec(page_size=64))
                self.assertEqual(outcome(UNWRAPPED, *pair)[0], "raised")
                fixer = FixQuietly()
                fixer.raises = raises
                self.install_guard("on", load_entry_points=False)
                register(fixer)
                recorder = record()
                with guard_logs_off():
                    kind, _ = outcome(utils.setup_state_kv_args, *pair)
                sglang_dsv4_guard.uninstall()
                self.assertEqual(kind, "ok")
                codes = recorder.codes
                self.assertNotIn("DSV4G099", codes)
                self.assertNotIn("DSV4G005", codes)
                named = [d for f in g090(recorder.reports[0].findings, "FixQuietly")
                         for d in f.details]
                self.assertTrue(any("changed what SGLang reads" in d for d in named), named)


class Calls:
    """A check plug-in that writes its name into a shared list when called."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.__name__ = name
        self.log = log

    @hookimpl
    def sglang_dsv4_guard_check_state(self) -> list[Finding]:
        self.log.append(self.__name__)
        return []


class First(Calls):
    @hookimpl(tryfirst=True)
    def sglang_dsv4_guard_check_state(self) -> list[Finding]:
        return super().sglang_dsv4_guard_check_state()


class Last(Calls):
    @hookimpl(trylast=True)
    def sglang_dsv4_guard_check_state(self) -> list[Finding]:
        return super().sglang_dsv4_guard_check_state()


class Wrapper:
    @hookimpl(wrapper=True)
    def sglang_dsv4_guard_report(self) -> Iterator[None]:
        return (yield)


class TestPluggyContract(GuardTestCase):
    """Item 8: pluggy's call order, and hook wrappers refused when registered."""

    def test_implementations_run_in_pluggy_call_order(self) -> None:
        """tryfirst, then last-registered first, trylast at the end: exactly the order
        pluggy's own hook call uses on the same manager."""
        log: list[str] = []
        plugins = manager(*((p.__name__, p) for p in (
            Last("last", log), Calls("a", log), First("first", log), Calls("b", log))))
        kwargs = {"pair": None, "context": None}
        plugins.pm.unregister(name="builtin_state")  # it reads the pair; not under test
        plugins.collect("sglang_dsv4_guard_check_state", kwargs)
        guard_order = list(log)
        log.clear()
        plugins.pm.hook.sglang_dsv4_guard_check_state(**kwargs)
        self.assertEqual(guard_order, log)
        self.assertEqual(guard_order, ["first", "b", "a", "last"])

    def test_hook_wrapper_refused_at_registration(self) -> None:
        """``wrapper=True`` is refused with a clear error by ``testing.check_pools`` and is a
        load problem (not a "returned generator" DSV4G090) through a real entry point."""
        with self.assertRaises(ValueError) as caught:
            check_pools(*build_pair(), Wrapper())
        self.assertIn("does not support hook wrappers", str(caught.exception))
        source = """
            from sglang_dsv4_guard import hookimpl
            @hookimpl(hookwrapper=True)
            def sglang_dsv4_guard_report(report):
                yield
        """
        with entry_point_plugin("acme_wrapper", source):
            plugins = manager(load_entry_points=True)
        self.assertNotIn("acme_wrapper", plugins.names())
        [problem] = g090(plugins.load_problems, "acme_wrapper")
        self.assertIn("sglang_dsv4_guard_report as a hook wrapper", problem.details[0])


class Raising:
    @hookimpl
    def sglang_dsv4_guard_check_state(self) -> list[Finding]:
        raise ZeroDivisionError("plug-in bug")


class TestStrictModeRule(GuardTestCase):
    """Item 9: a plug-in's failure is reported and never blocks, in strict mode too."""

    def test_strict_plugin_failure_never_blocks_a_healthy_pair(self) -> None:
        """Strict mode, a pair SGLang accepts, a check that raises: SGLang's result stands,
        the DSV4G090 is reported and its details say truly that it did not block."""
        pair = build_pair()
        expected = outcome(UNWRAPPED, *pair)
        self.install_guard("strict", load_entry_points=False)
        register(Raising())
        recorder = record()
        with guard_logs_off():
            self.assertEqual(outcome(utils.setup_state_kv_args, *pair), expected)
        [failure] = g090(recorder.reports[0].findings, "Raising")
        self.assertIn("raised ZeroDivisionError: plug-in bug", failure.details[0])
        self.assertIn("never blocks, in strict mode either", failure.details[1])

    def test_strict_plugin_import_failure_does_not_block_install(self) -> None:
        """Strict mode with a plug-in that fails at import: installed, the failure is a
        load problem, as for a check that raises."""
        with entry_point_plugin("acme_import_fails", "raise ImportError('no numpy here')\n"), \
                guard_logs_off():
            self.install_guard("strict")
        current = installation()
        assert current is not None
        [problem] = g090(current.runtime.plugins.load_problems, "acme_import_fails")
        self.assertIn("ImportError: no numpy here", problem.details[0])


class TestBaseExceptionPolicy(GuardTestCase):
    """Item 10: SystemExit and friends are a plug-in's failure; Ctrl-C in the main thread
    is the operator's."""

    def test_systemexit_at_plugin_import_is_g090_not_server_death(self) -> None:
        """A plug-in that runs argparse at import (SystemExit 2): install() succeeds and the
        failure is a DSV4G090 load problem naming it."""
        source = "import argparse\nargparse.ArgumentParser().parse_args(['--bogus'])\n"
        with entry_point_plugin("acme_argparse", source), guard_logs_off(), \
                contextlib.redirect_stderr(io.StringIO()):
            self.install_guard("on")
        current = installation()
        assert current is not None
        [problem] = g090(current.runtime.plugins.load_problems, "acme_argparse")
        self.assertIn("raised SystemExit: 2", problem.details[0])

    def test_systemexit_in_hook_keeps_sglang_verdict(self) -> None:
        """A check that calls sys.exit() on a pair SGLang rejects: SGLang's error, with the
        DSV4G090, not a SystemExit."""
        host, guarded = rejected_pair_guarded(self, "on", Exits())
        self.assertEqual(str(guarded).splitlines()[0], str(host))
        self.assertIn("raised SystemExit: 3", g090(guarded.findings, "Exits")[0].details[0])

    def test_keyboardinterrupt_in_hook_off_main_thread_keeps_verdict(self) -> None:
        """In a worker thread no operator can send Ctrl-C: a hook's KeyboardInterrupt is its
        failure, and the caller still gets SGLang's error."""
        pair = build_pair(draft=PoolSpec(compression_ratios=(4,)))
        _, host = outcome(UNWRAPPED, *pair)
        self.install_guard("on", load_entry_points=False)
        register(Interrupts())
        seen: list[tuple[str, Any]] = []
        with guard_logs_off():
            worker = threading.Thread(
                target=lambda: seen.append(outcome(utils.setup_state_kv_args, *pair)))
            worker.start()
            worker.join()
        [(kind, guarded)] = seen
        self.assertEqual((kind, str(guarded).splitlines()[0]), ("raised", str(host)))
        self.assertTrue(g090(guarded.findings, "Interrupts"))

    def test_keyboardinterrupt_in_main_thread_propagates(self) -> None:
        """In the main thread a KeyboardInterrupt is taken as the operator's Ctrl-C and
        propagates, as it would without the guard."""
        self.assertIs(threading.current_thread(), threading.main_thread())
        plugins = manager(("Interrupts", Interrupts()))
        with self.assertRaises(KeyboardInterrupt):
            plugins.collect("sglang_dsv4_guard_check_state", {"pair": None, "context": None})


class TestPluginErrorIsItsOwn(GuardTestCase):
    """Item 11: a third-party ERROR finding on SGLang's pass path is not DSV4G099."""

    def test_plugin_error_finding_on_pass_path_is_not_g099(self) -> None:
        """A plug-in's ERROR finding carrying a host_message, on a pair SGLang accepts:
        the report holds the plug-in's finding and no DSV4G099."""
        self.install_guard("on", load_entry_points=False)
        register(SiteRule())
        recorder = record()
        with guard_logs_off():
            kind, _ = outcome(utils.setup_state_kv_args, *build_pair())
        self.assertEqual(kind, "ok")
        self.assertEqual(recorder.codes, ["ACME009"])
        self.assertEqual(recorder.reports[0].findings[0].origin, "SiteRule")


if __name__ == "__main__":
    import unittest

    unittest.main()
