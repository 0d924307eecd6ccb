"""One Kubernetes container: its environment as the kubelet builds it, and the GPU its
pod asks for.

``env`` entries with ``value`` are resolved in order (``$(VAR)`` of an earlier entry);
a ``valueFrom`` (Secret, ConfigMap, fieldRef, resourceFieldRef), ``envFrom`` and
Dynamo's ``envFromSecret`` are read when the pod starts, so each is an ``unresolved``
line. Dynamo's service-level ``envs`` come before the container's ``env``. The GPU is the
product a ``nodeSelector`` or required ``nodeAffinity`` names (the nearest pod spec
first), else ``amd.com/gpu`` when the container asks for that resource.
"""

from __future__ import annotations

import yaml

from sglang_dsv4_guard.check.inputs.expand import Scope, VarValue, expand_kube, unresolved_line
from sglang_dsv4_guard.check.inputs.nodes import get, items, pairs, region, scalar
from sglang_dsv4_guard.check.inputs.source import Source

__all__ = ["GPU_LABELS", "container_env", "gpu_of"]

# Node labels naming the GPU product (NVIDIA's GPU feature discovery, AMD's operator,
# GKE's accelerator label).
GPU_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name",
              "cloud.google.com/gke-accelerator")
_REFS = (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap"),
         ("fieldRef", "fieldRef"), ("resourceFieldRef", "resourceFieldRef"))


def _value_from(node: yaml.Node) -> str:
    for key, kind in _REFS:
        ref = get(node, key)
        if ref is not None:
            what = scalar(get(ref, "fieldPath")) or scalar(get(ref, "resource")) or \
                f"{scalar(get(ref, 'name'))}/{scalar(get(ref, 'key'))}"
            return f"valueFrom {kind} {what}, read when the pod starts"
    return "valueFrom, read when the pod starts"


def container_env(source: Source, container: yaml.Node, ancestors: list[yaml.Node]
                  ) -> tuple[dict[str, VarValue], dict[str, str], list[str]]:
    """The container's env (name -> value and where it is written), why each name
    without value has none, and one ``unresolved`` line for each."""
    env: dict[str, VarValue] = {}
    why: dict[str, str] = {}
    notes: list[str] = []
    lists = [get(a, "envs") for a in ancestors] + [get(container, "env")]
    scope = Scope(why=why)
    for entries in lists:
        for entry in items(entries):
            name = scalar(get(entry, "name"))
            if not name:
                continue
            source_node = get(entry, "valueFrom")
            value_node = get(entry, "value")
            if source_node is not None:
                why[name] = _value_from(source_node)
                env.pop(name, None)
                notes.append(unresolved_line(name, entry.start_mark.line + 1, why[name],
                                             "not in env"))
                continue
            typed = scalar(value_node) or ""
            place = region(source, value_node if value_node is not None else entry)
            arg = expand_kube(typed, env, scope, place)
            notes += arg.unresolved
            env[name] = VarValue(arg.text, place.fresh())
    for entry in items(get(container, "envFrom")):
        for key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
            ref = scalar(get(entry, key, "name"))
            if ref:
                notes.append(unresolved_line(f"envFrom {kind} {ref}", entry.start_mark.line + 1,
                                             "its variables are read when the pod starts",
                                             "none of them is known here"))
    for ancestor in ancestors:
        secret = get(ancestor, "envFromSecret")
        if scalar(secret):
            notes.append(unresolved_line(f"envFromSecret {scalar(secret)}",
                                         secret.start_mark.line + 1,  # type: ignore[union-attr]
                                         "its variables are read when the pod starts",
                                         "none of them is known here"))
    return env, why, notes


def _affinity_products(spec: yaml.Node) -> list[str]:
    terms = get(spec, "affinity", "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
    found: list[str] = []
    for term in items(terms):
        for expression in items(get(term, "matchExpressions")):
            if scalar(get(expression, "key")) in GPU_LABELS and \
                    scalar(get(expression, "operator")) == "In":
                found += [v for v in (scalar(n) for n in items(get(expression, "values"))) if v]
    return list(dict.fromkeys(found))


def gpu_of(container: yaml.Node, ancestors: list[yaml.Node], notes: list[str],
           where: str) -> str | None:
    """The GPU product the pod is scheduled on (raw), or None when the manifest does not
    say; several allowed products are a note and None."""
    for spec in reversed(ancestors):
        for key, value in pairs(get(spec, "nodeSelector")):
            if key in GPU_LABELS and scalar(value):
                return scalar(value)
        products = _affinity_products(spec)
        if len(products) == 1:
            return products[0]
        if products:
            notes.append(f"{where}: its nodeAffinity allows several GPU products "
                         f"({', '.join(products)}); no GPU is assumed")
            return None
    for kind in ("limits", "requests"):
        if any(key == "amd.com/gpu" for key, _ in pairs(get(container, "resources", kind))):
            return "amd.com/gpu"
    return None
