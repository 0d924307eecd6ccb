"""``sglang-dsv4-guard check``: predict a PD deployment's failures from its launch flags.

By concern, each layer importing only those below it (``tools/imports.py``): the
sub-packages ``offline``, ``server``, ``fixing`` and ``rows`` (each says what it holds),
then ``child`` (the one process that imports SGLang, started with the environment
``check`` controls), ``predict`` (the whole run), ``prove`` (``--fix``: each fix proven by
a re-run) and ``text`` (rendering).

The command imports none of SGLang itself; its entry is ``child.answer_in_child``,
reached through ``sglang-dsv4-guard check``; the package itself exports nothing.
"""
