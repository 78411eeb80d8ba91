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
