"""``sglang-dsv4-guard check``: predict a PD deployment's failures from its launch flags.

``parse`` (the release's own flag parser and resolution, as the servers' device),
``derive`` (its ``ModelConfig`` and attention-TP function), ``pools`` (miniature real
pools and SGLang's real state check), ``asymmetry`` (prefill/decode differences),
``predict`` (the whole run), ``text`` (rendering), ``child`` (the one process that
imports SGLang, started with the environment ``check`` controls) and ``sandbox`` (that
child's walls: no network, no writes). The command imports none of SGLang itself; its
entry is ``child.answer_in_child``, reached through ``sglang-dsv4-guard check``; the
package itself exports nothing.
"""
