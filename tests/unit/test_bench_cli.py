"""`bin/revive bench` end to end: bad input is refused naming the option (exit 2, no traceback), an unreachable
server is exit 2, and short levels against the lab twin on loopback write reports whose numbers recompute from
requests.jsonl, with the exit code of their verdicts (docs/bench.md)."""
from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai import Answer, FakeServer

from ansible.module_utils.revive_bench.load import LevelConfig, summarize
from ansible.module_utils.revive_bench.probe import TimeScaleError, Traits, resolve_time_scale

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import harness  # noqa: E402

MODEL = "chat-20b"


def bench(*argv, timeout=90, env=None):
    return subprocess.run([sys.executable, str(REPO / "bin" / "revive"), "bench", *argv], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """The field notes' deployment at a time scale of 0.01: a 32-token answer takes some 30 ms."""
    tmp = tmp_path_factory.mktemp("twin")
    model = harness.write_model("internlm2-chat-20b", tmp / "chat-20b-fp16")
    server = harness.start(model, harness.FIELD_NOTES_FLAGS, harness.twin_env(tmp, time_scale=0.01,
                                                                              extra=harness.FIELD_NOTES_ENV),
                           tmp / "twin.log", served_name=MODEL)
    yield server
    server.stop()


@pytest.mark.parametrize("argv, words", [
    (["--concurrency", "8,0"], "argument --concurrency: '0' must be > 0"),
    (["--duration", "-5"], "argument --duration: '-5' must be > 0"),
    (["--duration", "nan"], "argument --duration: 'nan' is not a finite number"),
    (["--slo-e2e-p95", "inf"], "argument --slo-e2e-p95: 'inf' is not a finite number"),
    (["--concurrency", "8,x"], "argument --concurrency: 'x' is not an integer"),
    (["--concurrency", "8,16,8"], "argument --concurrency: a level appears twice in 8,16,8"),
    (["--url", "ftp://host:1"], "argument --url: 'ftp://host:1': the scheme must be http or https"),
    (["--url", "http://h:99999"], "argument --url: 'http://h:99999': bad port"),
    (["--confidence", "1"], "argument --confidence: 1 must be < 1"),
    (["--prompts", "/nonexistent.jsonl"], "--prompts /nonexistent.jsonl: No such file or directory"),
    (["--tokenizer", "/nonexistent.json"], "--tokenizer /nonexistent.json: No such file or directory"),
    (["--node-observations", "/nonexistent.json"], "--node-observations /nonexistent.json: [Errno 2]"),
    (["--time-scale", "0"], "argument --time-scale: '0' must be > 0"),
    (["--time-scale", "fast"], "argument --time-scale: 'fast' is not a number"),
    (["--arrivals", "constant"], "argument --arrivals: constant arrivals need --rate"),
    (["--rate", "2", "--arrivals", "burst"], "argument --arrivals: invalid choice: 'burst'"),
])
def test_bad_input_is_refused_naming_the_option(argv, words, tmp_path):
    done = bench("--url", "http://127.0.0.1:1", "--model", "m", "--out", str(tmp_path), *argv, timeout=30)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_unreachable_server_is_a_connection_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = bench("--url", f"http://127.0.0.1:{port}", "--model", "m", "--out", str(tmp_path / "r"), timeout=30)
    assert done.returncode == 2 and "cannot connect (ConnectionRefusedError" in done.stderr, done.stderr
    assert not (tmp_path / "r").exists()


def recomputed(records, level, time_scale=1.0):
    config = LevelConfig(level["concurrency"], 0, 0, 0, 0, time_scale=time_scale)
    return summarize([r for r in records if r["level"] == level["concurrency"]], config, *level["window"])["stats"]


def test_short_levels_against_the_twin_pass_and_recompute_from_the_raw_records(twin, tmp_path):
    out = tmp_path / "run"
    # a generous client bound and SLO: this 2-core machine also runs the twin and Molecule's scenarios (make test runs
    # the unit tests beside them), and at time scale 0.01 a 50 ms stall of the twin is 5 simulated seconds (level 4
    # saw a P95 of 6-10 s there, ~3 s alone); the bound's and the SLO's own rules are the next test's subject
    # the twin runs at 0.01 (its /version says so): latencies and the SLO are simulated seconds, 100x the wall ones
    done = bench("--url", f"http://127.0.0.1:{twin.port}", "--model", MODEL, "--concurrency", "2,4", "--duration",
                 "2", "--warmup", "0.3", "--max-tokens", "32", "--slo-e2e-p95", "40", "--min-achieved", "0.8",
                 "--max-lag-p99-ms", "500", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["verdicts"] == {"2": "PASS", "4": "PASS"} and summary["recommended_concurrency"] == 4
    assert "bench: level 2 measure" in done.stderr and "bench: level 4: PASS" in done.stderr
    assert "s (simulated s)" in done.stderr and "simulated server, time scale 0.01" in done.stderr
    simulation = summary["simulation"]
    assert (simulation["time_scale"], simulation["source"]) == (0.01, "server /version twin.time_scale")
    assert "simulated seconds" in simulation["note"] and simulation["duration_simulated_s"] == pytest.approx(200)
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {r["level"] for r in records} == {2, 4} and all(r["ok"] for r in records)
    rows = list(csv.DictReader((out / "levels.csv").open()))
    for level, row in zip(summary["levels"], rows):
        again = recomputed(records, level, 0.01)
        wall = recomputed(records, level)
        stats = level["stats"]
        assert stats["e2e_s"]["p95"] == pytest.approx(100 * wall["e2e_s"]["p95"])   # the records keep wall times
        assert stats["dispatch_lag_s"] == wall["dispatch_lag_s"]
        for key in ("requests", "completed", "failed", "output_tokens", "warmup_excluded", "drain_excluded"):
            assert again[key] == stats[key], key
        for metric in ("ttft_s", "e2e_s", "tpot_s", "itl_s"):
            assert again[metric]["p95"] == pytest.approx(stats[metric]["p95"]), metric
        assert again["achieved_concurrency"] == pytest.approx(stats["achieved_concurrency"])
        assert stats["completed"] >= summary["slo"]["min_completions"] == 59
        assert stats["e2e_p95_bounds"]["upper"] <= 40 and stats["output_tokens_mean"] == 32
        assert stats["usage_vs_stream"]["mismatched"] == 0
        assert float(row["e2e_p95_s"]) == pytest.approx(stats["e2e_s"]["p95"]) and row["verdict"] == "PASS"
    provenance = summary["provenance"]
    assert provenance["servers"][f"http://127.0.0.1:{twin.port}"]["version"]["simulates"] == "0.5.4"
    assert provenance["servers"][f"http://127.0.0.1:{twin.port}"]["time_scale"] == 0.01
    assert provenance["prompts"]["count"] == 153 and len(provenance["prompts"]["sha256"]) == 64
    assert provenance["command"].startswith("revive bench --url http://127.0.0.1:")
    report = (out / "report.md").read_text()
    assert "| 2 | PASS |" in report and "not checked: server restart: no node observation" in report
    assert "No plots" in report


def test_an_impossible_lag_bound_makes_the_level_invalid_and_a_tiny_slo_fails(twin, tmp_path):
    common = ["--url", f"http://127.0.0.1:{twin.port}", "--model", MODEL, "--concurrency", "2", "--duration", "1.5",
              "--warmup", "0.2", "--max-tokens", "16", "--min-achieved", "0.5"]
    invalid = bench(*common, "--max-lag-p99-ms", "0", "--out", str(tmp_path / "a"))
    assert invalid.returncode == 3, invalid.stderr
    assert "level 2: INVALID: client bottleneck: dispatch lag p99" in invalid.stderr
    failed = bench(*common, "--max-lag-p99-ms", "1000", "--slo-e2e-p95", "0.001", "--chat",
                   "--out", str(tmp_path / "b"))
    assert failed.returncode == 1, failed.stderr
    level = json.loads((tmp_path / "b" / "summary.json").read_text())["levels"][0]
    assert level["verdict"]["verdict"] == "FAIL" and "P95 E2E over the SLO" in level["verdict"]["reasons"][0]
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["endpoint"] == "chat"


def test_two_targets_one_without_done_and_a_key_from_the_environment(tmp_path):
    """Two targets share the load round robin; the non-vLLM one (no [DONE], an empty /version) is probed as such and
    none of its answers fails for it, the vLLM-like one keeps the rule; the key from the environment is sent; a node
    observation of a restart fails the level whatever the client saw."""
    plain = lambda n, body: Answer(tokens=4, token_delay=0.01, send_done=False)  # noqa: E731
    vllm_like = lambda n, body: Answer(tokens=4, token_delay=0.01)  # noqa: E731
    with FakeServer(version={}, answer_for=plain) as one, FakeServer(answer_for=vllm_like) as two:
        urls = [f"http://127.0.0.1:{one.port}", f"http://127.0.0.1:{two.port}"]
        observed = tmp_path / "node.json"
        observed.write_text(json.dumps({"2": {"restarts": 1, "oom_lines": 0}}))
        done = bench("--url", ",".join(urls), "--model", "tiny", "--concurrency", "2", "--duration", "1", "--warmup",
                     "0.1", "--max-tokens", "4", "--node-observations", str(observed), "--out", str(tmp_path / "r"),
                     env=dict(os.environ, REVIVE_API_KEY="s3cret"))
        keys = {r["headers"].get("authorization") for r in one.requests + two.requests}
    assert done.returncode == 1, done.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["levels"][0]["verdict"] == {"verdict": "FAIL", "reasons": ["server restart: 1 during the level"],
                                               "not_checked": ["GPU balance: not observed"]}
    servers = summary["provenance"]["servers"]
    assert (servers[urls[0]]["sends_done"], servers[urls[1]]["sends_done"]) == (False, True)
    records = [json.loads(line) for line in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    assert records and all(r["ok"] and r["done"] == (r["target"] == urls[1]) for r in records)
    stats = summary["levels"][0]["stats"]
    assert stats["failed"] == 0 and stats["output_tokens_mean"] == 4
    assert set(stats["per_target"]) == set(urls)
    assert sum(t["requests"] for t in stats["per_target"].values()) == stats["requests"]
    assert keys == {"Bearer s3cret"} and "s3cret" not in (tmp_path / "r" / "summary.json").read_text()


def traits(label, scale):
    return Traits(label, {"twin": {"time_scale": scale}} if scale else {}, ["m"], True, "last_only", False, True,
                  0.1, 4, scale)


def test_time_scale_auto_takes_the_servers_agreed_scale_and_an_explicit_one_wins():
    assert resolve_time_scale({"a": traits("a", None)}) == (1.0, None)
    both = {"a": traits("a", 0.2), "b": traits("b", 0.2)}
    assert resolve_time_scale(both) == (0.2, "server /version twin.time_scale")
    assert resolve_time_scale({"a": traits("a", 0.2)}, 0.5) == (0.5, "--time-scale")
    assert resolve_time_scale({"a": traits("a", None), "b": traits("b", 0.2)}, 1.0) == (1.0, "--time-scale")
    with pytest.raises(TimeScaleError, match=r"do not agree .*: a: 0.2, b: 0.5; "):
        resolve_time_scale({"a": traits("a", 0.2), "b": traits("b", 0.5)})


def test_targets_that_disagree_on_the_time_scale_are_a_usage_error_naming_them(twin, tmp_path):
    with FakeServer(models=[MODEL], answer_for=lambda n, body: Answer(tokens=2)) as real:
        urls = [f"http://127.0.0.1:{twin.port}", f"http://127.0.0.1:{real.port}"]
        done = bench("--url", ",".join(urls), "--model", MODEL, "--out", str(tmp_path / "r"), timeout=30)
        streamed = [r for r in real.requests if r["path"].endswith("completions")]
    assert len(streamed) == 1       # the probe's request: no load before the scale is settled
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (f"--time-scale auto: the targets do not agree on their simulated time scale (/version twin.time_scale): "
            f"{urls[0]}: 0.01, {urls[1]}: none (not simulated)") in done.stderr
    assert not (tmp_path / "r").exists()


def test_an_explicit_time_scale_of_a_quarter_reports_four_times_the_wall_latencies(tmp_path):
    """A server that says nothing of a time scale, benched with --time-scale 0.25: every latency in the summary is 4x
    the wall one recomputed from requests.jsonl, throughput a quarter, the dispatch lag unscaled."""
    answer = lambda n, body: Answer(tokens=4, token_delay=0.01)  # noqa: E731
    with FakeServer(answer_for=answer) as fake:
        done = bench("--url", f"http://127.0.0.1:{fake.port}", "--model", "tiny", "--concurrency", "2", "--duration",
                     "1", "--warmup", "0.1", "--max-tokens", "4", "--slo-e2e-p95", "30", "--time-scale", "0.25",
                     "--max-lag-p99-ms", "500", "--min-achieved", "0.5", "--out", str(tmp_path / "r"))
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["simulation"]["time_scale"] == 0.25 and summary["simulation"]["source"] == "--time-scale"
    assert summary["simulation"]["server_time_scales"] == {f"http://127.0.0.1:{fake.port}": None}
    assert "(simulated s)" in done.stderr
    records = [json.loads(line) for line in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    level = summary["levels"][0]
    wall, stats = recomputed(records, level), level["stats"]
    again = recomputed(records, level, 0.25)
    assert stats["e2e_s"]["p95"] == pytest.approx(again["e2e_s"]["p95"]) and stats["time_scale"] == 0.25
    for metric in ("ttft_s", "e2e_s", "tpot_s", "itl_s"):
        for key in ("p50", "p95", "max"):
            assert stats[metric][key] == pytest.approx(4 * wall[metric][key]), (metric, key)
    assert stats["e2e_s"]["p50"] >= 4 * 0.03
    assert stats["output_throughput_tok_s"] == pytest.approx(wall["output_throughput_tok_s"] / 4)
    assert stats["dispatch_lag_s"] == wall["dispatch_lag_s"]
    assert stats["achieved_concurrency"] == pytest.approx(wall["achieved_concurrency"])


def test_a_real_server_at_real_time_has_no_simulation(tmp_path):
    with FakeServer(answer_for=lambda n, body: Answer(tokens=2)) as fake:
        done = bench("--url", f"http://127.0.0.1:{fake.port}", "--model", "tiny", "--concurrency", "1", "--duration",
                     "0.3", "--warmup", "0", "--max-tokens", "2", "--out", str(tmp_path / "r"), "--json")
    summary = json.loads(done.stdout)
    assert summary["simulation"] is None and summary["levels"][0]["stats"]["time_scale"] == 1.0
    assert "simulated" not in done.stderr


def test_live_progress_on_a_terminal_and_plain_lines_elsewhere():
    import io

    from rich.console import Console

    from revive_cli import bench as bench_cli

    class NotATerminal(io.StringIO):
        def isatty(self):
            return False

    assert bench_cli.progress_reporter(NotATerminal()) is None
    out = io.StringIO()
    live = bench_cli.LiveProgress(Console(file=out, force_terminal=True, width=120))
    with live:
        live({"level": 32, "phase": "measure", "elapsed_s": 12.5, "completions": 118, "in_flight": 32,
              "e2e_p95_s": 7.512, "errors": 1, "time_scale": 0.2})
        live({"level": 32, "verdict": "PASS", "reasons": ["P95 E2E within the SLO"], "time_scale": 0.2})
    text = __import__("re").sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    for words in ("revive bench", "118", "7.512 (sim.)", "level 32: PASS: P95 E2E within the SLO", "done"):
        assert words in text, (words, text)
