"""The vllm_plan module through Ansible: ansible-doc renders it, a play plans and sets the host fact."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import yaml

from fixtures.gpus import facts_file, lab_facts
from fixtures.models import write_model

BIN = os.path.dirname(sys.executable)


def run_play(repo, tmp_path, tasks):
    play = tmp_path / "play.yml"
    play.write_text(textwrap.dedent("""\
        - name: Plan
          hosts: localhost
          gather_facts: false
          tasks:
        """) + textwrap.indent(textwrap.dedent(tasks), "    "))
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play)],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=180)
    results = json.loads(proc.stdout)["plays"][0]["tasks"]
    return proc.returncode, [task["hosts"]["localhost"] for task in results]


def test_ansible_doc_renders_vllm_plan(repo):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", "vllm_plan"], cwd=repo,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for text in ("Derives the vLLM release that runs well on the node", "fail_on_refusal", "exclude_gpus",
                 "Plan the vLLM release for this node", "RETURN VALUES", "kv_cache"):
        assert text in proc.stdout, text


def test_play_plans_the_20b_and_sets_the_host_fact(repo, tmp_path):
    model = write_model(str(tmp_path / "chat-20b-fp16"), "internlm2-chat-20b", size="sparse", dtype="F16", shards=4)
    facts = facts_file(tmp_path, lab_facts("v100-pcie-8x"))
    code, results = run_play(repo, tmp_path, f"""\
        - name: Describe the model
          model_inspect:
            path: {model}
          register: revive_model_facts
        - name: Plan
          vllm_plan:
            gpu: "{{{{ lookup('ansible.builtin.file', '{facts}') | from_json }}}}"
            model: "{{{{ revive_model_facts.model }}}}"
            releases: "{{{{ lookup('ansible.builtin.file', '{repo}/data/vllm-releases.yml') | from_yaml }}}}"
            serve:
              served_model_name: chat-20b
            host_ram_mb: 393216
        - name: Read the fact back
          ansible.builtin.debug:
            msg: "{{{{ ansible_facts['revive_release']['replicas'] | map(attribute='cuda_visible_devices') | list }}}}"
        """)
    assert code == 0
    inspected, planned, shown = results
    assert inspected["model"]["parameter_count"] == 19_861_149_696
    release = planned["release"]
    assert planned["refused"] is False and planned["changed"] is False
    assert planned["ansible_facts"]["revive_release"]["vllm_version"] == "0.8.5.post1"
    assert release["args"][release["args"].index("--served-model-name") + 1] == "chat-20b"
    assert "--enforce-eager" in release["args"] and release["env"]["NCCL_P2P_DISABLE"] == "1"
    assert shown["msg"] == ["0,1,2,3", "4,5,6,7"]
    # The planned release's driver window, for gpu_fitness: the data file's entry of that release, as written there.
    with open(f"{repo}/data/vllm-releases.yml", encoding="utf-8") as data:
        assert planned["driver"] == yaml.safe_load(data)["releases"]["0.8.5.post1"]["driver"]


def test_refusal_without_failing_lets_the_play_quarantine(repo, tmp_path):
    model = write_model(str(tmp_path / "awq"), "llama-2-7b-chat-awq", config_only=True)
    facts = facts_file(tmp_path, lab_facts("v100-pcie-8x"))
    code, results = run_play(repo, tmp_path, f"""\
        - name: Describe the model
          model_inspect:
            path: {model}
          register: revive_model_facts
        - name: Plan
          vllm_plan:
            gpu: "{{{{ lookup('ansible.builtin.file', '{facts}') | from_json }}}}"
            model: "{{{{ revive_model_facts.model }}}}"
            releases: "{{{{ lookup('ansible.builtin.file', '{repo}/data/vllm-releases.yml') | from_yaml }}}}"
            fail_on_refusal: false
        - name: Plan again, failing
          vllm_plan:
            gpu: "{{{{ lookup('ansible.builtin.file', '{facts}') | from_json }}}}"
            model: "{{{{ revive_model_facts.model }}}}"
            releases: "{{{{ lookup('ansible.builtin.file', '{repo}/data/vllm-releases.yml') | from_yaml }}}}"
        """)
    assert code != 0
    _, quarantined, failed = results
    assert quarantined["refused"] is True and "failed" not in quarantined
    assert "awq checkpoints need CC 7.5" in quarantined["refusal"]["reason"]
    assert failed["failed"] is True and failed["msg"].startswith("vLLM plan refused: ")


def test_malformed_release_data_fails_with_its_path(repo, tmp_path):
    model = write_model(str(tmp_path / "m"), "llama-2-7b-chat", config_only=True)
    facts = facts_file(tmp_path, lab_facts("v100-pcie-8x"))
    code, results = run_play(repo, tmp_path, f"""\
        - name: Describe the model
          model_inspect:
            path: {model}
          register: revive_model_facts
        - name: Plan with data lacking its releases
          vllm_plan:
            gpu: "{{{{ lookup('ansible.builtin.file', '{facts}') | from_json }}}}"
            model: "{{{{ revive_model_facts.model }}}}"
            releases: {{schema_version: 1}}
        """)
    assert code != 0
    assert results[1]["msg"] == ("releases parameter (data/vllm-releases.yml): top level: missing key 'releases'")


def test_a_group_member_plans_its_part_of_the_group_through_ansible(repo, tmp_path):
    model = write_model(str(tmp_path / "mixtral"), "mixtral-8x22b-instruct", size="tiny", dtype="F16")
    facts = facts_file(tmp_path, lab_facts("v100-pcie-8x"))
    members = [{"host": f"node{n}", "gpu": "__FACTS__", "python_version": "3.11.2", "address": f"10.0.0.{n}",
                "interface": "eth0"} for n in (1, 2)]
    members_yaml = json.dumps(members).replace("__FACTS__", f"{{{{ lookup('ansible.builtin.file', '{facts}') "
                                                          "| from_json }}")
    plan_task = f"""\
        - name: Describe the model
          model_inspect:
            path: {model}
          register: revive_model_facts
        - name: Plan node2's part
          vllm_plan:
            gpu: "{{{{ lookup('ansible.builtin.file', '{facts}') | from_json }}}}"
            model: "{{{{ revive_model_facts.model }}}}"
            releases: "{{{{ lookup('ansible.builtin.file', '{repo}/data/vllm-releases.yml') | from_yaml }}}}"
            overrides: {{vllm_version: "0.5.4", tensor_parallel_size: 8, pipeline_parallel_size: 2}}
            package_source: {{type: mirror, index_url: "https://pypi.internal.example/simple"}}
            group:
              name: mixtral
              member: node2
              ray_port: RAY_PORT
              members: {members_yaml}
            fail_on_refusal: false
        """
    code, results = run_play(repo, tmp_path, plan_task.replace("RAY_PORT", "6380"))
    assert code == 0, results
    worker = results[1]["release"]
    assert worker["replicas"] == [] and worker["group"]["role"] == "worker"
    assert worker["group"]["ray"]["address"] == "10.0.0.1:6380" and worker["group"]["ray"]["expected_gpus"] == 16
    code, results = run_play(repo, tmp_path, plan_task.replace("RAY_PORT", "0"))
    assert code != 0 and results[1]["msg"].startswith("vllm_plan: group.ray_port is 0: it must be a whole number at "
                                                      "least 1 and at most 65535")
