"""The twin's OpenAI API against vLLM 0.5.4's shapes (docs/facts/vllm-volta.md §4-§5): streams and
full responses of both endpoints, usage accounting, errors, auth, /metrics in both frontend modes, HTTP/1.1."""
from __future__ import annotations

import http.client
import json
import re
import socket
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import harness  # noqa: E402

MODEL = "chat-20b"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ID = {"chat": re.compile(r"^chat-[0-9a-f]{32}$"), "cmpl": re.compile(r"^cmpl-[0-9a-f]{32}$")}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return harness.write_model("internlm2-chat-20b", tmp_path_factory.mktemp("m") / "chat-20b-fp16")


@pytest.fixture(scope="module")
def twin(model_dir, tmp_path_factory):
    """The field notes' flags with --disable-frontend-multiprocessing (metrics on), fast time."""
    tmp = tmp_path_factory.mktemp("twin")
    server = harness.start(model_dir, harness.FIELD_NOTES_FLAGS + ["--disable-frontend-multiprocessing"],
                           harness.twin_env(tmp, time_scale=0.002, extra=harness.FIELD_NOTES_ENV), tmp / "twin.log",
                           served_name=MODEL)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keyed(model_dir, tmp_path_factory):
    """Default frontend multiprocessing, --api-key and VLLM_API_KEY (the environment wins, api_server.py:248)."""
    tmp = tmp_path_factory.mktemp("keyed")
    env = harness.twin_env(tmp, time_scale=0.002, extra={"VLLM_API_KEY": "env-key", **harness.FIELD_NOTES_ENV})
    server = harness.start(model_dir, harness.FIELD_NOTES_FLAGS + ["--api-key", "flag-key"], env, tmp / "twin.log",
                           served_name=MODEL)
    yield server
    server.stop()


def chat_body(**extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "How do I warm up a vLLM server?"}],
            "max_tokens": 12, "seed": 7}
    body.update(extra)
    return body


def test_chat_stream_has_054s_chunks(twin):
    result = harness.stream(twin, CHAT, chat_body(stream=True))
    assert result.status == 200 and result.complete and result.events[-1] == "[DONE]"
    chunks = result.chunks()
    first = chunks[0]
    assert list(first) == ["id", "object", "created", "model", "choices"]
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]
    assert ID["chat"].match(first["id"]) and first["object"] == "chat.completion.chunk" and first["model"] == MODEL
    assert {c["id"] for c in chunks} == {first["id"]} and {c["created"] for c in chunks} == {first["created"]}
    content = chunks[1:]
    assert all(list(c["choices"][0]) == ["index", "delta", "logprobs", "finish_reason"] for c in content[:-1])
    assert all(list(c["choices"][0]["delta"]) == ["content"] for c in content)
    last = content[-1]["choices"][0]
    assert list(last) == ["index", "delta", "logprobs", "finish_reason", "stop_reason"]
    assert last["finish_reason"] == "length" and last["stop_reason"] is None
    assert len(content) == 12


def test_chat_stream_usage_is_continuous_and_matches_the_chunks(twin):
    result = harness.stream(twin, CHAT, chat_body(stream=True, max_tokens=20, stream_options={"include_usage": True}))
    chunks = result.chunks()
    prompt = chunks[0]["usage"]["prompt_tokens"]
    assert chunks[0]["usage"] == {"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0}
    token_chunks = chunks[1:-1]
    assert [c["usage"]["completion_tokens"] for c in token_chunks] == list(range(1, 21))
    assert all(list(c["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"] for c in chunks)
    final = chunks[-1]
    assert list(final) == ["id", "object", "created", "model", "choices", "usage"] and final["choices"] == []
    assert final["usage"] == {"prompt_tokens": prompt, "total_tokens": prompt + 20, "completion_tokens": 20}


def test_continuous_usage_stats_false_gives_null_usage_until_the_final_chunk(twin):
    options = {"include_usage": True, "continuous_usage_stats": False}
    chunks = harness.stream(twin, CHAT, chat_body(stream=True, stream_options=options)).chunks()
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_chat_full_response_and_its_usage(twin):
    status, headers, data = harness.request(twin, "POST", CHAT, chat_body())
    assert status == 200 and headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(data)
    body = json.loads(data)
    assert list(body) == ["id", "object", "created", "model", "choices", "usage"]
    assert ID["chat"].match(body["id"]) and body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "stop_reason"]
    assert list(choice["message"]) == ["role", "content", "tool_calls"] and choice["message"]["tool_calls"] == []
    assert list(body["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]
    assert body["usage"]["completion_tokens"] == 12
    streamed = harness.stream(twin, CHAT, chat_body(stream=True)).chunks()
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in streamed) == choice["message"]["content"]


def test_answers_end_at_eos_unless_ignore_eos(twin):
    status, _, data = harness.request(twin, "POST", CHAT, chat_body(max_tokens=None, seed=11))
    body = json.loads(data)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert 100 < body["usage"]["completion_tokens"] < 4000
    _, _, data = harness.request(twin, "POST", COMPLETIONS, {"model": MODEL, "prompt": "Hi", "ignore_eos": True,
                                                             "max_tokens": 1500})
    assert json.loads(data)["usage"]["completion_tokens"] == 1500


def test_completions_stream_and_full(twin):
    result = harness.stream(twin, COMPLETIONS, {"model": MODEL, "prompt": "The lab runs", "max_tokens": 5,
                                                "stream": True})
    chunks = result.chunks()
    assert result.events[-1] == "[DONE]" and len(chunks) == 5
    assert all(list(c) == ["id", "object", "created", "model", "choices", "usage"] for c in chunks)
    assert all(c["usage"] is None and c["object"] == "text_completion" for c in chunks)
    assert ID["cmpl"].match(chunks[0]["id"])
    assert list(chunks[0]["choices"][0]) == ["index", "text", "logprobs", "finish_reason", "stop_reason"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    status, _, data = harness.request(twin, "POST", COMPLETIONS, {"model": MODEL, "prompt": "The lab runs",
                                                                  "ignore_eos": True})
    body = json.loads(data)
    assert body["object"] == "text_completion" and ID["cmpl"].match(body["id"])
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 20, "completion_tokens": 16}  # max_tokens default 16


@pytest.mark.parametrize("path, body, status, expected", [
    (CHAT, chat_body(model="gpt-4"), 404,
     {"object": "error", "message": "The model `gpt-4` does not exist.", "type": "NotFoundError", "param": None,
      "code": 404}),
    (COMPLETIONS, {"model": MODEL, "prompt": "word " * 4000, "max_tokens": 200}, 400,
     {"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you requested 4201 "
      "tokens (4001 in the messages, 200 in the completion). Please reduce the length of the messages or completion.",
      "type": "BadRequestError", "param": None, "code": 400}),
    (CHAT, chat_body(messages=[{"role": "user", "content": "word " * 4100}], max_tokens=None), 400,
     {"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you requested 4111 "
      "tokens in the messages, Please reduce the length of the messages.", "type": "BadRequestError", "param": None,
      "code": 400}),
    (CHAT, chat_body(max_completion_tokens=100), 400,
     {"object": "error", "message": "[{'type': 'extra_forbidden', 'loc': ('body', 'max_completion_tokens'), 'msg': "
      "'Extra inputs are not permitted', 'input': 100}]", "type": "BadRequestError", "param": None, "code": 400}),
    (CHAT, chat_body(n=0), 400,
     {"object": "error", "message": "n must be at least 1, got 0.", "type": "BadRequestError", "param": None,
      "code": 400}),
])
def test_errors_are_flat_objects_with_054s_messages(twin, path, body, status, expected):
    got_status, _, data = harness.request(twin, "POST", path, body)
    assert (got_status, json.loads(data)) == (status, expected)


def test_stream_options_without_stream_and_bad_json_are_400(twin):
    _, _, data = harness.request(twin, "POST", CHAT, chat_body(stream_options={"include_usage": True}))
    message = json.loads(data)["message"]
    assert message.startswith("[{'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, stream_options can only "
                              "be set if stream is true'")
    conn = http.client.HTTPConnection("127.0.0.1", twin.port, timeout=10)
    conn.request("POST", CHAT, body=b'{"model": ', headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 400
    assert json.loads(response.read())["message"] == ("[{'type': 'json_invalid', 'loc': ('body', 10), 'msg': 'JSON "
                                                      "decode error', 'input': {}, 'ctx': {'error': 'Expecting value'}}]")
    conn.close()


def test_unknown_routes_and_methods(twin):
    assert harness.request(twin, "GET", "/v2/models")[0:3:2] == (404, b'{"detail":"Not Found"}')
    status, headers, data = harness.request(twin, "GET", CHAT)
    assert (status, headers["allow"], data) == (405, "POST", b'{"detail":"Method Not Allowed"}')


def test_health_models_version(twin):
    status, headers, data = harness.request(twin, "GET", "/health")
    assert (status, headers["content-length"], data) == (200, "0", b"")
    _, _, data = harness.request(twin, "GET", "/v1/models")
    card = json.loads(data)["data"][0]
    assert (card["id"], card["root"], card["max_model_len"], card["owned_by"]) == (MODEL, MODEL, 4096, "vllm")
    assert card["permission"][0]["id"].startswith("modelperm-")
    _, _, data = harness.request(twin, "GET", "/version")
    version = json.loads(data)
    assert (version["version"], version["simulated"], version["twin"]["faults"]) == ("0.5.4+sim", True, {})


def test_api_key_from_the_environment_guards_v1_only(keyed):
    unauthorized = (401, b'{"error":"Unauthorized"}')
    assert harness.request(keyed, "GET", "/v1/models")[0:3:2] == unauthorized
    assert harness.request(keyed, "GET", "/v1/models", headers={"Authorization": "Bearer flag-key"})[0:3:2] == \
        unauthorized
    assert harness.request(keyed, "GET", "/v1/models", headers={"Authorization": "Bearer env-key"})[0] == 200
    for open_path in ("/health", "/version", "/metrics"):
        assert harness.request(keyed, "GET", open_path)[0] == 200


def test_metrics_in_default_mode_have_no_vllm_series(keyed):
    harness.request(keyed, "POST", CHAT, chat_body(), headers={"Authorization": "Bearer env-key"})
    status, headers, data = harness.request(keyed, "GET", "/metrics")
    text = data.decode()
    assert status == 200 and headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "vllm:" not in text
    assert "# TYPE python_gc_objects_collected_total counter" in text and "process_resident_memory_bytes " in text


FAMILIES = {
    "vllm:cache_config_info": "gauge", "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_swapped": "gauge", "vllm:gpu_cache_usage_perc": "gauge", "vllm:cpu_cache_usage_perc": "gauge",
    "vllm:num_preemptions_total": "counter", "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter", "vllm:time_to_first_token_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram", "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_best_of": "histogram", "vllm:request_params_n": "histogram",
    "vllm:request_success_total": "counter", "vllm:spec_decode_draft_acceptance_rate": "gauge",
    "vllm:spec_decode_efficiency": "gauge", "vllm:spec_decode_num_accepted_tokens_total": "counter",
    "vllm:spec_decode_num_draft_tokens_total": "counter", "vllm:spec_decode_num_emitted_tokens_total": "counter",
    "vllm:avg_prompt_throughput_toks_per_s": "gauge", "vllm:avg_generation_throughput_toks_per_s": "gauge",
}


def metric_values(twin):
    text = harness.request(twin, "GET", "/metrics")[2].decode()
    return text, list(harness.iter_metrics(text))


def value(samples, name, **labels):
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


def test_metrics_with_disable_frontend_multiprocessing_count_what_was_served(twin):
    _, before = metric_values(twin)
    usage = []
    for max_tokens in (7, 9, 11):
        _, _, data = harness.request(twin, "POST", COMPLETIONS, {"model": MODEL, "prompt": "count me", "max_tokens":
                                                                 max_tokens, "ignore_eos": True})
        usage.append(json.loads(data)["usage"])
    text, after = metric_values(twin)
    for family, kind in FAMILIES.items():
        assert f"# TYPE {family} {kind}\n" in text
    assert value(after, "vllm:prompt_tokens_total") - value(before, "vllm:prompt_tokens_total") == \
        sum(u["prompt_tokens"] for u in usage)
    assert value(after, "vllm:generation_tokens_total") - value(before, "vllm:generation_tokens_total") == 27
    assert value(after, "vllm:request_success_total", finished_reason="length") - \
        value(before, "vllm:request_success_total", finished_reason="length") == 3
    assert value(after, "vllm:num_requests_running", model_name=MODEL) == 0
    buckets = [lab["le"] for n, lab, _ in after if n == "vllm:time_to_first_token_seconds_bucket"]
    assert buckets == ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0",
                       "2.5", "5.0", "7.5", "10.0", "+Inf"]
    tokens = [lab["le"] for n, lab, _ in after if n == "vllm:request_prompt_tokens_bucket"]
    assert tokens == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0", "2000.0",
                      "+Inf"]
    info = next(lab for n, lab, _ in after if n == "vllm:cache_config_info")
    assert info["block_size"] == "16" and info["gpu_memory_utilization"] == "0.92" and int(info["num_gpu_blocks"]) > 0
    assert 'vllm:e2e_request_latency_seconds_count{model_name="chat-20b"}' in text


def test_keep_alive_content_length_and_chunked_streams(twin):
    conn = http.client.HTTPConnection("127.0.0.1", twin.port, timeout=10)
    for _ in range(2):
        conn.request("GET", "/version")
        response = conn.getresponse()
        assert response.getheader("server") == "uvicorn" and response.getheader("connection") is None
        assert len(response.read()) == int(response.getheader("content-length"))
    conn.request("POST", CHAT, body=json.dumps(chat_body(stream=True)), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.getheader("transfer-encoding") == "chunked"
    assert response.getheader("content-type") == "text/event-stream; charset=utf-8"
    assert response.read().endswith(b"data: [DONE]\n\n")
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    conn.close()


def test_a_client_that_disconnects_is_aborted(twin):
    _, before = metric_values(twin)
    sock = socket.create_connection(("127.0.0.1", twin.port))
    body = json.dumps(chat_body(stream=True, max_tokens=4000, ignore_eos=True)).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    assert b"200 OK" in sock.recv(4096)
    sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, samples = metric_values(twin)
        if value(samples, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.02)
    assert value(samples, "vllm:num_requests_running") == 0
    # aborted: not counted as a success, and far fewer than 4000 tokens were generated
    assert value(samples, "vllm:request_success_total") == value(before, "vllm:request_success_total")
    assert value(samples, "vllm:generation_tokens_total") - value(before, "vllm:generation_tokens_total") < 2000
