"""The node_firewall role through ansible-playbook on this machine, in check mode, for a host that has no guard yet
(a new node, or one where revive_firewall was off): the run passes, reports the write as a change, writes nothing,
and never asks systemd about the unit it has not written (systemd knows no such unit: the start task and the reload
handler failed the run before they were skipped in check mode)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

BIN = os.path.dirname(sys.executable)


def test_check_mode_on_a_host_without_the_guard_reports_the_write_and_touches_nothing(repo, tmp_path):
    unit = f"revive-firewall-check-{os.getpid()}.service"   # a unit no systemd here knows
    params = {"node_firewall_release": {"replicas": [{"name": "vllm-0", "port": 8000}]},
              "node_firewall_frontdoors": ["10.0.0.4"], "node_firewall_monitors": ["10.0.0.5"],
              "node_firewall_exporter_ports": [9100], "node_firewall_ssh_port": 22,
              "node_firewall_rules_path": str(tmp_path / "etc/firewall.nft"),
              "node_firewall_unit": unit, "node_firewall_unit_dir": str(tmp_path / "units")}
    play = tmp_path / "play.yml"
    play.write_text(textwrap.dedent(f"""\
        - name: Guard
          hosts: localhost
          gather_facts: false
          roles:
            - role: node_firewall
              vars: {json.dumps(params)}
        """))
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play),
                           "--check"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    tasks = {t["task"]["name"].split(" : ", 1)[-1]: t["hosts"]["localhost"] for t in report["plays"][0]["tasks"]
             if "localhost" in t["hosts"]}   # a meta task (flush_handlers) reports no host
    written = tasks["Write the rules and the unit that loads them at boot"]
    assert written["changed"] and written["files"]["unit"]["changed"], written
    assert tasks["Enable and start the unit"].get("skipped"), tasks["Enable and start the unit"]
    assert not (tmp_path / "units").exists() and not (tmp_path / "etc").exists()
    assert report["stats"]["localhost"]["failures"] == 0
