"""The guard around decode peers registering with a Mooncake or NIXL prefill rank
(``NixlKVManager._add_remote_peer``; Mooncake's registration, parsed and written by a
closure of ``start_prefill_thread``), and the prefill threads that die of what they
registered (NIXL's and Mooncake's bootstrap threads, Mooncake's ``transfer_worker``),
lazily, the moment SGLang imports the connector; and MORI's registration beyond its TP
rule (called by :mod:`sglang_dsv4_guard.mori.wrapper` through
:func:`.wrapper.mori_registration`, wired by the composition root). Codes: DSV4G036,
DSV4G040 - 043, DSV4G045, DSV4G046, the ones ``check`` gives for the same conditions;
DSV4G050 (Mooncake's state layout), DSV4G055 - 057 (NIXL's prepared state, MORI's
state transfer) and DSV4G058 (NIXL's and MORI's replicated Mamba state), which ``check``
cannot predict from launch lines.

- :mod:`~sglang_dsv4_guard.peers.snapshot`: the registration as two endpoints;
- :mod:`~sglang_dsv4_guard.peers.checks`: the built-in ``check_registration`` hook, on the
  conditions of :mod:`sglang_dsv4_guard.pd`;
- :mod:`~sglang_dsv4_guard.peers.guard`: the per-process state and the rules the wrappers share;
- :mod:`~sglang_dsv4_guard.peers.nixl`, :mod:`~sglang_dsv4_guard.peers.mooncake`: each
  backend's wrappers; :mod:`~sglang_dsv4_guard.peers.wrapper`: the connectors installed.

Nothing here imports ``nixl``, ``mooncake`` or SGLang's connector modules.
"""
