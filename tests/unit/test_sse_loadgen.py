"""The lab's load client (lab/loadgen/loadgen.py) counts what a client would call failed: cut streams, answers
without [DONE], HTTP errors - and names the server that answered."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fake_openai import Answer, FakeServer

LOADGEN = Path(__file__).resolve().parents[2] / "lab" / "loadgen" / "loadgen.py"


def test_loadgen_counts_cut_streams_missing_done_and_http_errors(tmp_path):
    def answer(number, body):
        return [Answer(tokens=3), Answer(tokens=3, cut_after_tokens=1), Answer(tokens=3, send_done=False),
                Answer(status=503, error_body={"message": "no server"})][number % 4]

    out = tmp_path / "load.json"
    with FakeServer(answer_for=answer) as fake:
        done = subprocess.run([sys.executable, str(LOADGEN), "--host", "127.0.0.1", "--port", str(fake.port),
                               "--model", "tiny", "--api-key", "k", "--concurrency", "2", "--max-tokens", "8",
                               "--duration", "0.5", "--out", str(out)], capture_output=True, text=True, timeout=60)
        sent = fake.completions
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["sent"] == sent >= 8
    assert summary["ok"] + summary["failed"] == summary["sent"]
    # every 4th request is good (number % 4 == 0); the others fail three different ways
    assert summary["ok"] == sum(1 for n in range(1, sent + 1) if n % 4 == 0)
    assert summary["truncated"] == sum(1 for n in range(1, sent + 1) if n % 4 == 1)
    assert summary["http_errors"] == {"503": sum(1 for n in range(1, sent + 1) if n % 4 == 3)}
    assert summary["without_done"] >= summary["truncated"] + sum(1 for n in range(1, sent + 1) if n % 4 == 2)
    assert {f["status"] for f in summary["failures"]} <= {200, 503}
    assert json.loads(done.stdout)["sent"] == sent
    # the timeline places every request by the second it was sent: [second, ok, failed], seconds since started_at
    assert [row[0] for row in summary["timeline"]] == [0]
    assert sum(row[1] for row in summary["timeline"]) == summary["ok"]
    assert sum(row[2] for row in summary["timeline"]) == summary["failed"]
    assert 0 < summary["started_at"] <= min(f["sent_at"] for f in summary["failures"]) + summary["started_at"]


def test_loadgen_asks_for_full_length_answers_only_with_ignore_eos(tmp_path):
    """--ignore-eos puts vLLM's ignore_eos sampling parameter in every request (answers run to max_tokens, as the
    fleet scenario's long streams need); without it the body carries no such field."""
    for flag, expected in (([], None), (["--ignore-eos"], True)):
        bodies = []

        def answer(number, body):
            bodies.append(body)
            return Answer(tokens=2)

        out = tmp_path / f"load{len(flag)}.json"
        with FakeServer(answer_for=answer) as fake:
            done = subprocess.run([sys.executable, str(LOADGEN), "--host", "127.0.0.1", "--port", str(fake.port),
                                   "--model", "tiny", "--concurrency", "1", "--max-tokens", "300",
                                   "--duration", "0.3", "--out", str(out), *flag],
                                  capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert bodies and {body.get("ignore_eos") for body in bodies} == {expected}
        assert {body["max_tokens"] for body in bodies} == {300}
        assert json.loads(out.read_text())["ignore_eos"] is bool(expected)


def test_loadgen_ramp_up_starts_the_clients_spread_out_and_stops_on_time(tmp_path):
    """--ramp-up S: client i waits i/concurrency of S before its first request; a stop during the wait ends it."""
    def run(*extra):
        out = tmp_path / "load.json"
        with FakeServer(answer_for=lambda number, body: Answer(tokens=2)) as fake:
            done = subprocess.run([sys.executable, str(LOADGEN), "--host", "127.0.0.1", "--port", str(fake.port),
                                   "--model", "tiny", "--api-key", "k", "--concurrency", "4", "--think-time", "0.2",
                                   "--duration", "0.5", "--out", str(out), *extra],
                                  capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(out.read_text())

    together, spread = run(), run("--ramp-up", "8")
    # all four clients send from the start; spread over 8 s, only the first starts within the 0.5 s
    assert together["sent"] >= 4 and together["ramp_up_s"] == 0.0
    assert 1 <= spread["sent"] <= 3 and spread["ramp_up_s"] == 8.0
    assert spread["duration_s"] < 2
