"""The node side of a bench (sampler.py), what it says per level (observe.py) and the review that judges a report
with it (review.py): hand-built samples with known restarts, health failures, counters, OOM lines and GPU spreads."""
from __future__ import annotations

import json

import pytest

from ansible.module_utils.revive_bench import observe, review, sampler
from ansible.module_utils.revive_bench.verdict import FAIL, PASS, Bounds, judge

SHOW = """Id=node1-vllm-0.service
NRestarts=2
ActiveState=active
SubState=running
MainPID=4242

Id=node1-vllm-1.service
NRestarts=0
ActiveState=activating
SubState=auto-restart
MainPID=0
"""
METRICS = """# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="stop",model_name="m"} 7.0
vllm:request_success_total{finished_reason="length",model_name="m"} 3.0
vllm:generation_tokens_total{model_name="m"} 1200.0
vllm:num_requests_running{model_name="m"} 4.0
process_cpu_seconds_total 1.5e+01
"""


def test_systemctl_show_blocks_become_unit_states():
    units = sampler.parse_systemctl_show(SHOW)
    assert units["node1-vllm-0.service"] == {"n_restarts": 2, "active": "active", "sub": "running", "main_pid": 4242}
    assert units["node1-vllm-1.service"]["active"] == "activating"
    assert units["node1-vllm-1.service"]["main_pid"] == 0


def test_counters_are_summed_over_labels_and_gauges_left_out():
    counters = sampler.parse_counters(METRICS)
    assert counters == {"vllm:request_success_total": 10.0, "vllm:generation_tokens_total": 1200.0,
                        "process_cpu_seconds_total": 15.0}


def test_oom_lines_from_the_journal_with_time_and_unit():
    lines = [json.dumps({"MESSAGE": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                         "__REALTIME_TIMESTAMP": "1700000000500000", "_SYSTEMD_UNIT": "node1-vllm-0.service"}),
             json.dumps({"MESSAGE": "INFO: 200 OK", "__REALTIME_TIMESTAMP": "1700000001000000"}),
             json.dumps({"MESSAGE": list(b"Out of memory: Killed process 77 (python3)"), "_TRANSPORT": "kernel",
                         "__REALTIME_TIMESTAMP": "1700000002000000"}),
             "not json"]
    found = sampler.oom_lines(lines)
    assert [(f["t"], f["unit"]) for f in found] == [(1700000000.5, "node1-vllm-0.service"), (1700000002.0, "kernel")]
    assert "Killed process 77" in found[1]["line"]


def test_the_record_names_what_to_watch_and_a_missing_one_is_a_clear_error(tmp_path):
    record = tmp_path / "releases.json"
    record.write_text(json.dumps({"current": {"id": "r1", "vllm_version": "0.5.4", "simulated": True, "args": ["-x"],
                                              "replicas": [{"name": "node1-vllm-0", "unit": "node1-vllm-0.service",
                                                            "port": 8000, "gpus": [0, 1],
                                                            "argv": ["/v/bin/python", "-m", "x", "--port", 8000]}]}}))
    watch = sampler.load_replicas(str(record))
    # the argv is what a limit the bench applies is tied to (invocation.bench_limit_fact)
    assert watch["replicas"] == [{"name": "node1-vllm-0", "unit": "node1-vllm-0.service", "port": 8000,
                                  "gpus": ["0", "1"], "tensor_parallel_size": None,
                                  "argv": ["/v/bin/python", "-m", "x", "--port", "8000"],
                                  # no --host: vLLM binds every interface, reached at loopback
                                  "host": "127.0.0.1"}]
    record.write_text(json.dumps({"current": {"id": "r2", "replicas": [
        {"name": "vllm-0", "unit": "vllm-0.service", "port": 8000, "argv": ["/p", "--host", "10.0.3.11"]}]}}))
    assert sampler.load_replicas(str(record))["replicas"][0]["host"] == "10.0.3.11"
    with pytest.raises(sampler.SampleError, match="provision the node"):
        sampler.load_replicas(str(tmp_path / "missing.json"))
    record.write_text(json.dumps({"current": None}))
    with pytest.raises(sampler.SampleError, match="nothing is serving"):
        sampler.load_replicas(str(record))


class FakeProbes(sampler.Probes):
    """Scripted node: the unit restarts at the third sample, /health fails once, GPU 1 busier."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def open_nvml(self):
        self.nvml_note = "NVML, driver 535.183.01"

    def units(self, units):
        self.calls += 1
        restarted = self.calls >= 3
        return {units[0]: {"n_restarts": 1 if restarted else 0, "active": "active", "sub": "running",
                           "main_pid": 200 if restarted else 100}}

    def http(self, port, path, host="127.0.0.1"):
        if path == "/health":
            return {"status": None if self.calls == 3 else 200, "body": ""}
        return {"status": 200, "body": f"vllm:request_success_total {self.calls * 5 if self.calls < 3 else 1}\n"}

    def gpus(self, indices):
        return {"0": {"util": 50, "mem_util": 10, "memory_used": 1}, "1": {"util": 90, "mem_util": 10, "memory_used": 1}}

    def journal(self, units, since, until):
        return [json.dumps({"MESSAGE": "CUDA out of memory", "__REALTIME_TIMESTAMP": str(int((since + 2.5) * 1e6)),
                            "_SYSTEMD_UNIT": units[0]})]


def test_the_sampler_writes_header_samples_journal_and_end(tmp_path):
    record = tmp_path / "releases.json"
    record.write_text(json.dumps({"current": {"id": "r1", "vllm_version": "0.5.4", "replicas": [
        {"name": "node1-vllm-0", "unit": "node1-vllm-0.service", "port": 8000, "gpus": [0, 1],
         "tensor_parallel_size": 2}]}}))
    clock = {"t": 1000.0}
    out = tmp_path / "node1.jsonl"
    count = sampler.run(str(record), str(out), 1.0, 4.0, None, "node1", probes=FakeProbes(),
                        sleep=lambda s: clock.__setitem__("t", clock["t"] + s), now=lambda: clock["t"])
    assert count == 5
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["kind"] == "header" and lines[0]["gpu_source"] == "NVML, driver 535.183.01"
    assert [line["t"] for line in lines if line["kind"] == "sample"] == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    assert [line["kind"] for line in lines[-2:]] == ["journal", "end"]
    node = observe.load_samples(str(out))
    obs = observe.observe_level([node], 1000.5, 1001.0, 1004.0)
    # NRestarts 0 -> 1 and MainPID 100 -> 200: one restart, not two
    assert obs["restarts"] == 1 and obs["restarted"] == ["node1/node1-vllm-0"]
    assert obs["health_failures"] == 1
    assert obs["counters_backwards"] == ["vllm:request_success_total"]
    assert obs["oom_lines"] == 1
    assert obs["gpu_imbalance"] == pytest.approx(0.40)
    assert obs["gpu_imbalance_where"] == "inside node1/node1-vllm-0 (GPUs 0, 1)"


def samples_file(tmp_path, node, replicas, rows, journal=()):
    """A sampler output written by hand: rows = [(t, {replica: state}, {gpu: util})]."""
    path = tmp_path / f"{node}.jsonl"
    lines = [{"kind": "header", "node": node, "t": rows[0][0], "simulated": True, "vllm_version": "0.5.4",
              "release_id": "r1", "gpu_source": "NVML", "argv": ["--x"],
              "replicas": [{"name": n, "unit": f"{n}.service", "port": p, "gpus": g} for n, p, g in replicas]}]
    for t, states, gpus in rows:
        lines.append({"kind": "sample", "t": t, "replicas": states,
                      "gpus": {k: {"util": v} for k, v in gpus.items()}})
    lines += [{"kind": "journal", "t": t, "unit": "u", "line": "CUDA out of memory"} for t in journal]
    lines.append({"kind": "end", "t": rows[-1][0]})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return observe.load_samples(str(path))


def healthy(pid=10, restarts=0, counter=1.0):
    return {"n_restarts": restarts, "active": "active", "main_pid": pid, "health": 200,
            "counters": {"vllm:request_success_total": counter}}


def test_a_quiet_level_observes_nothing_wrong_and_only_its_span_counts(tmp_path):
    node = samples_file(tmp_path, "node1", [("r0", 8000, ["0", "1"])],
                        [(t, {"r0": healthy(pid=10 if t < 100 else 11, counter=t)}, {"0": 40, "1": 42})
                         for t in range(0, 120, 5)], journal=[5.0])
    # the PID changed at t=100 and an OOM line came at t=5: both outside the level [20, 90]
    obs = observe.observe_level([node], 20.0, 30.0, 90.0)
    assert (obs["restarts"], obs["health_failures"], obs["oom_lines"], obs["counters_backwards"]) == (0, 0, 0, [])
    assert obs["gpu_imbalance"] == pytest.approx(0.02)
    assert judge_pass(obs)
    later = observe.observe_level([node], 80.0, 90.0, 110.0)
    assert later["restarts"] == 1 and later["restarted"] == ["node1/r0"]


def judge_pass(obs):
    from test_bench_verdict import level_stats
    return judge(level_stats([5.0] * 100), 8, Bounds(slo_e2e_p95_s=12.0), node=obs).verdict == PASS


def test_a_replica_busier_than_its_peers_is_an_imbalance_between_replicas(tmp_path):
    a = samples_file(tmp_path, "node1", [("a0", 8000, ["0", "1"])],
                     [(t, {"a0": healthy()}, {"0": 40, "1": 40}) for t in range(0, 60, 2)])
    b = samples_file(tmp_path, "node2", [("b0", 8000, ["0", "1"])],
                     [(t, {"b0": healthy()}, {"0": 70, "1": 70}) for t in range(0, 60, 2)])
    obs = observe.observe_level([a, b], 0.0, 10.0, 50.0)
    assert obs["gpu_imbalance"] == pytest.approx(0.30) and obs["gpu_imbalance_where"] == "between replicas"
    from test_bench_verdict import level_stats
    verdict = judge(level_stats([5.0] * 100), 8, Bounds(slo_e2e_p95_s=12.0), node=obs)
    assert verdict.verdict == FAIL and "spread 0.30 between replicas > 0.20" in verdict.reasons[0]


def test_a_node_without_samples_in_the_level_is_named_not_passed(tmp_path):
    a = samples_file(tmp_path, "node1", [("a0", 8000, ["0"])], [(t, {"a0": healthy()}, {"0": 40}) for t in range(10)])
    b = samples_file(tmp_path, "node2", [("b0", 8000, ["0"])], [(100.0, {"b0": healthy()}, {"0": 40})])
    obs = observe.observe_level([a, b], 0.0, 2.0, 9.0)
    assert obs["nodes_not_observed"] == ["node2"]
    from test_bench_verdict import level_stats
    verdict = judge(level_stats([5.0] * 100), 8, Bounds(slo_e2e_p95_s=12.0), node=obs)
    assert "nodes not observed: node2" in verdict.not_checked
    assert observe.observe_level([b], 0.0, 2.0, 9.0) is None


def bench_report(records_by_level, zero=1000.0, warmup=2.0):
    """A summary + records as `revive bench` writes them, built through load.summarize."""
    from ansible.module_utils.revive_bench.load import LevelConfig, summarize
    from ansible.module_utils.revive_bench.report import level_summary
    from ansible.module_utils.revive_bench.verdict import judge as judge_level
    levels, records = [], []
    bounds = Bounds(slo_e2e_p95_s=12.0)
    for concurrency, (window, dicts) in records_by_level.items():
        stats = summarize(dicts, LevelConfig(concurrency=concurrency, duration=window[1] - window[0], warmup=warmup,
                                             max_tokens=10, timeout=60), *window)["stats"]
        stats["achieved_concurrency"] = float(concurrency)
        verdict = judge_level(stats, concurrency, bounds).as_dict()
        levels.append(level_summary({"concurrency": concurrency, "rate": None, "window": list(window),
                                     "stats": stats}, verdict, None))
        records += dicts
    summary = {"model": "m", "targets": ["http://lb1:80"], "mode": "closed loop", "ignore_eos": False,
               "warmup_s": warmup, "slo": {"e2e_p95_s": 12.0, "quantile": 0.95, "confidence": 0.95,
                                           "min_completions": 59},
               "bounds": {"slo_e2e_p95_s": 12.0, "max_dispatch_lag_p99_s": 0.05, "min_achieved_share": 0.95,
                          "max_error_rate": 0.01, "max_early_eos_share": 0.05, "max_gpu_imbalance": 0.2,
                          "knee_elasticity": 0.5},
               "levels": levels, "knees": [], "clock_zero": {"wall_time": zero}}
    return summary, records


def request(level, n, served_by, sent, e2e, tokens=10):
    step = (e2e - 0.5) / (tokens - 1)
    return {"index": n, "level": level, "target": "http://lb1:80", "served_by": served_by, "prompt_id": "p",
            "max_tokens": tokens, "ignore_eos": False, "scheduled": sent, "sent": sent, "first_byte": sent + 0.1,
            "events": [[sent + 0.5 + i * step, 1] for i in range(tokens)], "ended": sent + e2e, "status": 200,
            "finish_reasons": ["length"], "done": True, "usage": {"completion_tokens": tokens}, "error": None,
            "ok": True}


def test_review_fails_a_level_with_a_restart_though_its_latencies_pass_and_flags_the_slow_replica(tmp_path):
    dicts = []
    for n in range(240):
        slow = n % 3 == 2
        dicts.append(request(8, n, ["node1-vllm-0", "node2-vllm-0", "node3-vllm-0"][n % 3], 3.0 + n * 0.2,
                             6.0 if slow else 4.0))
    summary, records = bench_report({8: ((2.0, 60.0), dicts)})
    assert summary["levels"][0]["verdict"]["verdict"] == PASS
    nodes = []
    for name in ("node1", "node2", "node3"):
        pid = (lambda t: 10 if t < 1030 else 11) if name == "node2" else (lambda t: 10)
        rows = [(1000.0 + t, {f"{name}-vllm-0": healthy(pid=pid(1000.0 + t))}, {"0": 50, "1": 50})
                for t in range(0, 70, 2)]
        nodes.append(samples_file(tmp_path, name, [(f"{name}-vllm-0", 8000, ["0", "1"])], rows))
    judged = review.review(summary, records, nodes)
    level = judged["levels"][0]
    assert level["verdict"]["verdict"] == FAIL
    assert "server restart: 1 during the level (node2/node2-vllm-0)" in level["verdict"]["reasons"]
    assert judged["exit_code"] == 1 and judged["recommended_concurrency"] is None
    replicas = level["replicas"]
    assert {label: r["verdict"]["verdict"] for label, r in replicas.items()} == {
        "node1-vllm-0": PASS, "node2-vllm-0": FAIL, "node3-vllm-0": PASS}
    assert {name: n["verdict"] for name, n in level["nodes"].items()} == {"node1": PASS, "node2": FAIL, "node3": PASS}
    assert [(o["replica"], o["metric"]) for o in level["outliers"]] == [
        ("node3-vllm-0", "tpot_s.p50"), ("node3-vllm-0", "e2e_s.p50")]
    assert level["outliers"][1]["ratio"] == pytest.approx(1.5)


def test_review_without_samples_keeps_the_client_verdict_and_lists_the_node_rules_unchecked():
    dicts = [request(8, n, None, 3.0 + n * 0.2, 4.0) for n in range(200)]
    summary, records = bench_report({8: ((2.0, 50.0), dicts)})
    judged = review.review(summary, records, [])
    level = judged["levels"][0]
    assert level["verdict"]["verdict"] == PASS
    assert "server restart: no node observation" in level["verdict"]["not_checked"]
    assert list(level["replicas"]) == ["http://lb1:80"] and level["outliers"] == []


def test_front_door_server_names_map_to_the_nodes_replicas_and_simulated_time_is_kept(tmp_path):
    dicts = [request(8, n, ["node1-vllm-0", "node2-vllm-0"][n % 2], 3.0 + n * 0.2, 1.0) for n in range(240)]
    summary, records = bench_report({8: ((2.0, 60.0), dicts)})
    summary["levels"][0]["stats"]["time_scale"] = 0.25        # the twin's clock: wall seconds x 4
    nodes = [samples_file(tmp_path, name, [("vllm-0", 8000, ["0"])],
                          [(1000.0 + t, {"vllm-0": healthy()}, {"0": 50}) for t in range(0, 70, 2)])
             for name in ("node1", "node2")]
    level = review.review(summary, records, nodes)["levels"][0]
    assert {label: r["node"] for label, r in level["replicas"].items()} == {"node1-vllm-0": "node1",
                                                                          "node2-vllm-0": "node2"}
    assert level["replicas"]["node1-vllm-0"]["e2e_s"]["p50"] == pytest.approx(4.0)
    assert level["replicas"]["node1-vllm-0"]["node_observation"]["restarts"] == 0
    judged = review.review(summary, records, nodes)
    assert judged["recommended_concurrency"] == 8 and judged["recommended_per_replica"] == 4
    assert review.review(summary, records, [])["recommended_per_replica"] is None   # no replica attributed
