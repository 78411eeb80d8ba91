"""Verdicts per level (PASS / FAIL / INCONCLUSIVE / INVALID), the knee, the recommended concurrency, the exit code.

Rules, in order (docs/bench.md "Verdict"); every rule that applies adds its reason, the first verdict wins:
1. FAIL on a node observation: a service restart or an OOM line during the level fails it whatever the client saw.
2. INVALID when the client was the bottleneck (dispatch lag p99 over its bound, achieved concurrency under its
   share of the target in a closed loop) or, with ignore_eos, more than the allowed share of answers ended before
   max_tokens (early EOS makes the P95 look better than it is). An INVALID level's latencies say nothing.
3. FAIL when the error rate is over its limit, the GPU imbalance over its tolerance, or the one-sided LOWER
   confidence bound of P95 E2E is above the SLO (the true P95 is over it, at the stated confidence).
4. PASS when the one-sided UPPER confidence bound of P95 E2E is within the SLO.
5. INCONCLUSIVE otherwise: too few completions for the bound (stats.min_completions), or the bounds straddle it.
Node observations (restarts, OOM lines, GPU balance) are an optional dict per level; without one those rules are
listed under "not_checked" in the verdict, never passed in silence.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

PASS, FAIL, INCONCLUSIVE, INVALID = "PASS", "FAIL", "INCONCLUSIVE", "INVALID"
NODE_RULES = ("server restart", "out of memory", "GPU balance")


@dataclass
class Bounds:
    slo_e2e_p95_s: float
    max_dispatch_lag_p99_s: float = 0.050
    min_achieved_share: float = 0.95
    max_error_rate: float = 0.01
    max_early_eos_share: float = 0.05
    max_gpu_imbalance: float = 0.20     # max - min utilisation share, when a node observation gives it
    knee_elasticity: float = 0.5


@dataclass
class Verdict:
    verdict: str
    reasons: List[str] = field(default_factory=list)
    not_checked: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _node_rules(node: Optional[Dict[str, Any]], bounds: Bounds) -> tuple:
    """(fail reasons from restarts/OOM, fail reasons from GPU balance, rules not checked)."""
    if node is None:
        return [], [], [f"{rule}: no node observation" for rule in NODE_RULES]
    hard, balance, unchecked = [], [], []
    if node.get("restarts") is None:
        unchecked.append("server restart: not observed")
    elif node["restarts"] > 0:
        hard.append(f"server restart: {node['restarts']} during the level{_named(node.get('restarted'))}")
    if node.get("health_failures"):
        hard.append(f"server unhealthy: {node['health_failures']} /health sample(s) not 200 during the level"
                    f"{_named(node.get('unhealthy'))}")
    if node.get("counters_backwards"):
        hard.append(f"server restart: /metrics counters went backwards ({', '.join(node['counters_backwards'])})")
    if node.get("oom_lines") is None:
        unchecked.append("out of memory: not observed")
    elif node["oom_lines"] > 0:
        hard.append(f"out of memory: {node['oom_lines']} journal line(s)")
    if node.get("gpu_imbalance") is None:
        unchecked.append("GPU balance: not observed")
    elif node["gpu_imbalance"] > bounds.max_gpu_imbalance:
        where = f" {node['gpu_imbalance_where']}" if node.get("gpu_imbalance_where") else ""
        balance.append(f"GPU balance: spread {node['gpu_imbalance']:.2f}{where} > {bounds.max_gpu_imbalance:.2f}")
    if node.get("nodes_not_observed"):
        unchecked.append(f"nodes not observed: {', '.join(node['nodes_not_observed'])}")
    return hard, balance, unchecked


def _named(names: Optional[Sequence[str]]) -> str:
    return f" ({', '.join(names)})" if names else ""


def judge(stats: Dict[str, Any], target_concurrency: int, bounds: Bounds, closed_loop: bool = True,
          ignore_eos: bool = False, node: Optional[Dict[str, Any]] = None) -> Verdict:
    """The verdict of one level from its metrics.aggregate()+load.summarize() stats."""
    hard, balance, unchecked = _node_rules(node, bounds)
    if hard:
        return Verdict(FAIL, hard, unchecked)
    invalid = []
    lag = stats["dispatch_lag_s"]["p99"]
    if lag is not None and lag > bounds.max_dispatch_lag_p99_s:
        invalid.append(f"client bottleneck: dispatch lag p99 {lag * 1000:.1f} ms > "
                       f"{bounds.max_dispatch_lag_p99_s * 1000:g} ms")
    achieved = stats["achieved_concurrency"]
    if closed_loop and achieved < bounds.min_achieved_share * target_concurrency:
        invalid.append(f"client bottleneck: achieved concurrency {achieved:.2f} < "
                       f"{bounds.min_achieved_share:.0%} of {target_concurrency}")
    if ignore_eos and stats["early_eos_share"] > bounds.max_early_eos_share:
        invalid.append(f"early EOS: {stats['early_eos']} of {stats['completed']} answers ended before max_tokens "
                       f"({stats['early_eos_share']:.1%} > {bounds.max_early_eos_share:.0%}) despite ignore_eos")
    if invalid:
        return Verdict(INVALID, invalid, unchecked)
    failing = list(balance)
    if stats["error_rate"] > bounds.max_error_rate:
        failing.append(f"error rate {stats['error_rate']:.1%} > {bounds.max_error_rate:.1%} "
                       f"({stats['failed']} of {stats['requests']}: {_errors(stats['errors'])})")
    p95 = stats["e2e_s"]["p95"]
    b = stats["e2e_p95_bounds"]
    conf = f"{b['confidence']:.0%}"
    if b["lower"] is not None and b["lower"] > bounds.slo_e2e_p95_s:
        failing.append(f"P95 E2E over the SLO: its {conf} lower bound {b['lower']:.3f} s (X_({b['lower_rank']}) of "
                       f"{b['n']}) > {bounds.slo_e2e_p95_s:g} s; point estimate {p95:.3f} s")
    if failing:
        return Verdict(FAIL, failing, unchecked)
    if b["upper"] is None:
        return Verdict(INCONCLUSIVE, [f"too few completions: {b['n']} < {b['min_completions']} needed for a "
                                      f"{conf} upper bound of P95 E2E"], unchecked)
    if b["upper"] <= bounds.slo_e2e_p95_s:
        return Verdict(PASS, [f"P95 E2E within the SLO: its {conf} upper bound {b['upper']:.3f} s "
                              f"(X_({b['upper_rank']}) of {b['n']}) <= {bounds.slo_e2e_p95_s:g} s; point estimate "
                              f"{p95:.3f} s"], unchecked)
    return Verdict(INCONCLUSIVE, [f"P95 E2E undecided: {conf} bounds {b['lower']:.3f} s .. {b['upper']:.3f} s "
                                  f"straddle the SLO {bounds.slo_e2e_p95_s:g} s; run longer"], unchecked)


def _errors(errors: Dict[str, int]) -> str:
    return ", ".join(f"{reason} x{count}" for reason, count in sorted(errors.items(), key=lambda kv: -kv[1]))


def knees(levels: Sequence[Dict[str, Any]], metric: str, key: str, threshold: float) -> List[Dict[str, Any]]:
    """Steps between consecutive levels (by concurrency) whose elasticity ln(m2/m1) / ln(c2/c1) is at least
    `threshold`: the metric grows at least that fast relative to the load (0.5: doubling the load raises it by
    >= 41 %). The field report's first knee, TTFT P50 2.1 s -> 3.9 s for 16 -> 32, is 0.89."""
    points = sorted((level["concurrency"], (level["stats"][metric] or {}).get(key)) for level in levels
                    if level["verdict"]["verdict"] != INVALID)
    steps = []
    for (c1, m1), (c2, m2) in zip(points, points[1:]):
        if not m1 or not m2 or c2 <= c1:
            continue
        elasticity = math.log(m2 / m1) / math.log(c2 / c1)
        if elasticity >= threshold:
            steps.append({"metric": f"{metric}.{key}", "from": c1, "to": c2, "before": m1, "after": m2,
                          "elasticity": round(elasticity, 3)})
    return steps


def recommend(levels: Sequence[Dict[str, Any]]) -> Optional[int]:
    """The highest concurrency whose level passed; None when none did."""
    passed = [level["concurrency"] for level in levels if level["verdict"]["verdict"] == PASS]
    return max(passed) if passed else None


def exit_code(verdicts: Sequence[str]) -> int:
    """0 every level PASS, 1 some level FAIL, 3 some level INCONCLUSIVE/INVALID and none FAIL."""
    if any(v == FAIL for v in verdicts):
        return 1
    if verdicts and all(v == PASS for v in verdicts):
        return 0
    return 3
