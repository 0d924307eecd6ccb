"""``check`` against a running server: its inputs read here, in the command (no SGLang).

- ``--prefill-server-info FILE|URL`` / ``--decode-server-info FILE|URL``: a server's
  ``/get_server_info`` answer (a saved file, or fetched from an ``http://`` URL), whose
  resolved arguments stand for that server's launch line: the check process turns them
  into it with the installed release's parser (:mod:`.server.server_info`);
- ``--prefill-bootstrap HOST:PORT``: the prefill's bootstrap server's ``/route`` answer,
  which decode's first contact reads (:mod:`.bootstrap` compares the decode's launch
  line against it).

Only a loopback host is contacted (127.0.0.0/8, ::1, ``localhost`` resolved to loopback
addresses only): any other is refused before any connection (:func:`loopback`). One GET
per input, with a short time limit, no retry, no redirect, no proxy (``http.client``).
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import socket
import urllib.parse
from collections.abc import Mapping
from typing import Any

from sglang_dsv4_guard.check.offline.parse import CheckInputError

__all__ = ["FETCH_TIMEOUT", "MAX_ANSWER_BYTES", "ROUTE_PATH", "live_request", "live_roles",
           "loopback"]

#: Seconds one GET may take (connecting and reading): a running server answers at once.
FETCH_TIMEOUT = 5.0
#: The largest answer read (a server-info answer is tens of KiB).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: The query decode's first contact sends (``try_ensure_parallel_info``): the prefill's
#: parallel info, not one rank's address.
ROUTE_PATH = ("/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1"
              "&target_pp_rank=-1")
#: The path asked when a server-info URL names none (every release serves it).
INFO_PATH = "/get_server_info"
_LOOPBACK_ONLY = ("check contacts only a loopback address (127.0.0.0/8, ::1, localhost): "
                  "run it on that host, or forward a local port to it (ssh -L); a "
                  "server-info answer can also be saved to a file and given as its path")
# Each live option: its attribute, the role it stands for and the request key it fills.
_OPTIONS = (("prefill_server_info", "prefill", "prefill_server_info"),
            ("decode_server_info", "decode", "decode_server_info"),
            ("prefill_bootstrap", "prefill", "prefill_route"))


def _option(attr: str) -> str:
    return "--" + attr.replace("_", "-")


def live_roles(args: argparse.Namespace) -> dict[str, str]:
    """The role each live option given stands for, as ``{role: option}``; a role given
    twice (a launch line and a live option, or two live options) raises
    :class:`CheckInputError` naming both."""
    roles: dict[str, str] = {}
    for attr, role, _ in _OPTIONS:
        if getattr(args, attr, None) is None:
            continue
        other = roles.get(role) or (f"--{role}" if getattr(args, role, None) is not None
                                    else None)
        if other is not None:
            raise CheckInputError(_option(attr), f"the {role} server is given by {other} "
                                                 "already; give one of them")
        roles[role] = _option(attr)
    return roles


def loopback(option: str, value: str, host: str, port: int) -> list[str]:
    """The addresses to connect to for ``host``: itself when it is a loopback address,
    ``localhost``'s loopback addresses; any other host raises :class:`CheckInputError`
    naming ``option`` and ``value``, before any connection or name look-up."""
    name = host.strip("[]").lower()
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    if address is not None and address.is_loopback:
        return [name]
    if name != "localhost":
        raise CheckInputError(option, f"{value!r}: {host!r} is not a loopback address; "
                                      f"{_LOOPBACK_ONLY}")
    try:
        found = socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise CheckInputError(option, f"{value!r}: localhost does not resolve here "
                                      f"({exc})") from None
    kept = [str(addr[0]) for _, _, _, _, addr in found if _is_loopback(str(addr[0]))]
    if not kept:
        raise CheckInputError(option, f"{value!r}: localhost resolves to no loopback address "
                                      f"here; {_LOOPBACK_ONLY}")
    return list(dict.fromkeys(kept))


def _is_loopback(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def _port(option: str, value: str, text: str | None) -> int:
    if text is None or not text.isdigit() or not 0 < int(text) < 65536:
        raise CheckInputError(option, f"{value!r}: expected a port number from 1 to 65535 "
                                      f"(got {text!r})")
    return int(text)


def _get(option: str, value: str, host: str, port: int, path: str) -> bytes:
    """One GET of ``path`` from ``host`` (loopback only): the body of a 200 answer, else
    :class:`CheckInputError` naming the option, the value and what happened."""
    addresses = loopback(option, value, host, port)
    where = f"{host}:{port}"
    last = "no address"
    for address in addresses:  # localhost: each loopback address it has, until one answers
        connection = http.client.HTTPConnection(address, port, timeout=FETCH_TIMEOUT)
        try:
            connection.request("GET", path, headers={"Accept": "application/json"})
            answer = connection.getresponse()
            body = answer.read(MAX_ANSWER_BYTES + 1)
        except ConnectionRefusedError:
            last = "connection refused: nothing listens on that port"
            continue
        except TimeoutError:
            raise CheckInputError(option, f"{value!r}: {where} did not answer GET {path} "
                                          f"within {FETCH_TIMEOUT:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            last = f"{type(exc).__name__}: {exc}"
            continue
        finally:
            connection.close()
        if len(body) > MAX_ANSWER_BYTES:
            raise CheckInputError(option, f"{value!r}: the answer to GET {path} is larger "
                                          f"than {MAX_ANSWER_BYTES // (1024 * 1024)} MiB")
        if answer.status != 200:
            text = " ".join(body.decode("utf-8", "replace").split())[:300]
            raise CheckInputError(option, f"{value!r}: {where} answered GET {path} with "
                                          f"HTTP {answer.status}: {text or answer.reason}")
        return body
    raise CheckInputError(option, f"{value!r}: cannot connect to {where} ({last})")


def _json(option: str, value: str, body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise CheckInputError(option, f"{value!r}: not JSON ({exc})") from None


def _server_info(option: str, value: str) -> Any:
    """The server-info answer ``value`` names: fetched from an ``http://`` URL, else read
    from the file."""
    if "://" in value:
        url = urllib.parse.urlsplit(value)
        if url.scheme != "http":
            raise CheckInputError(option, f"{value!r}: only an http:// URL is fetched (a "
                                          "server's own HTTP port on this host), or give a "
                                          "file")
        try:
            port = url.port or 80
        except ValueError as exc:
            raise CheckInputError(option, f"{value!r}: {exc}") from None
        path = (url.path if url.path not in ("", "/") else INFO_PATH) + (
            f"?{url.query}" if url.query else "")
        return _json(option, value, _get(option, value, url.hostname or "", port, path))
    try:
        if os.path.getsize(value) > MAX_ANSWER_BYTES:
            raise CheckInputError(option, f"{value!r}: larger than "
                                          f"{MAX_ANSWER_BYTES // (1024 * 1024)} MiB")
        with open(value, "rb") as fh:
            body = fh.read()
    except OSError as exc:
        raise CheckInputError(option, f"cannot read {value!r}: {exc.strerror or exc} (a "
                                      "saved /get_server_info answer, or an http:// URL)"
                              ) from None
    return _json(option, value, body)


def _route(option: str, value: str) -> dict[str, Any]:
    """The ``/route`` answer of the bootstrap server at ``value`` (``HOST:PORT``)."""
    host, colon, port = value.rpartition(":")
    if not colon or not host or "/" in value:
        raise CheckInputError(option, f"expected HOST:PORT, the prefill's bootstrap address "
                                      f"(--disaggregation-bootstrap-port) (got {value!r})")
    answer = _json(option, value, _get(option, value, host, _port(option, value, port),
                                       ROUTE_PATH))
    if not isinstance(answer, dict):
        raise CheckInputError(option, f"{value!r}: the /route answer is not a JSON object "
                                      f"(got {type(answer).__name__})")
    return answer


def _mapped(info: Any, mapping: Mapping[str, str]) -> Any:
    """``info`` with each top-level value that is a mapped model path replaced by its
    local directory (``--model-path-map``)."""
    if not isinstance(info, dict) or not mapping:
        return info
    return {key: mapping.get(item, item) if isinstance(item, str) else item
            for key, item in info.items()}


def live_request(args: argparse.Namespace, request: dict[str, Any],
                 models: Mapping[str, str]) -> dict[str, Any]:
    """``request`` (a typed pair's) with each live option's answer in place of that
    server's launch line: ``prefill_server_info``/``decode_server_info`` (model paths
    mapped by ``models``), ``prefill_route`` with ``prefill_bootstrap`` (its address),
    and ``live_sources`` naming where each came from. Raises :class:`CheckInputError`."""
    if getattr(args, "prefill_bootstrap", None) is not None:
        for other, why in (("fix", "--fix proves its fixes by re-running the check on both "
                                   "launch lines, and the prefill's is not known"),
                           ("prefill_gpu", "the prefill is read from its /route answer, "
                                           "which its GPU does not change"),
                           ("prefill_env", "the prefill is read from its /route answer, "
                                           "which its environment does not change")):
            if getattr(args, other, None):
                raise CheckInputError("--prefill-bootstrap", f"not with {_option(other)}: "
                                                             f"{why}")
    out = dict(request)
    sources: dict[str, str] = {}
    for attr, role, key in _OPTIONS:
        value = getattr(args, attr, None)
        if value is None:
            continue
        option = _option(attr)
        if key == "prefill_route":
            out[key], out["prefill_bootstrap"] = _route(option, value), value
        else:
            out[key] = _mapped(_server_info(option, value), models)
        out.pop(role, None)
        sources[role] = f"{option} {value}"
    if sources:
        out["live_sources"] = sources
    return out
