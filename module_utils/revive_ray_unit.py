"""A serving group member's Ray unit (roles/ray_cluster): the `ray start` command and the environment, from the
member's part of the group plan (module_utils/revive_cluster.py) and the role's settings.

* `ray start --block` keeps Ray in the foreground and exits when one of its processes dies, which suits a systemd
  `Type=simple` unit that restarts it (Ray 2.34 `scripts/scripts.py`, `--block`).
* The head: `--head --port`; a worker: `--address <head>:<port>`, and it exits while the head does not answer, so
  systemd retries until it joins. Every member: `--node-ip-address` = the IP vLLM uses (`VLLM_HOST_IP`; vLLM #2406:
  the two must match), `--num-gpus` = the stage's GPUs, which `CUDA_VISIBLE_DEVICES` in the unit's environment
  names, so Ray hands out exactly the planned ones.
* `--include-dashboard=false` unless asked: the dashboard's job API runs any code it is sent, as the service user.
* Fixed ports (GCS, node and object manager, the agents, metrics, worker range) instead of Ray's random ones, so a
  host firewall can open exactly these between the members.
* `--temp-dir` under the service user's state directory: the head's vLLM unit runs with `PrivateTmp=yes`, so Ray's
  default `/tmp/ray` (sockets, session) would be invisible to it; a driver learns the session directory from the
  cluster, so both units find it there.
* `--disable-usage-stats` and `RAY_USAGE_STATS_ENABLED=0`: nodes reach no external address.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping

from ansible.module_utils.revive_record.systemd import environment_assignment, exec_start

# Option name -> `ray start` flag, in the order they are written. ray_client_server is the head's only.
PORT_FLAGS = (
    ("node_manager", "--node-manager-port"),
    ("object_manager", "--object-manager-port"),
    ("runtime_env_agent", "--runtime-env-agent-port"),
    ("dashboard_agent_grpc", "--dashboard-agent-grpc-port"),
    ("dashboard_agent_listen", "--dashboard-agent-listen-port"),
    ("metrics_export", "--metrics-export-port"),
    ("min_worker", "--min-worker-port"),
    ("max_worker", "--max-worker-port"),
)
HEAD_PORT_FLAGS = (("ray_client_server", "--ray-client-server-port"), ("dashboard", "--dashboard-port"))


class RayUnitError(ValueError):
    """Settings a Ray unit cannot be written with; the message names the setting and how to fix it."""


def _port(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise RayUnitError(f"ray_cluster_ports.{name} is {value!r}: it must be a TCP port, 1 to 65535")
    return value


def check_ports(ports: Mapping[str, Any], gcs_port: int) -> Dict[str, int]:
    """Every port set, distinct, the worker range in order and clear of the others."""
    wanted = [name for name, _ in PORT_FLAGS + HEAD_PORT_FLAGS]
    unknown = sorted(set(ports) - set(wanted))
    missing = [name for name in wanted if name not in ports]
    if unknown or missing:
        raise RayUnitError(f"ray_cluster_ports: {'unknown ' + ', '.join(unknown) if unknown else ''}"
                           f"{'; ' if unknown and missing else ''}{'missing ' + ', '.join(missing) if missing else ''}"
                           f". It takes exactly {', '.join(wanted)}")
    checked = {name: _port(name, ports[name]) for name in wanted}
    low, high = checked["min_worker"], checked["max_worker"]
    if low > high:
        raise RayUnitError(f"ray_cluster_ports: min_worker {low} is above max_worker {high}")
    singles = dict((name, port) for name, port in checked.items() if name not in ("min_worker", "max_worker"))
    singles["gcs (the group's ray_port)"] = _port("gcs", gcs_port)
    seen: Dict[int, str] = {}
    for name, port in singles.items():
        if port in seen:
            raise RayUnitError(f"ray_cluster_ports: {name} and {seen[port]} are both {port}")
        if low <= port <= high:
            raise RayUnitError(f"ray_cluster_ports: {name} {port} lies in the worker range {low}-{high}")
        seen[port] = name
    return checked


def ray_unit(release: Mapping[str, Any], venv: str, temp_dir: str, ports: Mapping[str, Any],
             environment: Mapping[str, Any], dashboard: bool = False) -> Dict[str, Any]:
    """{role, argv, exec_start, env, environment} of the member's Ray unit. `release` is the member's release
    (its `group` section); `environment` the site's extra variables (the plan's win)."""
    group = release.get("group") or {}
    role, ray = group.get("role"), group.get("ray") or {}
    if role not in ("head", "worker"):
        raise RayUnitError(f"a Ray unit runs on a serving group's head or worker; this release's group role is "
                           f"{role!r} (a spare or a node outside any group runs none)")
    if not str(venv).startswith("/"):
        raise RayUnitError(f"the release venv {venv!r} is not an absolute path")
    if not str(temp_dir).startswith("/"):
        raise RayUnitError(f"Ray's temp dir {temp_dir!r} is not an absolute path")
    checked = check_ports(ports, int(ray.get("port") or 0))
    argv: List[str] = [f"{str(venv).rstrip('/')}/bin/ray", "start", "--block"]
    if role == "head":
        argv += ["--head", f"--port={ray['port']}"]
    else:
        argv += [f"--address={ray['address']}"]
    argv += [f"--node-ip-address={ray['node_ip_address']}", f"--num-gpus={int(ray['num_gpus'])}",
             f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    argv += [f"{flag}={checked[name]}" for name, flag in PORT_FLAGS]
    if role == "head":
        argv += [f"--include-dashboard={'true' if dashboard else 'false'}"]
        argv += [f"{flag}={checked[name]}" for name, flag in HEAD_PORT_FLAGS
                 if name != "dashboard" or dashboard]
    env = {str(k): str(v) for k, v in environment.items()}
    env.update({str(k): str(v) for k, v in (ray.get("env") or {}).items()})
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return {"role": role, "argv": argv, "exec_start": exec_start(argv), "env": env,
            "environment": [environment_assignment(key, env[key]) for key in sorted(env)]}
