"""The fleet after the preflight: facts and plan files on every GPU node, the probe venv, and the summary with
the degraded node quarantined for four distinct reasons and the healthy nodes fit."""
from __future__ import annotations

import json
import os

import pytest
from lab_testinfra import lab_host, lab_hosts

testinfra_hosts = lab_hosts("gpu_nodes")
SUMMARY = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "preflight-summary.json")
DEGRADED_CHECKS = ["ecc_uncorrected", "foreign_process", "pcie_width", "retired_pages_pending"]


def node_json(host, path: str) -> dict:
    file = host.file(path)
    assert (file.user, file.group, file.mode) == ("root", "root", 0o644), path
    return json.loads(file.content_string)


def profile_of(host) -> str:
    return lab_host(host.backend.host.name)["gpu_profile"]


def summary() -> dict:
    with open(SUMMARY, encoding="utf-8") as handle:
        return json.load(handle)


def test_gpu_facts_file_describes_the_nodes_simulated_gpus(host):
    facts = node_json(host, "/var/lib/revive/gpu-facts.json")
    assert facts["simulated"] is True
    assert facts["simulated_profile_name"] == profile_of(host)
    assert facts["count"] == 8
    assert {d["name"] for d in facts["devices"]} == {"Tesla V100-PCIE-32GB"}
    assert facts["topology"]["matrix"][0][4] == "SYS"


def test_plan_file_holds_the_planned_release_with_the_production_shape(host):
    plan = node_json(host, "/var/lib/revive/plan.json")
    release = plan["release"]
    assert plan["model"] == {"name": "tiny-chat", "revision": "rev1",
                             "source": "model_store:/srv/models/tiny-chat/rev1"}
    assert (plan["refused"], plan["refusal"]) == (False, None)
    assert release["vllm_version"] == "0.8.5.post1"
    assert [r["cuda_visible_devices"] for r in release["replicas"]] == ["0,1,2,3", "4,5,6,7"]
    args = release["args"]
    assert args[args.index("--model") + 1] == "/data/models/tiny-chat/rev1"
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--dtype") + 1] == "half"
    assert "--enforce-eager" in args
    assert release["env"]["NCCL_P2P_DISABLE"] == "1"


def test_probe_venv_is_complete_with_the_pinned_nvidia_ml_py(host):
    marker = node_json(host, "/opt/revive/probe-venv/.revive-venv.json")
    assert marker["pins"] == ["nvidia-ml-py==13.615.71"]
    assert marker["installed"] == {"nvidia-ml-py": "13.615.71"}
    assert host.run("/opt/revive/probe-venv/bin/python -c 'import pynvml'").rc == 0


@pytest.mark.parametrize("node", ["node1", "node2"])
def test_summary_lists_the_healthy_nodes_as_fit_with_their_release(node):
    line = summary()["hosts"][node]
    assert (line["status"], line["reasons"], line["unfit_checks"]) == ("fit", [], [])
    assert line["release"] == "vLLM 0.8.5.post1, 2 x TP 4 (GPUs 0,1,2,3 | 4,5,6,7)"


def test_summary_quarantines_the_degraded_node_for_four_distinct_reasons():
    line = summary()["hosts"]["node3"]
    assert line["status"] == "quarantined"
    assert line["unfit_checks"] == DEGRADED_CHECKS
    assert [reason.split(":")[0] for reason in line["reasons"]] == [
        "GPU 1 (00000000", "GPU 3 (00000000", "GPU 5 (00000000", "GPU 6 (00000000"]


def test_summary_headline_and_policy():
    report = summary()
    assert report["counts"] == {"fit": 2, "quarantined": 1, "failed": 0, "not_probed": 0}
    assert (report["unfit_percent"], report["max_unfit_percent"], report["exceeded"]) == (33.3, 50.0, False)
    assert report["lines"][0] == ("2 fit, 1 quarantined, 0 failed of 3 GPU node(s): 33.3 % unfit, policy allows at "
                                  "most 50 % (revive_max_unfit_percent)")
