"""revive bench's load levels against the scripted server (module_utils/revive_bench/load.py): a closed loop holds
its concurrency, every level sends the same prompt sequence, several targets share the load round robin, and a
seeded open loop is reproducible."""
from __future__ import annotations

import asyncio

import pytest
from fake_openai import Answer, FakeServer

from ansible.module_utils.revive_bench.client import Target
from ansible.module_utils.revive_bench.load import LevelConfig, Workload, run_level, summarize
from ansible.module_utils.revive_bench.prompts import Prompt, order


def workload(ports):
    targets = [Target("http", "127.0.0.1", port) for port in ports]
    prompts = [Prompt(f"q{n}", [{"role": "user", "content": f"question {n}"}]) for n in range(10)]
    return Workload(targets=targets, expect_done={t.label: True for t in targets},
                    include_usage={t.label: True for t in targets}, model="tiny", prompts=prompts,
                    order=order(len(prompts), 7))


def level(ports, **config):
    settings = {"concurrency": 3, "duration": 0.8, "warmup": 0.2, "max_tokens": 8, "timeout": 5.0}
    settings.update(config)
    return asyncio.run(run_level(workload(ports), LevelConfig(**settings)))


def slow(number, body):
    return Answer(tokens=5, token_delay=0.02)


def test_a_closed_loop_level_holds_its_concurrency_and_excludes_warmup_and_drain():
    events = []
    with FakeServer(answer_for=slow) as fake:
        result = asyncio.run(run_level(workload([fake.port]), LevelConfig(3, 0.8, 0.2, 8, 5.0), events.append))
    stats, records = result["stats"], result["records"]
    start, end = result["window"]
    assert end - start == pytest.approx(0.8)
    assert stats["sent"] == len(records) and stats["warmup_excluded"] >= 3 and stats["drain_excluded"] >= 1
    assert stats["requests"] == stats["sent"] - stats["warmup_excluded"] - stats["drain_excluded"]
    assert stats["completed"] == stats["requests"] > 10 and stats["failed"] == 0
    assert 2.7 <= stats["achieved_concurrency"] <= 3.0
    assert 0 <= stats["dispatch_lag_s"]["p99"] < 0.05
    assert all(r["ended"] is not None for r in records)      # the drain was waited for
    assert events and events[-1]["level"] == 3 and "e2e_p95_s" in events[-1]


def test_every_level_sends_the_same_prompt_sequence_round_robin_over_targets():
    with FakeServer(answer_for=slow) as one, FakeServer(answer_for=slow) as two:
        first = level([one.port, two.port], concurrency=2)
        second = level([one.port, two.port], concurrency=4)
    labels = [f"http://127.0.0.1:{one.port}", f"http://127.0.0.1:{two.port}"]
    for result in (first, second):
        by_index = sorted(result["records"], key=lambda r: r["index"])
        assert [r["target"] for r in by_index[:6]] == labels * 3
        assert set(result["stats"]["per_target"]) == set(labels)
        assert sum(t["requests"] for t in result["stats"]["per_target"].values()) == result["stats"]["requests"]
    ids = [[r["prompt_id"] for r in sorted(res["records"], key=lambda r: r["index"])] for res in (first, second)]
    common = min(map(len, ids))
    assert common >= 10 and ids[0][:common] == ids[1][:common]


def test_a_seeded_open_loop_is_reproducible():
    with FakeServer(answer_for=lambda n, body: Answer(tokens=2)) as fake:
        runs = [level([fake.port], concurrency=10, rate=40.0, duration=0.5, warmup=0.0, seed=3) for _ in range(2)]
    scheduled = [[r["scheduled"] - run["window"][0] for r in run["records"]] for run in runs]
    assert scheduled[0] == pytest.approx(scheduled[1], abs=2e-6) and 5 <= len(scheduled[0]) <= 45
    lag = [r["sent"] - r["scheduled"] for r in runs[0]["records"]]
    assert min(lag) >= 0


def test_constant_arrivals_are_evenly_spaced_and_the_same_without_a_seed():
    with FakeServer(answer_for=lambda n, body: Answer(tokens=2)) as fake:
        runs = [level([fake.port], concurrency=10, rate=20.0, duration=0.5, warmup=0.0, seed=seed,
                      arrivals="constant") for seed in (1, 2)]
    for run in runs:
        scheduled = sorted(r["scheduled"] - run["window"][0] for r in run["records"])
        assert scheduled == pytest.approx([0.05 * (k + 1) for k in range(len(scheduled))], abs=1e-6)
        assert len(scheduled) in (9, 10)  # 0.05 ... 0.45 s, and 0.5 s when the sum rounds under the end
        assert min(r["sent"] - r["scheduled"] for r in run["records"]) >= 0


def test_summarize_at_a_time_scale_scales_latencies_and_throughput_not_the_client_or_the_records():
    """Hand-built records at scale 0.25: latencies 4x the wall ones, throughput per simulated second (wall rate x
    0.25), but the dispatch lag (the client's own) stays wall time, achieved concurrency is a ratio, and the records
    are not rewritten."""
    def rec(sent, first, last, ended, lag=0.002, target="t"):
        return {"index": 0, "level": 2, "target": target, "scheduled": sent - lag, "sent": sent, "ended": ended,
                "events": [[first, 1], [last, 1]], "ok": True, "max_tokens": 2, "ignore_eos": False,
                "usage": {"completion_tokens": 2}, "error": None}
    records = [rec(1.0, 1.5, 2.0, 2.01), rec(1.2, 1.3, 1.7, 1.71, lag=0.010), rec(2.1, 2.4, 2.9, 2.95)]
    before = [dict(r, events=[list(e) for e in r["events"]]) for r in records]
    wall = summarize(records, LevelConfig(2, 2.0, 1.0, 2, 5.0), 1.0, 3.0)["stats"]
    result = summarize(records, LevelConfig(2, 2.0, 1.0, 2, 5.0, time_scale=0.25), 1.0, 3.0)
    stats = result["stats"]
    assert records == before and result["records"] == before and result["window"] == [1.0, 3.0]
    assert stats["time_scale"] == 0.25 and wall["time_scale"] == 1.0
    assert stats["ttft_s"]["max"] == pytest.approx(4 * 0.5) and stats["ttft_s"]["p50"] == pytest.approx(4 * 0.3)
    assert stats["e2e_s"]["max"] == pytest.approx(4 * 1.0) and stats["e2e_s"]["mean"] == pytest.approx(4 * 2.3 / 3)
    assert stats["tpot_s"]["mean"] == pytest.approx(4 * wall["tpot_s"]["mean"])
    assert stats["itl_s"]["p95"] == pytest.approx(4 * wall["itl_s"]["p95"])
    # 6 tokens in a 2 s wall window = 3 tok/s wall = 0.75 tok/s per simulated second (the window is 8 simulated s)
    assert wall["output_throughput_tok_s"] == pytest.approx(3.0)
    assert stats["output_throughput_tok_s"] == pytest.approx(0.75)
    assert stats["requests_per_s"] == pytest.approx(wall["requests_per_s"] * 0.25)
    assert stats["dispatch_lag_s"] == wall["dispatch_lag_s"] and stats["dispatch_lag_s"]["max"] == pytest.approx(0.010)
    assert stats["achieved_concurrency"] == pytest.approx(wall["achieved_concurrency"])
    assert stats["per_target"]["t"]["e2e_s"]["max"] == pytest.approx(4.0)


def test_a_level_at_a_time_scale_reports_progress_in_simulated_seconds():
    events = []
    with FakeServer(answer_for=slow) as fake:
        result = asyncio.run(run_level(workload([fake.port]), LevelConfig(2, 1.1, 0.1, 8, 5.0, time_scale=0.5),
                                       events.append))
    e2e_wall = [r["events"][-1][0] - r["sent"] for r in result["records"] if r["ok"]]
    assert min(e2e_wall) >= 0.08                                     # 5 tokens 20 ms apart, wall
    assert result["stats"]["e2e_s"]["max"] >= 2 * 0.08
    measuring = [e for e in events if e["e2e_p95_s"] is not None]
    assert measuring and all(e["time_scale"] == 0.5 for e in events)
    assert min(e["e2e_p95_s"] for e in measuring) >= 2 * 0.08
