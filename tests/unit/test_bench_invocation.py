"""How playbooks/benchmark.yml calls the bench (module_utils/revive_bench/invocation.py): the argv from the role's
variables, every bad value refused naming its variable, the API key never on a command line, and the outcome."""
from __future__ import annotations

import pytest

from ansible.module_utils.revive_bench.invocation import InvocationError, bench_argv, bench_limit_fact, bench_outcome

GOOD = {"model": "tiny-chat", "url": "http://10.0.0.4:80", "concurrency": [8, 16], "duration_s": 60,
        "warmup_s": 0, "max_tokens": 200, "slo_e2e_p95_s": 12.0, "request_timeout_s": 120, "extra_args": [],
        "out": "/var/tmp/revive-bench/r1/bench"}


def test_the_argv_from_good_settings():
    assert bench_argv(GOOD) == ["bench", "--url", "http://10.0.0.4:80", "--model", "tiny-chat", "--concurrency",
                                "8,16", "--duration", "60", "--warmup", "0", "--max-tokens", "200", "--slo-e2e-p95",
                                "12", "--timeout", "120", "--out", "/var/tmp/revive-bench/r1/bench"]
    assert bench_argv(dict(GOOD, extra_args=["--ignore-eos"]))[-1] == "--ignore-eos"


@pytest.mark.parametrize("change, words", [
    ({"model": ""}, "benchmark_model is empty"),
    ({"url": ""}, "benchmark_url ''"),
    ({"url": "ftp://x"}, "benchmark_url 'ftp://x'"),
    ({"concurrency": []}, "benchmark_concurrency is []"),
    ({"concurrency": [8, 0]}, "benchmark_concurrency is [8, 0]"),
    ({"concurrency": ["8"]}, "benchmark_concurrency is ['8']"),
    ({"concurrency": [True]}, "benchmark_concurrency is [True]"),
    ({"concurrency": [8, 8]}, "names a level twice"),
    ({"duration_s": 0}, "benchmark_duration_s is 0: it must be a number > 0"),
    ({"duration_s": float("nan")}, "benchmark_duration_s is nan"),
    ({"warmup_s": -1}, "benchmark_warmup_s is -1"),
    ({"max_tokens": 2.5}, "benchmark_max_tokens is 2.5: it must be a whole number"),
    ({"max_tokens": "200"}, "benchmark_max_tokens is '200'"),
    ({"slo_e2e_p95_s": float("inf")}, "benchmark_slo_e2e_p95_s is inf"),
    ({"request_timeout_s": -5}, "benchmark_request_timeout_s is -5"),
    ({"extra_args": "--chat"}, "benchmark_extra_args is '--chat': it must be a list"),
    ({"extra_args": ["--api-key", "k"]}, "set benchmark_api_key"),
    ({"extra_args": ["--api-key=k"]}, "never on a command line"),
])
def test_every_bad_setting_is_refused_naming_it(change, words):
    with pytest.raises(InvocationError) as raised:
        bench_argv(dict(GOOD, **change))
    assert words in str(raised.value)


SUMMARY = {"levels": [{"concurrency": 8, "verdict": {"verdict": "PASS", "reasons": ["ok"]}},
                      {"concurrency": 16, "verdict": {"verdict": "FAIL", "reasons": ["server restart: 1", "x"]}}],
           "recommended_concurrency": 8}


@pytest.mark.parametrize("rc, strict, failed", [(0, True, False), (1, True, True), (1, False, True), (2, True, True),
                                                (3, True, True), (3, False, False), (9, False, True)])
def test_the_outcome_fails_on_fail_and_by_choice_on_undecided(rc, strict, failed):
    assert bench_outcome(rc, SUMMARY, strict)["failed"] is failed


def test_the_outcome_message_names_each_level_and_the_first_reason_of_a_non_pass():
    outcome = bench_outcome(1, SUMMARY)
    assert outcome["message"] == ("bench: a level FAILED; 8: PASS; 16: FAIL (server restart: 1); recommended "
                                  "concurrency 8")
    assert outcome["recommended_concurrency"] == 8


def test_the_outcome_names_the_front_doors_per_replica_limit_when_the_judge_found_one():
    outcome = bench_outcome(0, dict(SUMMARY, recommended_per_replica=4))
    assert outcome["message"].endswith("recommended concurrency 8 (4 per replica: frontdoor_server_maxconn: 4 "
                                       "queues the rest at the front door)")
    assert outcome["recommended_per_replica"] == 4


def judged(recommended=32, per_replica=16, node_verdict="PASS", served=("node1",), header=True):
    level = {"concurrency": 32, "verdict": {"verdict": "PASS", "reasons": []},
             "replicas": {f"{n}-vllm-{i}": {"node": n} for n in served for i in (0, 1)},
             "nodes": {n: {"verdict": node_verdict} for n in served}}
    headers = {"node1": {"vllm_version": "0.5.4", "release_id": "abc123def456",
                         "replicas": [{"name": "vllm-0", "port": 8000, "argv": ["py", "--port", "8000"]},
                                      {"name": "vllm-1", "port": 8001, "argv": ["py", "--port", "8001"]}]}}
    return {"levels": [level], "recommended_concurrency": recommended, "recommended_per_replica": per_replica,
            "review": {"node_headers": headers if header else {}}}


def test_the_limit_fact_for_a_node_that_served_the_recommended_level():
    out = bench_limit_fact(judged(), "node1", "run7")
    assert out["apply"] is True
    assert out["fact"] == {"bench": "run7", "recommended_concurrency": 32, "release_id": "abc123def456",
                           "replicas": {"vllm-0": {"maxconn": 16, "argv": ["py", "--port", "8000"],
                                                   "vllm_version": "0.5.4", "port": 8000},
                                        "vllm-1": {"maxconn": 16, "argv": ["py", "--port", "8001"],
                                                   "vllm_version": "0.5.4", "port": 8001}}}
    assert "node1: maxconn 16 for vllm-0, vllm-1" in out["message"] and "next converge" in out["message"]
    # a replica too few completions for its own bound does not stop it: the level had them
    assert bench_limit_fact(judged(node_verdict="INCONCLUSIVE"), "node1", "run7")["apply"] is True


@pytest.mark.parametrize("summary, node, words", [
    (judged(recommended=None, per_replica=None), "node1", "no level passed"),
    (judged(header=False), "node1", "was not sampled"),
    (judged(served=("node2",)), "node1", "none of its replicas served the recommended level 32"),
    (judged(node_verdict="FAIL"), "node1", "its own verdict at the recommended level 32 is FAIL"),
])
def test_nothing_is_applied_without_a_measurement_that_holds(summary, node, words):
    out = bench_limit_fact(summary, node, "run7")
    assert out["apply"] is False and out["fact"] == {} and words in out["message"], out["message"]
