"""Serving groups (issue 16): the GPU nodes that serve one model together, declared in the inventory by setting
`revive_serving_group: <name>` on each member. The planner plans a group from its members' probes (the GPU facts
of module_utils/revive_nvml.py and the Python the release's venv gets); the members must be identical where vLLM
and Ray need them to be (docs/facts/multi-node.md §1.3):

* the same GPUs - count, model name, memory, compute capability: one plan's TP size, KV sizing and flags serve
  every stage;
* the same driver version: the release's kernels and NCCL run on every node;
* the same Python version, patch included: Ray refuses to join nodes whose Python differs in the patch version.

`check_group` names every member that differs from the others (the value most members share; on a tie, the first
member's, in name order) and what it has, in one message, so the operator fixes them all at once.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

# What must match, in the order the message lists it: (key, what it is called).
FIELDS: Tuple[Tuple[str, str], ...] = (
    ("gpu_count", "GPU count"),
    ("gpu_name", "GPU model"),
    ("gpu_memory_bytes", "GPU memory"),
    ("compute_capability", "compute capability"),
    ("driver_version", "NVIDIA driver"),
    ("python_version", "Python (patch version included; Ray refuses a mismatch)"),
)


class GroupRefusal(ValueError):
    """A serving group that cannot be planned as one; the message says which members, what differs, how to fix."""


def groups_of(settings: Mapping[str, Mapping[str, Any]]) -> Dict[str, List[str]]:
    """{group name: its member hosts, sorted} from each host's revive_serving_group (hosts without it serve alone)."""
    groups: Dict[str, List[str]] = {}
    for host in sorted(settings):
        name = settings[host].get("revive_serving_group")
        if name in (None, ""):
            continue
        if not isinstance(name, str):
            raise GroupRefusal(f"{host}: revive_serving_group is {name!r}; it must be a group name (a string), e.g. "
                               "mixtral-a. Fix it in the host's or its group's vars")
        groups.setdefault(name, []).append(host)
    return groups


def signature(gpu_facts: Mapping[str, Any], python_version: Optional[str]) -> Dict[str, Any]:
    """What must match across the group, from one member's GPU facts and its Python version (x.y.z)."""
    devices: Sequence[Mapping[str, Any]] = gpu_facts.get("devices") or []
    names = sorted({str(d.get("name")) for d in devices})
    memories = sorted({int((d.get("memory") or {}).get("total_bytes") or 0) for d in devices})
    ccs = sorted({str(d.get("compute_capability")) for d in devices})
    return {
        "gpu_count": len(devices),
        "gpu_name": names[0] if len(names) == 1 else " + ".join(names) or "none",
        "gpu_memory_bytes": memories[0] if len(memories) == 1 else tuple(memories),
        "compute_capability": ccs[0] if len(ccs) == 1 else " + ".join(ccs) or "none",
        "driver_version": str(gpu_facts.get("driver_version") or "unknown"),
        "python_version": str(python_version or "unknown"),
    }


def _shown(key: str, value: Any) -> str:
    if key == "gpu_memory_bytes":
        values = value if isinstance(value, tuple) else (value,)
        return " + ".join(f"{v / 2 ** 30:.1f} GiB" for v in values)
    return str(value)


def check_group(name: str, members: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """The group's common signature; `members` maps each host to {"gpu": GPU facts, "python_version": "3.11.2"}.
    Raises GroupRefusal naming every member that differs, and how."""
    if not members:
        raise GroupRefusal(f"serving group {name!r} has no member: set revive_serving_group: {name} on its nodes")
    hosts = sorted(members)
    signatures = {host: signature(members[host].get("gpu") or {}, members[host].get("python_version"))
                  for host in hosts}
    problems: List[str] = []
    common: Dict[str, Any] = {}
    for key, label in FIELDS:
        counts = Counter(signatures[host][key] for host in hosts)
        top = max(counts.values())
        wanted = next(signatures[host][key] for host in hosts if counts[signatures[host][key]] == top)
        common[key] = wanted
        odd = [host for host in hosts if signatures[host][key] != wanted]
        if odd:
            problems.append(f"{label}: {', '.join(f'{h} has {_shown(key, signatures[h][key])}' for h in odd)}, "
                            f"the others {_shown(key, wanted)}")
    if problems:
        raise GroupRefusal(f"serving group {name!r} ({', '.join(hosts)}) is not identical, so one plan cannot serve "
                           f"it: {'; '.join(problems)}. Fix: give every member the same GPUs, driver and Python "
                           "(re-run the preflight after), or move the odd node out of the group "
                           "(revive_serving_group)")
    return common
