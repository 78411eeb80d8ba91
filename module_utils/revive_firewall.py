"""A host's guard (docs/network.md): who may reach a GPU node's vLLM, Ray and exporter ports, or a front door host's
HAProxy metrics port (given as its one exporter port, with no release), as one nftables table.

The table `inet revive_guard` is the only thing it touches: its input chain accepts a guarded port's connections
from the allowed sources and from the node itself, and answers everyone else with a TCP reset (a client sees
"connection refused" at once, not a timeout). Every other packet goes on unjudged (policy accept), so the rules of
the distribution or the operator stay theirs and SSH can never be cut by this table; a guarded port that is the SSH
port is refused before anything is written. The text begins by creating and deleting the table, so `nft -f` replaces
it in one transaction, at boot and on every change (nft(8), "ruleset" and the transaction semantics of -f).

- vLLM ports (every replica's --port; vLLM serves /metrics on the same port): the front door hosts, the monitoring
  hosts and the operator's extra sources. A fleet without a front door has clients calling the replicas directly:
  then only the extra sources restrict them, and with none the ports stay open, said so in the report.
- Ray ports of a serving group's member (GCS on the head, the fixed ports of every node, the worker port range):
  the group's members only, at their cluster addresses.
- Exporter ports (node exporter, the GPU exporter; given when the fleet has monitoring hosts): the monitoring hosts
  and the operator's extra sources. The front door has no business there.
"""
from __future__ import annotations

import ipaddress
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

TABLE = "revive_guard"


class FirewallError(ValueError):
    """Inputs that would guard nothing, lock out SSH or not parse; the message says which and how to fix it."""


def _sources(values: Iterable[Any], what: str) -> Tuple[List[str], List[str]]:
    v4, v6 = [], []
    for value in values:
        text = str(value).strip()
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise FirewallError(f"{what}: {text!r} is not an IP address or network (CIDR). Fix: give addresses, "
                                "e.g. the hosts' ansible_host as IP addresses, or 10.0.0.0/24") from None
        (v4 if network.version == 4 else v6).append(str(network) if network.num_addresses > 1 else
                                                     str(network.network_address))
    return sorted(set(v4), key=_ip_key), sorted(set(v6), key=_ip_key)


def _ip_key(text: str):
    return ipaddress.ip_network(text, strict=False)


def _port(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not str(value).isdigit():
        raise FirewallError(f"{what}: {value!r} is not a port number")
    port = int(value)
    if not 1 <= port <= 65535:
        raise FirewallError(f"{what}: {port} is not a port number (1-65535)")
    return port


def ray_ports(release: Mapping[str, Any], fixed: Mapping[str, Any]) -> List[str]:
    """The Ray ports of a group member: the GCS port and the fixed ports of ray_cluster_ports, the worker range as
    one `min-max` element."""
    group = release.get("group") or {}
    if not group or group.get("role") not in ("head", "worker"):
        return []
    ports = [_port((group.get("ray") or {}).get("port"), "the group's Ray port")]
    low = high = None
    for name, value in sorted(fixed.items()):
        if name == "min_worker":
            low = _port(value, f"ray_cluster_ports.{name}")
        elif name == "max_worker":
            high = _port(value, f"ray_cluster_ports.{name}")
        else:
            ports.append(_port(value, f"ray_cluster_ports.{name}"))
    elements = [str(p) for p in sorted(set(ports))]
    if low is not None and high is not None:
        if low > high:
            raise FirewallError(f"ray_cluster_ports: min_worker {low} is above max_worker {high}")
        elements.append(f"{low}-{high}")
    return elements


def guard(release: Mapping[str, Any], frontdoors: Sequence[Any], monitors: Sequence[Any], extra: Sequence[Any],
          fixed_ray_ports: Mapping[str, Any], ssh_port: Any = 22, exporter_ports: Sequence[Any] = ()) -> Dict[str, Any]:
    """The node's rules: {"ruleset": nft text, "report": [lines], "vllm_ports", "ray_ports", "exporter_ports",
    "open": bool}."""
    vllm_ports = sorted({_port(r.get("port"), f"replica {r.get('name', '?')}'s port")
                         for r in release.get("replicas") or []})
    cluster_ports = ray_ports(release, fixed_ray_ports)
    metrics_ports = sorted({_port(p, "an exporter's port") for p in exporter_ports})
    ssh = _port(ssh_port, "ansible_port")
    if ssh in vllm_ports + metrics_ports or any(_in_element(ssh, e) for e in cluster_ports):
        raise FirewallError(f"the SSH port {ssh} is among the ports to guard (vLLM {vllm_ports}, Ray "
                            f"{cluster_ports}, exporters {metrics_ports}): guarding it could lock Ansible out. Fix: "
                            "move the replica, Ray or exporter port")
    for port in metrics_ports:
        if port in vllm_ports or any(_in_element(port, e) for e in cluster_ports):
            raise FirewallError(f"the exporter port {port} is also a vLLM or Ray port of this node (vLLM "
                                f"{vllm_ports}, Ray {cluster_ports}): one of them could not listen. Fix: "
                                "monitoring_node_exporter_port or monitoring_gpu_exporter_port, or the replica's port")
    service_v4, service_v6 = _sources(list(frontdoors) + list(monitors) + list(extra),
                                      "the front door, monitoring hosts and revive_firewall_allow")
    metrics_v4, metrics_v6 = _sources(list(monitors) + list(extra), "the monitoring hosts and revive_firewall_allow")
    members = [m.get("address") for m in ((release.get("group") or {}).get("members") or [])]
    cluster_v4, cluster_v6 = _sources(members, "the serving group's member addresses")
    open_ports = bool(vllm_ports) and not (service_v4 or service_v6)
    open_metrics = bool(metrics_ports) and not (metrics_v4 or metrics_v6)
    report = []
    if vllm_ports:
        report.append(f"vLLM ports {', '.join(map(str, vllm_ports))}: "
                      + ("OPEN to every source - no front door, monitoring host or revive_firewall_allow entry"
                         if open_ports else f"only from {', '.join(service_v4 + service_v6)} and the node itself"))
    if cluster_ports:
        report.append(f"Ray ports {', '.join(cluster_ports)}: only from the group's members "
                      f"{', '.join(cluster_v4 + cluster_v6)} and the node itself")
    if metrics_ports:
        report.append(f"exporter ports {', '.join(map(str, metrics_ports))}: "
                      + ("OPEN to every source - no monitoring host or revive_firewall_allow entry" if open_metrics
                         else f"only from {', '.join(metrics_v4 + metrics_v6)} and the node itself"))
    if not report:
        report.append("no vLLM, Ray or exporter port on this node: nothing to guard")
    lines = [
        "# revive (role node_firewall): who may reach this node's vLLM, Ray and exporter ports. Everything else",
        "# passes unjudged (policy accept): the distribution's or the operator's own rules stay. docs/network.md",
        f"table inet {TABLE}",
        f"delete table inet {TABLE}",
        f"table inet {TABLE} {{",
    ]
    if vllm_ports and not open_ports:   # each set only where a rule names it
        lines += _set("service_v4", "ipv4_addr", service_v4) + _set("service_v6", "ipv6_addr", service_v6)
    if cluster_ports:
        lines += _set("cluster_v4", "ipv4_addr", cluster_v4) + _set("cluster_v6", "ipv6_addr", cluster_v6)
    if metrics_ports and not open_metrics:
        lines += _set("metrics_v4", "ipv4_addr", metrics_v4) + _set("metrics_v6", "ipv6_addr", metrics_v6)
    lines += ["\tchain input {", "\t\ttype filter hook input priority filter; policy accept;",
              '\t\tiif "lo" accept']
    if vllm_ports and not open_ports:
        lines += _guarded("vllm", ", ".join(map(str, vllm_ports)), "service", service_v4, service_v6)
    if cluster_ports:
        lines += _guarded("ray", ", ".join(cluster_ports), "cluster", cluster_v4, cluster_v6)
    if metrics_ports and not open_metrics:
        lines += _guarded("exporters", ", ".join(map(str, metrics_ports)), "metrics", metrics_v4, metrics_v6)
    lines += ["\t}", "}"]
    return {"ruleset": "\n".join(lines) + "\n", "report": report, "vllm_ports": vllm_ports,
            "ray_ports": cluster_ports, "exporter_ports": metrics_ports, "open": open_ports}


def _in_element(port: int, element: str) -> bool:
    low, _, high = element.partition("-")
    return int(low) <= port <= int(high or low)


def _set(name: str, kind: str, elements: List[str]) -> List[str]:
    if not elements:
        return []
    flags = " flags interval;" if any("/" in e for e in elements) else ""
    return [f"\tset {name} {{ type {kind};{flags} elements = {{ {', '.join(elements)} }} }}"]


def _guarded(label: str, ports: str, sources: str, v4: List[str], v6: List[str]) -> List[str]:
    rules = []
    if v4:
        rules.append(f"\t\ttcp dport {{ {ports} }} ip saddr @{sources}_v4 accept")
    if v6:
        rules.append(f"\t\ttcp dport {{ {ports} }} ip6 saddr @{sources}_v6 accept")
    rules.append(f'\t\ttcp dport {{ {ports} }} counter reject with tcp reset comment "{label}: not an allowed source"')
    return rules
