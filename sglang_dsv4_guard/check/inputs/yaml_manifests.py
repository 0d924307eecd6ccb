"""YAML files: Kubernetes manifests (one object, several documents, ``List`` kinds,
rendered Helm or Kustomize output) and docker-compose files, read into commands.

Every container of an object is found wherever its kind keeps it (``containers`` lists,
Dynamo's ``mainContainer``, OME's ``runner``); the path to it says the server's role
slot (``spec.roles[].name`` of a DisaggregatedSet or RoleBasedGroup, a Dynamo service or
component, OME's ``engineConfig``/``decoderConfig``) and node (``leaderTemplate``/
``workerTemplate``, OME's ``leader``/``worker``). Its ``command`` + ``args`` are one
command, as Kubernetes runs it (:func:`.commands.interpret`). docker-compose services
are read by :mod:`.compose`.
"""

from __future__ import annotations

import yaml

from sglang_dsv4_guard.check.inputs.commands import MARKERS, Context, Found, interpret, make_draft, run_script
from sglang_dsv4_guard.check.inputs.compose import read_compose
from sglang_dsv4_guard.check.inputs.expand import Scope, expand_kube, unresolved_line
from sglang_dsv4_guard.check.inputs.kube import container_env, gpu_of
from sglang_dsv4_guard.check.inputs.nodes import Budget, compose, get, items, mapping, pairs, region, scalar
from sglang_dsv4_guard.check.inputs.source import Source

__all__ = ["read_yaml"]

_CONTAINER_KEYS = frozenset({"mainContainer", "runner"})
_SLOTS = frozenset({"engineConfig", "decoderConfig", "routerConfig"})
_NODES = {"leaderTemplate": "leader", "leader": "leader", "workerTemplate": "worker",
          "worker": "worker"}
_SIBLING = {"leaderTemplate": "workerTemplate", "workerTemplate": "leaderTemplate",
            "leader": "worker", "worker": "leader"}
_ROLES = ("prefill", "decode")


def read_yaml(source: Source, found: Found) -> bool:
    """Read every document of a YAML (or JSON) file; False when it holds no Kubernetes
    object or compose file."""
    budget = Budget(source.path)
    known = False
    for index, document in enumerate(compose(source)):
        if not mapping(document):
            continue
        kind = scalar(get(document, "kind"))
        if kind is None and mapping(get(document, "services")):
            read_compose(source, document, index, found, budget)
            known = True
            continue
        objects = items(get(document, "items")) if kind and kind.endswith("List") \
            else [document]
        for number, obj in enumerate(objects):
            label = _label(obj, index, number if len(objects) > 1 else None)
            group = (f"{source.path}#{index}.{number}:{label}", f"{source.path}: {label}")
            if scalar(get(obj, "kind")) == "ConfigMap":
                _config_map(source, obj, label, group, found)
            else:
                _walk(source, obj, [], [obj], _Object(label, group, obj), found, budget)
            known = known or kind is not None
    return known


def _label(obj: yaml.Node, index: int, number: int | None) -> str:
    kind = scalar(get(obj, "kind")) or "document"
    name = scalar(get(obj, "metadata", "name"))
    if name:
        return f"{kind}/{name}"
    return f"{kind} {index + 1}" + (f" item {number + 1}" if number is not None else "")


class _Object:
    """The object being walked: its label, first pairing group and whether it names
    prefill and decode roles itself (OME's engine and decoder)."""

    def __init__(self, label: str, group: tuple[str, str], node: yaml.Node) -> None:
        self.label = label
        self.group = group
        self.decoder = get(node, "spec", "decoderConfig") is not None


def _walk(source: Source, node: yaml.Node, path: list[str | int], ancestors: list[yaml.Node],
          obj: _Object, found: Found, budget: Budget) -> None:
    budget.spend(node)
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            container = path[-1:] == ["containers"] and mapping(item)
            if container:
                _container(source, item, [*path, i], ancestors, obj, found)
                budget.spend(item)
            else:
                _walk(source, item, [*path, i], ancestors, obj, found, budget)
    elif isinstance(node, yaml.MappingNode):
        for key, value in pairs(node):
            if key in _CONTAINER_KEYS and mapping(value):
                _container(source, value, [*path, key], [*ancestors, node], obj, found)
                budget.spend(value)
            elif not isinstance(value, yaml.ScalarNode):
                _walk(source, value, [*path, key], [*ancestors, node], obj, found, budget)


def _slot(path: list[str | int], ancestors: list[yaml.Node]) -> tuple[str, str | None,
                                                                       str | None, list[str]]:
    """The role slot, node, declared role and names of the container at ``path``."""
    slot, node, declared = "", None, None
    names: list[str] = []
    walked: yaml.Node | None = ancestors[0] if ancestors else None
    for i, step in enumerate(path):
        child = walked.value[step] if isinstance(step, int) and isinstance(
            walked, yaml.SequenceNode) and step < len(walked.value) else get(walked, str(step))
        parent = path[i - 1] if i else None
        if isinstance(step, int) and parent in ("roles", "components") and child is not None:
            name = scalar(get(child, "name")) or str(step)
            slot, names = f"role {name}", [*names, name]
            kind = scalar(get(child, "type")) or scalar(get(child, "subComponentType"))
            declared = kind if kind in _ROLES else (name if name in _ROLES else declared)
        elif parent == "services" and isinstance(step, str):
            slot, names = f"service {step}", [*names, step]
            kind = scalar(get(child, "subComponentType"))
            declared = kind if kind in _ROLES else declared
        elif step in _SLOTS:
            slot = str(step)
        elif isinstance(step, str) and step in _NODES and \
                get(walked, _SIBLING[step]) is not None:  # a leader and workers
            node = _NODES[step]
        walked = child
    return slot, node, declared, names


def _container(source: Source, cnode: yaml.Node, path: list[str | int],
               ancestors: list[yaml.Node], obj: _Object, found: Found) -> None:
    name = scalar(get(cnode, "name"))
    slot, node, declared, names = _slot(path, ancestors)
    if obj.decoder and slot in ("engineConfig", "decoderConfig"):
        declared = "prefill" if slot == "engineConfig" else "decode"
    where = " ".join(p for p in (obj.label, slot, node) if p) + (
        f", container {name}" if name else "")
    env, why, notes = container_env(source, cnode, ancestors)
    scope = Scope(vars=dict(env), exported=set(env), kube=env, why=why,
                  unset_why="not set in the script or the container's env")
    unit = f"{obj.group[0]}:{slot}" + ("" if node else
                                        f":{name or '.'.join(str(p) for p in path)}")
    metadata_name = obj.label.split("/", 1)[-1]
    ctx = Context(source, where, obj.group, unit, node, gpu_of(cnode, ancestors, found.notes,
                                                                where),
                  declared, (*names, metadata_name), tuple(notes),
                  image=scalar(get(cnode, "image")) or "")
    command = items(get(cnode, "command"))
    nodes = command + items(get(cnode, "args"))
    args = [expand_kube(scalar(n) or "", env, scope, region(source, n)) for n in nodes]
    text_env = {k: v.text for k, v in env.items()}
    started = interpret(args, text_env, scope, ctx, found)
    if not started and not command and args and args[0].text.startswith("-") and \
            "sglang" in ctx.image and "router" not in ctx.image:
        why_line = unresolved_line(f"image {ctx.image}", cnode.start_mark.line + 1,
                                   "no command: the image's entrypoint is taken to be "
                                   "SGLang's server", "its arguments are read")
        found.add(make_draft(ctx, args, len(args), 0, "entrypoint", text_env,
                                       (why_line,)))


def _config_map(source: Source, obj: yaml.Node, label: str, group: tuple[str, str],
                found: Found) -> None:
    """A ConfigMap's scripts (``data.<key>``) that start a server or a router, each read
    as the script a container mounts and runs."""
    for key, value in pairs(get(obj, "data")):
        text = scalar(value)
        if text and MARKERS.search(text):
            where = f"{label} data {key}"
            ctx = Context(source, where, group, f"{group[0]}:data {key}", names=(key,))
            run_script(text, None, region(source, value),
                       Scope(unset_why="not set in the script (the container's env is not "
                             "known here)"), ctx, found)
