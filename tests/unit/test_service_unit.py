"""templates/vllm.service.j2 rendered by Ansible from a release: the exact lines a node gets, on real and on
simulated GPUs, and `systemd-analyze verify` on this machine; the role's documentation renders."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from ansible.module_utils.revive_record.release import HostView, build_release
from ansible.module_utils.revive_record.systemd import StartTiming, parse_exec_words
from test_release import _plan_json

BIN = os.path.dirname(sys.executable)


def render(repo, tmp_path, release: dict, replica_index: int, extra: dict | None = None) -> str:
    (tmp_path / "release.json").write_text(json.dumps(release))
    dest = tmp_path / f"{release['replicas'][replica_index]['unit']}"
    play = tmp_path / "render.yml"
    play.write_text(textwrap.dedent(f"""\
        - name: Render a unit
          hosts: localhost
          gather_facts: false
          vars_files:
            - {repo}/roles/vllm_service/defaults/main.yml
            - {repo}/roles/vllm_service/vars/main.yml
          tasks:
            - name: Render
              ansible.builtin.template:
                src: {repo}/templates/vllm.service.j2
                dest: {dest}
                mode: "0644"
              vars:
                __vllm_service_unit_release: "{{{{ lookup('ansible.builtin.file', '{tmp_path}/release.json') | from_json }}}}"
                __vllm_service_unit: "{{{{ __vllm_service_unit_release.replicas[{replica_index}] }}}}"
        """))
    env = dict(os.environ, ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    args = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play)]
    for key, value in (extra or {}).items():
        args += ["-e", json.dumps({key: value})]
    proc = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dest.read_text()


def unit_lines(text: str) -> list:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.fixture
def real_release(tmp_path_factory, repo, monkeypatch, tmp_path):
    monkeypatch.chdir(repo)
    plan = json.loads(_plan_json(str(tmp_path_factory.getbasetemp() / "release-plan"), False))
    venv = tmp_path / "venvs/0.5.4-1a2b3c4d"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin/python")
    return build_release(plan, str(venv), HostView("node1", tuple(range(80)), (0, 1), "1", "c0ffee"), StartTiming(),
                         {"VLLM_NO_USAGE_STATS": "1"})


def test_the_unit_runs_the_plans_argv_with_its_environment_pinning_and_limits(repo, tmp_path, real_release):
    text = render(repo, tmp_path, real_release, 1)
    lines = unit_lines(text)
    replica = real_release["replicas"][1]
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    assert parse_exec_words(exec_start[len("ExecStart="):]) == replica["argv"]
    assert f'Environment={" ".join(replica["environment"])}' in lines
    assert '"CUDA_VISIBLE_DEVICES=4,5,6,7"' in replica["environment"]
    for expected in ("CPUAffinity=20-39,60-79", "NUMAPolicy=bind", "NUMAMask=1", "KillMode=mixed",
                     "TimeoutStopSec=60", "Restart=always", "RestartSec=10", "StartLimitBurst=3",
                     f"StartLimitIntervalSec={replica['start_limit_interval_seconds']}",
                     f"TimeoutStartSec={replica['start_timeout_seconds']}", "LimitNOFILE=65536",
                     "EnvironmentFile=/etc/vllm/vllm.env", "User=vllm", "Group=vllm", "NoNewPrivileges=yes",
                     "ProtectSystem=strict", "DevicePolicy=closed", "DeviceAllow=char-nvidia-frontend rw",
                     "DeviceAllow=char-nvidia-uvm rw", "UMask=0077"):
        assert expected in lines, expected
    assert (f"ExecStartPost={real_release['python']} -I /usr/local/libexec/revive/vllm-wait-healthy "
            f"--host 10.0.3.11 --port 8001 "
            f"--deadline {replica['health_deadline_seconds']} --pid ${{MAINPID}}") in lines
    assert not any(line.startswith("ReadWritePaths=") for line in lines)
    assert "VLLM_API_KEY" not in text


def test_the_unit_starts_after_the_nvidia_uvm_loader_and_checks_the_node_first(repo, tmp_path, real_release):
    lines = unit_lines(render(repo, tmp_path, real_release, 0))
    unit_section = lines[lines.index("[Unit]"):lines.index("[Service]")]
    assert "After=network-online.target revive-nvidia-uvm.service" in unit_section
    assert "Wants=network-online.target revive-nvidia-uvm.service" in unit_section
    # Requires= would stop or restart every replica along with the loader.
    assert not any(line.startswith(("Requires=", "BindsTo=", "Requisite=")) for line in lines)
    service = lines[lines.index("[Service]"):]
    assert [line for line in service if line.startswith("ExecStartPre=")] == [
        "ExecStartPre=/usr/local/libexec/revive/revive-nvidia-uvm check /dev/nvidia-uvm"]
    # It runs as the service user in the unit's own sandbox, which sees the host's /dev.
    assert not any(line.startswith(("PrivateDevices=", "PermissionsStartOnly=")) for line in lines)
    assert "User=vllm" in service and "DevicePolicy=closed" in service


def test_simulated_gpus_leave_the_pinning_as_a_comment_and_the_lab_dir_writable(repo, tmp_path, real_release):
    lab = dict(real_release, simulated=True, replicas=[dict(r, cpu_affinity=None, numa_node=None,
                                            pinning_note="planned CPUs 0-19,40-59, NUMA node 0: not applied")
                                       for r in real_release["replicas"]])
    text = render(repo, tmp_path, lab, 0, {"vllm_service_writable_dirs": ["/run/fake-nvml"]})
    lines = unit_lines(text)
    assert not any(line.startswith(("CPUAffinity=", "NUMAPolicy=", "NUMAMask=")) for line in lines)
    assert "# CPU/NUMA pinning: planned CPUs 0-19,40-59, NUMA node 0: not applied." in text.splitlines()
    assert "ReadWritePaths=/run/fake-nvml" in lines
    # The stand-in /dev/nvidia-uvm of simulated GPUs has no nvidia-uvm major to compare.
    assert "ExecStartPre=/usr/local/libexec/revive/revive-nvidia-uvm check --simulated /dev/nvidia-uvm" in lines


# systemd-analyze comes with systemd (a dependency of systemd-container, which .ci/run installs for the lab).
def test_systemd_analyze_verify_accepts_the_unit(repo, tmp_path, real_release):
    helper = tmp_path / "vllm-wait-healthy"
    shutil.copy(repo / "roles/vllm_service/files/vllm-wait-healthy", helper)
    uvm_helper = tmp_path / "revive-nvidia-uvm"
    shutil.copy(repo / "roles/vllm_service/files/revive-nvidia-uvm", uvm_helper)
    text = render(repo, tmp_path, real_release, 0, {"vllm_service_health_helper": str(helper),
                                                    "vllm_service_uvm_helper": str(uvm_helper)})
    unit = tmp_path / "vllm-0.service"
    unit.write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr.strip()) == (0, "")


def test_ansible_doc_renders_both_entry_points_of_vllm_service(repo):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-t", "role", "-r", "roles", "vllm_service"], cwd=repo,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for text in ("ENTRY POINT: *main*", "ENTRY POINT: *rollback*", "vllm_service_api_key", "KillMode=mixed",
                 "vllm_service_rollback_reason"):
        assert text in proc.stdout, text
