"""``check`` against running servers: ``--prefill-server-info`` / ``--decode-server-info``
(a server's ``/get_server_info`` answer, from a file or a loopback URL, read as its launch
line) and ``--prefill-bootstrap`` (the decode's line against the prefill bootstrap server's
``/route`` answer). The bootstrap server is the release's own ``CommonKVBootstrapServer``
on 127.0.0.1, with the prefill's ranks registering through the release's own
``register_to_bootstrap``; the server-info answer is the release's own for the launch
line (``build_server_info``, else ``resolved_dict()`` or ``dataclasses.asdict`` as the
HTTP server of releases before it answers). A live pair gives the findings of the launch lines it was started
from; only loopback hosts are contacted."""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import json
import os
import socket
import tempfile
import threading
import time
import unittest
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any
from unittest import mock

from check_helpers import DSV4, LLAMA, check_json, run_cli, server
from helpers import GuardTestCase
from sglang.srt.disaggregation.common import conn
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard.check.rows.contract  # noqa: F401  (registers every row's values)
from sglang_dsv4_guard.check.offline.parse import parse_launch, release_parser
from sglang_dsv4_guard.check.server.derive import derive_server
from sglang_dsv4_guard.check.server.endpoint_values import endpoint_of
from sglang_dsv4_guard.check.server.pools import published_server_args
from sglang_dsv4_guard.check.server.server_info import info_line

register_cpu_ci(est_time=40, suite="stage-a-test-cpu")

# What the /route answer lets check compare: decode's first contact and its allocation policy.
FIRST_CONTACT = {"DSV4G022", "DSV4G030", "DSV4G031", "DSV4G032", "DSV4G033", "DSV4G034",
                 "DSV4G035", "DSV4G037"}
# (name, prefill line, decode line): a pair that fails its first contact twice, one that
# pairs, and a DeepSeek-V4 pair whose decode alone has attention context parallelism.
PAIRS = (
    ("llama page size and dtype",
     server("prefill", LLAMA, "--tp-size 2 --page-size 16 --kv-cache-dtype fp8_e4m3", "mooncake"),
     server("decode", LLAMA, "--page-size 32", "mooncake")),
    ("llama matched",
     server("prefill", LLAMA, "--tp-size 2", "mooncake"),
     server("decode", LLAMA, "--tp-size 2", "mooncake")),
    ("dsv4 decode cp",
     server("prefill", DSV4, "--tp-size 4"),
     server("decode", DSV4, "--tp-size 4 --attn-cp-size 2")),
)


def live_json(*argv: str) -> tuple[int, dict[str, Any]]:
    """``check ARGV... --format json``: the exit status and the parsed document."""
    status, out, err = run_cli("check", *argv, "--format", "json")
    assert status in (0, 1), f"exit {status}: {err}"
    return status, json.loads(out)


def found(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """A check document's findings as (code, severity), in order."""
    return [(f["code"], f["severity"]) for f in doc["findings"]]


def server_info(role: str, line: str) -> dict[str, Any]:
    """The server's ``/get_server_info`` answer for ``line``, as the release builds it."""
    server_args = parse_launch(role, line, {}).server_args
    try:
        from sglang.srt.utils.common import build_server_info
    except ImportError:  # before 0.5.22 the HTTP server answers the fields itself:
        resolved = getattr(server_args, "resolved_dict", None)  # resolved from 0.5.19,
        info = resolved() if resolved else dataclasses.asdict(server_args)  # else asdict
    else:
        info = build_server_info(server_args, {"max_total_num_tokens": 4096})
    info.update(version="0.0.0-running", internal_states=[{}])
    answer: dict[str, Any] = json.loads(json.dumps(info, default=str))
    return answer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Published:
    """The resolved ``ServerArgs`` with the KV cache dtype the model runner records (0.5.16
    registers ``server_args.kv_cache_dtype``, which the runner rewrites so)."""

    def __init__(self, server_args: Any, kv_cache_dtype: Any) -> None:
        self._args, self.kv_cache_dtype = server_args, kv_cache_dtype

    def __getattr__(self, name: str) -> Any:
        return getattr(self._args, name)


@contextmanager
def bootstrap(line: str, ranks: int | None = None) -> Iterator[str]:
    """The release's bootstrap server on 127.0.0.1 with the prefill of ``line``
    registered by the release's ``register_to_bootstrap``, one call per attention-TP rank
    (``ranks`` of them, when fewer); its ``HOST:PORT``. Stopped after the block."""
    args = parse_launch("prefill", line, {})
    end = endpoint_of(derive_server(args))
    port = free_port()
    boot = conn.CommonKVBootstrapServer("127.0.0.1", port)
    try:
        _wait_listening(port)
        tp = int(end.get("attn_tp_size"))
        with published_server_args(args.server_args):
            for rank in range(tp if ranks is None else ranks):
                manager = object.__new__(conn.CommonKVManager)
                vars(manager).update(
                    dist_init_addr=None, bootstrap_host="127.0.0.1", bootstrap_port=port,
                    attn_tp_size=tp, attn_tp_rank=rank, attn_cp_size=1, attn_cp_rank=0,
                    attn_dp_size=1, attn_dp_rank=0, pp_size=1, pp_rank=0, system_dp_size=1,
                    system_dp_rank=0, local_ip="127.0.0.1", rank_port=20000 + rank,
                    kv_args=SimpleNamespace(page_size=end.get("page_size"),
                                            rust_http_port=None),
                    kv_cache_dtype_str=end.get("kv_cache_dtype_str"),
                    kv_layout=end.get("kv_layout"),
                    dsv41_spec_layout=end.get("dsv41_spec_layout"),
                    server_args=_Published(args.server_args, end.get("kv_cache_dtype_str")))
                manager.register_to_bootstrap()
        yield f"127.0.0.1:{port}"
    finally:  # its tasks (a periodic clean-up) cancelled first: the loop closes with none pending
        boot._loop.call_soon_threadsafe(_cancel_all, boot._loop)
        boot.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise AssertionError(f"the bootstrap server did not listen on {port}")


@contextmanager
def info_http(info: dict[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 answering every GET with ``info``; its base URL and
    the paths asked. Stopped after the block."""
    asked: list[str] = []
    body = json.dumps(info).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", asked
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


class TestServerInfo(GuardTestCase):
    def setUp(self) -> None:
        super().setUp()
        scratch = tempfile.TemporaryDirectory()
        self.addCleanup(scratch.cleanup)
        self.dir = scratch.name

    def saved(self, info: dict[str, Any], name: str = "info.json") -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(info, fh)
        return path

    def test_same_findings_as_the_launch_lines(self) -> None:
        """Each server given by its server-info answer (a saved file) gives the findings,
        codes and severities, of the launch lines it was started from."""
        for name, prefill, decode in PAIRS:
            with self.subTest(name):
                _, lines = check_json(prefill, decode)
                _, live = live_json("--decode", decode, "--prefill-server-info",
                                     self.saved(server_info("prefill", prefill)))
                self.assertEqual(found(live), found(lines))
                _, both = live_json("--prefill-server-info",
                                     self.saved(server_info("prefill", prefill), "p.json"),
                                     "--decode-server-info",
                                     self.saved(server_info("decode", decode), "d.json"))
                self.assertEqual(found(both), found(lines))

    def test_url_on_loopback(self) -> None:
        """An http:// URL on 127.0.0.1 is fetched by the command with one GET (its path,
        else /get_server_info) and read as the saved answer is."""
        _, prefill, decode = PAIRS[0]
        _, lines = check_json(prefill, decode)
        with info_http(server_info("prefill", prefill)) as (url, asked):
            _, base = live_json("--decode", decode, "--prefill-server-info", url)
            _, named = live_json("--decode", decode, "--prefill-server-info", url + "/server_info")
        self.assertEqual(asked, ["/get_server_info", "/server_info"])
        self.assertEqual(found(base), found(lines))
        self.assertEqual(found(named), found(lines))

    def test_unknown_fields_listed(self) -> None:
        """A field the release's parser has no flag for is dropped and named in one
        unknowns line, with the answer's own additions (version, internal_states)."""
        _, prefill, decode = PAIRS[1]
        info = {**server_info("prefill", prefill), "field_of_a_newer_release": 7}
        _, doc = live_json("--decode", decode, "--prefill-server-info", self.saved(info))
        dropped = [u for u in doc["unknowns"] if "have no flag" in u]
        self.assertEqual(len(dropped), 1, doc["unknowns"])
        for name in ("field_of_a_newer_release", "version", "internal_states"):
            self.assertIn(name, dropped[0])
        self.assertTrue(any("0.0.0-running" in u for u in doc["unknowns"]))

    def test_line_reads_back(self) -> None:
        """Every flag of the line the answer stands for reads back, with the release's
        parser, as the answer's value; a value no flag gives is said, never typed."""
        info = server_info("prefill", PAIRS[2][1])
        line = info_line(info)
        parsed = vars(release_parser(ServerArgs).parse_args(list(line.argv)))
        typed = {token.split("=", 1)[0] for token in line.argv if token.startswith("--")}
        self.assertIn("--tp-size", typed)
        for dest, value in parsed.items():
            if dest in info and "--" + dest.replace("_", "-") in typed:
                self.assertEqual(json.dumps(value, default=str),
                                 json.dumps(info[dest], default=str), dest)
        self.assertEqual(parsed["tp_size"], 4)
        self.assertEqual(parsed["disaggregation_mode"], "prefill")

    def test_model_path_map(self) -> None:
        """The server's model path is not on this machine: exit 2 naming the option and
        --model-path-map; with --model-path-map PATH=DIR it is read from DIR."""
        _, prefill, decode = PAIRS[0]
        info = server_info("prefill", prefill)
        info = {k: "/models/llama" if v == LLAMA else v for k, v in info.items()}
        path = self.saved(info)
        status, out, err = run_cli("check", "--prefill-server-info", path, "--decode", decode)
        self.assertEqual((status, out), (2, ""), err)
        self.assertIn(f"--prefill-server-info {path}", err)
        self.assertIn("--model-path-map", err)
        self.assertNotIn("Traceback", err)
        _, lines = check_json(prefill, decode)
        _, doc = live_json("--decode", decode, "--prefill-server-info", path,
                            "--model-path-map", f"/models/llama={LLAMA}")
        self.assertEqual(found(doc), found(lines))

    def test_bad_input(self) -> None:
        """A role given twice, a file that is not an answer, an unreadable file: exit 2,
        one line naming the option, no traceback."""
        _, prefill, decode = PAIRS[1]
        cases = (
            (("--prefill", prefill, "--prefill-server-info", "x.json", "--decode", decode),
             "--prefill-server-info"),
            (("--prefill-server-info", self.saved({"a": 1}, "a.json"), "--decode", decode),
             "no model_path"),
            (("--prefill-server-info", os.path.join(self.dir, "absent.json"), "--decode",
              decode), "cannot read"),
            (("--prefill-server-info", "https://127.0.0.1:1/", "--decode", decode),
             "only an http:// URL"),
            (("--prefill-server-info", self.saved(server_info("decode", decode), "d.json"),
              "--decode", decode), "--disaggregation-mode is 'decode'"),
        )
        for argv, words in cases:
            with self.subTest(words):
                status, out, err = run_cli("check", *argv)
                self.assertEqual((status, out), (2, ""), err)
                self.assertIn(words, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)


class TestBootstrap(GuardTestCase):
    def test_same_findings_as_the_launch_lines(self) -> None:
        """The decode's line against the running prefill's bootstrap server gives the
        first-contact findings (codes, severities) of the launch lines it was started
        from, and says what the /route answer does not carry."""
        for name, prefill, decode in PAIRS:
            with self.subTest(name), bootstrap(prefill) as address:
                _, lines = check_json(prefill, decode)
                status, live = live_json("--decode", decode, "--prefill-bootstrap", address)
                expected = [f for f in found(lines) if f[0] in FIRST_CONTACT]
                self.assertEqual(found(live), expected)
                self.assertEqual(status, 1 if any(s == "error" for _, s in expected) else 0)
                self.assertEqual(live["prefill_bootstrap"]["address"], address)
                self.assertTrue(any("not in the /route answer" in u for u in live["unknowns"]))

    def test_decode_running_too(self) -> None:
        """The decode given by its server-info answer, against the prefill's bootstrap
        server: the same findings as its launch line gives."""
        _, prefill, decode = PAIRS[0]
        with tempfile.TemporaryDirectory() as scratch, bootstrap(prefill) as address:
            path = os.path.join(scratch, "decode.json")
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(server_info("decode", decode), fh)
            _, typed = live_json("--decode", decode, "--prefill-bootstrap", address)
            _, live = live_json("--decode-server-info", path, "--prefill-bootstrap", address)
        self.assertEqual(found(live), found(typed))
        self.assertEqual([c for c, _ in found(live)], ["DSV4G022", "DSV4G030"])

    def test_not_fully_registered(self) -> None:
        """A prefill whose ranks have not all registered answers 503: exit 2 naming the
        option, the address and SGLang's answer, no traceback."""
        _, prefill, decode = PAIRS[0]
        with bootstrap(prefill, ranks=1) as address:
            status, out, err = run_cli("check", "--prefill-bootstrap", address,
                                       "--decode", decode)
        self.assertEqual((status, out), (2, ""), err)
        self.assertIn(f"--prefill-bootstrap: '{address}'", err)
        self.assertIn("HTTP 503", err)
        self.assertNotIn("Traceback", err)


class TestLoopbackOnly(GuardTestCase):
    def test_other_hosts_refused_before_any_connection(self) -> None:
        """A host that is not a loopback address is refused, exit 2 naming the option, the
        value and that only loopback is contacted, with no look-up or connection tried."""
        decode = PAIRS[1][2]
        cases = (("--prefill-bootstrap", "10.1.2.3:8998"),
                 ("--prefill-bootstrap", "prefill.example.com:8998"),
                 ("--prefill-server-info", "http://192.168.0.7:30000/get_server_info"),
                 ("--prefill-server-info", "http://[2001:db8::1]:30000/"))
        refused = AssertionError("check tried to contact a host")
        with mock.patch("socket.create_connection", side_effect=refused) as connect, \
                mock.patch("socket.getaddrinfo", side_effect=refused) as lookup, \
                mock.patch.object(socket.socket, "connect", side_effect=refused) as raw:
            for option, value in cases:
                with self.subTest(value):
                    status, out, err = run_cli("check", option, value, "--decode", decode)
                    self.assertEqual((status, out), (2, ""), err)
                    self.assertIn(f"{option}: '{value}'", err)
                    self.assertIn("only a loopback address", err)
        self.assertEqual((connect.call_count, lookup.call_count, raw.call_count), (0, 0, 0))

    def test_unreachable_port(self) -> None:
        """Nothing listens on the port: exit 2 naming the option and the address, no
        traceback."""
        decode = PAIRS[1][2]
        port = free_port()
        for option, value in (("--prefill-bootstrap", f"127.0.0.1:{port}"),
                              ("--prefill-server-info", f"http://localhost:{port}/")):
            with self.subTest(option):
                status, out, err = run_cli("check", option, value, "--decode", decode)
                self.assertEqual((status, out), (2, ""), err)
                self.assertIn(f"{option}: '{value}'", err)
                self.assertIn(f":{port}", err)
                self.assertIn("cannot connect", err)
                self.assertNotIn("Traceback", err)


if __name__ == "__main__":
    unittest.main()
