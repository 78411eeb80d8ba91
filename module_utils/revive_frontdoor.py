"""The front door's backend servers: one per replica of every GPU node's planned release, and each one's limit.

A server's `maxconn` is how many requests HAProxy sends it at once; the rest wait in HAProxy's queue (bounded by
`timeout queue`) instead of inside vLLM, where they would push the scheduler into preemption and swapping (the field
notes: "queue rather than raise --max-num-seqs"; docs/facts/lb-and-rolling.md §1.3). Where the limit comes from,
first match wins:
1. a limit the bench measured for this replica and applied to the node (playbooks/benchmark.yml with
   `benchmark_apply: true` writes the local fact `revive_frontdoor` on the node: per replica the recommended
   per-server concurrency and the argv it was measured with) - only while the planned replica still runs that argv
   and vLLM version; a limit measured for another argv is stale and ignored, and said so;
2. `frontdoor_server_maxconn` when above 0;
3. the plan's `streams` of the replica.
Whatever the source, never above the replica's `--max-num-seqs`: requests beyond it would wait inside vLLM,
invisible to the front door. The role's template renders the servers; the role prints every limit and its source.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible.module_utils.revive_serve_address import node_reach_address

DEFAULT_MAX_NUM_SEQS = 256   # vLLM's default --max-num-seqs (0.5.4 to 0.10)


def _measured(applied: Optional[Mapping[str, Any]], replica: Mapping[str, Any], vllm_version: str
              ) -> Dict[str, Any]:
    """{'maxconn': int, 'source': str} from the node's applied bench limit, or {'stale': reason} / {}."""
    if applied and not isinstance(applied, Mapping):
        # Ansible turns a facts.d file it cannot parse into an error string
        return {"stale": f"the node's local fact revive_frontdoor is not a JSON object ({str(applied)[:200]}): not "
                         "applied; run playbooks/benchmark.yml -e benchmark_apply=true again"}
    replicas = (applied or {}).get("replicas")
    entry = (replicas if isinstance(replicas, Mapping) else {}).get(replica.get("name"))
    if not isinstance(entry, Mapping):
        return {}
    bench = applied.get("bench") or "a bench run"
    args = [str(arg) for arg in replica.get("args") or []]
    argv = [str(arg) for arg in entry.get("argv") or []]
    if str(entry.get("vllm_version") or "") != vllm_version or not args or argv[-len(args):] != args:
        return {"stale": f"the limit {entry.get('maxconn')} from {bench} was measured on vLLM "
                         f"{entry.get('vllm_version')} with another argv than the planned one: not applied; "
                         "benchmark the new release (playbooks/benchmark.yml -e benchmark_apply=true)"}
    try:
        limit = int(entry.get("maxconn"))
    except (TypeError, ValueError):
        limit = 0
    if limit < 1:
        return {"stale": f"the applied limit {entry.get('maxconn')!r} from {bench} is not a positive integer: not "
                         "applied"}
    return {"maxconn": limit, "source": f"measured by {bench}"}


def backend_servers(nodes: Sequence[Mapping[str, Any]], server_maxconn: Any = 0) -> List[Dict[str, Any]]:
    """One server per replica: {name, node, address, port, maxconn, source, note, report (a line for the play)}.
    `nodes`: per GPU node {name, address, release (the plan, host fact revive_release), applied (the local fact
    revive_frontdoor)}."""
    servers, fleet_maxconn = [], int(server_maxconn or 0)
    for node in nodes:
        release = node.get("release") or {}
        max_num_seqs = int((release.get("settings") or {}).get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS)
        for replica in release.get("replicas") or []:
            measured = _measured(node.get("applied"), replica, str(release.get("vllm_version") or ""))
            if "maxconn" in measured:
                wanted, source = measured["maxconn"], measured["source"]
            elif fleet_maxconn > 0:
                wanted, source = fleet_maxconn, "frontdoor_server_maxconn"
            else:
                wanted = int(replica.get("streams") or max_num_seqs)
                source = "the plan's streams per replica"
            note = measured.get("stale", "")
            if wanted > max_num_seqs:
                note = (note + "; " if note else "") + f"{wanted} capped at --max-num-seqs {max_num_seqs}"
            name, limit = f"{node['name']}-{replica['name']}", min(wanted, max_num_seqs)
            servers.append({"name": name, "node": node["name"], "address": node.get("address") or node["name"],
                            "port": int(replica["port"]), "maxconn": limit, "source": source, "note": note,
                            "report": f"{name}: maxconn {limit} from {source}" + (f" ({note})" if note else "")})
    return servers


def frontdoor_servers(node_names: Sequence[str], hostvars: Mapping[str, Any], server_maxconn: Any = 0
                      ) -> List[Dict[str, Any]]:
    """The filter: backend_servers() from the GPU nodes' host variables (the address the replicas listen on, from
    module_utils/revive_serve_address.py: the release's --host, else ansible_host; the facts revive_release
    and, from /etc/ansible/facts.d, revive_frontdoor). Ansible keeps local facts under `ansible_local` even inside
    `ansible_facts`, where it strips the prefix from every other fact (ansible-core's setup module)."""
    nodes = []
    for name in node_names:
        host = hostvars[name]
        facts = host.get("ansible_facts") or {}
        nodes.append({"name": name, "address": node_reach_address(host, name),
                      "release": facts.get("revive_release") or {},
                      "applied": (facts.get("ansible_local") or {}).get("revive_frontdoor")})
    return backend_servers(nodes, server_maxconn)


# The role's defaults (roles/frontdoor/defaults/main.yml; a unit test keeps them equal): another play reads an lb
# host's inventory variables through hostvars, which holds no role defaults.
DEFAULT_PORT = 80
DEFAULT_TLS_PORT = 443


def frontdoor_url(lb: Mapping[str, Any], lb_name: str) -> str:
    """The base URL clients reach the front door at, from an lb host's variables: https on frontdoor_tls_port when
    it has a certificate, else http on frontdoor_port; the host is frontdoor_name, else the front doors' virtual
    address (frontdoor_vip, held by whichever lb host keepalived chose), else its ansible_host (an IPv6 address in
    brackets). The certificate covers that name (the role's preflight checks it)."""
    host = str(lb.get("frontdoor_name") or lb.get("frontdoor_vip") or lb.get("ansible_host") or lb_name)
    tls = bool(lb.get("frontdoor_tls_certificate"))
    port = int(lb.get("frontdoor_tls_port", DEFAULT_TLS_PORT) if tls else lb.get("frontdoor_port", DEFAULT_PORT))
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"
