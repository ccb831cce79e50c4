"""A process under valgrind's callgrind, counted between two points of its life, and what
its dumps say (for ``instructions.py``).

The process starts uninstrumented (``--instr-atstart=no``: valgrind runs it several times
slower, not ~50x); ``callgrind_control`` switches instrumentation on and off, zeroes the
counters and dumps them (``NAME.callgrind.1``, ``.2``...), each dump's ``totals:`` line the
Ir (instructions executed) since the last zero, over all the process's threads. Source: the
Callgrind manual, https://valgrind.org/docs/manual/cl-manual.html, and its format,
https://valgrind.org/docs/manual/cl-format.html.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from processes import wait_ready

__all__ = ["Counted", "ready", "self_costs", "totals"]


class Counted:
    """One process under callgrind (instrumentation off until :meth:`instrument`)."""

    def __init__(self, name: str, command: list[str], workdir: Path, source: Path,
                 env: dict[str, str]) -> None:
        """Start ``command`` in ``source`` with ``source`` first on the import path and
        ``env`` added to the environment; its files are ``workdir``'s ``name.*``."""
        self.name = name
        self.out = workdir / f"{name}.callgrind"
        self.dumps = 0
        env = {**os.environ, **env, "PYTHONPATH": str(source)}
        # The output to files (the gateway's request log: writes cost the same as to
        # /dev/null in user space, the only space counted), the child holds them open.
        with (workdir / f"{name}.stdout").open("wb") as out, \
                (workdir / f"{name}.stderr").open("wb") as err:
            self.proc = subprocess.Popen(
                ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                 f"--callgrind-out-file={self.out}", f"--log-file={workdir / name}.valgrind",
                 *command], cwd=source, env=env, stdout=out, stderr=err)
        self.log = workdir / f"{name}.stderr"

    def control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True,
                       capture_output=True)

    def instrument(self, on: bool) -> None:
        self.control(f"--instr={'on' if on else 'off'}")

    def zero(self) -> None:
        self.control("--zero")

    def dump(self) -> Path:
        """Dump the counts since the last zero; the dump's file once fully written."""
        self.control("--dump")
        self.dumps += 1
        path = self.out.with_name(f"{self.out.name}.{self.dumps}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if path.exists() and b"\ntotals:" in path.read_bytes()[-4096:]:
                return path
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: callgrind wrote no {path.name}")

    async def settle(self, quiet_s: float = 2.0, timeout_s: float = 900.0) -> None:
        """Wait until the process uses (almost) no CPU for ``quiet_s`` (s)."""
        stat = Path(f"/proc/{self.proc.pid}/stat")

        def cpu_ticks() -> int:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime

        deadline, quiet, last = time.monotonic() + timeout_s, 0.0, cpu_ticks()
        while quiet < quiet_s:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not settle in {timeout_s} s")
            await asyncio.sleep(0.5)
            now = cpu_ticks()
            quiet = quiet + 0.5 if now - last <= 2 else 0.0
            last = now


def totals(path: Path) -> int:
    """The dump's total Ir (callgrind's ``totals:`` line: the sum over its functions)."""
    for line in reversed(path.read_text().splitlines()):
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def self_costs(path: Path, per: int, top: int) -> dict[str, Any]:
    """The ``top`` functions by self cost and the ten costliest shared objects, in Ir per
    ``per`` (requests or seconds), read from the callgrind dump: a function's self cost is
    its cost lines but those after a ``calls=`` line (a callee's inclusive cost); recursion
    levels (``f'2``) and inlined files are merged into the function."""
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    functions: Counter[str] = Counter()
    objects: Counter[str] = Counter()
    obj = fn = ""
    after_call = False
    with path.open() as dump:
        for line in dump:
            if line[0].isdigit() or line[0] in "+-*":  # "position cost"
                fields = line.split()
                if after_call:
                    after_call = False
                elif len(fields) > 1:
                    functions[f"{fn} [{obj}]"] += int(fields[1])
                    objects[obj] += int(fields[1])
                continue
            key, _, value = line.rstrip("\n").partition("=")
            if key in ("ob", "fn", "cob", "cfn"):  # "(id) name", later "(id)" alone
                space = names[key[-2:]]
                ref, _, name = value.partition(" ")
                if name:
                    space[ref] = name
                if key == "ob":
                    obj = Path(space.get(ref, ref)).name
                elif key == "fn":
                    fn = re.sub(r"'\d+$", "", space.get(ref, ref))
            elif key == "calls":
                after_call = True
    return {"functions": [{"ir": c // per, "function": f}
                          for f, c in functions.most_common(top)],
            "by_object": {o: c // per for o, c in objects.most_common(10)}}


async def ready(counted: Counted, url: str, post: Any = None,
                headers: dict[str, str] | None = None) -> None:
    """Wait until the process answers ``url`` (GET, or POST of ``post``) or exits."""
    waiter = asyncio.ensure_future(wait_ready(url, timeout=600, post=post, headers=headers))
    while not waiter.done():
        if counted.proc.poll() is not None:
            waiter.cancel()
            raise RuntimeError(f"{counted.name} exited {counted.proc.returncode}:\n"
                               f"{counted.log.read_text()[-3000:]}")
        await asyncio.sleep(0.2)
    await waiter
