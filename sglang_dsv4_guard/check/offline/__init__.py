"""SGLang run offline for ``check``: the release's own flag parser and resolution
(``parse``), behind the child process's walls (``sandbox``), hearing what SGLang says
(``chatter``), answering its device probes as a GPU model (``probes``), telling a refusal
this machine caused from one the flags caused (``causes``), and finding a checkpoint's
remote code (``remote_code``). The child process itself is ``check/child.py``.
"""
