"""What the GPU nodes did during each level, from the samples of sampler.py: the verdict's node observations.

A level's span is its warm-up and measured window, `[window start - warm-up, window end]` on the wall clock
(summary.json's `clock_zero` + the level's window); the bench host and the nodes must share a clock (NTP on a real
fleet; the lab's containers share the kernel's). Per replica, over the span plus the last sample before it:

- restarts: the unit's `NRestarts` increase, or the number of times its `MainPID` changed, whichever is larger (a
  manual `systemctl restart` does not count in NRestarts; a restart between two samples still changes the PID);
- health failures: samples whose `GET /health` was not 200 (down, refusing, 5xx);
- counters backwards: consecutive samples where a `*_total` counter of `/metrics` went down (its process restarted);
- OOM lines: journal lines of the node's units or kernel that say out of memory, inside the span.

GPU balance over the measured window only (warm-up is uneven by nature): each GPU's mean utilisation; the spread
(max - min, as a share of 100 %) inside each replica's TP group, and between the replicas' means across the fleet
(the front door spreads the load; a replica whose GPUs work harder for the same share is degraded). The level's
`gpu_imbalance` is the largest of those spreads, named in `gpu_imbalance_where`. A long-lasting imbalance moves the
mean; a one-second spike does not.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple


class ObserveError(Exception):
    """A sample file cannot be used; the message names it."""


@dataclass
class NodeSamples:
    node: str
    header: Dict[str, Any]
    samples: List[Dict[str, Any]] = field(default_factory=list)
    journal: List[Dict[str, Any]] = field(default_factory=list)
    ended: Optional[float] = None


def load_samples(path: str) -> NodeSamples:
    """One node's sampler output (JSON lines)."""
    header, samples, journal, ended = None, [], [], None
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except ValueError as exc:
                    raise ObserveError(f"{path}:{number}: not JSON ({exc})") from None
                kind = entry.get("kind")
                if kind == "header":
                    header = entry
                elif kind == "sample":
                    samples.append(entry)
                elif kind == "journal":
                    journal.append(entry)
                elif kind == "end":
                    ended = entry.get("t")
    except OSError as exc:
        raise ObserveError(f"cannot read node samples {path}: {exc.strerror}") from None
    if header is None:
        raise ObserveError(f"{path}: no header line: not the output of `revive bench-sample`")
    samples.sort(key=lambda s: s["t"])
    return NodeSamples(header["node"], header, samples, journal, ended)


def level_spans(summary: Dict[str, Any]) -> List[Tuple[int, float, float, float]]:
    """(concurrency, span start, window start, window end) per level, wall-clock seconds."""
    zero = summary["clock_zero"]["wall_time"]
    warmup = summary.get("warmup_s") or 0.0
    return [(level["concurrency"], zero + level["window"][0] - warmup, zero + level["window"][0],
             zero + level["window"][1]) for level in summary["levels"]]


def _between(samples: List[Dict[str, Any]], start: float, end: float) -> List[Dict[str, Any]]:
    """The samples inside [start, end], preceded by the last one before start (the baseline) when there is one."""
    before = [s for s in samples if s["t"] < start]
    return before[-1:] + [s for s in samples if start <= s["t"] <= end]


def replica_events(samples: List[Dict[str, Any]], replica: str) -> Dict[str, Any]:
    """Restarts, health failures and counters that went backwards of one replica over consecutive samples."""
    states = [s["replicas"].get(replica) or {} for s in samples]
    restarts = [st.get("n_restarts") for st in states if st.get("n_restarts") is not None]
    nrestarts = (max(restarts) - restarts[0]) if restarts else None
    pids = [st.get("main_pid") for st in states]
    pid_changes = sum(1 for a, b in zip(pids, pids[1:]) if a and b and a != b)
    health = [st.get("health") for st in states[1:] or states]
    backwards: List[str] = []
    for a, b in zip(states, states[1:]):
        before, after = a.get("counters") or {}, b.get("counters") or {}
        backwards += [name for name, value in after.items() if name in before and value < before[name]]
    return {"restarts": max(nrestarts or 0, pid_changes),
            "nrestarts_delta": nrestarts, "pid_changes": pid_changes,
            "health_failures": sum(1 for h in health if h != 200), "health_samples": len(health),
            "counters_backwards": sorted(set(backwards))}


def gpu_means(samples: List[Dict[str, Any]]) -> Dict[str, float]:
    """Mean utilisation (%) per GPU over the samples that read it."""
    sums: Dict[str, List[float]] = {}
    for s in samples:
        for index, gpu in (s.get("gpus") or {}).items():
            if isinstance(gpu.get("util"), (int, float)):
                sums.setdefault(index, []).append(float(gpu["util"]))
    return {index: sum(values) / len(values) for index, values in sums.items()}


def observe_level(nodes: Sequence[NodeSamples], span_start: float, window_start: float, window_end: float
                  ) -> Optional[Dict[str, Any]]:
    """The node observation of one level across every node (verdict.judge's `node`), or None with no samples."""
    by_node: Dict[str, Any] = {}
    replica_means: Dict[str, float] = {}
    spreads: List[Tuple[float, str]] = []
    observed = False
    for node in nodes:
        span = _between(node.samples, span_start, window_end)
        if not [s for s in span if s["t"] >= span_start]:
            by_node[node.node] = None
            continue
        observed = True
        means = gpu_means([s for s in node.samples if window_start <= s["t"] <= window_end])
        replicas = {}
        for replica in node.header["replicas"]:
            events = replica_events(span, replica["name"])
            mine = [means[g] for g in replica["gpus"] if g in means]
            if mine:
                replica_means[f"{node.node}/{replica['name']}"] = sum(mine) / len(mine)
                spreads.append(((max(mine) - min(mine)) / 100.0,
                                f"inside {node.node}/{replica['name']} (GPUs {', '.join(replica['gpus'])})"))
            events["gpu_util_mean"] = {g: round(means[g], 1) for g in replica["gpus"] if g in means}
            replicas[replica["name"]] = events
        oom = [line for line in node.journal if span_start <= line["t"] <= window_end]
        by_node[node.node] = {"replicas": replicas, "oom_lines": len(oom), "oom_examples": [o["line"] for o in oom[:3]]}
    if not observed:
        return None
    if len(replica_means) > 1:
        spreads.append(((max(replica_means.values()) - min(replica_means.values())) / 100.0, "between replicas"))
    seen = [n for n in by_node.values() if n]
    events = [(f"{node}/{name}", r) for node, n in by_node.items() if n for name, r in n["replicas"].items()]
    worst = max(spreads, default=None)
    return {
        "restarts": sum(r["restarts"] or 0 for _, r in events),
        "restarted": sorted(name for name, r in events if r["restarts"]),
        "health_failures": sum(r["health_failures"] for _, r in events),
        "unhealthy": sorted(name for name, r in events if r["health_failures"]),
        "counters_backwards": sorted({c for _, r in events for c in r["counters_backwards"]}),
        "oom_lines": sum(n["oom_lines"] for n in seen),
        "gpu_imbalance": round(worst[0], 4) if worst else None,
        "gpu_imbalance_where": worst[1] if worst else None,
        "replica_gpu_util_mean": {k: round(v, 1) for k, v in sorted(replica_means.items())},
        "nodes_not_observed": sorted(name for name, n in by_node.items() if n is None),
        "by_node": by_node,
    }


def observe(summary: Dict[str, Any], nodes: Sequence[NodeSamples]) -> Dict[int, Optional[Dict[str, Any]]]:
    """{concurrency: observation} for every level of a bench summary."""
    return {c: observe_level(nodes, a, ws, we) for c, a, ws, we in level_spans(summary)}


def gpu_series(nodes: Sequence[NodeSamples]) -> Dict[str, List[Tuple[float, float]]]:
    """{"node/gpu": [(wall time, utilisation %)]} for the utilisation plot."""
    series: Dict[str, List[Tuple[float, float]]] = {}
    for node in nodes:
        for s in node.samples:
            for index, gpu in (s.get("gpus") or {}).items():
                if isinstance(gpu.get("util"), (int, float)):
                    series.setdefault(f"{node.node}/{index}", []).append((s["t"], float(gpu["util"])))
    return series
