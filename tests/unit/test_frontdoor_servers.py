"""The front door's backend servers and their limits (module_utils/revive_frontdoor.py, the role frontdoor's
`frontdoor_servers` filter): a bench limit applied to the node wins while the replica runs the argv it was measured
on, else frontdoor_server_maxconn, else the plan's streams; never above --max-num-seqs; every source said."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ansible.module_utils.revive_frontdoor import backend_servers, frontdoor_servers

ARGS = ["--model", "/srv/models/m", "--port", "8000", "--max-num-seqs", "64"]
ARGV = ["/opt/vllm/venvs/r1/bin/python", "-m", "vllm.entrypoints.openai.api_server"] + ARGS


def release(streams=16, max_num_seqs=64, version="0.5.4", args=ARGS):
    return {"vllm_version": version, "settings": {"max_num_seqs": max_num_seqs},
            "replicas": [{"name": "vllm-0", "port": 8000, "args": list(args), "streams": streams},
                         {"name": "vllm-1", "port": 8001, "args": list(args[:3]) + ["8001"] + list(args[4:]),
                          "streams": streams}]}


def applied(maxconn=32, argv=ARGV, version="0.5.4"):
    return {"bench": "20261201T2200Z", "replicas": {"vllm-0": {"maxconn": maxconn, "argv": list(argv),
                                                              "vllm_version": version}}}


def node(**kwargs):
    return [{"name": "node1", "address": "10.0.0.1", "release": kwargs.pop("rel", release()), **kwargs}]


def test_without_a_measurement_the_plans_streams_or_the_fleet_setting():
    servers = backend_servers(node())
    assert [(s["name"], s["address"], s["port"], s["maxconn"], s["source"]) for s in servers] == [
        ("node1-vllm-0", "10.0.0.1", 8000, 16, "the plan's streams per replica"),
        ("node1-vllm-1", "10.0.0.1", 8001, 16, "the plan's streams per replica")]
    assert [s["maxconn"] for s in backend_servers(node(), 24)] == [24, 24]
    assert backend_servers(node(), 24)[0]["source"] == "frontdoor_server_maxconn"


def test_a_measured_limit_wins_for_its_replica_only():
    servers = backend_servers(node(applied=applied()), 24)
    assert [(s["maxconn"], s["source"]) for s in servers] == [(32, "measured by 20261201T2200Z"),
                                                              (24, "frontdoor_server_maxconn")]
    assert servers[0]["report"] == "node1-vllm-0: maxconn 32 from measured by 20261201T2200Z"


def test_a_limit_measured_on_another_argv_or_version_is_stale_and_said_so():
    other = ARGV[:-1] + ["128"]
    for fact in (applied(argv=other), applied(version="0.8.5.post1"), applied(argv=[])):
        server = backend_servers(node(applied=fact))[0]
        assert server["maxconn"] == 16 and server["source"] == "the plan's streams per replica"
        assert "was measured on vLLM" in server["note"] and "not applied" in server["note"], server
        assert "benchmark_apply=true" in server["report"]


def test_a_bad_applied_value_is_not_applied():
    for bad in (0, -3, "many", None):
        server = backend_servers(node(applied=applied(maxconn=bad)))[0]
        assert server["maxconn"] == 16 and "is not a positive integer" in server["note"], bad


def test_a_fact_file_ansible_could_not_parse_is_not_applied():
    server = backend_servers(node(applied="error loading facts as JSON or ini - please check content"))[0]
    assert server["maxconn"] == 16 and "is not a JSON object" in server["note"]
    assert backend_servers(node(applied={"replicas": ["vllm-0"]}))[0]["note"] == ""


def test_never_above_max_num_seqs_whatever_the_source():
    capped = backend_servers(node(applied=applied(maxconn=100)))[0]
    assert capped["maxconn"] == 64 and "100 capped at --max-num-seqs 64" in capped["note"]
    assert backend_servers(node(), 500)[1]["maxconn"] == 64
    assert backend_servers(node(rel=release(streams=0, max_num_seqs=0)))[0]["maxconn"] == 256


def test_the_filter_reads_the_host_variables():
    hostvars = {"node1": {"ansible_host": "10.0.0.1",
                          "ansible_facts": {"revive_release": release(), "ansible_local": {"revive_frontdoor": applied()}}},
                "node2": {"ansible_facts": {"revive_release": release(streams=8)}}}
    servers = frontdoor_servers(["node1", "node2"], hostvars, "0")
    assert [(s["name"], s["address"], s["maxconn"]) for s in servers] == [
        ("node1-vllm-0", "10.0.0.1", 32), ("node1-vllm-1", "10.0.0.1", 16),
        ("node2-vllm-0", "node2", 8), ("node2-vllm-1", "node2", 8)]
    assert frontdoor_servers(["node3"], {"node3": {}}) == []


PLAYBOOK = """
- name: The front door's servers from what Ansible itself gathers
  hosts: node1
  gather_facts: false
  tasks:
    - name: Read the local facts as roles/frontdoor does (its fact path is the default /etc/ansible/facts.d)
      ansible.builtin.setup:
        gather_subset: ["!all", "!min", local]
        fact_path: "{{ fact_dir }}"
    # The preflight's vllm_plan returns revive_release as a fact; here it joins the gathered ones.
    - name: Show the servers
      ansible.builtin.debug:
        msg: >-
          {{ ['node1'] | frontdoor_servers({'node1': {'ansible_facts': hostvars['node1'].ansible_facts
                                                       | combine({'revive_release': release})}}) }}
"""


def test_the_filter_finds_a_limit_in_the_facts_ansible_really_gathers(tmp_path):
    # The shape of hostvars comes from a real setup run, not from this file: local facts stay `ansible_local`
    # inside ansible_facts (the filter read `local` once, and a bench limit never reached the front door).
    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "facts").mkdir()
    (tmp_path / "facts" / "revive_frontdoor.fact").write_text(json.dumps(applied(maxconn=5)))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    extra = {"fact_dir": str(tmp_path / "facts"), "release": release()}
    env = dict(os.environ, ANSIBLE_FILTER_PLUGINS=str(repo / "filter_plugins"),
               ANSIBLE_MODULE_UTILS=str(repo / "module_utils"), ANSIBLE_INJECT_FACT_VARS="false",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    done = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "node1,", "-c", "local",
                           str(tmp_path / "play.yml"), "--extra-vars", json.dumps(extra)],
                          capture_output=True, text=True, env=env, check=False, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    tasks = {t["task"]["name"]: t["hosts"]["node1"] for t in json.loads(done.stdout)["plays"][0]["tasks"]}
    servers = tasks["Show the servers"]["msg"]
    assert [(s["name"], s["maxconn"], s["source"]) for s in servers] == [
        ("node1-vllm-0", 5, "measured by 20261201T2200Z"), ("node1-vllm-1", 16, "the plan's streams per replica")]
