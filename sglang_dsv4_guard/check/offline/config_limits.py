"""The ``config.json`` values ``check`` refuses before SGLang reads them.

``check`` builds each server's miniature KV pools with SGLang's own constructors, one
layer for each layer the config declares (:mod:`..server.pools`, on the meta device:
no tensor memory, but Python objects and time per layer). A layer count far beyond any
released model's would only measure this machine; the limits below keep every check of
any ``config.json`` bounded (docs/check.md states the memory and time). The file is read
here only as JSON; a value that is not a number is left to SGLang's own reading, which
reports it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_CONFIG_BYTES", "MAX_LAYERS", "config_limit_error"]

#: The largest released DeepSeek model (V3, R1, V4) has 61 layers and one MTP layer;
#: other released models stay under 200. 4,096 leaves a wide margin for models to come.
MAX_LAYERS = 4096
#: Released configs are a few KiB (a quantization config listing modules, some hundred).
MAX_CONFIG_BYTES = 4 * 2**20

# The keys that count layers, each bounded by MAX_LAYERS ("compress_ratios": one entry
# per layer, MTP layers included, so twice the limit).
_LAYER_KEYS = ("num_hidden_layers", "num_nextn_predict_layers")
_PER_LAYER_LISTS = ("compress_ratios",)
_WHY = "the largest released DeepSeek model has 61 layers and one MTP layer"


def config_limit_error(path: str) -> str | None:
    """The one-line reason ``path``/config.json is refused, or ``None``: a file over
    :data:`MAX_CONFIG_BYTES`, or a layer count over :data:`MAX_LAYERS` (at the top level
    or in a nested config such as ``text_config``), or a file that is not a JSON object."""
    file = os.path.join(path, "config.json")
    try:
        size = os.path.getsize(file)
    except OSError:
        return None  # unreadable: SGLang's own reading says why
    if size > MAX_CONFIG_BYTES:
        return (f"{file}: {size:,} bytes; at most {MAX_CONFIG_BYTES:,} are read (released "
                "configs are a few KiB)")
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None  # SGLang's own reading reports it
    if not isinstance(config, dict):
        return (f"{file}: holds a JSON {type(config).__name__}; a model's config.json is a "
                "JSON object of its settings")
    for prefix, values in _configs("", config, 0):
        found = _over(values)
        if found is not None:
            return f"{file}: {prefix}{found}"
    return None


# How deep nested configs are read (``text_config``, a wrapper's ``llm_config.text_config``).
_DEPTH = 4


def _configs(prefix: str, config: Mapping[str, Any], depth: int
             ) -> list[tuple[str, Mapping[str, Any]]]:
    """``config`` and every config nested in it (at most :data:`_DEPTH` deep), each with
    its dotted prefix."""
    found = [(prefix, config)]
    if depth < _DEPTH:
        for key, value in config.items():
            if isinstance(value, dict):
                found += _configs(f"{prefix}{key}.", value, depth + 1)
    return found


def _over(values: Mapping[str, Any]) -> str | None:
    for key in _LAYER_KEYS:
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_LAYERS:
            return f"{key} must be at most {MAX_LAYERS:,} (got {value:,}): {_WHY}"
    for key in _PER_LAYER_LISTS:
        value = values.get(key)
        if isinstance(value, list) and len(value) > 2 * MAX_LAYERS:
            return (f"{key} has {len(value):,} entries; at most {2 * MAX_LAYERS:,} (one per "
                    f"layer, MTP layers included): {_WHY}")
    return None
