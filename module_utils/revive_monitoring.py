"""The Prometheus configuration of a fleet: every scrape target, with its labels, from the inventory and each GPU
node's release record (docs/monitoring.md).

Inputs: the GPU nodes to monitor and their addresses (the inventory's `ansible_host`), each node's release record's
`current` release (module_utils/revive_record/: `id`, `vllm_version`, `replicas` with `name`, `port`, `argv`), the
front door hosts, and the release data (data/vllm-releases.yml: which releases export no `vllm:*` series without
`--disable-frontend-multiprocessing`, vllm-project/vllm#7188). Output: prometheus.yml as text - jobs in a fixed order,
targets sorted, no timestamp - so the same fleet gives byte-identical text and a replica added, removed or moved to
another release changes it (the role reloads Prometheus on a change, never restarts it).

Jobs (the rules in monitoring/rules/ select on them):
- `vllm`: every replica's `/metrics`, labels `node`, `replica`, `release` (the record's release id), `vllm_version`
  and `vllm_metrics` (`exported`, or `absent` for a release that needs the flag and runs without it: its
  VllmMetricsMissing alert is expected, and the module warns);
- `vllm_health`: blackbox's `http` probe of every replica's `/health` (0.5.4 has no HTTP status metrics), same labels;
- `node`: node exporter on every GPU node (`node`); `gpu`: the GPU exporter per node (`node`, `gpu_exporter`:
  `dcgm` = dcgm-exporter, `nvitop` = nvitop-exporter);
- `haproxy`: the front door's built-in Prometheus exporter (HAProxy 2.6 `prometheus-exporter` service; `frontdoor`);
- `prometheus`, `alertmanager`, `blackbox`: the monitor host's own services.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

GPU_EXPORTERS = ("dcgm", "nvitop")
METRICS_FLAG = "--disable-frontend-multiprocessing"
DURATION = re.compile(r"[0-9]+(ms|s|m|h|d)")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
HEADER = ("# Managed by revive (module prometheus_config, module_utils/revive_monitoring.py): generated from the\n"
          "# inventory and every GPU node's release record; local changes are overwritten. docs/monitoring.md\n")


class MonitoringError(Exception):
    """The fleet cannot be monitored as given; the message says what, where and how to fix it."""


@dataclass(frozen=True)
class Settings:
    """What the monitor host and the exporters listen on, and Prometheus' own settings."""

    gpu_exporter: str
    gpu_exporter_port: int
    node_exporter_port: int = 9100
    frontdoor_exporter_port: int = 8405
    prometheus_address: str = "127.0.0.1:9090"
    alertmanager_addresses: Tuple[str, ...] = ("127.0.0.1:9093",)
    blackbox_address: str = "127.0.0.1:9115"
    blackbox_module: str = "http_health"
    rule_files: Tuple[str, ...] = ("/etc/prometheus/rules/*.yml",)
    scrape_interval: str = "15s"
    scrape_timeout: str = "10s"
    evaluation_interval: str = "15s"
    external_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    job: str
    address: str          # what Prometheus scrapes (host:port), or the URL blackbox probes
    labels: Tuple[Tuple[str, str], ...]


@dataclass(frozen=True)
class Fleet:
    targets: Tuple[Target, ...]
    warnings: Tuple[str, ...]

    def by_job(self, job: str) -> List[Target]:
        return [target for target in self.targets if target.job == job]


def releases_needing_flag(release_data: Mapping[str, Any]) -> Dict[str, bool]:
    """{vLLM version: whether its /metrics needs --disable-frontend-multiprocessing} from data/vllm-releases.yml."""
    releases = release_data.get("releases") if isinstance(release_data, Mapping) else None
    if not isinstance(releases, Mapping) or not releases:
        raise MonitoringError("the release data has no `releases` mapping: pass data/vllm-releases.yml parsed "
                              "(lookup('file', 'data/vllm-releases.yml') | from_yaml)")
    needs = {}
    for version, entry in releases.items():
        value = (entry or {}).get("metrics_need_disable_frontend_multiprocessing") if isinstance(entry, Mapping) \
            else None
        if not isinstance(value, bool):
            raise MonitoringError(f"data/vllm-releases.yml: releases.{version}.metrics_need_disable_frontend_"
                                  "multiprocessing is not true or false; every release must say it")
        needs[str(version)] = value
    return needs


def _port(value: Any, what: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = 0
    if not 0 < port < 65536 or isinstance(value, bool):
        raise MonitoringError(f"{what}: {value!r} is not a TCP port (1-65535)")
    return port


def exporter_ports(role_defaults: Mapping[str, Any], own_ports: Mapping[str, Any], gpu_exporter: Any = None,
                   gpu_exporter_port: Any = None, node_exporter_port: Any = None) -> List[int]:
    """The ports the monitoring role's exporters entry point has a GPU node listen on, [node exporter, GPU exporter]
    sorted, for the node's guard (module_utils/revive_firewall.py), which is written before the exporters exist.

    Each setting is the inventory's value, else the role's default (`role_defaults`: roles/monitoring/defaults);
    a GPU exporter port of 0 is the exporter's own (`own_ports`: the role's vars, {kind: port})."""
    def setting(value: Any, name: str) -> Any:
        return role_defaults.get(name) if value is None else value

    kind = setting(gpu_exporter, "monitoring_gpu_exporter")
    if kind not in own_ports:
        raise MonitoringError(f"monitoring_gpu_exporter {kind!r} is not one of {', '.join(sorted(own_ports))} "
                              "(dcgm: DCGM 4.x + dcgm-exporter, production; nvitop: nvitop-exporter, the lab)")
    gpu = setting(gpu_exporter_port, "monitoring_gpu_exporter_port")
    gpu_port = _port(own_ports[kind], f"{kind}'s own port") if str(gpu) == "0" else \
        _port(gpu, "monitoring_gpu_exporter_port")
    node_port = _port(setting(node_exporter_port, "monitoring_node_exporter_port"), "monitoring_node_exporter_port")
    return sorted({node_port, gpu_port})


def check_settings(settings: Settings) -> None:
    if settings.gpu_exporter not in GPU_EXPORTERS:
        raise MonitoringError(f"gpu_exporter {settings.gpu_exporter!r} is not one of {', '.join(GPU_EXPORTERS)} "
                              "(dcgm: DCGM 4.x + dcgm-exporter, production; nvitop: nvitop-exporter, the lab)")
    for name in ("gpu_exporter_port", "node_exporter_port", "frontdoor_exporter_port"):
        _port(getattr(settings, name), name)
    for name in ("scrape_interval", "scrape_timeout", "evaluation_interval"):
        if not DURATION.fullmatch(str(getattr(settings, name))):
            raise MonitoringError(f"{name} {getattr(settings, name)!r} is not a Prometheus duration like 15s or 1m")
    for name in settings.external_labels:
        if not LABEL_NAME.fullmatch(str(name)):
            raise MonitoringError(f"external label {name!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
    for address in (settings.prometheus_address, settings.blackbox_address) + tuple(settings.alertmanager_addresses):
        host, _, port = str(address).rpartition(":")
        if not host:
            raise MonitoringError(f"{address!r} is not host:port (the monitor host's own services)")
        _port(port, f"address {address}")


def _version_key(version: str) -> str:
    """The release data's key of a recorded version: a local suffix ('+sim', the lab's twin) is not part of it."""
    return version.split("+", 1)[0]


def _replicas(node: str, release: Mapping[str, Any], record_path: str) -> List[Mapping[str, Any]]:
    replicas = release.get("replicas")
    if not isinstance(replicas, list) or not replicas:
        raise MonitoringError(f"{node}: the current release {release.get('id')} in {record_path} has no replicas; "
                              "re-provision the node (site.yml or playbooks/rolling.yml)")
    for replica in replicas:
        if not isinstance(replica, Mapping) or not replica.get("name") or replica.get("port") is None:
            raise MonitoringError(f"{node}: a replica of release {release.get('id')} in {record_path} has no name "
                                  "or port; the record is not one vllm_release wrote - re-provision the node")
    return sorted(replicas, key=lambda replica: (str(replica["name"]), int(replica["port"])))


def fleet_targets(nodes: Sequence[str], records: Mapping[str, Optional[Mapping[str, Any]]],
                  addresses: Mapping[str, str], frontdoors: Sequence[str], settings: Settings,
                  metrics_need_flag: Mapping[str, bool], allow_missing: bool = False,
                  record_path: str = "/var/lib/revive/releases.json") -> Fleet:
    """Every target of the fleet, sorted; refuses a fleet Prometheus could not scrape as meant.

    `records`: per node the `current` release of its record (null: the node never had one); `addresses`: per
    inventory name the address to scrape (missing: the name itself); `allow_missing` (check mode on a fresh
    fleet): a node without a release gets only its exporters, with a warning, instead of a refusal."""
    check_settings(settings)
    warnings: List[str] = []
    names = sorted(str(node) for node in nodes)
    if len(set(names)) != len(names):
        raise MonitoringError(f"GPU nodes {names} name a node twice; list every node once")
    unknown = sorted(set(records) - set(names))
    if unknown:
        raise MonitoringError(f"release records of {', '.join(unknown)}, which are not among the GPU nodes to monitor "
                              f"({', '.join(names) or 'none'}): add them to monitoring_nodes or drop their records")
    node_ports = {"node exporter": _port(settings.node_exporter_port, "node_exporter_port"),
                  f"{settings.gpu_exporter} GPU exporter": _port(settings.gpu_exporter_port, "gpu_exporter_port")}
    seen_addresses: Dict[str, str] = {}
    targets: List[Target] = []
    for node in names:
        address = str(addresses.get(node) or node)
        if address in seen_addresses:
            raise MonitoringError(f"{node} and {seen_addresses[address]} have the same address {address}: their "
                                  "targets would collide; give every GPU node its own ansible_host")
        seen_addresses[address] = node
        targets.append(Target("node", f"{address}:{settings.node_exporter_port}", (("node", node),)))
        targets.append(Target("gpu", f"{address}:{settings.gpu_exporter_port}",
                              (("gpu_exporter", settings.gpu_exporter), ("node", node))))
        release = records.get(node)
        if not release:
            message = (f"{node} has no current release in its record {record_path}: provision it (site.yml) before "
                       "monitoring it, or leave it out of monitoring_nodes (the playbooks leave quarantined nodes out)")
            if not allow_missing:
                raise MonitoringError(message)
            warnings.append(f"{message}; only its node and GPU exporters are scraped")
            continue
        if not isinstance(release, Mapping) or not release.get("id") or not release.get("vllm_version"):
            raise MonitoringError(f"{node}: the current release in {record_path} has no id or vllm_version; it is not "
                                  "a record vllm_release wrote - re-provision the node")
        release_id, version = str(release["id"]), str(release["vllm_version"])
        if _version_key(version) not in metrics_need_flag:
            raise MonitoringError(f"{node} runs vLLM {version} (release {release_id}), which data/vllm-releases.yml "
                                  "does not hold: whether its /metrics needs --disable-frontend-multiprocessing is "
                                  "unknown; add the release to the data or roll the node to a release it holds")
        used = {port: what for what, port in node_ports.items()}
        for replica in _replicas(node, release, record_path):
            name, port = str(replica["name"]), _port(replica["port"], f"{node} replica {replica['name']} port")
            if port in used:
                raise MonitoringError(f"{node}: replica {name} of release {release_id} listens on port {port}, which "
                                      f"{used[port]} uses too; move the exporter (monitoring_*_port) or the "
                                      "replica's port (the plan) so each port on the node has one owner")
            used[port] = f"replica {name}"
            argv = [str(word) for word in replica.get("argv") or release.get("args") or []]
            absent = metrics_need_flag[_version_key(version)] and METRICS_FLAG not in argv
            if absent:
                warnings.append(f"{node} {name} runs vLLM {version} (release {release_id}) without {METRICS_FLAG}: "
                                "its /metrics has no vllm:* series (vllm-project/vllm#7188), so VllmMetricsMissing "
                                "is expected there; labelled vllm_metrics=absent. Plan the release with metrics on "
                                "(the planner adds the flag) and roll the node")
            labels = (("node", node), ("release", release_id), ("replica", name), ("vllm_metrics",
                      "absent" if absent else "exported"), ("vllm_version", version))
            targets.append(Target("vllm", f"{address}:{port}", labels))
            targets.append(Target("vllm_health", f"http://{address}:{port}/health", labels))
    for frontdoor in sorted(set(str(host) for host in frontdoors)):
        address = str(addresses.get(frontdoor) or frontdoor)
        targets.append(Target("haproxy", f"{address}:{settings.frontdoor_exporter_port}",
                              (("frontdoor", frontdoor),)))
    return Fleet(tuple(sorted(targets, key=lambda t: (t.job, t.labels, t.address))), tuple(warnings))


def _static(targets: Sequence[Target]) -> List[Dict[str, Any]]:
    return [{"targets": [target.address], "labels": dict(target.labels)} for target in targets]


def prometheus_config(fleet: Fleet, settings: Settings) -> Dict[str, Any]:
    """prometheus.yml as a dict, jobs in a fixed order (the self-monitoring ones first)."""
    check_settings(settings)
    global_section: Dict[str, Any] = {"scrape_interval": settings.scrape_interval,
                                      "scrape_timeout": settings.scrape_timeout,
                                      "evaluation_interval": settings.evaluation_interval}
    if settings.external_labels:
        global_section["external_labels"] = {str(k): str(v) for k, v in sorted(settings.external_labels.items())}
    jobs: List[Dict[str, Any]] = [
        {"job_name": "prometheus", "static_configs": [{"targets": [settings.prometheus_address]}]},
        {"job_name": "alertmanager", "static_configs": [{"targets": sorted(settings.alertmanager_addresses)}]},
        {"job_name": "blackbox", "static_configs": [{"targets": [settings.blackbox_address]}]},
    ]
    if fleet.by_job("vllm"):
        jobs.append({"job_name": "vllm", "metrics_path": "/metrics", "static_configs": _static(fleet.by_job("vllm"))})
        # Blackbox's multi-target pattern: the URL becomes ?target= (and the instance), blackbox is scraped.
        jobs.append({"job_name": "vllm_health", "metrics_path": "/probe",
                     "params": {"module": [settings.blackbox_module]},
                     "static_configs": _static(fleet.by_job("vllm_health")),
                     "relabel_configs": [
                         {"source_labels": ["__address__"], "target_label": "__param_target"},
                         {"source_labels": ["__param_target"], "target_label": "instance"},
                         {"target_label": "__address__", "replacement": settings.blackbox_address}]})
    for job in ("node", "gpu", "haproxy"):
        if fleet.by_job(job):
            jobs.append({"job_name": job, "metrics_path": "/metrics", "static_configs": _static(fleet.by_job(job))})
    return {"global": global_section, "rule_files": list(settings.rule_files),
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": sorted(settings.alertmanager_addresses)}]}]},
            "scrape_configs": jobs}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # A JSON string is a YAML double-quoted scalar: no value can be read as a number, a bool or a comment.
    return json.dumps(str(value))


def _yaml(value: Any, indent: int) -> List[str]:
    pad = " " * indent
    lines: List[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, (Mapping, list)) and item and not _flat(item):
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_flow(item)}")
    else:
        for item in value:
            block = _yaml(item, indent + 2) if isinstance(item, (Mapping, list)) and not _flat(item) \
                else [f"{pad}  {_flow(item)}"]
            lines.append(f"{pad}- {block[0].lstrip()}")
            lines.extend(block[1:])
    return lines


def _flat(value: Any) -> bool:
    """A list of scalars is written inline (targets, source_labels)."""
    return isinstance(value, list) and all(not isinstance(item, (Mapping, list)) for item in value)


def _flow(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_flow(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key}: {_flow(item)}" for key, item in value.items()) + "}"
    return _scalar(value)


def render(config: Mapping[str, Any]) -> str:
    """The configuration as YAML text: block style, every string quoted, the order of `config` kept.
    Written here rather than with PyYAML, which the monitor host's Python need not have (AnsiballZ ships no
    third-party packages)."""
    return HEADER + "\n".join(_yaml(config, 0)) + "\n"


def fleet_config_text(nodes: Sequence[str], records: Mapping[str, Optional[Mapping[str, Any]]],
                      addresses: Mapping[str, str], frontdoors: Sequence[str], settings: Settings,
                      release_data: Mapping[str, Any], allow_missing: bool = False,
                      record_path: str = "/var/lib/revive/releases.json") -> Tuple[str, Fleet]:
    """prometheus.yml's text and the targets it holds (with warnings), from the fleet as the module gets it."""
    fleet = fleet_targets(nodes, records, addresses, frontdoors, settings, releases_needing_flag(release_data),
                          allow_missing, record_path)
    return render(prometheus_config(fleet, settings)), fleet
