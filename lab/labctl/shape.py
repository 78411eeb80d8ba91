"""Which hosts a lab has, their addresses, groups and GPU profiles. Pure: no system calls."""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import LabError

DEFAULT_NODES = 2
DEFAULT_GPU_PROFILE = "v100-pcie-8x"
MAX_NODES = 32

# The fleet roles besides GPU nodes, as in the field notes: an rsync source for models, a load client
# kept off the GPU nodes, the front door, and Prometheus (issue 15). Host name -> inventory group.
# Host names differ from their group names: Ansible warns when a host and a group share a name.
# lb2 is a second front door (keepalived holds the virtual address on one of them, docs/frontdoor-ha.md): only a
# lab that names it runs it, so the default lab is the field notes' single front door.
SUPPORT_HOSTS = {"model-store": "model_store", "bench1": "bench", "lb1": "lb", "monitor1": "monitor", "lb2": "lb"}
DEFAULT_SUPPORT_HOSTS = ("model-store", "bench1", "lb1", "monitor1")
GROUPS = ("gpu_nodes", "model_store", "bench", "lb", "monitor")

# Each lab owns one /24 of this /16; slot N is 10.213.N.0/24, the controller (the bridge) is .1.
LAB_SUPERNET = ipaddress.IPv4Network("10.213.0.0/16")
SUPPORT_HOST_OCTET = {"model-store": 2, "bench1": 3, "lb1": 4, "monitor1": 5, "lb2": 6}
FIRST_NODE_OCTET = 10  # node1 is .11


@dataclass(frozen=True)
class LabHost:
    name: str
    group: str
    octet: int
    gpu_profile: str | None = None

    @property
    def is_gpu_node(self) -> bool:
        return self.group == "gpu_nodes"


@dataclass(frozen=True)
class LabShape:
    """What `bin/lab up` was asked for: N GPU nodes, which support hosts, and each node's GPU profile."""

    nodes: int = DEFAULT_NODES
    support_hosts: tuple[str, ...] = DEFAULT_SUPPORT_HOSTS
    node_profiles: dict[str, str] = field(default_factory=dict)

    @property
    def hosts(self) -> list[LabHost]:
        hosts = [
            LabHost(f"node{i}", "gpu_nodes", FIRST_NODE_OCTET + i, self.node_profiles[f"node{i}"])
            for i in range(1, self.nodes + 1)
        ]
        hosts += [LabHost(name, SUPPORT_HOSTS[name], SUPPORT_HOST_OCTET[name]) for name in self.support_hosts]
        return hosts

    def describe(self) -> str:
        profiles = sorted(set(self.node_profiles.values()))
        support = ", ".join(self.support_hosts) or "no support hosts"
        return f"{self.nodes} GPU node(s) [{', '.join(profiles) or '-'}] + {support}"

    def to_json(self) -> dict:
        return {"nodes": self.nodes, "support_hosts": list(self.support_hosts),
                "node_profiles": dict(sorted(self.node_profiles.items()))}

    @classmethod
    def from_json(cls, data: dict) -> "LabShape":
        return cls(int(data["nodes"]), tuple(data["support_hosts"]), dict(data["node_profiles"]))


def known_profiles(profiles_dir: Path) -> list[str]:
    return sorted(p.stem for p in profiles_dir.glob("*.json"))


def profile_path(profiles_dir: Path, name: str) -> Path:
    """The profile file for `name`, or a LabError that lists the known profiles."""
    known = known_profiles(profiles_dir)
    if name not in known:
        listing = ", ".join(known) if known else f"none: {profiles_dir} has no *.json"
        raise LabError(f"unknown GPU profile {name!r}; known profiles ({profiles_dir}): {listing}")
    path = profiles_dir / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LabError(f"GPU profile {path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise LabError(f"GPU profile {path} has no `gpus` list; see the profile format in lab/fakenvml/README.md")
    return path


def parse_support_hosts(spec: str) -> tuple[str, ...]:
    """`model-store,bench1,lb1,monitor1,lb2` (any subset, in any order) or `none`."""
    if spec.strip() == "none":
        return ()
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in SUPPORT_HOSTS]
    if unknown:
        raise LabError(f"unknown support host(s) {', '.join(unknown)}; choose from "
                       f"{', '.join(SUPPORT_HOSTS)} (comma-separated) or `none`")
    # Keep the canonical order so the same set always means the same shape.
    return tuple(n for n in SUPPORT_HOSTS if n in names)


def build_shape(nodes: int, gpu_profiles: list[str], support_hosts: tuple[str, ...],
                profiles_dir: Path) -> LabShape:
    """Resolve `--nodes` and the `--gpu-profile NAME | HOST=NAME` options into a shape, validating names."""
    if not 0 <= nodes <= MAX_NODES:
        raise LabError(f"--nodes {nodes}: the lab runs 0 to {MAX_NODES} GPU nodes")
    node_names = [f"node{i}" for i in range(1, nodes + 1)]
    default = DEFAULT_GPU_PROFILE
    per_host: dict[str, str] = {}
    for spec in gpu_profiles:
        host, sep, name = spec.partition("=")
        if not sep:
            default = spec
            continue
        if host not in node_names:
            raise LabError(f"--gpu-profile {spec}: {host!r} is not a GPU node of this lab "
                           f"(GPU nodes: {', '.join(node_names) or 'none'})")
        per_host[host] = name
    profiles = {host: per_host.get(host, default) for host in node_names}
    for name in sorted(set(profiles.values())):
        profile_path(profiles_dir, name)
    return LabShape(nodes, support_hosts, profiles)


def slot_network(slot: int) -> ipaddress.IPv4Network:
    return list(LAB_SUPERNET.subnets(new_prefix=24))[slot]


def host_address(slot: int, host: LabHost) -> str:
    return str(slot_network(slot).network_address + host.octet)


def controller_address(slot: int) -> str:
    return str(slot_network(slot).network_address + 1)
