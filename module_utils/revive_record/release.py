"""The release the units will run, built from the planner's release and the venv the runtime role built."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ansible.module_utils.revive_record import ReleaseError
from ansible.module_utils.revive_record.pinning import host_pinning
from ansible.module_utils.revive_record.systemd import (
    StartTiming,
    environment_assignment,
    exec_start,
    health_deadline,
    start_limit_interval,
)

ID_LENGTH = 12
IDENTITY_KEYS = ("vllm_version", "venv", "venv_stamp", "python", "model")


def release_id(release: Dict[str, Any]) -> str:
    """A digest of what the units run: venv (and its build), model (and its bytes), every replica's argv,
    environment and pinning. Timestamps and derived timing are not part of it."""
    identity = {key: release.get(key) for key in IDENTITY_KEYS}
    identity["replicas"] = [{key: replica.get(key) for key in ("name", "port", "argv", "env", "cpu_affinity",
                                                               "numa_node")}
                            for replica in release.get("replicas") or []]
    group = release.get("group")
    if group:  # a group member: its place in the cluster (a release without a group keeps the id it always had)
        identity["group"] = {"name": group.get("name"), "role": group.get("role"), "stage": group.get("stage"),
                             "ray": group.get("ray")}
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:ID_LENGTH]


def _model_path(args: Sequence[str]) -> Optional[str]:
    args = list(args)
    for index, word in enumerate(args):
        if word == "--model" and index + 1 < len(args):
            return args[index + 1]
        if word.startswith("--model="):
            return word.split("=", 1)[1]
    return None


@dataclass(frozen=True)
class HostView:
    """What the module read on the node."""

    name: str
    online_cpus: Tuple[int, ...] = ()
    numa_nodes: Tuple[int, ...] = ()
    venv_stamp: Optional[str] = None
    model_content_id: Optional[str] = None


def build_release(plan: Dict[str, Any], venv: str, host: HostView, timing: StartTiming,
                  extra_environment: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The release the units will run, from the planner's release (vllm_plan's `release`, the host fact
    revive_release) and the venv the runtime role built for it.

    ExecStart is the venv's python, the plan's entrypoint, then the replica's argv exactly as planned.
    The plan's environment wins over `extra_environment` (the role's defaults such as usage-stats opt-out).
    """
    group = plan.get("group") or None
    # A serving group's worker or spare runs no vLLM server itself (module_utils/revive_cluster.py): its release is
    # the venv and the model its Ray worker serves a stage from.
    without_server = bool(group) and group.get("role") in ("worker", "spare")
    for key in ("vllm_version", "entrypoint") + (() if without_server else ("replicas",)):
        if not plan.get(key):
            raise ReleaseError(f"the release for {host.name} has no {key!r}: pass the planner's release (host fact "
                               "revive_release from the preflight), not a partial dict")
    if not venv.startswith("/"):
        raise ReleaseError(f"the release venv {venv!r} is not an absolute path")
    python = f"{venv.rstrip('/')}/bin/python"
    simulated = bool((plan.get("gpu") or {}).get("simulated"))
    model = plan.get("model") or {}
    weight_bytes = int(model.get("weight_bytes") or 0)
    replicas: List[Dict[str, Any]] = []
    model_paths: Set[str] = set()
    names: Set[str] = set()
    ports: Set[int] = set()
    for replica in plan["replicas"]:
        name = str(replica.get("name") or "")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
            raise ReleaseError(f"replica name {name!r} cannot name a systemd unit")
        port = int(replica["port"])
        if name in names or port in ports:
            raise ReleaseError(f"replica {name} (port {port}) repeats a name or port of another replica")
        names.add(name)
        ports.add(port)
        args = [str(arg) for arg in replica.get("args") or []]
        path = _model_path(args)
        if path is None:
            raise ReleaseError(f"replica {name} has no --model in its argv {args}")
        model_paths.add(path)
        env = {str(k): str(v) for k, v in (extra_environment or {}).items()}
        env.update({str(k): str(v) for k, v in (replica.get("env") or {}).items()})
        argv = [python] + [str(word) for word in plan["entrypoint"]] + args
        pinning = host_pinning(replica, host.online_cpus, host.numa_nodes, simulated, host.name)
        tensor_parallel_size = int(replica.get("tensor_parallel_size") or plan.get("tensor_parallel_size") or 1)
        deadline = health_deadline(weight_bytes, tensor_parallel_size, timing)
        # A serving group's head first waits for its Ray cluster (roles/ray_cluster's gate as ExecStartPre=).
        gate = timing.ray_gate_seconds if group and group.get("role") == "head" else 0
        replicas.append({
            "name": name, "unit": f"{name}.service", "port": port, "argv": argv, "env": env,
            "exec_start": exec_start(argv),
            "environment": [environment_assignment(k, env[k]) for k in sorted(env)],
            "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES", ""),
            "gpus": list(replica.get("gpus") or []), "tensor_parallel_size": tensor_parallel_size,
            "cpu_affinity": pinning.cpu_affinity, "numa_node": pinning.numa_node, "pinning_note": pinning.note,
            "health_deadline_seconds": deadline, "ray_gate_seconds": gate,
            "start_timeout_seconds": gate + deadline + timing.slack_seconds,
            "start_limit_interval_seconds": start_limit_interval(gate + deadline + timing.slack_seconds,
                                                                 timing.restart_seconds, timing.start_limit_burst),
        })
    if without_server:
        path = _model_path(plan.get("args") or [])
        if path is None:
            raise ReleaseError(f"the release of {host.name} (serving group {group.get('name')!r}, "
                               f"{group.get('role')}) has no --model in the group's argv {plan.get('args')}")
        model_paths.add(path)
    if len(model_paths) != 1:
        raise ReleaseError(f"the replicas load different models {sorted(model_paths)}; a release serves one model")
    release = {
        "vllm_version": str(plan["vllm_version"]), "venv": venv.rstrip("/"), "python": python,
        "venv_stamp": host.venv_stamp,
        "model": {"path": model_paths.pop(), "content_id": host.model_content_id, "weight_bytes": weight_bytes},
        "args": replicas[0]["argv"][1 + len(plan["entrypoint"]):] if replicas else [str(a) for a in plan["args"]],
        "replicas": replicas, "simulated": simulated,
    }
    if group:
        release["group"] = group
    release["id"] = release_id(release)
    return release


