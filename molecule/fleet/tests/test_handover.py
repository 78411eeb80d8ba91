"""Every GPU node's hand-over report: the release it runs, warmed up and settled, labelled simulated."""
from __future__ import annotations

import json

from lab_testinfra import lab_hosts

testinfra_hosts = lab_hosts("gpu_nodes")


def test_the_handover_report_is_passed_settled_and_simulated_for_the_release_the_node_runs(host):
    report_file = host.file("/var/lib/revive/handover.json")
    assert (report_file.user, report_file.mode) == ("root", 0o644)
    report = json.loads(report_file.content_string)
    record = json.loads(host.file("/var/lib/revive/releases.json").content_string)
    assert report["schema"] == 1 and report["simulated"] is True
    assert sorted(report["replicas"]) == ["vllm-0", "vllm-1"]
    for entry in report["replicas"].values():
        assert entry["passed"], entry["message"]
        assert entry["release"]["id"] == record["current"]["id"]
        assert entry["simulation"] == {"vllm": True, "gpus": True, "time_scale": 0.1}
        assert entry["vllm_version"] == "0.8.5.post1+sim"
        warm = entry["warmup"]
        assert warm["settled"] and 20 <= warm["requests_sent"] <= 60
        assert len(warm["answers"]) == warm["requests_sent"]
        assert all(a["ok"] and a["ttft_s"] > 0 and a["completion_tokens"] > 0 for a in warm["answers"])
        assert "revive-lab-key" not in report_file.content_string


def test_every_node_runs_release_b(host):
    record = json.loads(host.file("/var/lib/revive/releases.json").content_string)
    assert "--gpu-memory-utilization" in record["current"]["args"]
    assert record["current"]["args"][record["current"]["args"].index("--gpu-memory-utilization") + 1] == "0.9"
