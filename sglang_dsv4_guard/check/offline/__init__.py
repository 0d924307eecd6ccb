"""SGLang run offline for ``check``: the release's own parser and resolution behind the child
process's walls (``check/child.py``), and what SGLang says and probes meanwhile (each
module says what it holds; the map is in docs/contributing.md)."""
