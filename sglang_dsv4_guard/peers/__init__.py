"""The guard around decode peers registering with a prefill rank (NIXL's and Mooncake's;
MORI's beyond its TP rule) and the prefill threads that die of what they registered: the
per-process state and the rules the wrappers share (:mod:`.guard`), each backend's
wrappers (:mod:`.nixl`, :mod:`.mooncake`), the connectors installed (:mod:`.wrapper`), the
registration as two endpoints (:mod:`.snapshot`) and the built-in ``check_registration``
hook (:mod:`.checks`). The codes are listed in ``docs/codes.md``.
"""
