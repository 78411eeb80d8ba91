"""How the twin fails, as vLLM 0.5.4 does (docs/facts/lb-and-rolling.md §4.3-§4.4), and its fault knobs
(lab/vllm_twin/README.md): SIGTERM/SIGKILL cut open streams, draining only where 0.5.4 drains; every knob
shows its behaviour, is reported at start and in /version, and does nothing when unset."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import harness  # noqa: E402

CHAT = "/v1/chat/completions"
IN_PROCESS = ["--disable-frontend-multiprocessing"]
SLOW = 0.01  # a 2000-token stream of the 20B at TP 8 then lasts about half a second


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"20b": harness.write_model("internlm2-chat-20b", root / "chat-20b"),
            "7b": harness.write_model("llama-2-7b-chat", root / "llama-2-7b")}


def body(max_tokens=2000):
    return {"model": "m", "messages": [{"role": "user", "content": "Explain the rolling update."}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True}


def start(model, args, tmp_path, scale=SLOW, env=None, wait=True):
    extra = {"VLLM_SIM_COLD_START_REQUESTS": "0", **harness.FIELD_NOTES_ENV, **(env or {})}
    return harness.start(model, args, harness.twin_env(tmp_path, time_scale=scale, extra=extra),
                         tmp_path / "twin.log", served_name="m", wait=wait)


def open_streams(twin, count, max_tokens=2000):
    results = [None] * count

    def reader(i):
        results[i] = harness.stream(twin, CHAT, body(max_tokens))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


def wait_running(twin, count, timeout=10.0):
    """Wait until `count` streams are past their first token (the twin logs requests; we poll /metrics)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = harness.request(twin, "GET", "/metrics")[2].decode()
        running = sum(v for n, _, v in harness.iter_metrics(text) if n == "vllm:num_requests_running")
        if running >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{count} streams never ran:\n{twin.log()}")


def joined(threads, results, timeout=10):
    """Wait for the client threads; each must have ended (its stream finished or was cut)."""
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), f"a client stream still runs {timeout} s later"
    return results


def assert_cut(result):
    chunks = result.chunks()
    assert result.events and result.events[-1] != "[DONE]"
    assert all(c["choices"][0].get("finish_reason") is None for c in chunks)
    assert result.error is not None and "IncompleteRead" in result.error


def assert_whole(result):
    assert result.complete and result.events[-1] == "[DONE]"
    assert result.chunks()[-1]["choices"][0]["finish_reason"] == "length"


def test_sigterm_in_the_default_mode_cuts_open_streams(models, tmp_path):
    twin = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path)
    threads, results = open_streams(twin, 4)
    time.sleep(0.2)
    assert twin.stop(signal.SIGTERM) == 0
    for result in joined(threads, results):
        assert_cut(result)
    log = twin.log()
    assert "Gracefully stopping http server" in log and "vLLM ZMQ RPC Server was interrupted." in log


def test_sigterm_with_disable_frontend_multiprocessing_drains_a_single_gpu_replica(models, tmp_path):
    twin = start(models["7b"], ["--dtype", "half", "--disable-log-requests"] + IN_PROCESS, tmp_path)
    threads, results = open_streams(twin, 3)
    wait_running(twin, 3)
    twin.process.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    with pytest.raises(OSError):
        harness.request(twin, "GET", "/health", timeout=2)  # the listener is closed at once
    assert twin.process.wait(20) == 0
    for result in joined(threads, results):
        assert_whole(result)


def test_sigterm_to_the_whole_unit_kills_the_tp_workers_and_cuts_streams(models, tmp_path):
    """systemd's KillMode=control-group signals the workers too: the engine dies with them."""
    twin = start(models["20b"], harness.FIELD_NOTES_FLAGS + IN_PROCESS, tmp_path)
    threads, results = open_streams(twin, 3)
    wait_running(twin, 3)
    os.killpg(twin.process.pid, signal.SIGTERM)
    assert twin.process.wait(20) == 0
    for result in joined(threads, results):
        assert_cut(result)
    assert "died, exit code: -15" in twin.log()


def test_sigkill_cuts_streams(models, tmp_path):
    twin = start(models["20b"], harness.FIELD_NOTES_FLAGS + IN_PROCESS, tmp_path)
    threads, results = open_streams(twin, 2)
    wait_running(twin, 2)
    twin.process.kill()
    assert twin.process.wait() == -signal.SIGKILL
    assert len(joined(threads, results)) == 2
    for result in results:
        assert_cut(result)


def test_no_knob_no_fault(models, tmp_path):
    twin = start(models["20b"], ["--tensor-parallel-size", "4", "--dtype", "half", "--enforce-eager"] + IN_PROCESS,
                 tmp_path, scale=0.002, env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    try:
        threads, results = open_streams(twin, 6, max_tokens=30)
        assert all(r.status == 200 and r.events[-1] == "[DONE]" for r in joined(threads, results, 20))
        version = json.loads(harness.request(twin, "GET", "/version")[2])
        assert version["twin"]["faults"] == {}
        assert "[twin] fault knobs in effect: none" in twin.log()
        utilization = json.loads((tmp_path / "utilization.json").read_text())
        assert sorted(utilization) == ["4", "5", "6", "7"]
    finally:
        twin.stop()
    assert json.loads((tmp_path / "utilization.json").read_text()) == {}  # cleared on exit


def test_errors_after_n_requests_are_500s_in_054s_error_shape(models, tmp_path):
    twin = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path, scale=0.002,
                 env={"VLLM_SIM_FAULT_ERRORS_AFTER": "2"})
    try:
        statuses = []
        for _ in range(4):
            status, _, data = harness.request(twin, "POST", CHAT, {**body(10), "stream": False})
            statuses.append(status)
        assert statuses == [200, 200, 500, 500]
        assert json.loads(data) == {"object": "error", "message": "[twin fault VLLM_SIM_FAULT_ERRORS_AFTER=2] "
                                    "simulated engine error on request 4", "type": "InternalServerError",
                                    "param": None, "code": 500}
        assert json.loads(harness.request(twin, "GET", "/version")[2])["twin"]["faults"] == {
            "errors_after_requests": 2}
    finally:
        twin.stop()


def test_error_rate_fails_that_share_of_requests(models, tmp_path):
    twin = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path, scale=0.002,
                 env={"VLLM_SIM_FAULT_ERROR_RATE": "0.5", "VLLM_SIM_FAULT_SEED": "3"})
    try:
        statuses = [harness.request(twin, "POST", CHAT, {**body(2), "stream": False})[0] for _ in range(40)]
        assert set(statuses) == {200, 500} and 10 <= statuses.count(500) <= 30
        assert "error_rate=0.5" in twin.log()
    finally:
        twin.stop()


def test_crash_after_n_requests_exits_non_zero_and_cuts_the_others(models, tmp_path):
    twin = start(models["20b"], harness.FIELD_NOTES_FLAGS + IN_PROCESS, tmp_path,
                 env={"VLLM_SIM_FAULT_CRASH_AFTER_REQUESTS": "1", "VLLM_SIM_FAULT_CRASH_EXIT_CODE": "7"})
    threads, results = open_streams(twin, 2)
    wait_running(twin, 2)
    short = harness.stream(twin, CHAT, body(5))
    assert short.events[-1] == "[DONE]"
    assert twin.process.wait(20) == 7
    for result in joined(threads, results):
        assert_cut(result)
    assert "[twin fault] simulated crash (VLLM_SIM_FAULT_CRASH_AFTER_REQUESTS=1" in twin.log()


def test_crash_after_seconds(models, tmp_path):
    started = time.monotonic()
    twin = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path, scale=0.01,
                 env={"VLLM_SIM_FAULT_CRASH_AFTER_SECONDS": "50"})
    assert twin.process.wait(30) == 1
    assert time.monotonic() - started > 0.5
    assert "VLLM_SIM_FAULT_CRASH_AFTER_SECONDS=50" in twin.log()


def test_one_busy_gpu_shows_in_the_fake_nvml_utilisation(models, tmp_path):
    twin = start(models["20b"], ["--tensor-parallel-size", "4", "--dtype", "half", "--enforce-eager"] + IN_PROCESS,
                 tmp_path, scale=0.002, env={"CUDA_VISIBLE_DEVICES": "4,5,6,7", "VLLM_SIM_FAULT_BUSY_GPU": "1",
                                             "VLLM_SIM_FAULT_BUSY_GPU_EXTRA": "35"})
    try:
        utilization = json.loads((tmp_path / "utilization.json").read_text())
        assert utilization == {"4": {"gpu": 0, "memory": 0}, "5": {"gpu": 35, "memory": 0},
                               "6": {"gpu": 0, "memory": 0}, "7": {"gpu": 0, "memory": 0}}
        reader = subprocess.run(
            [sys.executable, "-c", "import pynvml; pynvml.nvmlInit(); print([pynvml.nvmlDeviceGetUtilizationRates("
             "pynvml.nvmlDeviceGetHandleByIndex(i)).gpu for i in range(8)])"],
            env=harness.twin_env(tmp_path), capture_output=True, text=True, timeout=30)
        assert reader.stdout.strip() == "[0, 0, 0, 0, 0, 35, 0, 0]"
    finally:
        twin.stop()


def e2e_seconds(twin) -> tuple:
    """(sum, count) of the twin's E2E latency histogram."""
    samples = {name: value for name, labels, value in
               harness.iter_metrics(harness.request(twin, "GET", "/metrics")[2].decode())
               if name in ("vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count")}
    return samples["vllm:e2e_request_latency_seconds_sum"], samples["vllm:e2e_request_latency_seconds_count"]


@pytest.mark.parametrize("clock", ["wall", "modelled"])
def test_the_metrics_clock_observes_wall_or_modelled_seconds(models, tmp_path, clock):
    """VLLM_SIM_METRICS_CLOCK: the E2E histogram holds the client's wall time (as vLLM) or that / the time scale."""
    scale = 0.01
    twin = start(models["20b"], ["--tensor-parallel-size", "4", "--dtype", "half", "--enforce-eager"] + IN_PROCESS,
                 tmp_path, scale=scale, env={"CUDA_VISIBLE_DEVICES": "4,5,6,7", "VLLM_SIM_METRICS_CLOCK": clock})
    try:
        started = time.monotonic()
        result = harness.stream(twin, CHAT, body(300))
        wall = time.monotonic() - started
        assert result.status == 200 and result.events[-1] == "[DONE]"
        total, count = e2e_seconds(twin)
        assert count == 1
        observed = total * (scale if clock == "modelled" else 1.0)  # back to wall seconds
        assert 0.5 * wall < observed <= wall, (clock, total, wall)
        assert json.loads(harness.request(twin, "GET", "/version")[2])["twin"]["metrics_clock"] == clock
        assert ("latency histograms in modelled seconds" in twin.log()) == (clock == "modelled")
    finally:
        twin.stop()


def test_decode_slowdown_warmup_and_drift_knobs_are_reported(models, tmp_path):
    env_file = tmp_path / "twin.env"
    env_file.write_text("# per-node faults\nVLLM_SIM_FAULT_DECODE_SLOWDOWN=2.5\nVLLM_SIM_FAULT_WARMUP_REQUESTS=1000\n"
                        "export VLLM_SIM_FAULT_LATENCY_DRIFT=0.1\n")
    twin = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path, scale=0.002)
    try:
        twin_report = json.loads(harness.request(twin, "GET", "/version")[2])["twin"]
        assert twin_report["faults"] == {"warmup_requests": 1000, "latency_drift_per_minute": 0.1,
                                         "decode_slowdown": 2.5}
        assert twin_report["env_file"] == str(env_file) and twin_report["cold_start"]["requests"] == 1000
        assert "[twin] fault knobs in effect: warmup_requests=1000, latency_drift_per_minute=0.1, " \
               "decode_slowdown=2.5" in twin.log()
        assert harness.stream(twin, CHAT, body(5)).events[-1] == "[DONE]"
    finally:
        twin.stop()


def test_answer_median_spreads_the_answers_and_is_reported(models, tmp_path):
    """VLLM_SIM_ANSWER_MEDIAN (a baseline setting, not a fault): answers end by EOS around it; the default (700)
    runs every answer to the field notes' max_tokens 200; ignore_eos still runs to max_tokens; a bad value stops
    the twin with exit 2."""
    def answers(twin, count, ignore_eos=False):
        lengths, reasons = [], []
        for i in range(count):
            request = {"model": "m", "prompt": f"question {i}: how do I drain a node?", "max_tokens": 200,
                       "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
            result = harness.stream(twin, "/v1/completions", request)
            chunks = result.chunks()
            lengths.append(chunks[-1]["usage"]["completion_tokens"])
            reasons.append(next(c["choices"][0]["finish_reason"] for c in chunks
                                if c["choices"] and c["choices"][0].get("finish_reason")))
        return sorted(lengths), reasons

    for name in ("default", "short", "bad"):
        (tmp_path / name).mkdir()
    default = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path / "default", scale=0.002)
    try:
        assert json.loads(harness.request(default, "GET", "/version")[2])["twin"]["answer_length"] == \
            {"median": 700.0, "sigma": 0.4}
        lengths, reasons = answers(default, 10)
        assert lengths == [200] * 10 and set(reasons) == {"length"}
    finally:
        default.stop()
    short = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path / "short", scale=0.002,
                  env={"VLLM_SIM_ANSWER_MEDIAN": "30"})
    try:
        assert json.loads(harness.request(short, "GET", "/version")[2])["twin"]["answer_length"]["median"] == 30.0
        assert "answers log-normal around 30 tokens (VLLM_SIM_ANSWER_MEDIAN)" in short.log()
        lengths, reasons = answers(short, 30)
        assert set(reasons) == {"stop"} and len(set(lengths)) > 10, lengths
        assert 15 <= lengths[len(lengths) // 2] <= 60 and max(lengths) < 200, lengths
        lengths, reasons = answers(short, 3, ignore_eos=True)
        assert lengths == [200] * 3 and set(reasons) == {"length"}
    finally:
        short.stop()
    bad = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path / "bad", env={"VLLM_SIM_ANSWER_MEDIAN": "0"},
                wait=False)
    assert bad.process.wait(30) == 2
    assert "VLLM_SIM_ANSWER_MEDIAN='0': expected a number of tokens between 1 and 131072" in bad.log()


def test_startup_failure_after_model_load(models, tmp_path):
    started = time.monotonic()
    twin = start(models["20b"], harness.FIELD_NOTES_FLAGS + IN_PROCESS, tmp_path, scale=0.01,
                 env={"VLLM_SIM_FAULT_FAIL_AFTER_LOAD": "disk read error on shard 2"}, wait=False)
    assert twin.process.wait(30) == 1
    assert time.monotonic() - started > 0.01 * 61  # the model load happened first
    log = twin.log()
    assert log.index("Loading model weights took") < log.index(
        "RuntimeError: [twin fault VLLM_SIM_FAULT_FAIL_AFTER_LOAD] disk read error on shard 2")


def test_invalid_knob_values_stop_the_twin_with_a_message(models, tmp_path):
    twin = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path, env={"VLLM_SIM_FAULT_ERROR_RATE": "2"},
                 wait=False)
    assert twin.process.wait(30) == 2
    assert "VLLM_SIM_FAULT_ERROR_RATE='2': expected a fraction between 0 and 1" in twin.log()
    clock = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path, env={"VLLM_SIM_METRICS_CLOCK": "fast"},
                  wait=False)
    assert clock.process.wait(30) == 2
    assert "VLLM_SIM_METRICS_CLOCK='fast': expected wall or modelled" in clock.log()


def test_stopping_before_draining_loses_the_open_streams_and_draining_first_loses_none(models, tmp_path):
    """The twin side of a rolling re-provision (docs/facts/lb-and-rolling.md §0.7): drain, wait, then stop."""
    (tmp_path / "drained").mkdir()
    drained = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path / "drained")
    threads, results = open_streams(drained, 3, max_tokens=300)
    joined(threads, results, 20)  # the front door sends nothing new; the in-flight streams run out
    assert drained.stop() == 0
    assert all(r.complete and r.events[-1] == "[DONE]" for r in results)
    (tmp_path / "undrained").mkdir()
    undrained = start(models["20b"], harness.FIELD_NOTES_FLAGS, tmp_path / "undrained")
    threads, results = open_streams(undrained, 3)
    time.sleep(0.2)  # default mode: no vllm:* metrics to watch (0.5.4's /metrics bug)
    assert undrained.stop() == 0
    for result in joined(threads, results, 20):
        assert_cut(result)
