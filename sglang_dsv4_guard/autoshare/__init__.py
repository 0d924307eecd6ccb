"""The one remedy: auto-sharing the draft pool's SWA index mapping (:mod:`.rebind`), on
the rule of :mod:`sglang_dsv4_guard.state.sharing`. Opt-in: ``SGLANG_DSV4_GUARD_AUTOSHARE=1``
or ``install(autoshare=True)``.
"""
