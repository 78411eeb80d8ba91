"""The streaming client (module_utils/revive_sse.py): SSE framing, what counts as a good answer, TTFT rules.

A scripted server (fake_openai.py) produces each failure a client must notice (docs/facts/lb-and-rolling.md
§4.1); the last tests read real streams from the vLLM twin, including one cut by SIGTERM.
"""
from __future__ import annotations

import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from ansible.module_utils.revive_sse import (
    Endpoint,
    SSEDecoder,
    StreamRequest,
    content_of,
    parse_prometheus,
    stream,
)
from fake_openai import Answer, FakeServer

REPO = Path(__file__).resolve().parents[2]


def chat(max_tokens=16, **extra) -> StreamRequest:
    return StreamRequest("chat", "tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens,
                         extra=extra)


def run(answer: Answer, request: StreamRequest = None, api_key: str = "") -> tuple:
    with FakeServer(answer_for=lambda number, body: answer) as fake:
        result = stream(Endpoint("127.0.0.1", fake.port, api_key, timeout=5), request or chat())
    return result, fake


# --- SSE framing ------------------------------------------------------------------------------------------

def test_decoder_joins_reads_handles_crlf_split_across_reads_and_skips_comments():
    decoder = SSEDecoder()
    assert decoder.feed(b": keep-alive comment\r\ndata: {\"a\"") == []
    assert decoder.feed(b": 1}\r") == []
    assert decoder.feed(b"\n\r\ndata: [DONE]\n") == ['{"a": 1}']
    assert decoder.feed(b"\n") == ["[DONE]"]


def test_decoder_joins_multi_line_data_and_delivers_an_unterminated_event_at_close():
    decoder = SSEDecoder()
    assert decoder.feed(b"event: x\ndata: one\ndata:two\n\ndata: last") == ["one\ntwo"]
    assert decoder.close() == ["last"]


def test_role_only_and_usage_only_chunks_carry_no_content():
    assert content_of("chat", {"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert content_of("chat", {"choices": [{"delta": {"role": "assistant", "content": ""}}]}) == ""
    assert content_of("chat", {"choices": [], "usage": {"prompt_tokens": 3}}) == ""
    assert content_of("chat", {"choices": [{"delta": {"content": "Hi"}}]}) == "Hi"
    assert content_of("completions", {"choices": [{"text": "a"}, {"text": "b"}]}) == "ab"


# --- good answers and timing ----------------------------------------------------------------------------------

def test_a_good_chat_stream_passes_with_usage_and_ttft_after_the_role_chunk():
    result, fake = run(Answer(tokens=5, role_delay=0.2, token_delay=0.01))
    assert result.ok, result.problems
    assert result.text == "word0 word1 word2 word3 word4"
    assert (result.prompt_tokens, result.completion_tokens, result.total_tokens) == (12, 5, 17)
    assert result.finish_reasons == ["length"] and result.done and not result.truncated
    # the role-only chunk came 0.2 s before the first token: TTFT includes that wait
    assert result.headers_s < 0.15 <= 0.2 <= result.ttft_s < result.e2e_s
    assert result.tpot_s == pytest.approx(0.01, abs=0.008)
    sent = fake.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["stream"] is True and sent["body"]["stream_options"] == {"include_usage": True}
    assert sent["body"]["max_tokens"] == 16 and "max_completion_tokens" not in sent["body"]
    assert "authorization" not in sent["headers"]


def test_completions_use_the_text_field_and_the_api_key_is_a_bearer_token():
    request = StreamRequest("completions", "tiny", prompt="Once", max_tokens=8)
    result, fake = run(Answer(tokens=3), request, api_key="s3cret")
    assert result.ok, result.problems
    assert result.text == "word0 word1 word2"
    assert fake.requests[0]["path"] == "/v1/completions"
    assert fake.requests[0]["body"]["prompt"] == "Once"
    assert fake.requests[0]["headers"]["authorization"] == "Bearer s3cret"


# --- what a client must count as failed ------------------------------------------------------------------------

def test_a_stream_cut_mid_body_is_truncated_and_failed():
    result, _ = run(Answer(tokens=8, cut_after_tokens=3))
    assert not result.ok and result.truncated
    assert result.problems[0].startswith("connection cut after 3 content events: IncompleteRead")


def test_a_clean_end_without_done_fails():
    result, _ = run(Answer(send_done=False))
    assert not result.ok and not result.truncated
    assert result.problems == ["the stream ended without data: [DONE]"]


def test_a_stream_without_finish_reason_fails():
    result, _ = run(Answer(finish_reason=None))
    assert result.problems == ["no finish_reason for every choice"]


def test_an_http_500_fails_with_vllms_message():
    body = {"object": "error", "message": "[twin fault] simulated engine error", "type": "InternalServerError",
            "param": None, "code": 500}
    result, _ = run(Answer(status=500, error_body=body))
    assert result.status == 500 and not result.ok
    assert len(result.problems) == 1
    assert re.fullmatch(r"HTTP 500 from http://127\.0\.0\.1:\d+/v1/chat/completions: "
                        r"\[twin fault\] simulated engine error", result.problems[0])


def test_an_error_event_inside_the_stream_fails():
    result, _ = run(Answer(tokens=6, error_event_after=2))
    assert not result.ok
    assert "error event in the stream: engine died" in result.problems


def test_insane_usage_fails():
    result, _ = run(Answer(tokens=4, usage_completion=40), chat(max_tokens=16))
    assert result.problems == ["usage.completion_tokens is 40, outside 1..16"]


def test_missing_usage_fails_when_it_was_asked_for():
    result, _ = run(Answer(send_usage=False))
    assert result.problems == ["no usage chunk (stream_options.include_usage was asked for)"]


def test_an_empty_answer_fails():
    result, _ = run(Answer(tokens=1, text=""))
    assert "the answer text is empty" in result.problems


def test_a_200_that_is_not_an_event_stream_fails():
    result, _ = run(Answer(content_type="text/html"))
    assert result.problems[0].startswith("HTTP 200 but Content-Type 'text/html', not text/event-stream")


def test_nothing_listening_is_a_failure_not_an_exception():
    with FakeServer() as fake:
        port = fake.port
    result = stream(Endpoint("127.0.0.1", port, timeout=2), chat())
    assert not result.ok and result.status == 0
    assert result.problems[0].startswith("ConnectionRefusedError") or "refused" in result.problems[0]


# --- Prometheus text ----------------------------------------------------------------------------------------

def test_prometheus_samples_and_sums_over_labels():
    text = ('# HELP vllm:num_requests_running Number of requests currently running on GPU.\n'
            '# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{model_name="tiny chat"} 3.0\n'
            'vllm:num_requests_waiting{model_name="a"} 1.0\n'
            'vllm:num_requests_waiting{model_name="b"} 2.0\n'
            'process_open_fds 12\n')
    samples = parse_prometheus(text)
    assert samples['vllm:num_requests_running{model_name="tiny chat"}'] == 3.0
    assert samples["vllm:num_requests_running"] == 3.0
    assert samples["vllm:num_requests_waiting"] == 3.0
    assert samples["process_open_fds"] == 12.0


# --- the twin: real 0.5.4 stream shapes ------------------------------------------------------------------------

sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))
import harness  # noqa: E402


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("twin")
    model = harness.write_model("llama-2-7b-chat", tmp / "model")
    env = harness.twin_env(tmp, time_scale=0.05, extra={"VLLM_SIM_COLD_START_REQUESTS": "0"})
    server = harness.start(model, ["-tp", "4"], env, tmp / "twin.log", served_name="tiny")
    yield server
    server.stop()


def test_twin_chat_and_completions_streams_pass_with_exact_usage(twin):
    endpoint = Endpoint("127.0.0.1", twin.port, timeout=30)
    for request in (chat(max_tokens=24, ignore_eos=True),
                    StreamRequest("completions", "tiny", prompt="The rolling update", max_tokens=24,
                                  extra={"ignore_eos": True})):
        result = stream(endpoint, request)
        assert result.ok, result.problems
        assert result.completion_tokens == 24 and result.content_events >= 1
        assert 0 < result.ttft_s <= result.e2e_s


def test_twin_sigterm_in_the_default_frontend_mode_truncates_the_open_stream(tmp_path):
    model = harness.write_model("llama-2-7b-chat", tmp_path / "model")
    env = harness.twin_env(tmp_path, time_scale=0.05, extra={"VLLM_SIM_COLD_START_REQUESTS": "0"})
    server = harness.start(model, ["-tp", "4"], env, tmp_path / "twin.log", served_name="tiny")
    results = []
    reader = threading.Thread(target=lambda: results.append(
        stream(Endpoint("127.0.0.1", server.port, timeout=30), chat(max_tokens=2000, ignore_eos=True))))
    reader.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "Avg prompt" not in server.log() and "Received request" not in server.log():
        time.sleep(0.05)
    time.sleep(0.3)
    server.stop(signal.SIGTERM)
    reader.join(30)
    result = results[0]
    assert not result.ok and result.truncated and not result.done
    assert result.problems[0].startswith("connection cut after")
