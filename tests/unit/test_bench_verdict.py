"""revive bench's verdict table, knee and recommendation (module_utils/revive_bench/verdict.py, docs/bench.md
"Verdict"): PASS / FAIL / INCONCLUSIVE / INVALID, node rules reported as not checked when nobody observed them."""
from __future__ import annotations

import pytest

from ansible.module_utils.revive_bench import metrics
from ansible.module_utils.revive_bench.verdict import (FAIL, INCONCLUSIVE, INVALID, PASS, Bounds, exit_code, judge,
                                                       knees, recommend)


def level_stats(e2e_values, failed=0, lag_p99=0.001, achieved=8.0, early=0, max_tokens=200):
    records = []
    for n, e2e in enumerate(e2e_values):
        tokens = max_tokens - 1 if n < early else max_tokens
        records.append({"sent": 0.0, "events": [[0.1, 1], [e2e, tokens - 1]], "ok": True, "max_tokens": max_tokens,
                        "ignore_eos": True, "usage": {"completion_tokens": tokens}, "error": None})
    records += [{"sent": 0.0, "events": [], "ok": False, "error": "HTTP 503: x", "max_tokens": max_tokens}] * failed
    stats = metrics.aggregate(records, 60.0, 0)
    stats["dispatch_lag_s"] = {"p50": lag_p99 / 2, "p99": lag_p99, "max": lag_p99}
    stats["achieved_concurrency"] = achieved
    return stats


SLO = Bounds(slo_e2e_p95_s=12.0)
ALL_NODE = {"restarts": 0, "oom_lines": 0, "gpu_imbalance": 0.05}


@pytest.mark.parametrize("name, stats, kwargs, verdict, words", [
    ("well under", level_stats([5.0] * 100), {}, PASS, "upper bound 5.000 s (X_(99) of 100) <= 12 s"),
    ("well over", level_stats([15.0] * 100), {}, FAIL, "lower bound 15.000 s (X_(91) of 100) > 12 s"),
    ("too few", level_stats([1.0] * 58), {}, INCONCLUSIVE, "58 < 59 needed"),
    # ranks 91..99 straddle 12 s: X_(91) = 11.5, X_(99) = 12.5
    ("straddles", level_stats([1.0] * 90 + [11.5] * 5 + [12.5] * 5), {}, INCONCLUSIVE, "straddle the SLO 12 s"),
    ("lagging client", level_stats([5.0] * 100, lag_p99=0.08), {}, INVALID, "dispatch lag p99 80.0 ms > 50 ms"),
    ("short of target", level_stats([5.0] * 100, achieved=7.0), {}, INVALID, "achieved concurrency 7.00 < 95% of 8"),
    ("open loop", level_stats([5.0] * 100, achieved=3.0), {"closed_loop": False}, PASS, "upper bound"),
    ("early EOS", level_stats([5.0] * 100, early=10), {"ignore_eos": True}, INVALID, "10 of 100 answers ended"),
    ("early EOS, not asked", level_stats([5.0] * 100, early=10), {}, PASS, "upper bound"),
    ("errors", level_stats([5.0] * 98, failed=2), {}, FAIL, "error rate 2.0% > 1.0% (2 of 100: HTTP 503 x2)"),
    ("restart beats a lagging client", level_stats([5.0] * 100, lag_p99=1.0), {"node": {**ALL_NODE, "restarts": 1}},
     FAIL, "server restart: 1 during the level"),
    ("OOM", level_stats([5.0] * 100), {"node": {**ALL_NODE, "oom_lines": 2}}, FAIL, "out of memory: 2"),
    ("imbalance", level_stats([5.0] * 100), {"node": {**ALL_NODE, "gpu_imbalance": 0.3}}, FAIL, "spread 0.30 > 0.20"),
])
def test_verdict_table(name, stats, kwargs, verdict, words):
    result = judge(stats, 8, SLO, **kwargs)
    assert result.verdict == verdict, (name, result)
    assert any(words in reason for reason in result.reasons), (name, result.reasons)


def test_node_rules_without_observations_are_listed_not_passed():
    result = judge(level_stats([5.0] * 100), 8, SLO)
    assert result.verdict == PASS
    assert result.not_checked == ["server restart: no node observation", "out of memory: no node observation",
                                  "GPU balance: no node observation"]
    assert judge(level_stats([5.0] * 100), 8, SLO, node=ALL_NODE).not_checked == []
    partial = judge(level_stats([5.0] * 100), 8, SLO, node={"restarts": 0})
    assert partial.not_checked == ["out of memory: not observed", "GPU balance: not observed"]


def level(concurrency, verdict, ttft_p50):
    return {"concurrency": concurrency, "verdict": {"verdict": verdict}, "stats": {"ttft_s": {"p50": ttft_p50}}}


def test_knee_is_the_step_where_ttft_grows_faster_than_the_load():
    # the field report: 16 -> 32 takes TTFT P50 from 2.1 s to 3.9 s, elasticity ln(3.9/2.1)/ln 2 = 0.893
    levels = [level(8, PASS, 1.9), level(16, PASS, 2.1), level(32, PASS, 3.9), level(64, INVALID, 30.0)]
    found = knees(levels, "ttft_s", "p50", 0.5)
    assert [(k["from"], k["to"], k["elasticity"]) for k in found] == [(16, 32, 0.893)]
    assert knees(levels, "ttft_s", "p50", 0.9) == []


def test_recommendation_is_the_highest_passing_level():
    assert recommend([level(8, PASS, 1), level(16, PASS, 1), level(32, PASS, 1), level(64, FAIL, 1)]) == 32
    assert recommend([level(8, INCONCLUSIVE, 1), level(16, FAIL, 1)]) is None


@pytest.mark.parametrize("verdicts, code", [([PASS, PASS], 0), ([PASS, FAIL, INVALID], 1), ([PASS, INCONCLUSIVE], 3),
                                            ([INVALID], 3), ([], 3)])
def test_exit_codes(verdicts, code):
    assert exit_code(verdicts) == code
