"""YAML nodes, composed from PyYAML's safe parser's events, read with their places in the
file.

:func:`compose` builds PyYAML's own node classes from the event stream of the safe
parser (libyaml's when installed), without recursion and without PyYAML's tag resolver
(a plain ``null``, ``~`` or empty scalar
is a null, every other scalar a string). Every node keeps its start and end marks, so a
value is placed in the file it came from. Reading is bounded: nesting deeper than
``MAX_DEPTH``, more than ``MAX_DOCUMENTS`` documents or ``MAX_NODES`` YAML events (about
a megabyte of dense YAML) are refused, and (:class:`Budget`) so are more than
``MAX_NODES`` nodes visited in one file, an alias counting each time it is followed, so
an alias bomb stops there.
"""

from __future__ import annotations

from collections.abc import Iterator

import yaml

from sglang_dsv4_guard.check.inputs.model import MAX_DEPTH, MAX_DOCUMENTS, MAX_NODES, InputError
from sglang_dsv4_guard.check.inputs.source import Region, Source

__all__ = ["Budget", "compose", "get", "items", "mapping", "pairs", "region", "scalar"]

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NULL, _STR = "tag:yaml.org,2002:null", "tag:yaml.org,2002:str"
_MAP, _SEQ = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"


def _syntax(source: Source, exc: yaml.YAMLError) -> InputError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    helm = " (it holds {{ }}: render a Helm chart with helm template first)" \
        if "{{" in source.text else ""
    return InputError(f"{source.path}{line}", f"YAML syntax: {problem}{helm}; give YAML "
                      "(Kubernetes manifests, docker-compose) a YAML parser reads")


def _limit(source: Source, event: yaml.Event, message: str) -> InputError:
    return InputError(f"{source.path}:{event.start_mark.line + 1}", message)


def compose(source: Source) -> list[yaml.Node | None]:
    """The documents of ``source`` (None for an empty one)."""
    documents: list[yaml.Node | None] = []
    built = 0
    anchors: dict[str, yaml.Node] = {}
    stack: list[tuple[yaml.Node, list[yaml.Node]]] = []
    root: yaml.Node | None = None
    try:
        for event in yaml.parse(source.text, Loader=_LOADER):
            node: yaml.Node | None = None
            built += 1
            if built > MAX_NODES:
                raise _limit(source, event, f"more than {MAX_NODES:,} YAML nodes; deployment "
                             "manifests hold far fewer (split the file)")
            if isinstance(event, yaml.DocumentStartEvent):
                root, anchors = None, {}
                if len(documents) >= MAX_DOCUMENTS:
                    raise _limit(source, event, f"more than {MAX_DOCUMENTS:,} YAML documents; "
                                 "split the file")
            elif isinstance(event, yaml.DocumentEndEvent):
                documents.append(root)
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in anchors:
                    raise _limit(source, event, f"YAML alias *{event.anchor} names no anchor "
                                 "defined before it")
                node = anchors[event.anchor]
            elif isinstance(event, yaml.ScalarEvent):
                plain = event.style is None or event.style == ""
                tag = event.tag or (_NULL if plain and event.value in ("", "~", "null", "Null",
                                                                       "NULL") else _STR)
                node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark,
                                       style=event.style or None)
            elif isinstance(event, yaml.CollectionStartEvent):
                kind = yaml.SequenceNode if isinstance(event, yaml.SequenceStartEvent) \
                    else yaml.MappingNode
                collection = kind(event.tag or (_SEQ if kind is yaml.SequenceNode else _MAP),
                                  [], event.start_mark, None, flow_style=event.flow_style)
                if len(stack) >= MAX_DEPTH:
                    raise _limit(source, event, f"YAML nested more than {MAX_DEPTH} deep; "
                                 "deployment manifests nest far less")
                _attach(stack, collection)
                root = root or collection
                if event.anchor:
                    anchors[event.anchor] = collection
                stack.append((collection, []))
                continue
            elif isinstance(event, yaml.CollectionEndEvent):
                collection, pending = stack.pop()
                collection.end_mark = event.end_mark
                if pending:  # a key without its value: cannot happen in a parsed stream
                    collection.value.append((pending[0], yaml.ScalarNode(_NULL, "")))
                continue
            if node is not None:
                if isinstance(event, yaml.ScalarEvent) and event.anchor:
                    anchors[event.anchor] = node
                _attach(stack, node)
                root = root or node
    except yaml.YAMLError as exc:
        raise _syntax(source, exc) from None
    return documents


def _attach(stack: list[tuple[yaml.Node, list[yaml.Node]]], node: yaml.Node) -> None:
    """Put ``node`` in the collection being built (a mapping takes a key, then its value)."""
    if not stack:
        return
    collection, pending = stack[-1]
    if isinstance(collection, yaml.SequenceNode):
        collection.value.append(node)
    elif pending:
        collection.value.append((pending.pop(), node))
    else:
        pending.append(node)


class Budget:
    """The nodes one file may still visit."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.left = MAX_NODES

    def spend(self, node: yaml.Node) -> None:
        self.left -= 1
        if self.left < 0:
            raise InputError(f"{self.path}:{node.start_mark.line + 1}",
                             f"more than {MAX_NODES:,} YAML nodes to read, counting each use "
                             "of an alias (an alias bomb?); split the file or drop the "
                             "aliases")


def mapping(node: yaml.Node | None) -> bool:
    return isinstance(node, yaml.MappingNode)


def pairs(node: yaml.Node | None, seen: frozenset[int] = frozenset()
          ) -> Iterator[tuple[str, yaml.Node]]:
    """A mapping's entries whose keys are scalars, then those its merge keys (``<<: *x``)
    bring in (the mapping's own come first, so they win)."""
    if not isinstance(node, yaml.MappingNode) or id(node) in seen:
        return
    merged: list[yaml.Node] = []
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode):
            if key.value == "<<" and key.style is None:
                merged += value.value if isinstance(value, yaml.SequenceNode) else [value]
            else:
                yield str(key.value), value
    for other in merged:
        yield from pairs(other, seen | {id(node)})


def get(node: yaml.Node | None, *path: str) -> yaml.Node | None:
    """The node at ``path`` of keys below ``node``, or None."""
    for key in path:
        node = next((value for name, value in pairs(node) if name == key), None)
        if node is None:
            return None
    return node


def scalar(node: yaml.Node | None) -> str | None:
    """A scalar's text as loaded (quotes removed, block scalars folded), else None; a
    YAML null is None."""
    if isinstance(node, yaml.ScalarNode):
        if node.tag == _NULL and node.style is None:
            return None
        return str(node.value)
    return None


def items(node: yaml.Node | None) -> list[yaml.Node]:
    """A sequence's items (a lone scalar reads as a sequence of one)."""
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.ScalarNode) and scalar(node) is not None:
        return [node]
    return []


def region(source: Source, node: yaml.Node) -> Region:
    """Where ``node`` is written in ``source``."""
    return source.region(node.start_mark.index, node.end_mark.index)
