"""Where a benchmarked command's CPU went (issue 17 §6): the whole machine's busy time (/proc/stat), the lab's hosts'
(the cgroups the lab recorded for each host, lab/labctl/state.py HostRecord.cgroups: the cgroup v2 one's
`cpu.stat`), and the controller's (the command and every
process it waited for: ansible-playbook, its workers, ssh; `getrusage(RUSAGE_CHILDREN)`).

The lab's hosts share this machine's CPUs with the controller, so a fleet of N nodes does N nodes' work on the
same cores; whether a run was bound by CPU shows in its busy share, and whether a node's own work grows with N in
its CPU seconds per node. pytest puts bench/ on sys.path (rootdir-relative imports, no package).
"""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional, Sequence

IDLE_FIELDS = (3, 4)  # idle, iowait of the `cpu` line (proc(5))


def busy_seconds(stat_line: str, ticks_per_second: int) -> float:
    """CPU seconds spent on anything but idle and iowait, from /proc/stat's first (`cpu`) line."""
    name, *values = stat_line.split()
    if name != "cpu" or len(values) < 5:
        raise ValueError(f"not the aggregate cpu line of /proc/stat: {stat_line!r}")
    numbers = [int(v) for v in values[:8]]  # guest and guest_nice are already counted in user and nice
    return sum(n for i, n in enumerate(numbers) if i not in IDLE_FIELDS) / ticks_per_second


def cgroup_usage(cpu_stat: str) -> float:
    """Seconds of `usage_usec` in a cgroup v2 `cpu.stat`."""
    for line in cpu_stat.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    raise ValueError("cpu.stat has no usage_usec line")


@dataclass
class Sample:
    busy: float
    controller: float
    hosts: Dict[str, float] = field(default_factory=dict)


def sample(host_cgroups: Mapping[str, Sequence[str]]) -> Sample:
    """Now: the machine's busy seconds, the controller's (children's) seconds, and each lab host's, from the first
    of its cgroups that has a `cpu.stat` (only cgroup v2 keeps one; the name=systemd hierarchy does not)."""
    with open("/proc/stat") as handle:
        busy = busy_seconds(handle.readline(), os.sysconf("SC_CLK_TCK"))
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    hosts = {}
    for host, cgroups in host_cgroups.items():
        for cgroup in cgroups:
            try:
                hosts[host] = cgroup_usage((Path(cgroup) / "cpu.stat").read_text())
                break
            except (OSError, ValueError):
                continue  # not the cgroup v2 one, or the host stopped
    return Sample(busy, children.ru_utime + children.ru_stime, hosts)


@dataclass
class Use:
    wall: float
    cpus: int
    busy: float
    controller: float
    hosts: Dict[str, float]

    def share(self, names: Iterable[str]) -> float:
        return sum(self.hosts.get(name, 0.0) for name in names)

    def summary(self, gpu_nodes: Iterable[str]) -> str:
        nodes = list(gpu_nodes)
        on_nodes = self.share(nodes)
        others = sum(self.hosts.values()) - on_nodes
        measured = self.controller + sum(self.hosts.values())
        offered = self.cpus * self.wall
        return (f"CPU {self.busy:.0f} s busy of {offered:.0f} ({100 * self.busy / offered:.0f} % of {self.cpus} "
                f"CPUs): controller {self.controller:.0f} s, GPU nodes {on_nodes:.0f} s "
                f"({on_nodes / max(1, len(nodes)):.0f} s per node), other lab hosts {others:.0f} s, "
                f"rest {max(0.0, self.busy - measured):.0f} s")


def use(before: Sample, after: Sample, wall: float, cpus: Optional[int] = None) -> Use:
    # A machine that restarted in between counts from zero again: its usage now is all of it
    hosts = {}
    for name, now in after.hosts.items():
        then = before.hosts.get(name, 0.0)
        hosts[name] = now - then if now >= then else now
    return Use(wall, cpus or os.cpu_count() or 1, after.busy - before.busy, after.controller - before.controller,
               hosts)
