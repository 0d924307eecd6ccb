"""``check -f`` on the sample deployments (examples/deployments): every pair they hold is
checked in one run, with the findings ``check`` gives on the lines extracted by hand; the
CI outputs (``--format sarif|github``, ``--quiet``, ``--fail-on``) point at the file and
line of the flag; the pre-commit hooks and the CI example run as documented."""

from __future__ import annotations

import json
import re
import shlex
import unittest
from pathlib import Path
from typing import Any

import yaml
from check_helpers import DSV4, run_cli
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from test_check_files import HAND_EXTRACTED, MODEL

from sglang_dsv4_guard.check.requests import POD_VARIABLES

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = "examples/deployments"
MAP = ("--model-path-map", f"{MODEL}={DSV4}")


def files_json(*more: str) -> tuple[int, dict[str, Any]]:
    """``check -f SAMPLES --format json`` in this process: status and document."""
    status, out, err = run_cli("check", "-f", SAMPLES, *MAP, "--format", "json", *more)
    assert status in (0, 1, 2), err
    return status, json.loads(out)


def by_hand(line: str) -> str:
    """A hand-extracted line as ``check -f`` reads it: the model path mapped, and each
    pod-identity variable read as the group's leader pod."""
    for name, value in POD_VARIABLES.items():
        line = line.replace(f"$({name})", value)
    return " ".join(DSV4 if token == MODEL else token.replace(f"={MODEL}", f"={DSV4}")
                    for token in shlex.split(line))


def codes(document: dict[str, Any] | None) -> list[str]:
    return [f["code"] for f in (document or {}).get("findings") or ()]


class TestEveryPairInOneRun(GuardTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.status, cls.doc = files_json()
        cls.pairs = {p["name"]: p for p in cls.doc["pairs"]}

    def test_every_sample_pair_is_found(self) -> None:
        """The run holds exactly the pairs extracted by hand, each once."""
        self.assertEqual(sorted(self.pairs), sorted(HAND_EXTRACTED))

    def test_findings_equal_the_hand_extracted_lines(self) -> None:
        """Each pair's findings (codes and severities, in order) and its error, if any,
        equal ``check --prefill --decode``'s on the lines extracted by hand."""
        for name, roles in HAND_EXTRACTED.items():
            with self.subTest(pair=name):
                argv = ["check", f"--prefill={by_hand(roles['prefill'][0])}",
                        f"--decode={by_hand(roles['decode'][0])}", "--format", "json"]
                for role in ("prefill", "decode"):
                    argv += [f"--{role}-env={k}={v}" for k, v in roles[role][1].items()]
                gpu = self.pairs[name]["document"] and self.pairs[name]["document"][
                    "derived"]["prefill"].get("gpu")
                if gpu:  # the GPU the manifest states, named as the operator would
                    argv += ["--gpu", gpu["typed"]]
                status, out, err = run_cli(*argv)
                pair = self.pairs[name]
                if status == 2:
                    self.assertIsNotNone(pair["error"], err)
                    continue
                hand = json.loads(out)
                self.assertIsNone(pair["error"])
                self.assertEqual(
                    [(f["code"], f["severity"]) for f in pair["document"]["findings"]],
                    [(f["code"], f["severity"]) for f in hand["findings"]])
                self.assertEqual(pair["failing"], status == 1)

    def test_the_broken_samples_fail_and_the_healthy_pass(self) -> None:
        """The samples broken on purpose have their errors; the healthy ones none; the
        exit status is the worst pair's (2: the llm-d sample's decode line is refused by
        the release's parser or not, by release)."""
        ome = self.pairs[f"{SAMPLES}/ome-runtime.yaml: ClusterServingRuntime/srt-dsv4-pd"]
        self.assertIn("DSV4G030", codes(ome["document"]))
        script = self.pairs[f"{SAMPLES}/launch-pd.sh (router at line 27)"]
        self.assertIn("DSV4G023", codes(script["document"]))
        for healthy in ("args/prefill.args + examples/deployments/args/decode.args",
                        "dynamo-graph.yaml: DynamoGraphDeployment/dsv4-disagg"):
            pair = self.pairs[f"{SAMPLES}/{healthy}"]
            self.assertEqual(codes(pair["document"]), [], healthy)
            self.assertFalse(pair["failing"])
        worst = 2 if any(p["error"] for p in self.doc["pairs"]) else 1
        self.assertEqual((self.status, self.doc["exit_status"]), (worst, worst))

    def test_servers_are_located(self) -> None:
        """Each pair says where each server is launched: file, line, what it is."""
        ome = self.pairs[f"{SAMPLES}/ome-runtime.yaml: ClusterServingRuntime/srt-dsv4-pd"]
        self.assertEqual(ome["prefill"]["file"], f"{SAMPLES}/ome-runtime.yaml")
        self.assertGreater(ome["decode"]["line"], ome["prefill"]["line"])
        self.assertIn("--kv-cache-dtype", ome["prefill"]["argv"])


class TestCiFormats(GuardTestCase):
    OME = f"{SAMPLES}/ome-runtime.yaml"

    def line_of(self, path: str, text: str) -> int:
        lines = (ROOT / path).read_text().splitlines()
        return next(i for i, line in enumerate(lines, 1)
                    if text in line and not line.lstrip().startswith("#"))

    def test_sarif_points_at_the_flag(self) -> None:
        """SARIF 2.1.0: a rule per code, a result per finding; the KV dtype mismatch is at
        the line of the prefill's ``--kv-cache-dtype`` in the OME manifest."""
        status, out, err = run_cli("check", "-f", self.OME, *MAP, "--format", "sarif")
        self.assertEqual(status, 1, err)
        log = json.loads(out)
        self.assertEqual(log["version"], "2.1.0")
        run = log["runs"][0]
        self.assertEqual(run["tool"]["driver"]["name"], "sglang-dsv4-guard")
        rules = {r["id"] for r in run["tool"]["driver"]["rules"]}
        results = {r["ruleId"]: r for r in run["results"]}
        self.assertLessEqual(set(results), rules)
        dtype = results["DSV4G030"]
        self.assertEqual(dtype["level"], "error")
        where = dtype["locations"][0]["physicalLocation"]
        self.assertEqual(where["artifactLocation"]["uri"], self.OME)
        self.assertEqual(where["region"]["startLine"],
                         self.line_of(self.OME, "--kv-cache-dtype bf16"))
        self.assertTrue(run["invocations"][0]["executionSuccessful"])

    def test_github_annotations_and_summary(self) -> None:
        """``--format github``: one ``::error file=...,line=...`` per error finding at its
        flag, then one line per pair."""
        status, out, err = run_cli("check", "-f", self.OME, *MAP, "--format", "github")
        self.assertEqual(status, 1, err)
        lines = out.splitlines()
        line = self.line_of(self.OME, "--kv-cache-dtype bf16")
        self.assertIn(f"::error file={self.OME},line={line},title=DSV4G030::", out)
        annotations = [a for a in lines if a.startswith("::")]
        self.assertEqual(len(annotations) + 1, len(lines), out)  # one per finding, summary
        self.assertTrue(all(re.match(r"::(error|warning|notice) file=", a) for a in annotations))
        self.assertTrue(any("%0Afix: " in a for a in annotations))  # one line each, fix kept
        self.assertTrue(lines[-1].startswith("FAIL "), lines[-1])

    def test_fail_on_warning_and_quiet(self) -> None:
        """A pair with only warnings: exit 0, or 1 with ``--fail-on warning``; ``--quiet``
        is one line per pair."""
        compose = f"{SAMPLES}/docker-compose.yaml"
        status, out, _ = run_cli("check", "-f", compose, *MAP, "--quiet")
        self.assertEqual(status, 0, out)
        self.assertEqual(len(out.strip().splitlines()), 1)
        self.assertRegex(out, r"^OK .*: 0 error\(s\), 1 warning\(s\) \(DSV4G021\)")
        status, out, _ = run_cli("check", "-f", compose, *MAP, "--quiet", "--fail-on",
                                 "warning")
        self.assertEqual(status, 1)
        self.assertTrue(out.startswith("FAIL "), out)

    def test_unreadable_inputs_exit_2_naming_them(self) -> None:
        """A pair whose model path is not here: exit 2, its line naming the file and line
        of the server and ``--model-path-map``; a bad ``--var``, ``--model-path-map`` or a
        mix of ``-f`` with ``--prefill``: exit 2 naming it, no traceback."""
        status, out, err = run_cli("check", "-f", self.OME, "--quiet")
        self.assertEqual(status, 2, err)
        self.assertRegex(out, rf"^ERROR .*{re.escape(self.OME)}:\d+ \(prefill\): "
                              r"--model-path: .*--model-path-map PATH=DIR")
        for bad, named in ((["--var", "1X=2"], "--var"),
                           (["--model-path-map", "nothing"], "--model-path-map"),
                           (["--prefill", "x"], "-f PATH... or --prefill")):
            status, out, err = run_cli("check", "-f", self.OME, *bad)
            self.assertEqual((status, out), (2, ""), bad)
            self.assertIn(named, err)
            self.assertNotIn("Traceback", err)


class TestPreCommitAndCiExample(GuardTestCase):
    def test_pre_commit_hooks_run_check(self) -> None:
        """Each hook of ``.pre-commit-hooks.yaml`` is ``check`` on the files pre-commit
        passes: its entry, with the sample files its ``files`` pattern selects, exits as
        ``check`` does (1: the OME sample is broken)."""
        hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
        self.assertEqual({h["id"] for h in hooks},
                         {"sglang-dsv4-guard", "sglang-dsv4-guard-system"})
        for hook in hooks:
            entry = shlex.split(hook["entry"])
            self.assertEqual(entry[0], "sglang-dsv4-guard")
            names = [str(p.relative_to(ROOT)) for p in sorted((ROOT / SAMPLES).rglob("*"))
                     if p.is_file() and re.search(hook["files"], p.name)]
            self.assertIn(f"{SAMPLES}/ome-runtime.yaml", names)
            self.assertIn(f"{SAMPLES}/launch-pd.sh", names)
            ome = [f"{SAMPLES}/ome-runtime.yaml"]  # pre-commit: entry, the hook's args, files
            status, out, err = run_cli(*entry[1:], *MAP, "--gpu", "H100", *ome)
            self.assertEqual(status, 1, err)
            self.assertEqual(len(out.strip().splitlines()), 1, out)

    def test_ci_example_commands(self) -> None:
        """The GitHub Actions example's ``check`` steps, run on the samples: the
        annotations step prints workflow commands; the SARIF step's file is SARIF 2.1.0."""
        workflow = yaml.safe_load((ROOT / "examples/ci/github-actions.yml").read_text())
        steps = [s["run"] for s in workflow["jobs"]["check"]["steps"]
                 if "sglang-dsv4-guard check" in s.get("run", "")]
        self.assertEqual(len(steps), 2)
        for run in steps:
            argv = shlex.split(run.split(" > ")[0].split("||")[0])
            self.assertEqual(argv[:2], ["sglang-dsv4-guard", "check"])
            self.assertIn("--model-path-map", argv)  # a real repository's paths are mapped
            argv = [f"{SAMPLES}/ome-runtime.yaml" if a == "deploy/" else
                    a.replace("=configs/deepseek-v4", f"={DSV4}") for a in argv[1:]]
            status, out, err = run_cli(*argv)
            self.assertEqual(status, 1, err)
            if "sarif" in argv:
                self.assertEqual(json.loads(out)["version"], "2.1.0")
            else:
                self.assertIn("::error file=", out)


if __name__ == "__main__":
    unittest.main()
