"""``check -f``: deployments read into SGLang invocations and prefill/decode pairs.

Kubernetes manifests (Deployment, StatefulSet, Pod, Job, LeaderWorkerSet, ``List``,
llm-d's DisaggregatedSet, RBG's RoleBasedGroup, OME's (Cluster)ServingRuntime, Dynamo's
DynamoGraphDeployment, rendered Helm or Kustomize output), docker-compose files, shell
scripts and args files. Pure Python and PyYAML: nothing here imports SGLang or runs a
command. The modules, by concern: :mod:`.model` (the values), :mod:`.source` (places in a
file), :mod:`.shell` (splitting), :mod:`.expand` (variables), :mod:`.commands`
(launchers, routers, scripts), :mod:`.nodes`, :mod:`.kube`, :mod:`.compose` and
:mod:`.yaml_manifests` (YAML), :mod:`.files` (paths), :mod:`.pairing` (pairs).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from sglang_dsv4_guard.check.inputs.commands import Found
from sglang_dsv4_guard.check.inputs.files import entries, read_entry
from sglang_dsv4_guard.check.inputs.model import InputError, Inputs, Invocation, Pair, Token
from sglang_dsv4_guard.check.inputs.pairing import pair
from sglang_dsv4_guard.check.inputs.source import no_collection

__all__ = ["InputError", "Inputs", "Invocation", "Pair", "Token", "read_inputs"]


def read_inputs(paths: Sequence[str], stdin: TextIO | None = None,
                replaced: Mapping[str, str] | None = None) -> Inputs:
    """Read ``paths`` (files, directories, ``-`` for ``stdin``, else ``sys.stdin``) into
    the invocations they start and the pairs those form; :class:`InputError` names a file
    that cannot be read, its line where there is one, and what is accepted. ``replaced``
    gives the text of some files instead of the disk's (by the path read)."""
    if not paths:
        raise InputError("-f", "no file named; give files, directories or - for stdin")
    found = Found()
    files = entries(list(paths))
    with no_collection():
        for entry in files:
            kept = len(found.drafts), len(found.routers)
            try:
                read_entry(entry, stdin if stdin is not None else sys.stdin, found, replaced)
            except InputError as exc:
                if not entry.walked:  # named: the operator meant it
                    raise
                del found.drafts[kept[0]:], found.routers[kept[1]:]
                found.notes.append(f"{exc} (skipped: found in a directory walk)")
        return pair(found, {e.path: e.together for e in files})
