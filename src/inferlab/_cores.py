"""How many cores this process may run on: what ``--workers`` and the client-bottleneck
advice count, rather than ``os.cpu_count()``, the machine's, which ``taskset``, a
container's cpuset and its CPU quota all leave out."""

from __future__ import annotations

import math
import os

#: cgroup v2's CPU quota of this process's group ("max 100000": none; "200000 100000":
#: two cores' worth of time per period).
CPU_MAX = "/sys/fs/cgroup/cpu.max"


def usable_cores(cpu_max: str = CPU_MAX) -> int:
    """The cores this process may run on: its CPU affinity (``sched_getaffinity``, where
    the platform has it, else ``os.cpu_count()``), bounded by the cgroup's ``cpu.max``
    quota where one is set (rounded up: 1.5 cores' worth is 2 cores to spread over). At
    least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_quota(cpu_max)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def cgroup_quota(path: str = CPU_MAX) -> float | None:
    """The cores' worth of CPU time the cgroup's ``cpu.max`` at ``path`` allows; None where
    there is no such file (cgroup v1, another OS), no quota ("max") or it cannot be read."""
    try:
        with open(path) as f:
            fields = f.read().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None
