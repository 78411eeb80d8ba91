"""A serving group member's plan (issue 16): every member computes the same group plan from the same inputs and
takes its own part of it, so the preflight needs no coordinator.

1. The members must be identical where one plan has to serve them all (module_utils/revive_serving_group.py:
   GPUs, driver, Python patch version); the refusal names every odd member.
2. The group is planned once, from the head's GPU facts (the first member in name order), with as many nodes as
   members (pipeline.py: TP inside a node, PP across nodes, the fewest stages that hold the workload).
3. When one node holds it (PP 1), no Ray runs: every member is planned from its own facts as a single node - the
   same plan a node outside any group gets.
4. Otherwise module_utils/revive_cluster.py gives this member its role (head, worker, spare) and its release.

Refusals of any step are PlanRefusals, so the preflight quarantines the member with the reason, as for any plan.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Mapping, Sequence

from ansible.module_utils.revive_cluster import ClusterError, member_release
from ansible.module_utils.revive_plan.inputs import NodeGroup, PlanRefusal
from ansible.module_utils.revive_serving_group import GroupRefusal, check_group

SOURCE = "docs/facts/multi-node.md §1.3; module_utils/revive_serving_group.py"


def plan_member(planner: Any, gpu_facts: Mapping[str, Any], model: Dict[str, Any], releases: Any,
                request: Sequence[Any], group: NodeGroup, name: str, members: Sequence[Mapping[str, Any]],
                member: str, ray_port: int = 6379) -> Dict[str, Any]:
    """This member's release dict. `planner` is revive_plan.plan_release; `request` its (workload, overrides,
    serve, host_ram_bytes, source); `members` [{host, gpu, python_version, address, interface}] of every member;
    `gpu_facts` this member's own."""
    hosts = sorted(str(m.get("host")) for m in members)
    unprobed = [host for host in hosts if not next(m for m in members if str(m.get("host")) == host).get("gpu")]
    if unprobed:
        raise PlanRefusal(f"serving group {name!r} ({', '.join(hosts)}) is planned from every member's probe, and "
                          f"this run has none of {', '.join(unprobed)} (unreachable, its probe failed, or left out "
                          "by --limit). Fix: run with every member, or move the node out of the group "
                          "(revive_serving_group)", SOURCE)
    if member not in hosts:
        raise PlanRefusal(f"{member} is not among the probed members of serving group {name!r} ({', '.join(hosts)})",
                          SOURCE)
    try:
        check_group(name, {str(m["host"]): {"gpu": m.get("gpu") or {}, "python_version": m.get("python_version")}
                           for m in members})
    except GroupRefusal as exc:
        raise PlanRefusal(str(exc), SOURCE) from None
    head = next(m for m in members if str(m.get("host")) == hosts[0])
    sized = replace(group, nodes=len(hosts))
    release = planner(dict(head.get("gpu") or {}), model, releases, *request, sized)
    if int(release.get("pipeline_parallel_size") or 1) == 1:
        own = planner(dict(gpu_facts), model, releases, *request, replace(group, nodes=1))
        own["warnings"] = list(own.get("warnings") or []) + [
            f"serving group {name!r}: one node holds the model and the workload's KV, so each of its {len(hosts)} "
            "members serves on its own (no Ray)"]
        return own
    try:
        return member_release(release, name, members, member, ray_port)
    except ClusterError as exc:
        raise PlanRefusal(str(exc), SOURCE) from None
