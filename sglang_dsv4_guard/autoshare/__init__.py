"""The one remedy: auto-sharing the draft pool's SWA index mapping (``DSV4G007``).

- :mod:`~sglang_dsv4_guard.autoshare.rule`: when rebinding is provably safe, a pure
  function of a :class:`~sglang_dsv4_guard.state.snapshot.StatePair`;
- :mod:`~sglang_dsv4_guard.autoshare.remedy`: the built-in ``remediate_state`` hook
  that acts on the rule through SGLang's own ``register_mapping``.

Opt-in: ``SGLANG_DSV4_GUARD_AUTOSHARE=1`` or ``install(autoshare=True)``.
"""
