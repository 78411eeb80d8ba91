"""Issue 13's first "Done when", through Ansible on a lab: `site.yml` provisions the field notes' deployment and
`playbooks/benchmark.yml` reproduces their load test - 8, 16 and 32 pass, 64 fails on P95 E2E over 12 s, the
recommended concurrency is 32 and the plots show the knee (docs/field-report.md ('Results')).

A lab of its own (1 GPU node v100-pcie-8x + model-store, bench1, lb1; `bin/lab --state-dir`), so a `make demo` lab
is untouched. The model: the sparse full-size InternLM2-Chat-20B fixture (`bin/lab seed-model --size sparse`: 39.7
GB of F16 that occupies no disk at the store); model_sync moves and hashes every byte of it onto the node (~40 GB
of the node's disk while the lab is up, about 4 minutes). The plan: the planner's own, with the operator's pins
of the field notes (vLLM 0.5.4, TP 8); it gives their flags (`--gpu-memory-utilization 0.92 --max-model-len 4096
--max-num-seqs 128 --max-num-batched-tokens 8192 --enforce-eager --swap-space 16`, NCCL P2P/SHM off). The twin runs
at VLLM_SIM_TIME_SCALE 0.2 (tests/unit/test_bench_field_notes.py says why 0.2 on 2 cores) and the bench reads the
scale from /version; the role's durations are wall seconds: each level measures 13 (65 simulated) after 2 (10
simulated) of warm-up. About 10 minutes in all, 6 of them site.yml (most of that the 40 GB sync).

What is simulated: the GPUs (fake NVML) and vLLM (the twin, calibrated on the field notes' table). What is real:
the lab's systemd, sshd, rsync, HAProxy, the roles, the bench client and its judge.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from logged_run import run_logged, tail

REPO = Path(__file__).resolve().parents[1]
LAB = [sys.executable, str(REPO / "bin/lab")]
DEPLOYMENT = {
    "revive_model_name": "chat-20b",
    "revive_model_revision": "rev1",
    "revive_model_source_path": "/srv/models/chat-20b/rev1",
    "revive_plan_overrides": {"tensor_parallel_size": 8, "vllm_version": "0.5.4"},
}
BENCH = {
    "benchmark_concurrency": [8, 16, 32, 64],
    "benchmark_duration_s": 13,
    "benchmark_warmup_s": 2,
    "benchmark_max_tokens": 200,
    "benchmark_slo_e2e_p95_s": 12,
    "benchmark_run_id": "fieldnotes",
}


def test_benchmark_playbook_reproduces_the_field_notes_on_a_lab(tmp_path):
    state = tmp_path / "lab"
    lab = [*LAB, "--state-dir", str(state)]
    vars_file = tmp_path / "deployment.yml"
    vars_file.write_text(yaml.safe_dump(DEPLOYMENT))
    bench_vars = dict(BENCH, benchmark_reports_dir=str(tmp_path / "reports"))
    playbook = ["ansible-playbook", "-i", "inventory/lab", "-i", str(state / "hosts.yml"), "-e", f"@{vars_file}"]
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0")
    times = {}
    try:
        for name, argv in [
            ("wheelhouse", [*LAB, "wheelhouse"]),
            ("lab up", [*lab, "up", "--nodes", "1"]),
            ("seed", [*lab, "seed-model", "--name", "chat-20b", "--fixture", "internlm2-chat-20b",
                      "--size", "sparse"]),
            ("time scale", [*lab, "ssh", "node1",
                            "mkdir -p /etc/vllm-sim && echo VLLM_SIM_TIME_SCALE=0.2 > /etc/vllm-sim/twin.env"]),
            ("site.yml", [*playbook, "site.yml"]),
        ]:
            log = tmp_path / f"{name.replace(' ', '-')}.log"
            rc, times[name] = run_logged(argv, log, env)
            assert rc == 0, f"{name} failed:\n{tail(log)}"
        log = tmp_path / "benchmark.log"
        rc, times["benchmark.yml"] = run_logged(
            [*playbook, "playbooks/benchmark.yml", "-e", json.dumps(bench_vars)], log, env)
    finally:
        subprocess.run([*lab, "down"], cwd=REPO, capture_output=True)
    report = tmp_path / "reports" / "fieldnotes"
    summary = json.loads((report / "bench" / "summary.json").read_text())
    levels = {level["concurrency"]: level for level in summary["levels"]}
    print("\nphase times (s):", ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    for concurrency, level in sorted(levels.items()):
        stats = level["stats"]
        print(f"  {concurrency:>3}: {level['verdict']['verdict']:<5} completed {stats['completed']:>4}  "
              f"TTFT p50 {stats['ttft_s']['p50']:.2f} s  E2E p95 {stats['e2e_s']['p95']:.2f} s  "
              f"{stats['output_throughput_tok_s']:.0f} tok/s  {'; '.join(level['verdict']['reasons'])}")
    print("recommended concurrency:", summary["recommended_concurrency"])

    assert rc != 0, "benchmark.yml must exit non-zero when a level failed"
    assert summary["simulation"]["source"] == "server /version twin.time_scale"
    assert summary["simulation"]["time_scale"] == 0.2
    assert summary["verdicts"] == {"8": "PASS", "16": "PASS", "32": "PASS", "64": "FAIL"}, tail(log)
    assert levels[64]["verdict"]["reasons"][0].startswith("P95 E2E over the SLO"), levels[64]["verdict"]
    assert summary["recommended_concurrency"] == 32
    for concurrency, level in levels.items():
        assert level["stats"]["completed"] >= summary["slo"]["min_completions"], concurrency
        assert level["stats"]["failed"] == 0, concurrency
    knee = [k for k in summary["knees"] if k["metric"] == "ttft_s.p50" and k["to"] in (32, 64)]
    assert knee, summary["knees"]
    assert sorted(p.name for p in (report / "bench").glob("*.png")), "the plots were not drawn"
