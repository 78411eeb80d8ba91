"""revive bench's per-request metrics and level aggregation on hand-built records (module_utils/revive_bench/metrics.py
and load.py's window rules): TTFT, E2E, TPOT, ITL, usage vs stream, early EOS, in-flight average."""
from __future__ import annotations

import pytest

from ansible.module_utils.revive_bench import load, metrics


def record(sent=10.0, events=((10.5, 1), (10.7, 1), (11.0, 1), (11.5, 1)), usage=4, ok=True, max_tokens=4,
           ignore_eos=False, ended=None, error=None, target="t"):
    return {"sent": sent, "scheduled": sent, "events": [list(e) for e in events], "ok": ok, "max_tokens": max_tokens,
            "ignore_eos": ignore_eos, "usage": None if usage is None else {"completion_tokens": usage},
            "ended": ended if ended is not None else (events[-1][0] if events else sent) + 0.01, "error": error,
            "target": target}


def test_ttft_e2e_tpot_and_itl_of_one_request():
    m = metrics.request_metrics(record())
    assert m.ttft == pytest.approx(0.5) and m.e2e == pytest.approx(1.5)
    assert m.tpot == pytest.approx((1.5 - 0.5) / 3)
    assert m.itl == pytest.approx([0.2, 0.3, 0.5])
    assert (m.output_tokens, m.stream_tokens, m.usage_tokens, m.early_eos) == (4, 4, 4, False)


def test_usage_wins_and_the_difference_to_the_stream_is_kept():
    m = metrics.request_metrics(record(usage=5, max_tokens=5))
    assert (m.output_tokens, m.stream_tokens) == (5, 4)
    assert m.tpot == pytest.approx(1.0 / 4)
    level = metrics.aggregate([record(usage=5), record()], 10.0, 0)
    assert level["usage_vs_stream"] == {"with_usage": 2, "mismatched": 1, "usage_minus_stream_tokens": 1}


def test_without_usage_the_stream_counts_running_increments():
    m = metrics.request_metrics(record(usage=None, events=((10.2, 1), (10.4, 3))))
    assert (m.output_tokens, m.usage_tokens) == (4, None)


def test_one_token_has_no_tpot_and_failures_have_no_metrics():
    assert metrics.request_metrics(record(events=((10.3, 1),), usage=1)).tpot is None
    assert metrics.request_metrics(record(ok=False, error="HTTP 503: boom")) is None


def test_early_eos_counts_only_with_ignore_eos():
    assert metrics.request_metrics(record(max_tokens=200, ignore_eos=True)).early_eos is True
    assert metrics.request_metrics(record(max_tokens=200)).early_eos is False
    level = metrics.aggregate([record(max_tokens=200, ignore_eos=True), record(max_tokens=4, ignore_eos=True)], 1, 0)
    assert level["early_eos"] == 1 and level["early_eos_share"] == pytest.approx(0.5)


def test_a_level_counts_failures_by_reason_and_never_averages_them_in():
    records = [record(), record(sent=20.0, events=((23.0, 1), (24.0, 1)), usage=2),
               record(ok=False, error="HTTP 503: no server"), record(ok=False, error="timeout: no answer in 5 s")]
    level = metrics.aggregate(records, 4.0, 8)
    assert (level["requests"], level["completed"], level["failed"]) == (4, 2, 2)
    assert level["error_rate"] == pytest.approx(0.5)
    assert level["errors"] == {"HTTP 503": 1, "timeout": 1}
    assert level["e2e_s"]["p50"] == pytest.approx((1.5 + 4.0) / 2)
    assert level["ttft_s"]["max"] == pytest.approx(3.0)
    assert level["output_throughput_tok_s"] == pytest.approx(2.0) and level["output_tokens"] == 6
    assert level["itl_s"]["max"] == pytest.approx(1.0)


def test_throughput_counts_the_tokens_inside_the_window_only():
    records = [record(), record(ok=False)]
    assert metrics.tokens_between(records, 10.6, 11.2) == 2     # 10.7 and 11.0 of the complete one


def test_window_rules_and_the_time_weighted_in_flight_count():
    inside = record(sent=1.0, events=((1.5, 1),), ended=2.0)
    warmup = record(sent=0.5, events=((1.5, 1),), ended=2.5)
    drain = record(sent=2.0, events=((3.5, 1),), ended=4.0)
    records = [inside, warmup, drain]
    assert load.measured(records, 1.0, 3.0) == [inside]
    # busy time in [1, 3]: 1.0 + 1.5 + 1.0 = 3.5 over 2 s
    assert load.in_flight_average(records, 1.0, 3.0) == pytest.approx(1.75)


def test_at_a_time_scale_of_a_quarter_every_latency_is_four_times_the_wall_one():
    """A simulated server whose simulated second lasts 0.25 wall seconds (the twin's VLLM_SIM_TIME_SCALE=0.25):
    the record's wall durations, TTFT 0.5, E2E 1.5, gaps 0.2/0.3/0.5, are 2, 6 and 0.8/1.2/2 simulated seconds."""
    m = metrics.request_metrics(record(), time_scale=0.25)
    assert m.ttft == pytest.approx(2.0) and m.e2e == pytest.approx(6.0)
    assert m.tpot == pytest.approx((6.0 - 2.0) / 3)
    assert m.itl == pytest.approx([0.8, 1.2, 2.0])
    assert (m.output_tokens, m.stream_tokens, m.early_eos) == (4, 4, False)


def test_at_a_time_scale_throughput_is_per_simulated_second():
    """8 tokens and 2 completions in a 4 s wall window: 2 tok/s and 0.5 req/s of wall time; at scale 0.25 the
    window is 16 simulated seconds: 0.5 tok/s and 0.125 req/s; the bounds are the scaled order statistics (with 2
    completions only the lower one exists: X_(1), E2E 1.5 s wall = 6 simulated s)."""
    records = [record(), record(sent=20.0, events=((23.0, 1), (24.0, 1)), usage=2)]
    wall = metrics.aggregate(records, 4.0, 8)
    simulated = metrics.aggregate(records, 4.0, 8, time_scale=0.25)
    assert (wall["output_throughput_tok_s"], wall["requests_per_s"]) == pytest.approx((2.0, 0.5))
    assert (simulated["output_throughput_tok_s"], simulated["requests_per_s"]) == pytest.approx((0.5, 0.125))
    assert simulated["e2e_s"]["max"] == pytest.approx(16.0) and simulated["ttft_s"]["p50"] == pytest.approx(7.0)
    assert simulated["e2e_p95_bounds"]["lower"] == pytest.approx(4 * wall["e2e_p95_bounds"]["lower"]) == 6.0
    for key in ("requests", "completed", "failed", "output_tokens", "usage_vs_stream", "early_eos"):
        assert simulated[key] == wall[key], key


def test_the_front_door_queue_is_reported_apart_and_excluded_only_when_asked():
    # waited 0.3 s at the front door, then the server's first token 0.2 s later and its last 1.2 s later
    queued = dict(record(), queued_s=0.3)
    client = metrics.request_metrics(queued)
    assert (client.ttft, client.e2e, client.queued) == (pytest.approx(0.5), pytest.approx(1.5), 0.3)
    served = metrics.request_metrics(queued, exclude_queue=True)
    assert (served.ttft, served.e2e) == (pytest.approx(0.2), pytest.approx(1.2))
    assert served.tpot == pytest.approx(client.tpot) and served.itl == pytest.approx(client.itl)
    # at a time scale of a half the wait is in simulated seconds as well
    assert metrics.request_metrics(queued, 0.5, exclude_queue=True).queued == pytest.approx(0.6)
    level = metrics.aggregate([queued, record()], 10.0, 0, exclude_queue=True)
    assert level["queue_reported"] == 1 and level["queue_s"]["p50"] == pytest.approx(0.3)
    assert level["e2e_s"]["max"] == pytest.approx(1.5)        # the record without a reported wait keeps its E2E
    assert metrics.aggregate([record()], 10.0, 0)["queue_s"]["p50"] is None


@pytest.mark.parametrize("header, seconds", [("250", 0.25), ("0", 0.0), ("-1", None), (None, None), ("x", None)])
def test_the_queue_header_in_milliseconds(header, seconds):
    from ansible.module_utils.revive_bench.client import queue_seconds
    assert queue_seconds(header) == seconds
