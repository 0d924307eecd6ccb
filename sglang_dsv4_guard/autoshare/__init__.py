"""The one remedy: auto-sharing the draft pool's SWA index mapping (:mod:`.rebind`).

- :mod:`~sglang_dsv4_guard.state.sharing`: when rebinding is provably safe, a pure
  function of a :class:`~sglang_dsv4_guard.state.snapshot.StatePair` (it lives with the
  state checks, since the shared-mapping check uses the same decision to offer the switch);
- :mod:`~sglang_dsv4_guard.autoshare.rebind`: the built-in ``remediate_state`` hook
  that acts on the rule through SGLang's own ``register_mapping``.

Opt-in: ``SGLANG_DSV4_GUARD_AUTOSHARE=1`` or ``install(autoshare=True)``.
"""
