"""CPU lists, and the planner's CPU/NUMA pinning of a replica as the unit applies it on this host."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from ansible.module_utils.revive_record import ReleaseError
from ansible.module_utils.revive_topology import CpuListError, format_cpu_list
from ansible.module_utils.revive_topology import parse_cpu_list as topology_cpu_list


def parse_cpu_list(text: Optional[str]) -> List[int]:
    """revive_topology.parse_cpu_list (the one CPU-list parser), its error as this package's ReleaseError."""
    try:
        return topology_cpu_list(text)
    except CpuListError as exc:
        raise ReleaseError(str(exc)) from None


@dataclass(frozen=True)
class Pinning:
    cpu_affinity: Optional[str]
    numa_node: Optional[int]
    note: Optional[str]


def host_pinning(replica: Dict[str, Any], online_cpus: Sequence[int], numa_nodes: Sequence[int], simulated: bool,
                 host: str) -> Pinning:
    """The planner's CPU/NUMA pinning of a replica, as the unit applies it on this host.

    On real GPUs the plan's CPUs and NUMA node come from NVML on this very host, so they must exist; a
    mismatch means the plan is for another machine and is refused. On the lab's simulated GPUs the plan
    describes the simulated server, not the host that runs the twin: the pinning is recorded in the unit
    as a comment and not applied (it would name CPUs and nodes the host does not have).
    """
    planned = [int(c) for c in replica.get("cpus") or []]
    numa = replica.get("numa_node")
    if not planned:
        return Pinning(None, None, None)
    planned_text = format_cpu_list(planned)
    if simulated:
        return Pinning(None, None, f"planned CPUs {planned_text}, NUMA node {numa}: not applied, the GPUs are "
                                   "simulated and this host is not the planned server")
    missing = sorted(set(planned) - set(online_cpus))
    if missing:
        raise ReleaseError(f"{replica.get('name')}: the plan pins CPUs {planned_text} but {host} has no online CPUs "
                           f"{format_cpu_list(missing)} (online: {format_cpu_list(online_cpus) or 'none'}); the plan "
                           "is for other hardware: run the preflight (probe and plan) on this host again")
    if numa is not None and int(numa) not in set(numa_nodes):
        raise ReleaseError(f"{replica.get('name')}: the plan binds memory to NUMA node {numa} but {host} has nodes "
                           f"{format_cpu_list(numa_nodes) or 'none'}; run the preflight on this host again")
    return Pinning(planned_text, None if numa is None else int(numa), None)

