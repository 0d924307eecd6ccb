"""The guard around SGLang's MORI connector (``sglang.srt.disaggregation.mori.conn``):
the wrappers of ``MoriKVManager._send_swa_dsa_state`` and ``_add_remote_peer`` and the
per-process MORI state (:mod:`.wrapper`), the plain values they read (:mod:`.snapshot`)
and the built-in ``check_send`` hook, pure (:mod:`.checks`, its code).
"""
