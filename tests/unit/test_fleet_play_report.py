"""molecule/fleet/files/play_report.py: the fleet scenario's assertions read its short report, so it must keep every
host's failed/changed/skipped/msg and the stats, pass ansible-playbook's exit code through and keep the full one."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "molecule" / "fleet" / "files" / "play_report.py"

PLAYBOOK = """
- name: A play that the short report names
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Say something
      ansible.builtin.debug:
        msg: nothing applied - no level passed
    - name: Change something
      ansible.builtin.command: "true"
      changed_when: true
    - name: Skip something
      ansible.builtin.debug:
        msg: never
      when: false
    - name: Fail on purpose
      ansible.builtin.fail:
        msg: the failure the scenario asserts on
"""


def test_the_short_report_keeps_what_the_assertions_read_and_the_exit_code(tmp_path):
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK)
    full = tmp_path / "runs" / "step.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), f"--full={full}", "--", str(Path(sys.executable).with_name("ansible-playbook")),
         "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)],
        capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2, done.stderr
    short = json.loads(done.stdout)
    tasks = {task["task"]["name"]: task["hosts"]["localhost"] for task in short["plays"][0]["tasks"]}
    assert short["plays"][0]["play"]["name"] == "A play that the short report names"
    assert tasks["Say something"]["msg"] == "nothing applied - no level passed"
    assert tasks["Change something"]["changed"] is True
    assert tasks["Skip something"]["skipped"] is True
    assert tasks["Fail on purpose"] == {"failed": True, "changed": False, "msg": "the failure the scenario asserts on"}
    assert short["stats"]["localhost"]["failures"] == 1 and short["stats"]["localhost"]["changed"] == 1
    # Nothing else of a result survives (a command's stdout, its argv, timings), but the full report keeps it all.
    assert "cmd" not in tasks["Change something"] and "duration" not in json.dumps(short)
    whole = json.loads(full.read_text())
    assert whole["plays"][0]["tasks"][1]["hosts"]["localhost"]["cmd"] == ["true"]


def test_a_command_without_a_json_report_fails_saying_so(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), f"--full={tmp_path / 'x.json'}", "--", "sh", "-c", "echo not json; exit 0"],
        capture_output=True, text=True, check=False, timeout=30)
    assert done.returncode == 1
    assert "no JSON report from sh (exit 0): not json" in done.stderr
