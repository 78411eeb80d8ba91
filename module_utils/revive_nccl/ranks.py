"""NCCL check: what each rank process gets (environment, CPU/NUMA placement, argv) and running one group."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible.module_utils.revive_record import ReleaseError
from ansible.module_utils.revive_record.pinning import parse_cpu_list
from ansible.module_utils.revive_topology import format_cpu_list
from ansible.module_utils.revive_nccl.spec import (
    GRACE_S,
    PLANNER_VARS,
    POLL_S,
    SEEN_PREFIXES,
    SYSTEMD_PATH,
    CheckSpec,
    Deps,
    NcclCheckError,
    _read,
    busbw_factor,
    human_size,
)
from ansible.module_utils.revive_nccl.topology import normalize_bdf

_PHASE = re.compile(r"^REVIVE_NCCL rank=(\d+) phase=(\S+)$")
_CHANNEL = re.compile(r"NCCL INFO Channel [\d/]+ ?: .*? via (\S+)")


@dataclass
class Placement:
    cpus: Tuple[int, ...] = ()          # the affinity applied to every rank; () = none
    numa_node: Optional[int] = None     # memory bound with numactl to this node; None = not bound
    numactl: Optional[str] = None
    notes: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return {"cpu_list": format_cpu_list(self.cpus), "applied": bool(self.cpus), "numa_node": self.numa_node,
                "numactl": self.numactl, "notes": list(self.notes)}


def placement(replica: Dict[str, Any], simulated: bool, deps: Deps) -> Placement:
    """The unit's CPUAffinity=/NUMAPolicy=bind for the ranks (revive_record.pinning.host_pinning's rules)."""
    name = replica.get("name", "replica")
    try:
        planned = [int(c) for c in replica.get("cpus") or []] or parse_cpu_list(replica.get("cpu_list") or "")
    except ReleaseError as error:
        raise NcclCheckError(f"{name}: {error}") from error
    numa = replica.get("numa_node")
    if not planned:
        return Placement(notes=["the plan pins no CPUs for this replica (its GPUs span sockets): none applied"])
    text = format_cpu_list(planned)
    online = set(deps.online_cpus())
    missing = sorted(set(planned) - online)
    nodes = set(deps.numa_nodes())
    if missing or (numa is not None and int(numa) not in nodes):
        if simulated:
            return Placement(notes=[f"planned CPUs {text}, NUMA node {numa}: not applied, the GPUs are simulated and "
                                    "this host is not the planned server (the unit does the same)"])
        where = (f"CPUs {format_cpu_list(missing)}" if missing else f"NUMA node {numa}")
        raise NcclCheckError(f"{name}: the plan pins CPUs {text} (NUMA node {numa}) but this host has no {where} "
                             f"(online CPUs {format_cpu_list(online) or 'none'}, nodes {format_cpu_list(nodes)}): "
                             "the plan is for other hardware; run the preflight (probe and plan) on this host again")
    result = Placement(cpus=tuple(planned))
    if numa is not None:
        result.numactl = deps.which("numactl")
        if result.numactl:
            result.numa_node = int(numa)
        else:
            result.notes.append(f"numactl not found: memory not bound to NUMA node {numa} for the check (the unit "
                                "binds it with NUMAPolicy=bind); CPU affinity applied")
    return result


def base_environment(spec: CheckSpec) -> Dict[str, str]:
    if spec.base_env is not None:
        return dict(spec.base_env)
    return {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8"}


def run_env(replica: Dict[str, Any], spec: CheckSpec, drop: Sequence[str] = (),
            add: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(full environment of a rank, the variables the check set: the plan's, NCCL_DEBUG, extra_env)."""
    own = {k: str(v) for k, v in (replica.get("env") or {}).items() if k not in drop}
    own.update(add or {})
    if spec.nccl_debug and "NCCL_DEBUG" not in own:
        own["NCCL_DEBUG"] = spec.nccl_debug
    own.update({k: str(v) for k, v in spec.extra_env.items()})
    env = base_environment(spec)
    for key in [k for k in env if k.startswith(SEEN_PREFIXES)]:
        del env[key]        # only the plan and extra_env say NCCL_*/CUDA_*: nothing leaks in from the base
    env.update(own)
    return env, own


def planned_disables(replica: Dict[str, Any]) -> bool:
    env = replica.get("env") or {}
    return all(str(env.get(k)) == "1" for k in PLANNER_VARS)


def alternative(replica: Dict[str, Any]) -> Tuple[List[str], Dict[str, str], str]:
    """(variables to drop, to add, description) for the compare run: the planner's P2P/SHM decision flipped."""
    env = replica.get("env") or {}
    if planned_disables(replica):
        drop = sorted(k for k in env if k.startswith("NCCL_"))
        return drop, {}, f"without the planned {' '.join(f'{k}={env[k]}' for k in drop)}"
    return [], {k: "1" for k in PLANNER_VARS}, "with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 forced"


@dataclass
class RunPlan:
    label: str                  # planned | alternative
    description: str
    env: Dict[str, str]
    own_env: Dict[str, str]
    world_size: int
    argv: List[List[str]]       # per rank, with WORKER and SPEC standing for the files written at run time


def replica_runs(replica: Dict[str, Any], spec: CheckSpec, place: Placement) -> List[RunPlan]:
    gpus = list(replica.get("gpus") or [])
    prefix = [place.numactl, f"--membind={place.numa_node}"] if place.numactl and place.numa_node is not None else []
    argv = [prefix + [spec.python, "-u", "WORKER", "SPEC", str(rank)] for rank in range(len(gpus))]
    env, own = run_env(replica, spec)
    runs = [RunPlan("planned", "with the planned environment", env, own, len(gpus), argv)]
    if spec.compare:
        drop, add, description = alternative(replica)
        env, own = run_env(replica, spec, drop, add)
        runs.append(RunPlan("alternative", description, env, own, len(gpus), argv))
    return runs


def validate_replica(replica: Dict[str, Any]) -> None:
    name = replica.get("name", "replica")
    gpus = replica.get("gpus")
    if not gpus:
        raise NcclCheckError(f"{name}: the replica lists no gpus; pass the plan's replicas (revive_release.replicas)")
    visible = str((replica.get("env") or {}).get("CUDA_VISIBLE_DEVICES", ""))
    if [v.strip() for v in visible.split(",") if v.strip()] != [str(g) for g in gpus]:
        raise NcclCheckError(f"{name}: env CUDA_VISIBLE_DEVICES={visible!r} does not name its gpus {gpus}: the plan "
                             "is inconsistent; plan again (bin/revive plan, or the preflight)")


# --- running one group of ranks ---------------------------------------------------------------------------

def _tail(path: str, lines: int) -> List[str]:
    text = _read(path) or ""
    return [line for line in text.splitlines() if line.strip()][-lines:]


def _phase_from_log(path: str) -> Optional[str]:
    phase = None
    for line in (_read(path) or "").splitlines():
        match = _PHASE.match(line.strip())
        if match:
            phase = match.group(2)
    return phase


def _kill(procs: Sequence[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for proc in procs:
        proc.wait()


def _size_rows(results: List[Dict[str, Any]], world_size: int) -> List[Dict[str, Any]]:
    rows = []
    for entries in zip(*(r.get("sizes") or [] for r in results)):
        size = int(entries[0]["bytes"])
        seconds = sum(float(e["time_s"]) for e in entries) / len(entries)
        algbw = size / seconds / 1e9 if seconds > 0 else 0.0
        rows.append({"bytes": size, "size": human_size(size), "time_us": round(seconds * 1e6, 1),
                     "algbw_gbps": round(algbw, 3), "busbw_gbps": round(algbw * busbw_factor(world_size), 3)})
    return rows


def execute(run: RunPlan, spec: CheckSpec, place: Placement, directory: str, deps: Deps,
            expected_bus_ids: Sequence[Optional[str]] = ()) -> Dict[str, Any]:
    """Start the ranks of one run, wait for them within the deadline, and return the run's result."""
    os.makedirs(directory, exist_ok=True)
    worker = os.path.join(directory, "worker.py")
    with open(worker, "w", encoding="utf-8") as handle:
        handle.write(deps.worker_source)
    n = run.world_size
    results_paths = [os.path.join(directory, f"result-{rank}.json") for rank in range(n)]
    logs = [os.path.join(directory, f"rank-{rank}.log") for rank in range(n)]
    spec_path = os.path.join(directory, "spec.json")
    with open(spec_path, "w", encoding="utf-8") as handle:
        json.dump({"world_size": n, "backend": spec.backend,
                   "init_method": "file://" + os.path.join(directory, "store"),
                   "sizes": list(spec.sizes), "iterations": spec.iterations, "warmup": spec.warmup,
                   "timeout_s": spec.timeout_s, "devices": list(range(n)), "result_paths": results_paths,
                   "seen_prefixes": list(SEEN_PREFIXES)}, handle)
    cpus = set(place.cpus)
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    out: Dict[str, Any] = {"label": run.label, "description": run.description, "world_size": n,
                           "backend": spec.backend, "env": dict(run.own_env), "ok": False, "reason": None,
                           "sizes": [], "peak_busbw_gbps": None, "transports": [], "versions": {}, "ranks": []}
    started = deps.now()
    procs: List[subprocess.Popen] = []
    try:
        for rank in range(n):
            argv = [spec_path if a == "SPEC" else worker if a == "WORKER" else a for a in run.argv[rank]]
            with open(logs[rank], "wb") as log:
                procs.append(subprocess.Popen(argv, env=run.env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, cwd=directory, start_new_session=True,
                                              preexec_fn=preexec, close_fds=True))
    except (OSError, subprocess.SubprocessError) as error:
        _kill(procs)
        out["reason"] = f"could not start rank {len(procs)} ({' '.join(run.argv[len(procs)][:3])} ...): {error}"
        out["duration_s"] = round(deps.now() - started, 3)
        return out
    # Grace: once a rank failed (the others would wait for it) or every rank reported (only teardown is left),
    # the rest get GRACE_S to exit on their own before they are killed.
    deadline, grace, killed = started + spec.timeout_s, None, None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        now = deps.now()
        if grace is None and any(c not in (None, 0) for c in codes):
            grace = (now, "failure")
        elif grace is None and all(os.path.exists(path) for path in results_paths):
            grace = (now, "teardown")
        if grace is not None and now - grace[0] > GRACE_S:
            killed = grace[1]
        elif now > deadline:
            killed = "deadline"
        if killed:
            _kill(procs)
            break
        deps.sleep(POLL_S)
    out["duration_s"] = round(deps.now() - started, 3)
    ranks = []
    for rank, proc in enumerate(procs):
        result = json.loads(_read(results_paths[rank]) or "null") or {}
        ranks.append(dict(result, rank=rank, pid=proc.pid, rc=proc.returncode,
                          phase=_phase_from_log(logs[rank]) or result.get("phase") or "start"))
    out["ranks"] = [{k: r.get(k) for k in ("rank", "pid", "rc", "phase", "affinity", "device", "error")} for r in ranks]
    out["versions"] = ranks[0].get("versions") or {}
    channels = set()
    for log in logs:
        channels.update(_CHANNEL.findall(_read(log) or ""))
    out["transports"] = sorted(channels)
    if killed == "teardown" and all(r.get("ok") for r in ranks):
        out["notes"] = [f"every rank reported, then destroy_process_group did not return within {GRACE_S:g} s: "
                        f"rank(s) {[r['rank'] for r in ranks if r['rc'] == -signal.SIGKILL]} killed in teardown"]
    out["reason"] = _failure(run, spec, place, ranks, killed, expected_bus_ids)
    if out["reason"] is None:
        out["ok"] = True
        out["sizes"] = _size_rows(ranks, n)
        out["peak_busbw_gbps"] = max(row["busbw_gbps"] for row in out["sizes"])
    else:
        out["log_tail"] = {str(rank): _tail(logs[rank], spec.log_lines) for rank in range(n)}
    return out


def _failure(run: RunPlan, spec: CheckSpec, place: Placement, ranks: List[Dict[str, Any]], killed: Optional[str],
             expected_bus_ids: Sequence[Optional[str]]) -> Optional[str]:
    failed = [r for r in ranks if not r.get("ok")]
    errors = [r for r in failed if r.get("error") or (r["rc"] or 0) > 0]
    if killed == "deadline" and not errors:
        stuck = [r for r in failed if r["rc"] == -signal.SIGKILL]
        phases = sorted({r["phase"] for r in stuck})
        return (f"the all-reduce did not finish within the {spec.timeout_s:g} s deadline: rank(s) "
                f"{[r['rank'] for r in stuck]} were killed in phase {', '.join(phases)} (init = NCCL communicator "
                "set-up, where the notes' hang at 'connecting to' was; size=N = an all-reduce of N bytes)")
    if failed:
        first = (errors or failed)[0]
        why = first.get("error") or f"exited with status {first['rc']} without a result"
        others = [r["rank"] for r in failed if r is not first]
        also = f"; rank(s) {others} stopped too" + (" (killed)" if killed else "") if others else ""
        return f"rank {first['rank']} failed in phase {first['phase']}: {why}{also}"
    expected_env = {k: v for k, v in run.env.items() if k.startswith(SEEN_PREFIXES)}
    for r in ranks:
        if r.get("seen_env") != expected_env:
            return (f"rank {r['rank']} saw NCCL/CUDA variables {r.get('seen_env')} instead of {expected_env}: the "
                    "environment did not reach the process as planned")
        if place.cpus and sorted(r.get("affinity") or []) != sorted(place.cpus):
            return (f"rank {r['rank']} ran on CPUs {format_cpu_list(r.get('affinity') or [])} instead of the planned "
                    f"{format_cpu_list(place.cpus)}")
        want = expected_bus_ids[r["rank"]] if r["rank"] < len(expected_bus_ids) else None
        have = (r.get("device") or {}).get("pci_bus_id")
        if spec.backend == "nccl" and want and have and normalize_bdf(want) != normalize_bdf(have):
            return (f"rank {r['rank']} ran on the GPU at {have}, but the plan's GPU is at {want}: CUDA's device order "
                    "is not the probe's (CUDA_DEVICE_ORDER=PCI_BUS_ID missing?)")
    return None
