"""A bench report judged again with what the nodes saw: node observations, a verdict per replica and node, outliers.

`revive bench` on the bench host judges what the client saw; playbooks/benchmark.yml then brings the report and
every node's samples (sampler.py) to the controller, where `revive bench-judge` (this module) reads them:

1. every level's node observation (observe.py) goes into its verdict (verdict.judge's rules 1 and 3: a restart, an
   unhealthy replica, counters that went backwards or an OOM line fail the level whatever the latencies were; a
   GPU spread over the tolerance fails it);
2. fleet mode: each request is attributed to the replica that served it (the front door's `X-Revive-Server`
   header, recorded as `served_by`; else the URL it was sent to) and gets a verdict per replica and per node from
   that replica's requests and its node's observation (no achieved-concurrency rule there: the front door decides
   a replica's share). Its P95 bounds are those of its own requests, so a replica needs its own completions;
3. outliers: a replica whose TPOT p50 (decode speed: what a throttled or degraded V100 loses first) or E2E p50 is
   more than `outlier_margin` above the median of its peers' in the same level is flagged, with both numbers.

The recommended concurrency and the exit code are recomputed from the new verdicts; the report files are
rewritten (requests.jsonl is left as it is).
"""
from __future__ import annotations

import json
import os
import statistics
from typing import Any, Dict, List, Optional, Sequence

from .load import measured
from .metrics import aggregate, tokens_between
from .observe import NodeSamples, observe
from .verdict import FAIL, INCONCLUSIVE, INVALID, PASS, Bounds, exit_code, judge, knees, recommend

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
ORDER = {PASS: 0, INCONCLUSIVE: 1, INVALID: 2, FAIL: 3}


class ReviewError(Exception):
    """The report directory cannot be reviewed; the message says why."""


def load_report(directory: str) -> tuple:
    """(summary, records) of a `revive bench --out` directory."""
    try:
        with open(os.path.join(directory, "summary.json"), encoding="utf-8") as handle:
            summary = json.load(handle)
        with open(os.path.join(directory, "requests.jsonl"), encoding="utf-8") as handle:
            records = [json.loads(line) for line in handle if line.strip()]
    except OSError as exc:
        raise ReviewError(f"{directory}: not a bench report ({exc.filename}: {exc.strerror})") from None
    except ValueError as exc:
        raise ReviewError(f"{directory}: a report file is not JSON: {exc}") from None
    return summary, records


def attribution(record: Dict[str, Any]) -> str:
    """The replica that served a request: the front door's served-by header, else the target URL."""
    return record.get("served_by") or record["target"]


def _replica_of(label: str, nodes: Sequence[NodeSamples]) -> tuple:
    """(node, replica name) a label stands for: the front door's server name `<node>-<replica>` (node1-vllm-0), a
    replica's own name, or a URL `http://node1:8000` at a replica's port; (None, None) for anything else (the front
    door's URL when no served-by header was recorded). With one node's samples, a loopback URL is that node's (the
    hand-over's SLO gate benches a node on the node, module_utils/revive_slo_gate.py)."""
    host_port = label.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    local = len(nodes) == 1 and host in LOOPBACK
    for node in nodes:
        for replica in node.header["replicas"]:
            if label in (f"{node.node}-{replica['name']}", replica["name"]) or (
                    (host == node.node or local) and port == str(replica["port"])):
                return node, replica["name"]
    return None, None


def _replica_observation(level_obs: Optional[Dict[str, Any]], node: Optional[NodeSamples], name: Optional[str]
                         ) -> Optional[Dict[str, Any]]:
    """One replica's share of a level's node observation (its node's OOM lines, its own restarts and GPUs)."""
    if level_obs is None or node is None or not level_obs["by_node"].get(node.node):
        return None
    seen = level_obs["by_node"][node.node]
    events = seen["replicas"].get(name)
    if events is None:
        return None
    means = list(events["gpu_util_mean"].values())
    label = f"{node.node}/{name}"
    return {"restarts": events["restarts"], "restarted": [label] if events["restarts"] else [],
            "health_failures": events["health_failures"], "unhealthy": [label] if events["health_failures"] else [],
            "counters_backwards": events["counters_backwards"], "oom_lines": seen["oom_lines"],
            "gpu_imbalance": round((max(means) - min(means)) / 100.0, 4) if means else None,
            "gpu_imbalance_where": f"inside {label}" if means else None}


def per_replica(level: Dict[str, Any], records: List[Dict[str, Any]], summary: Dict[str, Any], bounds: Bounds,
                nodes: Sequence[NodeSamples], level_obs: Optional[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """A verdict per replica of one level, from its own requests and its node's observation."""
    start, end = level["window"]
    mine_all: Dict[str, List[Dict[str, Any]]] = {}
    for record in records:
        mine_all.setdefault(attribution(record), []).append(record)
    out = {}
    for label, mine in sorted(mine_all.items()):
        stats = aggregate(measured(mine, start, end), end - start, tokens_between(mine, start, end),
                          summary["slo"]["quantile"], summary["slo"]["confidence"],
                          time_scale=level["stats"].get("time_scale", 1.0),
                          exclude_queue=bool(summary.get("exclude_queue")))
        stats["dispatch_lag_s"] = level["stats"]["dispatch_lag_s"]
        stats["achieved_concurrency"] = None
        node, name = _replica_of(label, nodes)
        obs = _replica_observation(level_obs, node, name)
        verdict = judge(stats, level["concurrency"], bounds, closed_loop=False,
                        ignore_eos=summary.get("ignore_eos", False), node=obs)
        out[label] = {"node": node.node if node else None, "verdict": verdict.as_dict(), "node_observation": obs,
                      "requests": stats["requests"], "completed": stats["completed"], "error_rate": stats["error_rate"],
                      "ttft_s": stats["ttft_s"], "e2e_s": stats["e2e_s"], "tpot_s": stats["tpot_s"],
                      "e2e_p95_bounds": stats["e2e_p95_bounds"],
                      "output_throughput_tok_s": stats["output_throughput_tok_s"]}
    return out


def outliers(replicas: Dict[str, Dict[str, Any]], margin: float) -> List[Dict[str, Any]]:
    """Replicas slower than the median of their peers by more than `margin` (TPOT p50, E2E p50)."""
    flagged = []
    for metric in ("tpot_s", "e2e_s"):
        values = {label: r[metric]["p50"] for label, r in replicas.items() if r[metric].get("p50")}
        for label, value in sorted(values.items()):
            peers = [v for other, v in values.items() if other != label]
            if not peers:
                continue
            median = statistics.median(peers)
            if value > (1.0 + margin) * median:
                flagged.append({"replica": label, "node": replicas[label]["node"], "metric": f"{metric}.p50",
                                "value": value, "peers_median": median, "ratio": round(value / median, 3),
                                "margin": margin})
    return flagged


def per_node(replicas: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """A node's verdict is the worst of its replicas' (FAIL > INVALID > INCONCLUSIVE > PASS)."""
    nodes: Dict[str, Dict[str, Any]] = {}
    for label, replica in replicas.items():
        name = replica["node"] or "unknown"
        entry = nodes.setdefault(name, {"verdict": PASS, "replicas": []})
        entry["replicas"].append(label)
        if ORDER[replica["verdict"]["verdict"]] > ORDER[entry["verdict"]]:
            entry["verdict"] = replica["verdict"]["verdict"]
    return nodes


def per_replica_limit(summary: Dict[str, Any]) -> Optional[int]:
    """The front door's per-server limit that keeps the fleet at the recommended concurrency: that level's
    concurrency shared by the replicas that served it (rounded down, so the total stays within what passed);
    None without a recommendation or when no request could be attributed to a replica of a sampled node.
    It is what `frontdoor_server_maxconn` takes (excess requests then queue at the front door, not in vLLM)."""
    recommended = summary.get("recommended_concurrency")
    level = next((lv for lv in summary["levels"] if lv["concurrency"] == recommended), None)
    if level is None:
        return None
    replicas = [r for r in (level.get("replicas") or {}).values() if r.get("node")]
    return max(1, recommended // len(replicas)) if replicas else None


def review(summary: Dict[str, Any], records: List[Dict[str, Any]], nodes: Sequence[NodeSamples],
           outlier_margin: float = 0.25, max_gpu_imbalance: Optional[float] = None) -> Dict[str, Any]:
    """The summary judged again with the nodes' samples (returns a new summary)."""
    summary = json.loads(json.dumps(summary))
    bound_args = dict(summary["bounds"])
    if max_gpu_imbalance is not None:
        bound_args["max_gpu_imbalance"] = max_gpu_imbalance
    bounds = Bounds(**bound_args)
    summary["bounds"] = bound_args
    observations = observe(summary, nodes) if nodes else {}
    closed = not summary.get("mode", "").startswith("open loop")
    for level in summary["levels"]:
        obs = observations.get(level["concurrency"])
        level["node"] = obs
        level["verdict"] = judge(level["stats"], level["concurrency"], bounds, closed_loop=closed,
                                 ignore_eos=summary.get("ignore_eos", False), node=obs).as_dict()
        mine = [r for r in records if r.get("level") == level["concurrency"]]
        level["replicas"] = per_replica(level, mine, summary, bounds, nodes, obs)
        level["nodes"] = per_node(level["replicas"])
        level["outliers"] = outliers(level["replicas"], outlier_margin)
    summary["verdicts"] = {str(level["concurrency"]): level["verdict"]["verdict"] for level in summary["levels"]}
    summary["recommended_concurrency"] = recommend(summary["levels"])
    summary["recommended_per_replica"] = per_replica_limit(summary)
    summary["knees"] = (knees(summary["levels"], "ttft_s", "p50", bounds.knee_elasticity)
                        + knees(summary["levels"], "e2e_s", "p95", bounds.knee_elasticity))
    summary["exit_code"] = exit_code(list(summary["verdicts"].values()))
    summary["review"] = {"nodes": [n.node for n in nodes], "outlier_margin": outlier_margin,
                         "node_headers": {n.node: {k: v for k, v in n.header.items() if k != "kind"} for n in nodes}}
    return summary

