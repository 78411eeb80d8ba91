"""The Ray cluster of a serving group (issue 16): which member is the head, a worker or a spare, and what each one's
release runs - the part of a group plan (module_utils/revive_plan/pipeline.py) that depends on the members.

A group plan is one replica of TP ranks per node and PP stages, one stage per node. `member_release` turns it into
the release of one member:

* the **head** (the first member in name order) runs Ray's head and the only vLLM server of the group: its replica
  keeps the plan's argv and gains `RAY_ADDRESS` (else 0.5.4's `ray.init(address=None)` silently starts a private
  one-node Ray) and the node's own `VLLM_HOST_IP`, `NCCL_SOCKET_IFNAME` and `GLOO_SOCKET_IFNAME`;
* a **worker** (the next PP - 1 members) runs a Ray worker that joins the head and serves no API itself: its
  release has no replica;
* a **spare** (members beyond PP) runs nothing; the group plan already warns that it is unused.

Every Ray unit's environment (`ray.env`) carries what vLLM's workers on that node need, because 0.5.4 passes only
`CUDA_VISIBLE_DEVICES`, `VLLM_INSTANCE_ID` and `VLLM_TRACE_FUNCTION` to its Ray workers, which otherwise inherit the
raylet's environment: the stage's GPUs, the plan's NCCL settings and attention backend, the node's IP and the
interface the group talks over (docs/facts/multi-node.md §1.3; vLLM #6803, #6804 for the interfaces, #2406 for the
IP that must be the same for Ray and vLLM).
"""
from __future__ import annotations

import copy
import ipaddress
from typing import Any, Dict, List, Mapping, Sequence

SOURCE = "docs/facts/multi-node.md §1.3"
# The plan's replica variables a Ray worker's vLLM process needs too (it inherits the raylet's environment).
STAGE_ENV_KEYS = ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
                  "VLLM_ATTENTION_BACKEND", "VLLM_ALLOW_LONG_MAX_MODEL_LEN")
ROLES = ("head", "worker", "spare")


class ClusterError(ValueError):
    """A member the cluster cannot be built with; the message names it and says how to fix it."""


def check_members(group: str, members: Sequence[Mapping[str, Any]]) -> List[Dict[str, str]]:
    """[{host, address, interface}] in name order; refuses a member without a usable address or interface."""
    shown: List[Dict[str, str]] = []
    problems: List[str] = []
    for member in sorted(members, key=lambda m: str(m.get("host"))):
        host, address, interface = str(member.get("host") or ""), member.get("address"), member.get("interface")
        try:
            ipaddress.ip_address(str(address))
        except ValueError:
            problems.append(f"{host or '(no host)'} has cluster address {address!r}, not an IP address")
            continue
        if not interface or not isinstance(interface, str):
            problems.append(f"{host} has no network interface for {address} (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME)")
            continue
        shown.append({"host": host, "address": str(address), "interface": interface})
    if problems:
        raise ClusterError(f"serving group {group!r}: {'; '.join(problems)}. Ray and vLLM need each member's IP "
                           "(`ray start --node-ip-address`, VLLM_HOST_IP) and the interface it is on. Fix: set "
                           "revive_cluster_address (and revive_cluster_interface when the address is not on one of "
                           "the node's interfaces) in those hosts' vars")
    addresses = [m["address"] for m in shown]
    twice = sorted({a for a in addresses if addresses.count(a) > 1})
    if twice:
        raise ClusterError(f"serving group {group!r}: members share the cluster address {', '.join(twice)}: Ray tells "
                           "its nodes apart by IP (vLLM #2406). Fix: give every member its own revive_cluster_address")
    return shown


def _role(position: int, stages: int) -> str:
    return "head" if position == 0 else "worker" if position < stages else "spare"


def member_release(release: Mapping[str, Any], group: str, members: Sequence[Mapping[str, Any]], member: str,
                   ray_port: int = 6379) -> Dict[str, Any]:
    """This member's release of a group plan with pipeline_parallel_size > 1: the plan with a `group` section and,
    on the head, the replica's Ray environment; on a worker or a spare, no replica."""
    stages = int(release.get("pipeline_parallel_size") or 1)
    replicas = release.get("replicas") or []
    if stages < 2 or len(replicas) != 1:
        raise ClusterError(f"serving group {group!r}: a Ray cluster serves one replica over 2 or more pipeline "
                           f"stages; this plan has {len(replicas)} replica(s) and {stages} stage(s)")
    ordered = check_members(group, members)
    if len(ordered) < stages:
        raise ClusterError(f"serving group {group!r}: the plan needs {stages} nodes and the group has "
                           f"{len(ordered)} ({', '.join(m['host'] for m in ordered)}). Fix: add members")
    hosts = [m["host"] for m in ordered]
    if member not in hosts:
        raise ClusterError(f"{member} is not a member of serving group {group!r} ({', '.join(hosts)})")
    replica = replicas[0]
    head = ordered[0]
    ray_address = f"{_url_host(head['address'])}:{ray_port}"
    stage_env = {key: str(value) for key, value in (replica.get("env") or {}).items() if key in STAGE_ENV_KEYS}
    roster = [dict(m, role=_role(n, stages), stage=n if n < stages else None) for n, m in enumerate(ordered)]
    mine = roster[hosts.index(member)]
    node_env = {"VLLM_HOST_IP": mine["address"], "NCCL_SOCKET_IFNAME": mine["interface"],
                "GLOO_SOCKET_IFNAME": mine["interface"]}
    gpus = len(replica.get("gpus") or [])
    result = copy.deepcopy(dict(release))
    result["group"] = {
        "name": group,
        "role": mine["role"],
        "stage": mine["stage"],
        "head": head["host"],
        "members": roster,
        "ray": {
            "address": ray_address,
            "port": int(ray_port),
            "node_ip_address": mine["address"],
            "num_gpus": gpus if mine["role"] != "spare" else 0,
            "expected_nodes": stages,
            "expected_gpus": gpus * stages,
            "env": dict(stage_env, **node_env) if mine["role"] != "spare" else {},
        },
    }
    if mine["role"] == "head":
        head_replica = result["replicas"][0]
        head_replica["env"] = dict(head_replica.get("env") or {}, RAY_ADDRESS=ray_address, **node_env)
        result["env"] = dict(head_replica["env"])
    else:
        result["replicas"] = []   # `args` stays: the group's server argv, which names the model every stage loads
        result["env"] = {}
    return result


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _is_ip(text: Any) -> bool:
    try:
        ipaddress.ip_address(str(text))
    except ValueError:
        return False
    return True


def _addresses(device: Mapping[str, Any]) -> List[str]:
    ipv4 = [device.get("ipv4") or {}] + list(device.get("ipv4_secondaries") or [])
    ipv6 = list(device.get("ipv6") or [])
    return [str(entry.get("address")) for entry in ipv4 + ipv6 if isinstance(entry, Mapping) and entry.get("address")]


def cluster_endpoint(facts: Mapping[str, Any], ansible_host: Any = "", address: str = "",
                     interface: str = "") -> Dict[str, str]:
    """{address, interface} a member is reached at by the group, from its gathered facts: the operator's address,
    else the inventory's `ansible_host` when it is an IP, else the default route's; the interface holding that
    address unless the operator names one - the default route's when it is its address (read from the routing
    table, which also holds when the per-interface facts miss one), else the interface whose facts list it. ""
    where none is found (check_members then refuses, naming the host)."""
    chosen = address or (str(ansible_host) if _is_ip(ansible_host) else "") or \
        str((facts.get("default_ipv4") or {}).get("address") or "")
    if interface or not chosen:
        return {"address": chosen, "interface": interface}
    route = facts.get("default_ipv4") or {}
    if route.get("address") == chosen and route.get("interface"):
        return {"address": chosen, "interface": str(route["interface"])}
    for name in facts.get("interfaces") or []:
        device = facts.get(str(name).replace("-", "_")) or {}
        if chosen in _addresses(device):
            return {"address": chosen, "interface": str(device.get("device") or name)}
    return {"address": chosen, "interface": ""}


def member_summary(release: Mapping[str, Any]) -> str:
    """One line for the preflight summary of a group member's release; "" for a release outside any group."""
    group = release.get("group") if isinstance(release, Mapping) else None
    if not group:
        return ""
    ray = group.get("ray") or {}
    layout = (f"TP {release.get('tensor_parallel_size')} x PP {release.get('pipeline_parallel_size')} on Ray "
              f"{ray.get('address')}")
    if group.get("role") == "spare":
        return f"vLLM {release.get('vllm_version')}, spare of serving group {group.get('name')} ({layout}): runs nothing"
    return (f"vLLM {release.get('vllm_version')}, {group.get('role')} of serving group {group.get('name')}, stage "
            f"{group.get('stage')} of {ray.get('expected_nodes')} ({layout}; GPUs "
            f"{(ray.get('env') or {}).get('CUDA_VISIBLE_DEVICES', '')})")
