"""The guard around decode peers registering with a Mooncake or NIXL prefill rank
(``NixlKVManager._add_remote_peer``; Mooncake's registration, parsed and written by a
closure of ``start_prefill_thread``), and the prefill threads that die of what they
registered (NIXL's and Mooncake's bootstrap threads, Mooncake's ``transfer_worker``),
lazily, the moment SGLang imports the connector; and MORI's registration beyond its TP
rule (called by :mod:`sglang_dsv4_guard.mori.wrapper` through
:func:`.wrapper.mori_registration`, wired by the composition root). Its findings are
the registration hook's (:mod:`.checks`: what only a registration shows) and the pair
conditions' (:mod:`sglang_dsv4_guard.pd.conditions`, which ``check`` runs too); the codes
are listed in ``docs/codes.md``.

- :mod:`~sglang_dsv4_guard.peers.snapshot`: the registration as two endpoints;
- :mod:`~sglang_dsv4_guard.peers.checks`: the built-in ``check_registration`` hook, on the
  conditions of :mod:`sglang_dsv4_guard.pd`;
- :mod:`~sglang_dsv4_guard.peers.guard`: the per-process state and the rules the wrappers share;
- :mod:`~sglang_dsv4_guard.peers.nixl`, :mod:`~sglang_dsv4_guard.peers.mooncake`: each
  backend's wrappers; :mod:`~sglang_dsv4_guard.peers.wrapper`: the connectors installed.

Nothing here imports ``nixl``, ``mooncake`` or SGLang's connector modules.
"""
