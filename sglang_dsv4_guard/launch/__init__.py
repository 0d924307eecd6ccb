"""``sglang-dsv4-guard check``: predict a PD deployment's failures from its launch flags.

``parse`` (the release's own flag parser), ``derive`` (its ``ModelConfig`` and
attention-TP function), ``pools`` (miniature real pools and SGLang's real state check),
``asymmetry`` (prefill/decode differences), ``predict`` (the whole run), ``text``
(rendering). Imports sglang only when a check runs. Its entry point is
``predict.run_check``, reached through ``sglang-dsv4-guard check``; the package itself
exports nothing.
"""
