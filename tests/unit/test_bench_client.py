"""revive bench's raw-socket client and probe against the scripted server (tests/unit/fake_openai.py): what counts
as a complete answer, what is a failure (no [DONE] where the server sends it, a cut body, 5xx, a stall: never a
hang), and the traits the probe derives."""
from __future__ import annotations

import asyncio
import socket
import time

import pytest
from fake_openai import Answer, FakeServer

from ansible.module_utils.revive_bench.client import (RequestRecord, Target, build_request, parse_url, request_body,
                                                      stream_request)
from ansible.module_utils.revive_bench.probe import ProbeError, probe


def send(port, kind="completions", expect_done=True, timeout=5.0, include_usage=True, ignore_eos=False):
    target = Target("http", "127.0.0.1", port)
    prompt = [{"role": "user", "content": "hi"}] if kind == "chat" else "hi"
    record = RequestRecord(index=0, level=1, target=target.label, prompt_id="p", max_tokens=8, ignore_eos=ignore_eos)
    payload = build_request(target, kind, request_body(kind, "tiny", prompt, 8, ignore_eos, include_usage), "k")
    return asyncio.run(stream_request(target, kind, payload, record, timeout, 1.0, expect_done))


def test_a_good_stream_keeps_every_event_time_and_the_usage():
    with FakeServer(answer_for=lambda n, body: Answer(tokens=5, token_delay=0.01)) as fake:
        record = send(fake.port, ignore_eos=True)
        body, headers = fake.requests[-1]["body"], fake.requests[-1]["headers"]
    assert record.ok and record.error is None and record.done and record.finish_reasons == ["length"]
    assert [tokens for _, tokens in record.events] == [1] * 5
    times = [at for at, _ in record.events]
    assert record.sent < record.first_byte <= times[0] and times == sorted(times) and times[-1] <= record.ended
    assert times[-1] - times[0] >= 0.04
    assert record.usage["completion_tokens"] == 5 and not record.usage_per_chunk
    assert body["stream"] is True and body["max_tokens"] == 8 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True} and body["prompt"] == "hi"
    assert headers["authorization"] == "Bearer k" and fake.requests[-1]["path"] == "/v1/completions"


def test_the_replica_the_front_door_names_is_recorded():
    with FakeServer(answer_for=lambda n, body: Answer(tokens=2, served_by="node2-vllm-1")) as fake:
        assert send(fake.port).served_by == "node2-vllm-1"
    with FakeServer(answer_for=lambda n, body: Answer(tokens=2)) as fake:
        assert send(fake.port).served_by is None


def test_no_done_fails_only_where_the_server_was_seen_sending_it():
    with FakeServer(answer_for=lambda n, body: Answer(tokens=3, send_done=False)) as fake:
        strict, lenient = send(fake.port, expect_done=True), send(fake.port, expect_done=False)
    assert not strict.ok and "without data: [DONE]" in strict.error
    assert lenient.ok and not lenient.done


def test_a_cut_stream_is_a_failure_not_a_short_success():
    with FakeServer(answer_for=lambda n, body: Answer(tokens=6, cut_after_tokens=2)) as fake:
        record = send(fake.port)
    assert not record.ok and record.error.startswith("connection cut after 2 content events")
    assert len(record.events) == 2


def test_a_5xx_and_an_error_event_are_failures_with_the_servers_message():
    with FakeServer(answer_for=lambda n, body: Answer(status=503, error_body={"message": "no capacity"})) as fake:
        record = send(fake.port)
    assert not record.ok and record.status == 503 and record.error == "HTTP 503: no capacity"
    with FakeServer(answer_for=lambda n, body: Answer(tokens=4, error_event_after=2)) as fake:
        record = send(fake.port)
    assert not record.ok and "error event in the stream: engine died" in record.error


def test_missing_finish_reason_is_a_failure():
    with FakeServer(answer_for=lambda n, body: Answer(tokens=3, finish_reason=None)) as fake:
        record = send(fake.port)
    assert not record.ok and record.error == "no finish_reason for every choice"


def test_the_role_only_first_chunk_is_not_the_first_token():
    with FakeServer(answer_for=lambda n, body: Answer(tokens=3, role_delay=0.2)) as fake:
        record = send(fake.port, kind="chat")
        assert fake.requests[-1]["path"] == "/v1/chat/completions"
    assert record.ok and record.role_only_first and len(record.events) == 3
    assert record.events[0][0] - record.first_byte >= 0.19


def test_a_stalled_server_times_out_and_a_closed_port_fails_fast():
    with FakeServer(answer_for=lambda n, body: Answer(tokens=3, first_delay=3.0)) as fake:
        started = time.monotonic()
        record = send(fake.port, timeout=0.4)
        assert time.monotonic() - started < 1.5
    assert not record.ok and record.error == "timeout: no complete answer within 0.4 s"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    record = send(port)
    assert not record.ok and record.error.startswith(f"connection refused by http://127.0.0.1:{port}")


@pytest.mark.parametrize("url, words", [("ftp://host", "scheme"), ("http://", "no host"), ("http://h:99999", "port"),
                                        ("localhost:8000", "scheme")])
def test_malformed_urls_are_refused(url, words):
    with pytest.raises(ValueError, match=words):
        parse_url(url)


def test_urls_keep_a_path_prefix():
    assert parse_url("https://lb.example/vllm/").label == "https://lb.example:443/vllm"


def test_probe_derives_the_servers_traits():
    with FakeServer(answer_for=lambda n, body: Answer(tokens=3)) as fake:
        traits = asyncio.run(probe(Target("http", "127.0.0.1", fake.port), "tiny"))
    assert traits.version == {"version": "0.5.4"} and traits.models == ["tiny"]
    assert (traits.usage, traits.sends_done, traits.include_usage_accepted) == ("last_only", True, True)
    assert traits.probe_output_tokens == 3
    with FakeServer(answer_for=lambda n, body: Answer(tokens=3, send_done=False)) as fake:
        traits = asyncio.run(probe(Target("http", "127.0.0.1", fake.port), "tiny", kind="chat"))
    assert not traits.sends_done and traits.role_only_first


def test_probe_retries_without_stream_options_when_they_are_refused():
    def answer(number, body):
        return Answer(status=400, error_body={"message": "extra fields"}) if "stream_options" in body else Answer()

    with FakeServer(answer_for=answer) as fake:
        traits = asyncio.run(probe(Target("http", "127.0.0.1", fake.port), "tiny"))
        assert fake.completions == 2
    assert not traits.include_usage_accepted and traits.usage == "none"


def test_probe_errors_name_the_problem():
    with FakeServer() as fake:
        with pytest.raises(ProbeError, match="does not serve model 'big'; it serves: tiny"):
            asyncio.run(probe(Target("http", "127.0.0.1", fake.port), "big"))
    with FakeServer(answer_for=lambda n, body: Answer(status=500)) as fake:
        with pytest.raises(ProbeError, match="the probe request to model 'tiny' failed: HTTP 500"):
            asyncio.run(probe(Target("http", "127.0.0.1", fake.port), "tiny"))

    async def not_http():
        async def answer(reader, writer):
            writer.write(b"SSH-2.0-OpenSSH_9.2\r\n")
            await writer.drain()
            writer.close()
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            await probe(Target("http", "127.0.0.1", port), "tiny", timeout=2)
    with pytest.raises(ProbeError, match="not an HTTP server"):
        asyncio.run(not_http())
