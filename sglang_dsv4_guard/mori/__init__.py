"""The guard around SGLang's MORI connector (``sglang.srt.disaggregation.mori.conn``).

Wraps ``MoriKVManager._send_swa_dsa_state`` (per request) and
``MoriKVManager._add_remote_peer`` (once per decode peer), lazily, the moment SGLang
imports the connector. Code: :data:`.checks.CODE`. The registration's other conditions (DCP
relayout, then the pair conditions of :mod:`sglang_dsv4_guard.pd.conditions`) are checked
by the peer guard (:mod:`sglang_dsv4_guard.peers`), which the composition root hands to
:class:`~sglang_dsv4_guard.mori.wrapper.MoriGuard` as a callable (``peers`` imports
``mori``, never the reverse).

- :mod:`~sglang_dsv4_guard.mori.snapshot`: plain values read from the manager and peer;
- :mod:`~sglang_dsv4_guard.mori.checks`: the built-in ``check_send`` hook, pure;
- :mod:`~sglang_dsv4_guard.mori.wrapper`: both wrappers and the per-process MORI state.

Nothing here imports ``mori`` (AMD's C library) or SGLang's connector module.
"""
