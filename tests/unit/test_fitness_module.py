"""gpu_fitness and preflight_summary through Ansible on localhost: docs render, a degraded node's verdict, and
the summary task list of the role stopping a run when the policy is exceeded."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from fixtures.gpus import lab_facts

BIN = os.path.dirname(sys.executable)


def ansible_env(repo) -> dict:
    return dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)


def run_playbook(repo, tmp_path, plays: list, *args: str) -> tuple[int, dict]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
                           *args], cwd=repo, env=ansible_env(repo), capture_output=True, text=True)
    return proc.returncode, json.loads(proc.stdout)


def task_result(report: dict, name: str, host: str = "localhost") -> dict:
    for play in report["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] in (name, f"gpu_preflight : {name}"):
                return task["hosts"][host]
    raise AssertionError(f"task {name!r} did not run")


def test_ansible_doc_renders_gpu_fitness_and_preflight_summary(repo):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", "gpu_fitness", "preflight_summary"],
                          cwd=repo, env=ansible_env(repo), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "Volta" in proc.stdout and "max_unfit_percent" in proc.stdout


def test_gpu_fitness_finds_the_degraded_nodes_four_faults(repo, tmp_path):
    facts = tmp_path / "gpu.json"
    facts.write_text(json.dumps(lab_facts("v100-pcie-8x-degraded")))
    rc, report = run_playbook(repo, tmp_path, [{
        "name": "Fitness", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Judge", "gpu_fitness": {
            "gpu": f"{{{{ lookup('ansible.builtin.file', '{facts}') | from_json }}}}",
            "release": {"vllm_version": "0.5.4", "pins": {"cuda": "12.1"}},
            "release_driver": {"min_branch": 525, "tested_branch": 535},
            "expected_gpu_count": 8, "expected_gpu_name": "Tesla V100-PCIE-32GB"}}]}])
    result = task_result(report, "Judge")
    assert rc == 0 and result["changed"] is False
    assert result["fit"] is False
    assert result["unfit_checks"] == ["ecc_uncorrected", "foreign_process", "pcie_width", "retired_pages_pending"]
    assert result["warning_messages"] == []


def summary_play(results: list, max_unfit_percent: int) -> list:
    """The role's summary entry point as playbooks/preflight.yml runs it (a play on the GPU nodes, its tasks once
    on the controller), over fixed results of two stand-in nodes."""
    return [{"name": "Stand-in GPU nodes", "hosts": "localhost", "gather_facts": False,
             "tasks": [{"name": "Add them with their preflight results",
                        "ansible.builtin.add_host": {"name": "{{ item.host }}", "groups": "gpu_nodes",
                                                     "ansible_connection": "local",
                                                     "gpu_preflight_result": "{{ item }}"},
                        "loop": results}]},
            {"name": "Summary", "hosts": "gpu_nodes", "gather_facts": False, "any_errors_fatal": True,
             "tasks": [{"name": "Summarise", "ansible.builtin.include_role": {
                 "name": "gpu_preflight", "tasks_from": "summary.yml"},
                 "vars": {"gpu_preflight_max_unfit_percent": max_unfit_percent}}]},
            {"name": "Later play", "hosts": "gpu_nodes", "gather_facts": False,
             "tasks": [{"name": "Would provision", "ansible.builtin.debug": {"msg": "provisioning"}}]}]


FIT = {"host": "node1", "probed": True, "fit": True, "reasons": [], "warnings": [], "release": "vLLM 0.5.4"}
UNFIT = {"host": "node2", "probed": True, "fit": False, "reasons": ["GPU 5 (00000000:89:00.0): 2 uncorrected ECC"],
         "warnings": [], "unfit_checks": ["ecc_uncorrected"], "release": "vLLM 0.5.4"}


def test_the_summary_shows_every_node_and_lets_the_run_go_on_within_the_policy(repo, tmp_path):
    rc, report = run_playbook(repo, tmp_path, summary_play([FIT, UNFIT], 50))
    assert rc == 0
    assert task_result(report, "Show the preflight summary", "node1")["msg"] == [
        "1 fit, 1 quarantined, 0 failed of 2 GPU node(s): 50 % unfit, policy allows at most 50 % "
        "(revive_max_unfit_percent)",
        "node1: FIT - vLLM 0.5.4",
        "node2: QUARANTINED - vLLM 0.5.4",
        "  unfit: GPU 5 (00000000:89:00.0): 2 uncorrected ECC",
    ]
    assert task_result(report, "Would provision", "node2")["msg"] == "provisioning"


def test_the_policy_stops_the_run_before_any_later_play(repo, tmp_path):
    rc, report = run_playbook(repo, tmp_path, summary_play([FIT, UNFIT], 40))
    policy = task_result(report, "Apply the fleet policy (revive_max_unfit_percent)", "node1")
    assert rc == 2
    assert policy["failed"] is True
    assert policy["msg"].startswith("fleet policy: stopping before anything is provisioned: 1 fit, 1 quarantined, "
                                    "0 failed of 2 GPU node(s): 50 % unfit, policy allows at most 40 %")
    assert "Would provision" not in [t["task"]["name"] for play in report["plays"] for t in play["tasks"]]
