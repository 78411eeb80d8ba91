"""playbooks/tasks/roll_node.yml with a node the controller cannot reach (issue 17 §4; docs/faults.md §6): through
Ansible, not only the decision function - the reachability check must keep the play going under any_errors_fatal,
the node must be reported and counted by the policy, nothing must be run on it, and a serving group with a lost
member must not roll its other members. node2 is an SSH host on a closed loopback port (refused at once); node1 has a
local connection, so a task run on it would run here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

BIN = os.path.dirname(sys.executable)


def roll(repo, tmp_path, hosts: str, group: bool, max_fail_percent: int) -> tuple:
    (tmp_path / "inventory.yml").write_text(textwrap.dedent("""\
        all:
          children:
            gpu_nodes:
              hosts:
                node1: {ansible_connection: local}
                node2: {ansible_host: 127.0.0.1, ansible_port: 9, ansible_user: nobody}
                node3: {ansible_connection: local}
        """))
    (tmp_path / "play.yml").write_text(textwrap.dedent(f"""\
        - name: Order the roll, as rolling.yml does
          hosts: localhost
          gather_facts: false
          tasks:
            - name: Keep the roll's hosts
              ansible.builtin.set_fact:
                rolling_order: {{hosts: [node1, node2, node3]}}
        - name: Roll, as rolling.yml's roll plays do
          hosts: {hosts}
          gather_facts: false
          serial: 2
          any_errors_fatal: true
          vars:
            rolling_release: {{vllm_version: "0.8.5", replicas: [{{name: vllm-0}}]}}
            rolling_group: {json.dumps(group)}
            rolling_max_fail_percent: {max_fail_percent}
          tasks:
            - name: Roll the node
              ansible.builtin.include_tasks: {repo}/playbooks/tasks/roll_node.yml
        - name: After the roll
          hosts: localhost
          gather_facts: false
          tasks:
            - name: Say the roll went on
              ansible.builtin.debug:
                msg: the roll went on
        """))
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
                           str(tmp_path / "play.yml")], cwd=repo, env=env, capture_output=True, text=True, timeout=180)
    report = json.loads(proc.stdout)
    tasks = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            tasks.setdefault(task["task"]["name"], {}).update(task["hosts"])
    return proc.returncode, tasks, report["stats"]


POLICY = "Apply the roll's failure policy (revive_rolling_max_fail_percent)"
REPORT = "Report the outcome of a node that is not rolled"


def test_a_lost_node_is_reported_touched_by_nothing_and_stops_a_roll_of_policy_0(repo, tmp_path):
    code, tasks, stats = roll(repo, tmp_path, "node2", group=False, max_fail_percent=0)
    assert code == 2, tasks
    reach = tasks["Check that the controller still reaches the node"]["node2"]
    assert reach["unreachable"] is True and "Connection refused" in reach["msg"]
    said = tasks[REPORT]["node2"]["msg"]
    assert said.startswith("node2: unreachable from the controller (") and "port 9: Connection refused" in said
    assert "not rolled to the planned release (vLLM 0.8.5), nothing on it changed" in said
    assert said.endswith("no front door (the inventory has no lb host)")
    # nothing ran on it: the roll's steps (facts first) were never included for it
    assert "Gather the node's facts" not in tasks and stats["node2"]["unreachable"] == 0
    assert tasks[POLICY]["node2"]["msg"].startswith("Roll stopped by policy: 1 of 3 node(s) (33.3 %) did not take")
    assert tasks[POLICY]["node2"]["msg"].endswith("Not rolled (still on their release, in the front door): node1, "
                                                  "node3.")
    assert "Say the roll went on" not in tasks


def test_within_the_policy_budget_the_roll_goes_on_past_a_lost_node(repo, tmp_path):
    code, tasks, _ = roll(repo, tmp_path, "node2", group=False, max_fail_percent=50)
    assert code == 0, tasks
    assert tasks[POLICY]["node2"].get("skipped") is True
    assert tasks[REPORT]["node2"]["msg"].startswith("node2: unreachable from the controller")
    assert tasks["Say the roll went on"]["localhost"]["msg"] == "the roll went on"


def test_a_serving_group_with_a_lost_member_rolls_none_of_its_members(repo, tmp_path):
    code, tasks, _ = roll(repo, tmp_path, "node1:node2", group=True, max_fail_percent=0)
    assert code == 2, tasks
    assert tasks["Check that the controller still reaches the node"]["node1"].get("ping") == "pong"
    assert tasks["Name the nodes of the batch the controller lost"]["node1"]["ansible_facts"]["rolling_lost"] == ["node2"]
    assert tasks[REPORT]["node1"]["msg"] == ("node1: not rolled: its serving group rolls as one, and the controller "
                                            "cannot reach node2; left as it was, nothing on it changed")
    assert "Gather the node's facts" not in tasks  # node1 was reached, yet not rolled alone
    assert tasks[POLICY]["node1"]["msg"].startswith("Roll stopped by policy: 2 of 3 node(s) (66.7 %)")
