"""``check`` judges a DeepSeek-V4 pair whose KV layout variables differ on each GPU model:
each server's start-up (SGLang's own ``select_dsv4_kv_layout`` as that GPU) and decode's
first contact (SGLang's own ``try_ensure_parallel_info`` on the layouts chosen there). An
error where every GPU model fails, a warning naming the GPU models that fail where some
do; releases without the selector (before 0.5.21) do not read the variable."""

from __future__ import annotations

import unittest
from pathlib import Path
from typing import Any

from check_helpers import DSV4, check_json, run_cli, server
from helpers import GuardTestCase, sglang_release
from packaging.version import Version
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

LAYOUT = "SGLANG_DSV4_KV_LAYOUT"
CODE = "DSV4G031"
SELECTOR = Version("0.5.21")  # select_dsv4_kv_layout: the variable is read from here
COMPARED = Version("0.5.23")  # decode's first contact compares the KV layouts from here
SM100 = ("SM100 (B200)", "SM103 (B300)")
OFF_SM100 = ("SM80 (A100)", "SM90 (H100/H200)", "SM120 (RTX PRO 6000)")


GOLDEN = Path(__file__).parent / "golden"


def _check(*more: str) -> tuple[int, dict[str, Any]]:
    line = {r: server(r, DSV4, "--tp-size 8", backend="mooncake") for r in ("prefill", "decode")}
    return check_json(line["prefill"], line["decode"], *more)


def _found(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == CODE]


def _per_gpu(finding: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The finding's per-GPU table: GPU model -> its row (the observations of the pair)."""
    return {o["name"].removeprefix("on "): o["value"] for o in finding["observations"]
            if o["role"] == "prefill/decode"}


def _failing(finding: dict[str, Any]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """GPU model -> (where it fails, which servers), for the GPU models that fail."""
    return {gpu: (row["fails_at"], tuple(row["fails"])) for gpu, row in _per_gpu(finding).items()
            if row["fails_at"] is not None}


class TestLayoutVariableOnOneSide(GuardTestCase):
    def test_v41_on_the_prefill_fails_everywhere_on_0_5_23(self) -> None:
        """SGLANG_DSV4_KV_LAYOUT=v41 on the prefill only: 0.5.23's prefill stops at
        start-up off SM100 and its decode exits at first contact on SM100/SM103: an
        error, exit 1, with the per-GPU table as data. 0.5.21 - 0.5.22 compare no layout
        at first contact: a warning naming the GPU models where the prefill stops at
        start-up, not SM100/SM103. Before 0.5.21: nothing."""
        status, doc = _check("--prefill-env", f"{LAYOUT}=v41")
        release = sglang_release()
        if release < SELECTOR:
            self.assertEqual((status, _found(doc)), (0, []))
            return
        (finding,) = _found(doc)
        self.assertEqual(set(_per_gpu(finding)), {*OFF_SM100, *SM100})
        started = {gpu: ("start-up", ("prefill",)) for gpu in OFF_SM100}
        if release >= COMPARED:
            self.assertEqual((status, finding["severity"]), (1, "error"))
            self.assertEqual(_failing(finding), {
                **started, **{gpu: ("first contact", ("decode",)) for gpu in SM100}})
        else:
            self.assertEqual((status, finding["severity"]), (0, "warning"))
            self.assertEqual(_failing(finding), started)
            for gpu in SM100:
                self.assertNotIn(gpu, finding["when"])
        for gpu in OFF_SM100:
            self.assertIn(gpu, finding["when"])

    def test_v41_is_no_longer_undecidable(self) -> None:
        """Judged per GPU model, v41 on one side leaves no 'not decidable' line."""
        _, doc = _check("--prefill-env", f"{LAYOUT}=v41")
        self.assertEqual([u for u in doc["unknowns"] if "not decidable" in u], [])

    def test_auto_on_the_decode_fails_on_sm100_only(self) -> None:
        """SGLANG_DSV4_KV_LAYOUT=auto on the decode only gives V4.1 on SM100/SM103 and V4
        elsewhere: 0.5.23's first contact refuses the pair on SM100/SM103 only, a warning
        naming them (exit 0) and not the others. 0.5.21 - 0.5.22 compare no layout and
        nothing stops: no finding."""
        status, doc = _check("--decode-env", f"{LAYOUT}=auto")
        if sglang_release() < COMPARED:
            self.assertEqual((status, _found(doc)), (0, []))
            return
        (finding,) = _found(doc)
        self.assertEqual((status, finding["severity"]), (0, "warning"))
        self.assertEqual(_failing(finding), {gpu: ("first contact", ("decode",))
                                             for gpu in SM100})
        self.assertEqual(finding["phase"], "first contact")
        for gpu in OFF_SM100:
            self.assertNotIn(gpu, finding["when"])
        self.assertEqual([u for u in doc["unknowns"] if "computed the V4 case" in u], [])

    def test_the_default_spelled_out_is_no_finding(self) -> None:
        """Near miss: v4 (every release's default where the variable exists) on one side
        only gives the same layout on every GPU model: no finding."""
        status, doc = _check("--prefill-env", f"{LAYOUT}=V4")
        self.assertEqual((status, _found(doc)), (0, []))

    def test_the_same_value_on_both_is_no_finding(self) -> None:
        """Near miss: v41 on both servers is one deployment choice (V4.1 needs SM100):
        no DSV4G031."""
        _, doc = _check("--prefill-env", f"{LAYOUT}=v41", "--decode-env", f"{LAYOUT}=v41")
        self.assertEqual(_found(doc), [])

    def test_fixes_unset_or_copy_and_are_proven(self) -> None:
        """The fixes: unset the variable on the server that sets it, or give the other
        server the same value, both environment edits; ``--fix`` proves them and the
        corrected pair exits 0."""
        if sglang_release() < SELECTOR:
            return  # nothing found, nothing to fix (asserted above)
        _, doc = _check("--prefill-env", f"{LAYOUT}=v41", "--fix")
        (finding,) = _found(doc)
        edits = [[(e["server"], e["name"], e["value"], e["remove"], e["env"])
                  for e in f["edits"]] for f in finding["fixes"]]
        self.assertEqual(edits, [[("prefill", LAYOUT, None, True, True)],
                                 [("decode", LAYOUT, "v41", False, True)]])
        self.assertTrue(all(f["proven"] for f in finding["fixes"]))
        self.assertEqual((doc["fix_status"], doc["fixed_check"]["exit_status"]),
                         ("corrected", 0))

    def test_golden_rendering(self) -> None:
        """The text report's DSV4G031 block for v41 on the prefill equals its golden file
        (0.5.23: the error; 0.5.21 - 0.5.22: the warning); before 0.5.21 there is none."""
        line = {r: server(r, DSV4, "--tp-size 8", backend="mooncake") for r in ("prefill", "decode")}
        _, out, _ = run_cli("check", "--prefill", line["prefill"], "--decode", line["decode"],
                            "--prefill-env", f"{LAYOUT}=v41")
        release = sglang_release()
        if release < SELECTOR:
            self.assertNotIn(f"[{CODE}]", out)
            return
        block = out[out.index(f"[{CODE}]"):].split("\n\n")[0] + "\n"
        name = "g031_v41_one_side_0_5_23.txt" if release >= COMPARED else \
            "g031_v41_one_side_0_5_21.txt"
        self.assertEqual(block, (GOLDEN / name).read_text())


if __name__ == "__main__":
    unittest.main()
