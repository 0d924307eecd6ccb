"""Put first on ``PYTHONPATH`` by ``tools/matrix.py`` for the traced run of the base
release only: every interpreter a test starts records the functions it runs for that
test (``tools/trace_drives.py``). Outside that run this directory is on no path."""

import os
import sys

if os.environ.get("DSV4_GUARD_DRIVES_TEST"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        from trace_drives import start_child
    finally:
        del sys.path[0]
    start_child()
