"""Each host keeps its own facts through the playbooks' boilerplate.

ansible-core stores the one mapping a `set_fact` with `run_once: true` returns as every host's non-persistent facts
(ansible/vars/manager.py set_nonpersistent_facts assigns it to each host, and later facts update it in place), so
the hosts share one dict from then on: every fact a later play sets or gathers on one host shows on all. It made
every GPU node's `ansible_facts` those of the last one gathered (a serving group's members all had one address).
The boilerplate every entry point imports must leave the hosts apart, and no task of the project may set a fact
with run_once unless it delegates the facts to one host."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

BIN = os.path.dirname(sys.executable)


def test_after_the_boilerplate_each_host_keeps_its_own_facts(repo, tmp_path):
    inventory = tmp_path / "inventory"
    shutil.copytree(repo / "inventory" / "lab" / "group_vars", inventory / "group_vars")
    # Two hosts on this machine told apart by their interpreters, which their gathered facts report.
    # (the controller venv's interpreter under two names: sys.executable is the name it was started by)
    pythons = {"node1": os.path.join(BIN, "python"), "node2": os.path.join(BIN, "python3")}
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        host: {"ansible_connection": "local", "ansible_python_interpreter": python}
        for host, python in pythons.items()}}}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(textwrap.dedent(f"""\
        - name: Boilerplate
          ansible.builtin.import_playbook: {repo}/playbooks/boilerplate.yml
          vars:
            validate_inventory_stages: [preflight]

        - name: Facts per host
          hosts: gpu_nodes
          gather_facts: true
          gather_subset: [min]
          tasks:
            - name: Show every host's interpreter as its facts say
              ansible.builtin.debug:
                msg: "{{{{ ansible_play_hosts | map('extract', hostvars, ['ansible_facts', 'python', 'executable'])
                          | list }}}}"
              run_once: true
        """))
    env = dict(os.environ, ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_CACHE_PLUGIN="memory")
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), str(playbook)], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tasks = json.loads(proc.stdout)["plays"][-1]["tasks"]
    shown = next(task for task in tasks if task["task"]["name"] == "Show every host's interpreter as its facts say")
    assert next(iter(shown["hosts"].values()))["msg"] == [pythons["node1"], pythons["node2"]]


def _tasks(path: Path):
    data = yaml.safe_load(path.read_text()) or []
    stack = list(data) if isinstance(data, list) else []
    while stack:
        item = stack.pop()
        if not isinstance(item, dict):
            continue
        yield item
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            stack.extend(item.get(key) or [])


def test_no_task_sets_a_fact_with_run_once_unless_it_delegates_the_facts(repo):
    offenders = []
    for folder in ("roles", "playbooks", "molecule"):
        for path in sorted((repo / folder).rglob("*.yml")):
            if "files" in path.parts or "templates" in path.parts:
                continue
            for task in _tasks(path):
                sets_fact = any(key in task for key in ("ansible.builtin.set_fact", "set_fact"))
                if sets_fact and task.get("run_once") and not task.get("delegate_facts"):
                    offenders.append(f"{path.relative_to(repo)}: {task.get('name')}")
    assert offenders == []
