"""A third party's prefill/decode condition (``sglang_dsv4_guard_check_pair``) runs in
``check`` and at run time alike, with the same finding; what it cannot judge is an
``unknowns`` line; one that raises is its own DSV4G090, and the check goes on."""

from __future__ import annotations

import contextlib
import importlib.metadata
import unittest
from typing import Any, ClassVar
from unittest import mock

import peers_real
import sglang.srt.disaggregation.nixl.conn as nixl
from check_helpers import DSV3, GPT_OSS, check_json, server
from helpers import GuardTestCase, guard_logs_off
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard import (
    Edit,
    Endpoint,
    Finding,
    Fix,
    FixKind,
    PairContext,
    Severity,
    hookimpl,
    hookspecs,
)
from sglang_dsv4_guard.hookmarkers import PAIR_HOOK
from sglang_dsv4_guard.host.releases import profile_for
from sglang_dsv4_guard.lifecycle import installation
from sglang_dsv4_guard.mori.snapshot import SendContext
from sglang_dsv4_guard.pd import conditions
from sglang_dsv4_guard.pd.asymmetry import asymmetry_findings
from sglang_dsv4_guard.pd.endpoint import MAX_UNKNOWNS, REFUSED, Value
from sglang_dsv4_guard.testing import register

register_cpu_ci(est_time=35, suite="stage-a-test-cpu")


class MooncakeOnly:
    """docs/plugins.md's example: the fleet's pairs transfer over Mooncake."""

    places: ClassVar[list[str]] = []

    @hookimpl
    def sglang_dsv4_guard_check_pair(self, prefill: Endpoint, decode: Endpoint,
                                     context: PairContext) -> list[Finding]:
        self.places.append(context.place)
        if not prefill.has("transfer_backend"):
            context.not_judged("ACME002: not judged: the prefill's transfer backend is not known")
            return []
        if prefill.get("transfer_backend") == "mooncake":
            return []
        return [Finding(
            code="ACME002", severity=Severity.WARNING,
            summary="the pair does not transfer over the fleet's Mooncake",
            subject="prefill -> decode transfer backend",
            observations=(prefill.observation("transfer_backend"),
                          decode.observation("transfer_backend")),
            fixes=(Fix(FixKind.FLAGS, "run both servers on Mooncake", field="transfer_backend",
                       edits=tuple(Edit(role, "--disaggregation-transfer-backend", "mooncake")
                                   for role in ("prefill", "decode"))),),
        )]


class CannotJudge:
    """A condition that can never be judged here."""

    @hookimpl
    def sglang_dsv4_guard_check_pair(self, prefill: Endpoint, decode: Endpoint,
                                     context: PairContext) -> list[Finding]:
        context.not_judged(f"ACME003 ({context.place}): not judged: no fleet inventory here")
        return []


class Raising:
    """A hostile condition."""

    @hookimpl
    def sglang_dsv4_guard_check_pair(self, prefill: Endpoint, decode: Endpoint,
                                     context: PairContext) -> list[Finding]:
        raise ZeroDivisionError("acme")


class Hostile:
    """A registration check that reports under the DCP relayout's code and tries to change
    the servers the pair conditions read."""

    @hookimpl
    def sglang_dsv4_guard_check_registration(self, registration: Any,
                                             context: Any) -> list[Finding]:
        for endpoint in (registration.prefill, registration.decode):
            try:
                endpoint.values["transfer_backend"] = None  # type: ignore[index]
            except TypeError:
                Hostile.refused += 1
        return [Finding(code="DSV4G036", severity=Severity.ERROR, summary="a plug-in's",
                        subject="anything")]

    refused = 0


class ClaimsPayloadCode:
    """A condition reporting under a built-in code (NIXL's payload refusal of a prefill-only
    draft) on every pair, with its own fix."""

    @hookimpl
    def sglang_dsv4_guard_check_pair(self, prefill: Endpoint, decode: Endpoint,
                                     context: PairContext) -> list[Finding]:
        return [Finding(code="DSV4G046", severity=Severity.WARNING, summary="a plug-in's",
                        subject="anything", fixes=(Fix(FixKind.ADVICE, "ask the fleet team"),))]


PLUGINS = {"mooncake_only": MooncakeOnly(), "cannot_judge": CannotJudge(), "raising": Raising(),
           "claims_payload": ClaimsPayloadCode()}
EAGLE = ("--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps 3 "
         "--speculative-num-draft-tokens 4")


def _check(backend: str, *names: str, model: str = GPT_OSS,
           decode_extra: str = "") -> dict[str, Any]:
    """``check --format json`` of a pair of ``model`` (GPT-OSS) on ``backend``, the decode
    with ``decode_extra``, with the plug-ins ``names`` installed as entry points, as an
    operator installs them."""
    points = [importlib.metadata.EntryPoint(name, f"{__name__}:PLUGINS", "sglang_dsv4_guard")
              for name in names]
    loaded = {name: PLUGINS[name] for name in names}

    def load(self: importlib.metadata.EntryPoint) -> Any:
        return loaded[self.name]

    real = importlib.metadata.entry_points

    def entry_points(**kw: Any) -> Any:
        return points if kw.get("group") == "sglang_dsv4_guard" else real(**kw)

    with mock.patch("importlib.metadata.entry_points", entry_points), \
            mock.patch.object(importlib.metadata.EntryPoint, "load", load):
        return check_json(server("prefill", model, backend=backend),
                          server("decode", model, decode_extra, backend=backend))[1]


def _edits(fixes: Any) -> set[tuple[str, str, Any, bool, bool]]:
    return {(e["server"], e["name"], e["value"], e["remove"], e["env"]) if isinstance(e, dict)
            else (e.server, e.name, e.value, e.remove, e.env)
            for f in fixes for e in (f["edits"] if isinstance(f, dict) else f.edits)}


class TestPairConditions(GuardTestCase):
    def setUp(self) -> None:
        super().setUp()
        MooncakeOnly.places.clear()

    def _registered(self, *plugins: object) -> list[Finding]:
        """The findings when a NIXL decode peer registers with a NIXL prefill (same
        attention TP: SGLang accepts it), the plug-ins registered."""
        self.install_guard("on", load_entry_points=False)
        register(*plugins)
        _, info = peers_real.registration(nixl, "nixl", tp=1)
        mgr = peers_real.prefill(nixl, "nixl", tp=1)
        with guard_logs_off():
            nixl.NixlKVManager._add_remote_peer(mgr, info)
        current = installation()
        assert current is not None
        return [f for r in current.peers.reports() for f in r.findings]

    def test_the_same_finding_in_check_and_at_registration(self) -> None:
        """On NIXL: ACME002 in check and when a peer registers, with the same severity,
        observed values and fix edits; the fix survives check's parser filter. On
        Mooncake: none in check."""
        checked = [f for f in _check("nixl", "mooncake_only")["findings"]
                   if f["code"] == "ACME002"]
        ran = [f for f in self._registered(PLUGINS["mooncake_only"]) if f.code == "ACME002"]
        self.assertEqual(MooncakeOnly.places, ["check", "registration"])
        self.assertEqual(len(checked), 1)
        self.assertEqual([(f["code"], f["severity"]) for f in checked],
                         [(f.code, f.severity.value) for f in ran])
        self.assertEqual([(o["role"], o["value"]) for o in checked[0]["observations"]],
                         [(o.role, o.value) for o in ran[0].observations])
        expected = {(role, "--disaggregation-transfer-backend", "mooncake", False, False)
                    for role in ("prefill", "decode")}
        self.assertEqual(_edits(checked[0]["fixes"]), expected)
        self.assertEqual(_edits(ran[0].fixes), expected)
        self.assertIn("decode peer", ran[0].details[0])  # the registering peer is named
        self.assertEqual([f for f in _check("mooncake", "mooncake_only")["findings"]
                          if f["code"] == "ACME002"], [])

    def test_not_judged_is_an_unknowns_line(self) -> None:
        """What a condition cannot judge is one of check's unknowns lines, never a finding."""
        doc = _check("nixl", "cannot_judge")
        self.assertIn("ACME003 (check): not judged: no fleet inventory here", doc["unknowns"])
        self.assertNotIn("ACME003", [f["code"] for f in doc["findings"]])

    def test_a_raising_condition_is_its_own_g090(self) -> None:
        """A condition that raises is a DSV4G090 naming it, in check and at registration;
        the built-in conditions and the other plug-ins still run."""
        doc = _check("nixl", "raising", "mooncake_only")
        codes = [f["code"] for f in doc["findings"]]
        self.assertIn("DSV4G090", codes)
        self.assertIn("ACME002", codes)
        ran = [f.code for f in self._registered(PLUGINS["raising"], PLUGINS["mooncake_only"])]
        self.assertIn("DSV4G090", ran)
        self.assertIn("ACME002", ran)


    def test_a_plugin_under_a_builtin_code_changes_no_builtin_rule(self) -> None:
        """A plug-in's finding under NIXL's payload code keeps its own fix (check derives
        fixes for built-in findings only) and leaves the built-in one-sided draft finding
        (DSV4G020) standing: a decode-only EAGLE pair over Mooncake."""
        doc = _check("mooncake", "claims_payload", model=DSV3, decode_extra=EAGLE)
        ours = [f for f in doc["findings"] if f["code"] == "DSV4G046"]
        self.assertEqual([[x["text"] for x in f["fixes"]] for f in ours], [["ask the fleet team"]])
        self.assertIn("DSV4G020", [f["code"] for f in doc["findings"]])


class TestAsymmetries(GuardTestCase):
    """pd/asymmetry.py on endpoints: what SGLang never compares, judged where both servers'
    values are known, never on values a refused resolution left as typed."""

    @staticmethod
    def _ends(prefill: dict[str, Any], decode: dict[str, Any]) -> tuple[Endpoint, Endpoint]:
        base = {"model_path": "/m/dsv4", "architecture": "DeepseekV4ForCausalLM",
                "speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4,
                "draft_model_path": "/m/dsv4", "transfer_backend": "mooncake",
                "unified_kv": False, REFUSED: False}
        return tuple(Endpoint(role, {k: Value(v, "flag") for k, v in {**base, **over}.items()},
                              env={})
                     for role, over in (("prefill", prefill), ("decode", decode)))  # type: ignore[return-value]

    def test_a_refused_servers_typed_algorithm_is_not_compared(self) -> None:
        """NEXTN typed on a server whose flags SGLang refused, EAGLE on the other: SGLang
        would resolve NEXTN to EAGLE, so no DSV4G021, and one unknowns line saying why."""
        found, unknowns = asymmetry_findings(*self._ends(
            {"speculative_algorithm": "NEXTN", REFUSED: True}, {}))
        self.assertEqual([f.code for f in found], [])
        self.assertEqual(len(unknowns), 1)
        self.assertIn("DSV4G021: not judged", unknowns[0])
        found, _ = asymmetry_findings(*self._ends({"speculative_num_draft_tokens": 2}, {}))
        self.assertEqual([f.code for f in found], ["DSV4G021"])

    def test_paths_are_compared_but_for_their_form(self) -> None:
        """``/m/dsv4/`` is ``/m/dsv4``; ``/m/other`` is another checkpoint (DSV4G024)."""
        found, _ = asymmetry_findings(*self._ends({"model_path": "/m/dsv4/"},
                                                  {"draft_model_path": "/m//dsv4"}))
        self.assertEqual(found, [])
        found, _ = asymmetry_findings(*self._ends({"model_path": "/m/other"}, {}))
        self.assertEqual([f.code for f in found], ["DSV4G024"])

    def test_nothing_is_judged_on_what_a_registration_carries(self) -> None:
        """The run time's endpoints carry no model, draft or KV layout: nothing found."""
        ends = (Endpoint("prefill", {"transfer_backend": Value("nixl", "the manager"),
                                     "speculative_algorithm": Value("EAGLE", "server args")}),
                Endpoint("decode", {"transfer_backend": Value("nixl", "the manager")}))
        self.assertEqual(asymmetry_findings(*ends), ([], []))


class TestPairContext(GuardTestCase):
    """What a condition records through its context is capped and read-only."""

    def test_not_judged_lines_are_text_capped_and_counted(self) -> None:
        class Unshowable:
            def __str__(self) -> str:
                raise RuntimeError("no")

        context = PairContext("check", "nixl")
        context.not_judged(Unshowable())  # type: ignore[arg-type]
        for i in range(MAX_UNKNOWNS + 9):
            context.not_judged(f"ACME{i}: not judged")
        self.assertIn("cannot be shown", context.unknowns[0])
        self.assertEqual(len(context.unknowns), MAX_UNKNOWNS + 1)
        self.assertEqual(context.unknowns[-1], "... +10 more lines not kept")
        self.assertIsInstance(context.unknowns, tuple)

    def test_the_old_name_of_place_still_reads_with_a_warning(self) -> None:
        """``phase`` was the contexts' name for ``place``: it still reads, with a
        DeprecationWarning, for plug-ins written against it."""
        for context in (PairContext("registration", "nixl"),
                        SendContext(profile_for(Version("0.5.23")), "on", "registration")):
            with self.assertWarns(DeprecationWarning):
                self.assertEqual(context.phase, "registration")


class TestBuiltinConditionsHold(GuardTestCase):
    """The built-in conditions cannot be switched off or changed by a plug-in, and one of
    them failing leaves the others running."""

    def test_a_plugins_relayout_code_does_not_switch_the_conditions_off(self) -> None:
        """A plug-in's finding under DSV4G036 (the DCP relayout's code) and its attempt to
        change the endpoints: the built-in NIXL payload refusal of a HiSparse decode of
        another TP is still reported, on the values SGLang's objects hold."""
        self.install_guard("on", load_entry_points=False)
        register(Hostile())
        _, info = peers_real.registration(nixl, "nixl", tp=2, kinds=("DRAM", "DRAM"))
        mgr = peers_real.prefill(nixl, "nixl", tp=1)
        with guard_logs_off(), contextlib.suppress(NotImplementedError):
            nixl.NixlKVManager._add_remote_peer(mgr, info)
        current = installation()
        assert current is not None
        codes = [f.code for r in current.peers.reports() for f in r.findings]
        self.assertIn("DSV4G036", codes)  # the plug-in's, reported as its own
        self.assertIn("DSV4G043", codes)  # SGLang's refusal, still judged
        self.assertEqual(Hostile.refused, 2)  # both endpoints read-only

    def test_a_failing_condition_is_logged_once_and_the_others_run(self) -> None:
        """A built-in condition that raises (a guard bug): an unknowns line naming it, one
        WARNING per process however many pairs meet it, and the next condition's finding."""
        def broken(prefill: Endpoint, decode: Endpoint, package: Any) -> Any:
            raise KeyError("boom")

        def found(prefill: Endpoint, decode: Endpoint, package: Any) -> Any:
            return [Finding(code="ACME009", severity=Severity.INFO, summary="s",
                            subject="x")], []

        ends = (Endpoint("prefill"), Endpoint("decode"))
        with mock.patch.object(conditions, "CONDITIONS", (broken, found)), \
                mock.patch.object(conditions, "_FAILED", set()), \
                self.assertLogs("sglang_dsv4_guard", "WARNING") as logs:
            for _ in range(3):
                context = PairContext("registration", "nixl")
                got = conditions.sglang_dsv4_guard_check_pair(*ends, context)
                self.assertEqual([f.code for f in got], ["ACME009"])
                self.assertEqual(len(context.unknowns), 1)
                self.assertIn("broken", context.unknowns[0])
        self.assertEqual(len([r for r in logs.records if "broken" in r.getMessage()]), 1)


class TestPairHookName(GuardTestCase):
    """The name the callers use (hookmarkers.PAIR_HOOK, a leaf) is the spec's."""

    def test_marker_names_the_spec(self) -> None:
        """``hookspecs`` has a spec by that name, and it is a hook spec of the project."""
        spec = getattr(hookspecs, PAIR_HOOK)
        self.assertEqual(spec.__name__, PAIR_HOOK)
        self.assertIn(f"{hookspecs.PROJECT}_spec", vars(spec))


if __name__ == "__main__":
    unittest.main()
