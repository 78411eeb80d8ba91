"""NCCL check: run a short all-reduce sweep per planned replica, with the environment its unit will have.

Why (issue #18, the field notes): the planner derives NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 from the
PCIe topology (revive_plan.layout.nccl_env) and nothing proved it. On the notes' box 8-way TP hung at "connecting
to ..." until P2P was disabled; on NVLink the same variables halve TP throughput. This module proves the
plan on the node before the units switch. Used by library/nccl_check.py and tests/device/check_nccl.py; runs
on the node with the system python3 (3.9+, standard library only). The ranks run in the release venv's python
(torch.distributed). Package layout: spec.py (parameters, host access), worker.py (the rank program, as
text), ranks.py (environment, placement, running one group of ranks), topology.py (ACS/IOMMU facts); this
file compares runs and checks every replica.

Per replica (the plan's `replicas` entries):
1. One process per GPU of the replica, `world_size = len(gpus)`, started from WORKER_SOURCE (worker.py) with
   exactly the replica's `env` (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, NCCL_*, VLLM_*) over a systemd-like
   base (PATH, LANG) plus NCCL_DEBUG=INFO for the diagnosis. CPU placement as the unit's CPUAffinity=
   (sched_setaffinity before exec) and NUMA as its NUMAPolicy=bind (`numactl --membind`, when numactl exists).
   The ranks meet through a torch FileStore in a private directory (`file://` init method, no port).
2. Each rank checks one all-reduce's sum, then times `iterations` all-reduces per size after `warmup` ones
   (nccl-tests' defaults: 20 and 5), float32, in place. Per size: time = mean of the ranks' times (nccl-tests'
   `-a 1`), algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests doc/PERFORMANCE.md, AllReduce),
   GB/s = 1e9 bytes/s as nccl-tests prints them.
3. A hard deadline per run: a rank that fails makes the others stop (grace GRACE_S, then SIGKILL to each
   rank's process group); a run past its deadline is killed the same way. The reason says which ranks were
   in which phase (init = communicator set-up, where the notes' hang was) with the last lines of each rank's
   output (NCCL_DEBUG=INFO goes to stdout, flushed per line by NCCL).
4. The ranks report the environment and CPU affinity they saw and, on NCCL, the PCI bus id of their device:
   anything other than planned fails the run (the environment did not arrive, or CUDA_DEVICE_ORDER did not
   map CUDA's indices to the planned GPUs).
5. compare: a second run with the planner's P2P/SHM decision flipped (without the planned NCCL_* variables
   when it set them; with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 when it did not). A result that contradicts
   the planner's rule is a warning with both figures; the plan is never changed here.
6. On PCIe-only replicas (no NVLink), the facts behind a hang, read-only: ACS control on the PCIe bridges
   above the GPUs (`lspci -vvv -D` ACSCtl lines; NCCL troubleshooting, "PCI Access Control Services") and
   IOMMU groups (/sys/kernel/iommu_groups, the kernel command line's iommu words).

backend gloo runs the same code on CPU processes (devices ignored): the lab and the unit tests use it and
the result says simulated. NCCL's own variables are passed but mean nothing to gloo.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Dict, Optional, Sequence, Tuple

from ansible.module_utils.revive_nccl.ranks import (  # noqa: F401 - re-exported
    Placement,
    RunPlan,
    alternative,
    execute,
    placement,
    planned_disables,
    replica_runs,
    run_env,
    validate_replica,
)
from ansible.module_utils.revive_nccl.spec import (  # noqa: F401 - re-exported
    DEFAULT_SIZES,
    CheckSpec,
    Deps,
    NcclCheckError,
    busbw_factor,
    human_size,
    parse_size,
)
from ansible.module_utils.revive_nccl.topology import parse_lspci_acs, read_topology  # noqa: F401 - re-exported
from ansible.module_utils.revive_nccl.worker import WORKER_SOURCE  # noqa: F401 - re-exported

__all__ = ["DEFAULT_SIZES", "WORKER_SOURCE", "CheckSpec", "Deps", "NcclCheckError", "Placement", "RunPlan",
           "alternative", "busbw_factor", "check", "compare_runs", "describe", "execute", "human_size",
           "parse_lspci_acs", "parse_size", "pcie_only", "placement", "planned_disables", "read_topology",
           "replica_runs", "run_env", "validate_replica"]


def compare_runs(replica: Dict[str, Any], planned: Dict[str, Any], other: Dict[str, Any],
                 margin: float) -> Tuple[str, str, bool]:
    """(verdict, message, is a warning): does the flipped run contradict the planner's rule?"""
    disables = planned_disables(replica)
    rule = ("the planner disables P2P/SHM here (" + (f"no NVLink, paths cross {replica.get('slowest_path')}"
            if not replica.get("nvlink") else "NVLink") + ")") if disables else \
        ("the planner keeps P2P/SHM on here (" + ("NVLink" if replica.get("nvlink") else
                                                  f"slowest path {replica.get('slowest_path')}") + ")")
    if not planned["ok"]:
        if other["ok"]:
            return ("contradicted", f"the planned run failed but {other['description']} it passed (peak busbw "
                    f"{other['peak_busbw_gbps']:g} GB/s): {rule}, and this node says otherwise", True)
        return "both_failed", f"both runs failed ({other['description']}: {other['reason']})", False
    if not other["ok"]:
        if disables:
            return ("confirmed", f"{other['description']} the all-reduce failed ({other['reason']}): {rule}, and "
                    "this node agrees", False)
        return ("alternative_failed", f"{other['description']} the all-reduce failed ({other['reason']}); the planned "
                "run passed", False)
    if len(replica.get("gpus") or []) < 2:
        return ("no_peers", "world size 1: no rank to exchange data with, so P2P/SHM carry nothing and the figures "
                "measure a kernel launch (both runs passed)", False)
    common = {row["bytes"]: row for row in other["sizes"]}
    row = max((r for r in planned["sizes"] if r["bytes"] in common), key=lambda r: r["bytes"])
    alt = common[row["bytes"]]
    ratio = alt["algbw_gbps"] / row["algbw_gbps"] if row["algbw_gbps"] else 0.0
    figures = (f"at {row['size']}: planned busbw {row['busbw_gbps']:g} GB/s (algbw {row['algbw_gbps']:g}), "
               f"{other['description']} busbw {alt['busbw_gbps']:g} GB/s (algbw {alt['algbw_gbps']:g}), ratio "
               f"{ratio:.2f}")
    if ratio > 1 + margin:
        return ("contradicted", f"{other['description']} the all-reduce passed and was faster, {figures}: {rule}. "
                "The plan is unchanged; prove the faster variant under load before changing the rule (the notes' "
                "hang came with TP 8)", True)
    if ratio < 1 - margin:
        return "confirmed", f"the planned environment is faster, {figures}: {rule}, and this node agrees", False
    return "no_difference", f"no difference beyond {margin:.0%}, {figures}", False


# --- the whole check --------------------------------------------------------------------------------------

def _bus_ids(replica: Dict[str, Any], gpu: Optional[Dict[str, Any]]) -> Dict[int, Optional[str]]:
    by_index = {int(d["index"]): d.get("pci_bus_id") for d in (gpu or {}).get("devices") or []}
    return {int(g): by_index.get(int(g)) for g in replica.get("gpus") or []}


def pcie_only(replica: Dict[str, Any], gpu: Optional[Dict[str, Any]]) -> bool:
    """No NVLink between any two GPUs of the replica (the probe's topology matrix when given, else the plan's)."""
    if replica.get("nvlink"):
        return False
    matrix = ((gpu or {}).get("topology") or {}).get("matrix")
    members = [int(g) for g in replica.get("gpus") or []]
    if not matrix or max(members, default=0) >= len(matrix):
        return True
    return not any(str(matrix[a][b]).startswith("NV") for a in members for b in members if a != b)


def _topology_for(replica: Dict[str, Any], spec: CheckSpec, gpu: Optional[Dict[str, Any]], deps: Deps,
                  lspci_cache: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    if len(replica.get("gpus") or []) < 2 or not pcie_only(replica, gpu):
        return None
    if spec.simulated:
        return {"notes": ["simulated GPUs: this host's PCIe is not the planned server's; ACS/IOMMU not read"]}
    if "parsed" not in lspci_cache:
        tool = deps.which("lspci")
        lspci_cache["parsed"] = None
        if tool:
            rc, out, err = deps.run([tool, "-vvv", "-D"])
            lspci_cache["parsed"] = parse_lspci_acs(out) if rc == 0 else {}
            if rc != 0:
                lspci_cache["error"] = f"lspci -vvv -D failed (rc {rc}): {(err or out).strip()[-200:]}"
    facts = read_topology(_bus_ids(replica, gpu), deps, lspci_cache["parsed"])
    if lspci_cache.get("error"):
        facts["notes"].append(lspci_cache["error"])
    return facts


def describe(replicas: Sequence[Dict[str, Any]], spec: CheckSpec, deps: Deps,
             gpu: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Check mode: what would run, per replica and run (argv per rank, environment, placement); nothing starts."""
    spec.validate()
    would, lspci_cache = [], {}
    for replica in replicas:
        validate_replica(replica)
        entry: Dict[str, Any] = {"name": replica.get("name"), "gpus": list(replica["gpus"]),
                                 "world_size": len(replica["gpus"]), "backend": spec.backend,
                                 "simulated": spec.simulated}
        if len(replica["gpus"]) == 1 and spec.single_gpu == "skip":
            entry["skipped"] = "one GPU: no NCCL traffic to check"
            would.append(entry)
            continue
        place = placement(replica, spec.simulated, deps)
        entry["placement"] = place.as_dict()
        entry["runs"] = [{"label": r.label, "description": r.description, "env": r.own_env, "argv": r.argv}
                         for r in replica_runs(replica, spec, place)]
        entry["topology"] = _topology_for(replica, spec, gpu, deps, lspci_cache)
        would.append(entry)
    processes = sum(len(run["argv"]) for e in would for run in e.get("runs", []))
    return {"would_run": would, "python": spec.python, "python_found": os.access(spec.python, os.X_OK),
            "msg": f"check mode: nothing started; would run {processes} rank process(es) of {spec.python} "
                   f"({spec.backend}) over {len([e for e in would if 'runs' in e])} replica(s), sizes "
                   f"{', '.join(human_size(s) for s in spec.sizes)}, deadline {spec.timeout_s:g} s per run"}


def check(replicas: Sequence[Dict[str, Any]], spec: CheckSpec, deps: Deps,
          gpu: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run the check on every replica, one after the other. Raises NcclCheckError before starting anything."""
    spec.validate()
    for replica in replicas:
        validate_replica(replica)
    if not os.access(spec.python, os.X_OK):
        raise NcclCheckError(f"the release venv's python {spec.python} does not exist or is not executable: the "
                             "venv exists only after the vllm_runtime role ran; pass vllm_runtime_venv.python")
    places = {id(r): placement(r, spec.simulated, deps) for r in replicas if len(r["gpus"]) > 1 or
              spec.single_gpu == "run"}
    root = spec.work_dir or tempfile.mkdtemp(prefix="revive-nccl-")
    lspci_cache: Dict[str, Any] = {}
    results, warnings = [], []
    try:
        for replica in replicas:
            results.append(_check_replica(replica, spec, deps, gpu, places.get(id(replica)), root, lspci_cache))
            warnings.extend(results[-1]["warnings"])
    finally:
        if not spec.work_dir:
            shutil.rmtree(root, ignore_errors=True)
    failed = [r for r in results if not r["ok"]]
    checked = [r for r in results if not r["skipped"]]
    if failed:
        msg = "; ".join(f"{r['name']} (GPUs {r['gpus']}): {r['reason']}" for r in failed)
    else:
        msg = (f"{len(checked)} replica(s) passed the {spec.backend} all-reduce check" +
               "".join(f"; {r['name']}: peak busbw {r['run']['peak_busbw_gbps']:g} GB/s over {r['world_size']} "
                       "rank(s)" for r in checked) + (f" ({len(results) - len(checked)} skipped)"
                                                      if len(results) > len(checked) else ""))
    return {"ok": not failed, "simulated": spec.simulated, "backend": spec.backend, "python": spec.python,
            "replicas": results, "warning_messages": warnings, "msg": msg}


def _check_replica(replica: Dict[str, Any], spec: CheckSpec, deps: Deps, gpu: Optional[Dict[str, Any]],
                   place: Optional[Placement], root: str, lspci_cache: Dict[str, Any]) -> Dict[str, Any]:
    name, gpus = replica.get("name") or f"replica-{replica.get('index')}", list(replica["gpus"])
    out: Dict[str, Any] = {"name": name, "index": replica.get("index"), "gpus": gpus, "world_size": len(gpus),
                           "backend": spec.backend, "simulated": spec.simulated, "ok": True, "skipped": False,
                           "reason": None, "duration_s": 0.0, "run": None, "compare": None, "topology": None,
                           "placement": None, "warnings": [], "notes": []}
    if place is None:
        out.update(skipped=True, reason="one GPU: no NCCL traffic to check (single_gpu: skip)")
        return out
    out["placement"] = place.as_dict()
    out["topology"] = _topology_for(replica, spec, gpu, deps, lspci_cache)
    buses = list(_bus_ids(replica, gpu).values())
    runs = replica_runs(replica, spec, place)
    planned = execute(runs[0], spec, place, os.path.join(root, f"{name}-planned"), deps, buses)
    out["run"] = planned
    out["duration_s"] = planned["duration_s"]
    if len(runs) > 1:
        other = execute(runs[1], spec, place, os.path.join(root, f"{name}-alternative"), deps, buses)
        verdict, message, warn = compare_runs(replica, planned, other, spec.compare_margin)
        out["compare"] = dict(other, verdict=verdict, message=message)
        out["duration_s"] = round(out["duration_s"] + other["duration_s"], 3)
        (out["warnings"] if warn else out["notes"]).append(f"{name}: {message}")
    if not planned["ok"]:
        out["ok"] = False
        tail_rank = next((r["rank"] for r in planned["ranks"] if r.get("error")), 0)
        tail = planned.get("log_tail", {}).get(str(tail_rank), [])[-10:]
        facts = (out["topology"] or {}).get("summary")
        out["reason"] = (f"{planned['reason']}" + (f". Topology: {facts}" if facts else "") +
                         f". Last output of rank {tail_rank}: " + (" | ".join(tail) if tail else "(none)") +
                         ". Fix: see docs/nccl-check.md (what a hang in init means, and the NCCL variables)")
    return out
