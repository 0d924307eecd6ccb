"""The fixes of ``check``'s findings: flag fixes derived from the two servers' differing
values (``flag_fixes``), and the fixes of a refused launch line, found by re-running the
release's resolution (``refusal``). ``--fix`` proves them (``check/prove.py``).
"""
