"""The code files a checkpoint's ``auto_map`` names next to its config.json.

A config.json copied alone from a checkpoint whose code sits beside it (DeepSeek's
``"AutoConfig": "configuration_deepseek.DeepseekV3Config"``) cannot be read with
``--trust-remote-code`` on this machine; ``check`` then reads it, in resolution and in
``ModelConfig``, with the release's class for its ``model_type``, and says so.
"""

from __future__ import annotations

import json
import os

__all__ = ["missing_code"]


def missing_code(path: str) -> tuple[str, ...]:
    """The code files ``auto_map`` in ``path``/config.json names next to it that are not there."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            auto_map = json.load(f).get("auto_map")
    except (OSError, ValueError, AttributeError):
        return ()
    if not isinstance(auto_map, dict):
        return ()
    names = [ref for value in auto_map.values()
             for ref in (value if isinstance(value, list) else [value])
             if isinstance(ref, str) and "--" not in ref and "." in ref]
    files = sorted({ref.rsplit(".", 1)[0].replace(".", os.sep) + ".py" for ref in names})
    return tuple(name for name in files if not os.path.isfile(os.path.join(path, name)))
