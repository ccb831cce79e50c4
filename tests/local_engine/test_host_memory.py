"""The engine's process keeps freed host memory (local_engine.host_memory): tensors freed
and allocated again, as a CPU decode step does with its temporaries, cost no new page
faults; with glibc's own heuristics each round of them was faulted in again."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from local_engine.host_memory import keep_freed_memory

PROBE = textwrap.dedent("""
    import resource, sys, torch
    from local_engine.host_memory import keep_freed_memory
    if sys.argv[1] == "keep":
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


def faults(mode: str) -> int:
    """Minor page faults of 10 rounds of freed and reallocated temporaries, in a fresh
    process (malloc's settings are per process)."""
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.split()[-1])


def test_freed_temporaries_are_reused_without_page_faults() -> None:
    if not keep_freed_memory():
        pytest.skip("the C library has no mallopt (not glibc)")
    # 10 rounds of 80 MB (20,480 pages): glibc gave it back and faulted it in again each
    # round (20,448 faults seen); kept, at most a one-off growth of the heap (2,560 seen)
    assert faults("plain") > 10_000
    assert faults("keep") < 5_000
