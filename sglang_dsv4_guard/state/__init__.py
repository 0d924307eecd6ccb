"""The guard around ``sglang.srt.disaggregation.utils.setup_state_kv_args``: the wrapper
(:mod:`.wrapper`), the pools' snapshot (:mod:`.snapshot`, :mod:`.tensors`,
:mod:`.provenance`, :mod:`.cuda_graphs`), the built-in ``check_state`` hook (:mod:`.checks`)
with its fixes (:mod:`.pool_fixes`), and the auto-share rule (:mod:`.sharing`).

Importing this package imports neither sglang nor torch.
"""
