"""The guard around ``sglang.srt.disaggregation.utils.setup_state_kv_args``.

Wraps SGLang's ``setup_state_kv_args`` (and the stale ``from ... import`` bindings of it
in ``sglang.srt.disaggregation.prefill`` and ``.decode``). Codes: those of :mod:`.checks`.

- :mod:`~sglang_dsv4_guard.state.snapshot`: plain values read from the target and
  draft pools (the only module here that touches SGLang objects);
- :mod:`~sglang_dsv4_guard.state.provenance`: which line registered each pool's mapping
  (SGLang's ``register_mapping`` observed once the guard is installed);
- :mod:`~sglang_dsv4_guard.state.checks`: the built-in ``check_state`` hook, pure;
- :mod:`~sglang_dsv4_guard.state.pool_fixes`: the checks' fixes, derived per differing field
  on the installed release;
- :mod:`~sglang_dsv4_guard.state.sharing`: the auto-share rule the checks and the
  remedy (:mod:`sglang_dsv4_guard.autoshare`) both follow, pure;
- :mod:`~sglang_dsv4_guard.state.wrapper`: the wrapper that runs SGLang's function once,
  then the hooks, and reports.

Importing this package imports neither sglang nor torch.
"""
