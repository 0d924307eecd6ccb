"""Peak extra memory of comparing two 20M-entry SWA index mappings that differ everywhere.

``tracemalloc`` does not see torch's CPU allocations, so each measurement runs in a fresh
interpreter and reads the kernel's figures: after the mappings are built, the peak
resident set (``VmHWM``) is reset to the current one (``echo 5 > /proc/self/clear_refs``,
Linux), and the extra is ``VmHWM`` after the comparison minus ``VmRSS`` before it. (A bare
``ru_maxrss`` difference is not enough: an earlier import peak can hide the comparison.)
Printed: the guard's chunked comparison (``compare_mappings``, what DSV4G004 runs) and,
for scale, the one-shot ``(a != b).nonzero()`` it replaced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ENTRIES = 20_000_000

PROBE = r"""
import json, sys, types
import torch
from sglang_dsv4_guard.state.snapshot import compare_mappings

n = int(sys.argv[1])
a = torch.arange(n, dtype=torch.int64)
b = a + 1                              # differs everywhere
target = types.SimpleNamespace(full_to_swa_index_mapping=a)
draft = types.SimpleNamespace(full_to_swa_index_mapping=b)
def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")                       # reset the peak RSS to the current RSS
before = status("VmRSS")
if sys.argv[2] == "guard":
    result = compare_mappings(target, draft)
    assert result.differing == n and result.first_difference == (0, 0, 1), result
else:
    diff = (a != b).reshape(-1)
    count = int(diff.sum().item())
    first = int(torch.nonzero(diff)[0].item())
    del diff
after = status("VmHWM")
print(json.dumps({"extra_bytes": after - before, "mapping_bytes": a.numel() * 8}))
"""


def measure(method: str, entries: int = ENTRIES) -> dict[str, int]:
    """Run the probe in a fresh interpreter; its extra peak RSS and one mapping's size."""
    done = subprocess.run([sys.executable, "-c", PROBE, str(entries), method],
                          capture_output=True, text=True, check=True, env=os.environ.copy())
    result: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    for method, label in (("guard", "guard's chunked comparison"),
                          ("naive", "one-shot (a != b).nonzero(), for scale")):
        m = measure(method)
        mb, mapping = m["extra_bytes"] / 2**20, m["mapping_bytes"] / 2**20
        print(f"mapping comparison, {ENTRIES:,} int64 entries all differing, {label}: "
              f"peak +{mb:.1f} MiB ({mb / mapping:.3f} of one {mapping:.0f} MiB mapping)")


if __name__ == "__main__":
    main()
