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
