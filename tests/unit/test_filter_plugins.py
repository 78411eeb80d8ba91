"""filter_plugins/revive.py through Ansible: the project's ansible.cfg loads it, its filters reach the decisions in
module_utils (tests/unit/test_handover.py has their tables), and a rescue's failed result becomes its message."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

BIN = os.path.dirname(sys.executable)


def test_the_filters_work_in_a_play_with_the_projects_configuration(repo, tmp_path):
    play = tmp_path / "play.yml"
    play.write_text(textwrap.dedent("""\
        - name: Filters
          hosts: localhost
          gather_facts: false
          tasks:
            - name: Fail in a loop
              block:
                - name: Check two replicas
                  ansible.builtin.assert:
                    that: item != 'vllm-1'
                    fail_msg: "{{ item }} is down"
                  loop: [vllm-0, vllm-1]
              rescue:
                - name: Keep what failed
                  ansible.builtin.set_fact:
                    failure: "{{ ansible_failed_result | failure_message(ansible_failed_task, 'the switch') }}"
            - name: Decide
              ansible.builtin.set_fact:
                state: >-
                  {{ {'current': {'id': 'a', 'replicas': [{'name': 'vllm-0'}]},
                      'report': {'replicas': {'vllm-0': {'passed': true, 'release': {'id': 'a'}}}}, 'servers': []}
                     | handover_state({'front_door': '', 'servers': none}) }}
                policy: >-
                  {{ [{'node': 'node1', 'took_release': false, 'message': 'm'}] | map('combine', {})
                     | roll_policy(['node1', 'node2'], 0) }}
                quoted: >-
                  {{ [{'name': 'vllm-0.service', 'status': {'ActiveState': 'failed'}}]
                     | units_to_quote(['vllm-0.service']) }}
                model: "{{ ['python', '--model', '/m', '--served-model-name', 'tiny-chat'] | served_model_name }}"
            - name: Show
              ansible.builtin.debug:
                msg: "{{ {'failure': failure, 'state': state, 'policy': policy, 'quoted': quoted, 'model': model} }}"
        """))
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play)],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    shown = json.loads(proc.stdout)["plays"][0]["tasks"][-1]["hosts"]["localhost"]["msg"]
    assert shown["failure"] == "Check two replicas: vllm-1 is down"
    assert (shown["state"]["handed_over"], shown["state"]["warm_up"]) == (True, False)
    assert shown["policy"]["stop"] is True
    assert shown["policy"]["message"] == ("Roll stopped by policy: 1 of 2 node(s) (50.0 %) did not take the release, more "
                                          "than revive_rolling_max_fail_percent 0 %. m. Not rolled (still on their "
                                          "release, in the front door): node2.")
    assert shown["quoted"] == ["vllm-0.service"]
    assert shown["model"] == "tiny-chat"


def test_rolling_refuses_a_serial_that_only_the_inventory_sets(repo, tmp_path):
    # playbooks/rolling.yml's first own play, run as it is over three local hosts: Ansible templates `serial` before
    # any host exists, so revive_rolling_serial from group_vars never reaches it; the play must say so.
    import yaml

    plays = yaml.safe_load((repo / "playbooks" / "rolling.yml").read_text())
    check = next(play for play in plays if play.get("name") == "Check that revive_rolling_serial reaches the roll's batches")
    (tmp_path / "check.yml").write_text(yaml.safe_dump([check], sort_keys=False))
    shutil.copytree(repo / "inventory" / "lab" / "group_vars", tmp_path / "group_vars")  # the lab's site settings
    (tmp_path / "group_vars" / "gpu_nodes.yml").write_text("revive_rolling_serial: 2\n")
    (tmp_path / "hosts.ini").write_text("[gpu_nodes]\nnode1\nnode2\nnode3\n\n[gpu_nodes:vars]\nansible_connection=local\n")
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)

    def run(*extra):
        proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "hosts.ini"),
                               str(tmp_path / "check.yml"), *extra],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=120)
        return proc, json.loads(proc.stdout)

    proc, report = run()
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr
    refusals = [task["hosts"]["node1"]["msg"] for play in report["plays"] for task in play["tasks"]
                if task["hosts"].get("node1", {}).get("failed")]
    assert refusals and refusals[0].startswith("revive_rolling_serial is 2 for this host, which asks for a first "
                                                "batch of 2 of 3 node(s), but Ansible made it 1 (node1)")
    assert "node2" not in json.dumps(report["plays"][0]["tasks"][-1]["hosts"])  # node1 alone was in that batch

    proc, report = run("-e", "revive_rolling_serial=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    batches = [sorted(play["tasks"][-1]["hosts"]) for play in report["plays"]]
    assert batches == [["node1", "node2"], ["node3"]]


def test_loading_the_plugin_imports_no_decision_and_every_filter_names_one_that_exists(repo):
    """Ansible loads the plugin file in each worker that compiles any filter, so it imports nothing of the project's
    own; every lazily named decision must still exist, or a filter would fail only when a play first calls it."""
    script = textwrap.dedent("""\
        import importlib, importlib.util, inspect, json, sys
        spec = importlib.util.spec_from_file_location("revive_filters", "filter_plugins/revive.py")
        plugin = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plugin)
        loaded = sorted(name for name in sys.modules if name.startswith("ansible.module_utils.revive"))
        filters = plugin.FilterModule().filters()
        missing = [name for name, (module, attr) in plugin._DECISIONS.items()
                   if not callable(getattr(importlib.import_module("ansible.module_utils." + module), attr, None))]
        print(json.dumps({"loaded": loaded, "filters": sorted(filters), "missing": missing,
                          "all_callable": all(callable(f) for f in filters.values())}))
        """)
    env = dict(os.environ, ANSIBLE_CONFIG=str(repo / "ansible.cfg"))
    proc = subprocess.run([sys.executable, "-c", script], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["loaded"] == [], f"loading the plugin imported {seen['loaded']}"
    assert seen["missing"] == []
    assert seen["all_callable"]
    assert {"handover_state", "replica_url", "serve_address", "slo_gate_concurrency", "time_scaled_rules",
            "node_firewall_guard", "ray_unit", "monitoring_exporter_ports"} <= set(seen["filters"])
    assert len(seen["filters"]) == 35
