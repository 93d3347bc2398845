"""Disjoint sets of CPU cores, one per server, for benchmarks that serve several
configurations on one machine at once.

sglang's scheduler busy-polls while idle, so every idle server keeps a CPU busy, and the
operating system may place a measured server's scheduler beside it or beside the benchmark
client. With ``--pin-cpus`` every server gets whole physical cores (SMT siblings together) of
its own and the client the rest. What it does not remove: on the one-H200 machine (16 cores,
one thread per core, 2026-12-03) the host time of the same 512-token target extend varied
between about 17 and 31 ms for stretches of seconds in either of two servers up at once, and
runs pinned this way still varied as much (median TTFT of one server's 1-request runs 33-51 ms).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

TOPOLOGY = "/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"


def parse_cpu_list(text: str) -> list[int]:
    """Linux's CPU list format: '0-3,8,10-11'."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def physical_cores(cpus: list[int],
                   siblings_of: Optional[Callable[[int], list[int]]] = None) -> list[list[int]]:
    """The allowed CPUs grouped by physical core (SMT siblings together), in CPU order."""
    siblings_of = siblings_of or _siblings_from_sysfs
    allowed = set(cpus)
    cores: list[list[int]] = []
    seen: set[int] = set()
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        core = sorted(sibling for sibling in siblings_of(cpu) if sibling in allowed) or [cpu]
        seen.update(core)
        cores.append(core)
    return cores


def _siblings_from_sysfs(cpu: int) -> list[int]:
    path = Path(TOPOLOGY.format(cpu=cpu))
    return parse_cpu_list(path.read_text()) if path.exists() else [cpu]


def split_cores(cores: list[list[int]], servers: int) -> tuple[list[set[int]], set[int]]:
    """Equal whole-core sets, one per server, and the rest (at least one core) for the client.
    Raises ValueError when there are fewer cores than servers + 1."""
    per_server = (len(cores) - 1) // servers
    if per_server < 1:
        raise ValueError(f"{len(cores)} physical cores cannot give {servers} servers a core each "
                         "and the client one")
    sets = [set().union(*cores[i * per_server:(i + 1) * per_server]) for i in range(servers)]
    return sets, set().union(*cores[servers * per_server:])


def cpu_sets(servers: int) -> tuple[list[set[int]], set[int]]:
    """This process's allowed CPUs split into per-server core sets and the client's set."""
    return split_cores(physical_cores(sorted(os.sched_getaffinity(0))), servers)
