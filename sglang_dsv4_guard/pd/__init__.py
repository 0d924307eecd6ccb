"""The prefill/decode contract: what SGLang compares between the two servers, and when.

Each module runs one of SGLang's own comparisons (or, where the comparison sits inside a
transfer thread, its digested condition) on two :class:`~.endpoint.Endpoint` values, one
per server, and returns findings that say when SGLang would find the problem and what the
operator would see. ``check`` builds the endpoints from two launch lines
(:mod:`sglang_dsv4_guard.check.server.endpoint_values`); the run-time wrappers build them from the live
managers.
"""
