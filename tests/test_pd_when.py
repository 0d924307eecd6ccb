"""When SGLang finds a broken prefill/decode contract, as ``check`` says it: the
bootstrap timeout is the server's value read with SGLang's own parser; ``when`` is data
(a phase and an effect) on every finding."""

from __future__ import annotations

import importlib
import unittest

from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.boundary import clean_finding, plugin_failure
from sglang_dsv4_guard.findings import Finding, Phase, Report, Severity, When
from sglang_dsv4_guard.host.targets import ENVIRON_MODULE, FLASHMLA_ENV
from sglang_dsv4_guard.pd.asymmetry import asymmetry_findings as pd_asymmetry
from sglang_dsv4_guard.pd.endpoint import Endpoint, Value
from sglang_dsv4_guard.pd.when import bootstrap_timeout, when_of

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")

VARIABLE = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"


def release_default() -> int:
    return int(getattr(importlib.import_module(ENVIRON_MODULE).envs, VARIABLE).default)


class TestBootstrapTimeout(GuardTestCase):
    def test_unset_is_the_release_default(self) -> None:
        """No value in the server's environment: the release's own default, said so."""
        seconds, source = bootstrap_timeout({})
        self.assertEqual(seconds, release_default())
        self.assertIn("default", source)

    def test_value_sglang_rejects_is_its_default(self) -> None:
        """A value SGLang's EnvInt refuses ('abc') is what SGLang makes of it: its
        default, with the value named."""
        seconds, source = bootstrap_timeout({VARIABLE: "abc"})
        self.assertEqual(seconds, release_default())
        self.assertIn("'abc'", source)
        self.assertIn("not a number SGLang accepts", source)

    def test_non_positive_times_out_at_once(self) -> None:
        """A timeout of -1 s never lets a poll wait (elapsed is never below it): the
        registration text says requests time out at their first poll."""
        text = when_of(Phase.REGISTRATION, "mooncake", {VARIABLE: "-1"}).effect
        self.assertIn("at their first poll", text)
        self.assertNotIn("after -1 s", text)

    def test_value_given_is_used(self) -> None:
        """A number in the server's environment is the one the text names."""
        self.assertIn("after 60 s", when_of(Phase.REGISTRATION, "nixl", {VARIABLE: "60"}).effect)


def _side(role: str, model: str, algo: str | None, tokens: int | None, backend: str,
          flashmla: str | None) -> Endpoint:
    values = {"model_path": model, "architecture": model.upper(), "draft_model_path": None,
              "speculative_algorithm": algo, "speculative_num_draft_tokens": tokens,
              "transfer_backend": backend, "unified_kv": flashmla is not None}
    return Endpoint(role, {k: Value(v, "flag") for k, v in values.items()},
                    env={FLASHMLA_ENV: flashmla} if flashmla else {})


def asymmetry_findings(p: Endpoint, d: Endpoint) -> list[Finding]:
    return pd_asymmetry(p, d)[0]


class TestWhenIsData(GuardTestCase):
    """``Finding.when`` holds a phase and an effect; JSON gives both, text prints ``when:``."""

    def test_asymmetries_carry_their_phase(self) -> None:
        """check's PD asymmetries: the speculative settings, backend, model and unified-KV
        mode are never compared by SGLang (silent; page sizes are decode's first contact's)."""
        p = _side("prefill", "a", "EAGLE", 4, "mooncake", "unified_kv_triton")
        d = _side("decode", "b", None, None, "nixl", None)
        found = {f.code: f.when.phase for f in asymmetry_findings(p, d)}
        self.assertEqual(found, {"DSV4G020": Phase.SILENT, "DSV4G023": Phase.SILENT,
                                 "DSV4G024": Phase.SILENT, "DSV4G025": Phase.SILENT})
        d = _side("decode", "a", "EAGLE", 2, "mooncake", "unified_kv_triton")
        self.assertEqual([(f.code, f.when.phase) for f in asymmetry_findings(p, d)],
                         [("DSV4G021", Phase.SILENT)])

    def test_json_gives_phase_and_text(self) -> None:
        """to_dict: ``phase`` the phase's value, ``when`` the effect (the text key kept)."""
        finding = asymmetry_findings(_side("prefill", "a", None, None, "nixl", None),
                                     _side("decode", "a", None, None, "mooncake", None))[0]
        self.assertEqual({k: finding.to_dict()[k] for k in ("code", "phase", "when")},
                         {"code": "DSV4G023", "phase": "silent",
                          "when": finding.when.effect})

    def test_the_guards_own_findings_say_so(self) -> None:
        """A plug-in's failure (DSV4G090) changes nothing in SGLang: phase GUARD."""
        self.assertIs(plugin_failure("acme", "check", "boom").when.phase, Phase.GUARD)

    def test_a_logged_silent_row_is_found_at_registration(self) -> None:
        """A condition SGLang logs when a decode rank registers has that phase; one it
        never reports stays silent."""
        self.assertEqual([when_of(Phase.SILENT, "nixl", logged=logged).phase
                          for logged in (True, False)], [Phase.REGISTRATION, Phase.SILENT])

    def test_a_plugins_when_is_checked(self) -> None:
        """A plug-in's ``when`` is a When (kept) or None; a plain string is refused,
        naming the type accepted."""
        base = Finding("ACME1", Severity.WARNING, "s", "x")
        kept = clean_finding(Finding("ACME1", Severity.WARNING, "s", "x",
                                     when=When(Phase.REGISTRATION, "at registration")), "acme")
        self.assertEqual((kept.when, clean_finding(base, "acme").when),
                         (When(Phase.REGISTRATION, "at registration"), None))
        with self.assertRaisesRegex(TypeError, "when must be a sglang_dsv4_guard.When"):
            clean_finding(Finding("ACME1", Severity.WARNING, "s", "x", when="soon"), "acme")

    def test_a_plugins_when_is_read_once_and_rebuilt(self) -> None:
        """A falsy When subclass comes out as a plain When (JSON renders it); a ``phase``
        property that changes between reads is read once: the finding keeps the phase that
        was checked, or is refused, never a value that breaks rendering."""
        class Falsy(When):
            def __bool__(self) -> bool:
                return False

        kept = clean_finding(Finding("ACME1", Severity.WARNING, "s", "x",
                                     when=Falsy(Phase.SILENT, "never")), "acme")
        self.assertIs(type(kept.when), When)
        self.assertEqual(Report.of([kept], {}).to_dict()["findings"][0]["phase"], "silent")

        class Shifty:
            reads = 0
            effect = "at some point"

            @property
            def phase(self) -> object:
                Shifty.reads += 1
                return Phase.FIRST_CONTACT if Shifty.reads == 1 else "x"

        kept = clean_finding(Finding("ACME1", Severity.WARNING, "s", "x",
                                     when=Shifty()), "acme")  # type: ignore[arg-type]
        self.assertEqual((kept.when, Shifty.reads), (When(Phase.FIRST_CONTACT, "at some point"), 1))
        self.assertEqual(Report.of([kept], {}).to_dict()["findings"][0]["phase"], "first contact")


if __name__ == "__main__":
    unittest.main()
