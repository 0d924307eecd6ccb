"""``sglang-dsv4-guard check``: predict a PD deployment's failures from its launch flags.

Its modules, layer by layer: ``tools/imports.py``'s ``LAYERS`` and the map in
docs/contributing.md. The command imports none of SGLang itself: its entry,
``child.answer_in_child``, runs the check in a child process (the only one that imports
SGLang); the package itself exports nothing.
"""
