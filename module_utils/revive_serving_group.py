"""Serving groups (issue 16): the GPU nodes that serve one model together, declared in the inventory by setting
`revive_serving_group: <name>` on each member (the inventory check refuses a bad name). Every member plans the group
from all members' probes (`group_members`: the GPU facts of module_utils/revive_nvml.py and the Python the release's
venv gets); the members must be identical where vLLM and Ray need them to be (docs/facts/multi-node.md §1.3):

* the same GPUs - count, model name, memory, compute capability: one plan's TP size, KV sizing and flags serve
  every stage;
* the same driver version: the release's kernels and NCCL run on every node;
* the same Python version, patch included: Ray refuses to join nodes whose Python differs in the patch version.

`check_group` names every member that differs from the others (the value most members share; on a tie, the first
member's, in name order) and what it has, in one message, so the operator fixes them all at once. After the fitness
rules, `unfit_members` holds back every member of a cluster whose head or worker is unfit.
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


def group_members(hostvars: Mapping[str, Mapping[str, Any]], hosts: Sequence[str], name: str,
                  record: str = "gpu_preflight_member") -> List[Dict[str, Any]]:
    """The plan's `group.members` for serving group `name`: every host of `hosts` (the inventory's GPU nodes) that
    declares it (revive_serving_group), as its probe recorded it (`record`: {host, gpu, python_version, address,
    interface}), or just {host} when this run did not probe it (unreachable, failed, outside --limit) - which the
    group's plan then refuses, naming it."""
    members: List[Dict[str, Any]] = []
    for host in sorted(hosts):
        variables = hostvars.get(host) or {}
        if variables.get("revive_serving_group") != name:
            continue
        probed = variables.get(record)
        members.append(dict(probed) if isinstance(probed, Mapping) and probed.get("gpu") else {"host": host})
    return members


def unfit_members(release: Mapping[str, Any], hostvars: Mapping[str, Mapping[str, Any]],
                  key: str = "gpu_preflight_result") -> List[str]:
    """The members of this node's Ray cluster (head and workers of its release's `group`) whose preflight found them
    unfit, each with its first reason; [] when the release spans no nodes. `hostvars[host][key]` is a member's
    preflight result (absent: not probed)."""
    group = release.get("group") if isinstance(release, Mapping) else None
    if not group:
        return []
    unfit: List[str] = []
    for member in group.get("members") or []:
        if member.get("role") == "spare":
            continue
        result = (hostvars.get(member.get("host")) or {}).get(key)
        if not isinstance(result, Mapping):
            unfit.append(f"{member.get('host')} (no preflight result)")
        elif not result.get("fit"):
            reasons = result.get("reasons") or ["unfit"]
            unfit.append(f"{member.get('host')} ({reasons[0]})")
    return unfit
