"""The engine's process keeps freed host memory (local_engine.host_memory): tensors freed
and allocated again, as a CPU decode step does with its temporaries, cost no new page
faults. (With glibc's own heuristics the same probe usually faulted every round in again,
20,480-23,008 faults, but not always: where freed blocks land decides whether the heap's
top is trimmed, so that case cannot be asserted.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from local_engine.host_memory import keep_freed_memory

PROBE = textwrap.dedent("""
    import resource, torch
    from local_engine.host_memory import keep_freed_memory
    torch.set_num_threads(1)
    keep_freed_memory()
    def churn():  # a step's temporaries: 8 of 10 MB, all freed at its end
        xs = [torch.ones(10 * 2**20 // 4) for _ in range(8)]
        del xs
    churn(); churn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        churn()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def test_freed_temporaries_are_reused_without_page_faults() -> None:
    if not keep_freed_memory():
        pytest.skip("the C library has no mallopt (not glibc)")
    # a fresh process: malloc's settings are per process
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True)
    # kept: at most a one-off growth of the heap (0 or 2,560 faults seen)
    assert int(out.stdout.split()[-1]) < 5_000
