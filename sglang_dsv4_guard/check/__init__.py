"""``sglang-dsv4-guard check``: predict a PD deployment's failures from its launch flags.

By concern, each layer importing only those below it:

- ``offline``: SGLang's own parser and resolution, run offline behind walls;
- ``server``: one server derived from its launch line with the release's code;
- ``fixing``: the fixes of the findings, derived from the two servers' values;
- ``rows``: the prefill/decode contract rows, and the pair conditions run on them;
- ``child`` (the one process that imports SGLang, started with the environment
  ``check`` controls), ``predict`` (the whole run), ``prove`` (``--fix``: each fix proven by a re-run) and
  ``text`` (rendering).

The command imports none of SGLang itself; its entry is ``child.answer_in_child``,
reached through ``sglang-dsv4-guard check``; the package itself exports nothing.
"""
