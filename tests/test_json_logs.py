"""Logs for machines (issue 11, section 3): the report is structured data on the record.

With ``SGLANG_DSV4_GUARD_LOG_FORMAT=json`` the guard puts each report on the log record
under ``extra={"sglang_dsv4_guard": {...}}`` and keeps the message readable text, so a
JSON formatter configured through SGLang's own ``SGLANG_LOGGING_CONFIG_PATH`` (read by
``configure_logger`` in ``sglang.srt.utils.common``) writes one clean JSON object per
report: the report is data, never a JSON string inside a JSON string.
"""

from __future__ import annotations

import json
import os
import tempfile
import unittest

from helpers import GuardTestCase, fresh_python
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=42, suite="stage-a-test-cpu")

SERVER = r"""
import sys, types
sys.path.insert(0, sys.argv[1])
from sglang.srt.utils.common import configure_logger
configure_logger(types.SimpleNamespace(log_level="info"), prefix=" TP0")  # as a scheduler does
import sglang_dsv4_guard
from sglang_dsv4_guard.settings import settings_from_env
settings, problems = settings_from_env()
assert not problems and settings.log_format.value == "json", (settings, problems)
sglang_dsv4_guard.install(settings=settings, load_entry_points=False)
import sglang.srt.disaggregation.utils as utils
from sglang_dsv4_guard.testing import build_pair, new_kv_args, three_mismatch_pair
try:
    utils.setup_state_kv_args(new_kv_args(), *three_mismatch_pair())  # raised: 1 report
except RuntimeError:
    pass
utils.setup_state_kv_args(new_kv_args(), *build_pair(target_mapping="none"))  # a warning
import mori_stub
mori_stub.install_stub()
import sglang.srt.disaggregation.mori.conn as conn
mgr = mori_stub.manager(conn, attn_tp=8)
for i in range(3):  # one mismatch, three peers: three occurrences
    mgr._add_remote_peer(mori_stub.peer(conn, f"decode-{i}", decode_tp=4))
sglang_dsv4_guard.uninstall()
"""


class TestJsonThroughSGLangLoggingConfig(GuardTestCase):
    """A JSON formatter set up by SGLang's ``configure_logger`` from a config file."""

    def test_one_clean_json_object_per_report(self) -> None:
        """Every line is one JSON object; the five reports (raised, warning, three MORI
        peers) each carry the report as a nested object under ``sglang_dsv4_guard`` and
        a readable message that is not itself JSON."""
        tests_dir = os.path.dirname(os.path.abspath(__file__))
        with tempfile.TemporaryDirectory() as tmp:
            log_path = os.path.join(tmp, "server.log")
            config = {
                "version": 1, "disable_existing_loggers": False,
                "formatters": {"json": {"()": "helpers.JsonLineFormatter"}},
                "handlers": {"file": {"class": "logging.FileHandler", "filename": log_path,
                                      "formatter": "json"}},
                "root": {"level": "INFO", "handlers": ["file"]},
            }
            config_path = os.path.join(tmp, "logging.json")
            with open(config_path, "w", encoding="utf-8") as out:
                json.dump(config, out)
            done = fresh_python(SERVER, tests_dir, path_first=tests_dir, env={
                "SGLANG_LOGGING_CONFIG_PATH": config_path, "SGLANG_DSV4_GUARD": "1",
                "SGLANG_DSV4_GUARD_LOG_FORMAT": "json"})
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            with open(log_path, encoding="utf-8") as log:
                records = [json.loads(line) for line in log]
        guard = [r for r in records if r["logger"] == "sglang_dsv4_guard"]
        reports = [r for r in guard if "sglang_dsv4_guard" in r]
        self.assertEqual(len(reports), 5, guard)
        for record in reports:
            data = record["sglang_dsv4_guard"]
            self.assertIsInstance(data, dict)
            self.assertIsInstance(data["report"]["findings"], list)
            self.assertRegex(data["fingerprint"], r"^[0-9a-f]{12}$")
            self.assertTrue(record["message"].startswith("sglang-dsv4-guard"), record)
            with self.assertRaises(json.JSONDecodeError):
                json.loads(record["message"])
        codes = [r["sglang_dsv4_guard"]["codes"] for r in reports]
        self.assertEqual(codes[0], ["DSV4G001", "DSV4G004", "DSV4G005"])
        self.assertEqual(codes[1:], [["DSV4G004"]] + [["DSV4G006"]] * 3)
        self.assertTrue(reports[0]["sglang_dsv4_guard"]["raised"])
        self.assertEqual([r["sglang_dsv4_guard"].get("peers") for r in reports[2:]], [1, 2, 3])


if __name__ == "__main__":
    unittest.main()
