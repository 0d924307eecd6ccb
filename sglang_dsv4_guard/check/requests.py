"""``check``'s requests to its check process (:mod:`.child`), built in the command (which
never imports SGLang): a pair typed as two launch lines, or a pair read from deployment
files, with each server's GPU, the model paths mapped to local directories and the
variables the files leave without a value read as the group's leader pod.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sglang_dsv4_guard.check.offline.parse import CheckInputError, parse_env
from sglang_dsv4_guard.check.server.gpu_models import gpu_model

if TYPE_CHECKING:
    from sglang_dsv4_guard.check.inputs import Invocation, Pair

__all__ = ["POD_VARIABLES", "REFERENCE", "gpus_of", "model_path_map", "pair_request", "prepared",
           "request_of", "shared", "variables"]


def request_of(args: argparse.Namespace) -> dict[str, Any]:
    """The child's request for a pair typed as ``--prefill``/``--decode``; a malformed
    ``--*-env`` item raises :class:`~.parse.CheckInputError` naming it."""
    gpus, sources, _ = gpus_of(args)
    return {"prefill": args.prefill, "decode": args.decode,
            "prefill_env": parse_env("--prefill-env", args.prefill_env),
            "decode_env": parse_env("--decode-env", args.decode_env),
            "gpus": gpus, "gpu_sources": sources, **shared(args)}


def shared(args: argparse.Namespace) -> dict[str, Any]:
    """What every pair's request has from the command line."""
    return {"fix": bool(getattr(args, "fix", False)),
            "verbose": bool(getattr(args, "verbose", False)),
            "keep": getattr(args, "keep", None)}


def gpus_of(args: argparse.Namespace, pair: Pair | None = None
            ) -> tuple[dict[str, str | None], dict[str, str], list[str]]:
    """Each server's GPU and what named it: ``--prefill-gpu``/``--decode-gpu``, else
    ``--gpu`` (a name :func:`~.server.gpu_models.gpu_model` cannot read raises, before the
    child starts), else the GPU its manifest states (``pair``'s invocation; a label it
    cannot read is a note, and that server is judged on every GPU model). Also the notes."""
    gpus: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []
    for role in ("prefill", "decode"):
        gpus[role] = None
        for option in (f"--{role}-gpu", "--gpu"):
            text = getattr(args, option[2:].replace("-", "_"), None)
            if text is not None:
                gpu_model(text, option)
                gpus[role], sources[role] = text, option
                break
        invocation = None if pair is None else (pair.prefill if role == "prefill" else pair.decode)
        if gpus[role] is None and invocation is not None and invocation.gpu == "amd.com/gpu":
            notes.append(f"{role}: its pod asks for amd.com/gpu without naming the model: "
                         "an AMD GPU, which check does not model (judged as on this machine)")
            continue
        if gpus[role] is None and invocation is not None and invocation.gpu:
            where = f"{invocation.file}:{invocation.line} (the pod's GPU label)"
            try:
                gpu_model(invocation.gpu, where)
            except CheckInputError as exc:
                notes.append(f"{role}: {exc}; judged on every GPU model")
                continue
            gpus[role], sources[role] = invocation.gpu, where
    return gpus, sources, notes


def model_path_map(items: Sequence[str]) -> dict[str, str]:
    """``--model-path-map PATH=DIR`` items: a model path as the deployment writes it, and
    the local directory holding its ``config.json``; a malformed item raises
    :class:`~.parse.CheckInputError` naming it."""
    mapping: dict[str, str] = {}
    for item in items:
        path, eq, local = item.partition("=")
        if not eq or not path.strip() or not local.strip():
            raise CheckInputError("--model-path-map", f"expected PATH=DIR, a model path as the "
                                                      f"deployment writes it and a local "
                                                      f"directory with its config.json (got "
                                                      f"{item!r})")
        mapping[path.strip()] = local.strip()
    return mapping


# Variables a workload controller sets in each pod when it starts (LeaderWorkerSet, RBG)
# or that the pod's own address fills: a pair is checked as its group's leader pod, with
# these values (none of them enters a prefill/decode comparison), and says so.
POD_VARIABLES = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_WORKER_INDEX": "0",
                 "RBG_LWP_LEADER_ADDRESS": "127.0.0.1", "RBG_LWP_WORKER_INDEX": "0",
                 "POD_IP": "127.0.0.1"}
REFERENCE = re.compile(r"\$\((\w+)\)|\$\{(\w+)\}|\$(\w+)")


def variables(items: Sequence[str]) -> dict[str, str]:
    """``--var NAME=VALUE`` items: a value for a variable the deployment files leave
    without one; a malformed item raises :class:`~.parse.CheckInputError` naming it."""
    values: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise CheckInputError("--var", f"expected NAME=VALUE, a variable's name and the "
                                           f"value to read it as (got {item!r})")
        values[name] = value
    return values


def _substituted(argv: Sequence[str], given: Mapping[str, str], used: dict[str, str]
                 ) -> list[str]:
    """``argv`` with each reference the reader left (``$(X)``, ``${X}``, ``$X``) to a
    variable of ``given`` or :data:`POD_VARIABLES` replaced by its value (``used``
    records which)."""
    def value(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        found = given.get(name, POD_VARIABLES.get(name))
        if found is None:
            return match.group(0)
        used[name] = found
        return found
    return [REFERENCE.sub(value, token) if "$" in token else token for token in argv]


def _mapped(argv: Sequence[str], mapping: Mapping[str, str]) -> list[str]:
    """``argv`` with each value that is a mapped model path (alone or as ``--flag=PATH``)
    replaced by its local directory."""
    out = []
    for token in argv:
        flag, eq, value = token.partition("=")
        if token in mapping:
            token = mapping[token]
        elif eq and flag.startswith("--") and value in mapping:
            token = f"{flag}={mapping[value]}"
        out.append(token)
    return out


def pair_request(pair: Pair, args: argparse.Namespace,
                 models: Mapping[str, str] | None = None,
                 nodes: Mapping[str, Sequence[Invocation]] | None = None) -> dict[str, Any]:
    """The child's request for one pair read from files: each server's arguments as one
    shell-quoted line (the check splits it back into the same tokens), model paths mapped
    to local directories by ``models``, each server's environment and GPU (:func:`gpus_of`),
    and the lines of the other nodes of a multi-node server (``nodes``, by role: a fix
    edits them too)."""
    models = models or {}
    gpus, sources, _ = gpus_of(args, pair)
    used: dict[str, str] = {}
    argv = {role: prepared(invocation.argv, args, models, used)
            for role, invocation in (("prefill", pair.prefill), ("decode", pair.decode))}
    return {"name": pair.name, "gpus": gpus, "gpu_sources": sources,
            "prefill": shlex.join(argv["prefill"]), "decode": shlex.join(argv["decode"]),
            "prefill_env": dict(pair.prefill.env), "decode_env": dict(pair.decode.env),
            "nodes": {role: [shlex.join(prepared(inv.argv, args, models)) for inv in others]
                      for role, others in (nodes or {}).items()},
            "variables": used}




def prepared(argv: Sequence[str], args: argparse.Namespace, models: Mapping[str, str],
             used: dict[str, str] | None = None) -> list[str]:
    """One server's arguments from a file as the check is sent them: variables read
    (:func:`_substituted`; ``used`` records which) and model paths mapped."""
    given = variables(getattr(args, "var", None) or ())
    return _mapped(_substituted(argv, given, {} if used is None else used), models)
