"""The guard around decode's first contact with a prefill
(``sglang.srt.disaggregation.common.conn.CommonKVManager.try_ensure_parallel_info``): the
wrapper and what rises (:mod:`.wrapper`), when it answers the cached call itself
(:mod:`.cached`), both servers' values (:mod:`.snapshot`) and the built-in
``check_first_contact`` hook on ``check``'s runner (:mod:`.checks`).
"""
