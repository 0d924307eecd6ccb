"""The guard around decode's first contact with a prefill
(``sglang.srt.disaggregation.common.conn.CommonKVManager.try_ensure_parallel_info``).

Wrapped lazily, the moment SGLang imports the common connector module. The pass path
(fetched, not ready) is one ``try``; the cached one SGLang's own first statement where its
digest is a known release's; when SGLang raises its first mismatch, the
report names every one, with ``check``'s codes (:mod:`sglang_dsv4_guard.pd.first_contact`).

- :mod:`~sglang_dsv4_guard.contact.snapshot`: both servers' values (the decode's live
  manager, the prefill's ``PrefillServerInfo`` from SGLang's frame);
- :mod:`~sglang_dsv4_guard.contact.checks`: the built-in ``check_first_contact`` hook, on
  ``check``'s runner (:mod:`sglang_dsv4_guard.pd.first_contact`), and its fixes;
- :mod:`~sglang_dsv4_guard.contact.cached`: whether the wrapper may answer the cached case;
- :mod:`~sglang_dsv4_guard.contact.wrapper`: the wrapper and how the report travels.
"""
