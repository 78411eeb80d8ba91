"""revive-nvidia-uvm.service and its helper: the root oneshot that loads nvidia-uvm and creates /dev/nvidia-uvm
before the vLLM replicas start, and the check each replica runs first (ExecStartPre). The unit as Ansible renders
it, `systemd-analyze verify` on it with a replica, and the helper run against paths under tmp_path, with a fake
/proc/devices, nvidia-modprobe and modprobe standing in for the driver."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_service_unit import real_release, render, unit_lines  # noqa: F401 - real_release is a fixture

BIN = os.path.dirname(sys.executable)
UNIT = "revive-nvidia-uvm.service"
HELPER = str(Path(__file__).resolve().parents[2] / "roles/vllm_service/files/revive-nvidia-uvm")


def render_loader(repo, tmp_path, simulated: bool, extra: dict | None = None) -> str:
    dest = tmp_path / UNIT
    play = tmp_path / "render-uvm.yml"
    play.write_text(textwrap.dedent(f"""\
        - name: Render the nvidia-uvm unit
          hosts: localhost
          gather_facts: false
          vars_files:
            - {repo}/roles/vllm_service/defaults/main.yml
            - {repo}/roles/vllm_service/vars/main.yml
          tasks:
            - name: Render
              ansible.builtin.template:
                src: {repo}/roles/vllm_service/templates/revive-nvidia-uvm.service.j2
                dest: {dest}
                mode: "0644"
              vars:
                __vllm_service_uvm_simulated: {json.dumps(simulated)}
        """))
    env = dict(os.environ, ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    args = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play)]
    for key, value in (extra or {}).items():
        args += ["-e", json.dumps({key: value})]
    proc = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dest.read_text()


def test_the_loader_is_a_root_oneshot_that_stays_active_and_starts_at_boot(repo, tmp_path):
    text = render_loader(repo, tmp_path, simulated=False)
    assert text.startswith("#")  # ansible_managed, as a comment
    lines = unit_lines(text)
    assert lines[lines.index("[Service]"):lines.index("[Install]")] == [
        "[Service]", "Type=oneshot", "RemainAfterExit=yes",
        "ExecStart=/usr/local/libexec/revive/revive-nvidia-uvm load /dev/nvidia-uvm", "TimeoutStartSec=60"]
    assert lines[lines.index("[Install]"):] == ["[Install]", "WantedBy=multi-user.target"]
    # Root (no User=), nothing that would keep it from loading a module or making a node; the replicas order
    # themselves after it, so it names none of them.
    assert not any(line.startswith(("User=", "DynamicUser=", "ProtectKernelModules=", "DevicePolicy=",
                                    "PrivateDevices=", "CapabilityBoundingSet=", "NoNewPrivileges=",
                                    "DefaultDependencies=", "Before=", "After=")) for line in lines)
    assert "Description=Load nvidia-uvm and create /dev/nvidia-uvm for the vLLM replicas" in lines
    assert "simulated" not in text.lower()


def test_on_simulated_gpus_the_loader_says_so_and_makes_stand_in_nodes(repo, tmp_path):
    lines = unit_lines(render_loader(repo, tmp_path, simulated=True))
    assert "ExecStart=/usr/local/libexec/revive/revive-nvidia-uvm load --simulated /dev/nvidia-uvm" in lines
    assert ("Description=Load nvidia-uvm and create /dev/nvidia-uvm for the vLLM replicas (simulated GPUs: "
            "stand-in nodes)") in lines
    assert "Type=oneshot" in lines and "RemainAfterExit=yes" in lines


def test_systemd_analyze_verify_accepts_the_loader_with_a_replica_ordered_after_it(repo, tmp_path, real_release):
    units = tmp_path / "units"
    units.mkdir()
    helpers = {"vllm_service_health_helper": str(tmp_path / "vllm-wait-healthy"),
               "vllm_service_uvm_helper": str(tmp_path / "revive-nvidia-uvm")}
    for name in ("vllm-wait-healthy", "revive-nvidia-uvm"):
        shutil.copy(repo / "roles/vllm_service/files" / name, tmp_path / name)
    (units / "vllm-0.service").write_text(render(repo, tmp_path, real_release, 0, helpers))
    (units / UNIT).write_text(render_loader(repo, tmp_path, simulated=False, extra=helpers))
    proc = subprocess.run(["systemd-analyze", "verify", str(units / UNIT), str(units / "vllm-0.service")],
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr.strip()) == (0, "")
    replica = unit_lines((units / "vllm-0.service").read_text())
    assert f"After=network-online.target {UNIT}" in replica and f"Wants=network-online.target {UNIT}" in replica
    assert f"ExecStartPre={tmp_path}/revive-nvidia-uvm check /dev/nvidia-uvm" in replica


def test_the_role_installs_the_helper_executable_and_the_unit_it_names(repo):
    helper = repo / "roles/vllm_service/files/revive-nvidia-uvm"
    assert helper.stat().st_mode & stat.S_IXUSR
    assert f"UNIT={UNIT}\n" in helper.read_text()
    assert f"__vllm_service_uvm_unit: {UNIT}\n" in (repo / "roles/vllm_service/vars/main.yml").read_text()


# --- the helper, against paths under tmp_path ----------------------------------------------------------------

HELPER_ENV_KEYS = ("REVIVE_NVIDIA_MODPROBE", "REVIVE_PROC_DEVICES")


@pytest.fixture
def driver(tmp_path):
    """A stand-in for the driver: /proc/devices, nvidia-modprobe and modprobe, all under tmp_path.

    The fakes log their argv and, unless told to fail, register nvidia-uvm (major 511) among the character
    devices of the fake /proc/devices, as the real module would; nvidia-modprobe also makes the node.
    """
    proc_devices = tmp_path / "proc-devices"
    proc_devices.write_text("Character devices:\n  1 mem\n  4 tty\n195 nvidia-frontend\n\nBlock devices:\n"
                            "  8 sd\n511 not-a-char-device\n")
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    calls = tmp_path / "calls"
    for name, body in (("modprobe", "echo modprobe \"$@\" >> {calls}\n"
                                    "[ -e {fakes}/modprobe.fails ] && exit 1\n"
                                    "sed -i 's/^Character devices:$/&\\n511 nvidia-uvm/' {pd}\n"),
                       ("nvidia-modprobe", "echo nvidia-modprobe \"$@\" >> {calls}\n"
                                           "sed -i 's/^Character devices:$/&\\n511 nvidia-uvm/' {pd}\n"
                                           "mknod -m 0666 \"$FAKE_UVM_DEVICE\" c 511 0\n")):
        fake = fakes / name
        fake.write_text("#!/bin/sh\n" + body.format(calls=calls, fakes=fakes, pd=proc_devices))
        fake.chmod(0o755)

    class Driver:
        def __init__(self):
            self.proc_devices, self.fakes, self.calls = proc_devices, fakes, calls
            self.device = tmp_path / "dev" / "nvidia-uvm"
            self.device.parent.mkdir()

        def run(self, *args, nvidia_modprobe: bool = False):
            env = {key: value for key, value in os.environ.items() if key not in HELPER_ENV_KEYS}
            env.update(PATH=f"{fakes}:/usr/sbin:/usr/bin:/sbin:/bin", REVIVE_PROC_DEVICES=str(proc_devices),
                       REVIVE_NVIDIA_MODPROBE=str(fakes / "nvidia-modprobe") if nvidia_modprobe
                       else str(tmp_path / "no-nvidia-modprobe"),
                       FAKE_UVM_DEVICE=str(self.device))
            return subprocess.run([HELPER, *args], env=env, capture_output=True, text=True, timeout=30)

        def logged(self) -> list:
            return calls.read_text().splitlines() if calls.exists() else []

        def node(self, path=None) -> tuple:
            info = os.stat(path or self.device)
            return stat.S_ISCHR(info.st_mode), os.major(info.st_rdev), os.minor(info.st_rdev), info.st_mode & 0o777

    return Driver()


def test_check_without_the_node_fails_fast_with_the_reason(driver):
    proc = driver.run("check", str(driver.device))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (f"revive-nvidia-uvm: {driver.device} is missing: the nvidia-uvm kernel module is not "
                           f"loaded; see {UNIT}\n")


def test_check_names_a_loaded_module_whose_node_was_not_made(driver):
    driver.proc_devices.write_text(driver.proc_devices.read_text().replace("195 nvidia-frontend\n",
                                                                           "195 nvidia-frontend\n511 nvidia-uvm\n"))
    proc = driver.run("check", str(driver.device))
    assert proc.returncode == 1
    assert (f"{driver.device} is missing: the nvidia-uvm kernel module is loaded (major 511) but its device node "
            f"was not created; see {UNIT}") in proc.stderr


def test_check_refuses_what_is_not_a_character_device(driver):
    driver.device.write_text("")
    proc = driver.run("check", str(driver.device))
    assert proc.returncode == 1
    assert f"{driver.device} is not a character device" in proc.stderr and f"see {UNIT}" in proc.stderr


def test_check_refuses_a_node_when_the_module_is_not_loaded(driver):
    os.mknod(driver.device, 0o666 | stat.S_IFCHR, os.makedev(511, 0))
    proc = driver.run("check", str(driver.device))
    assert proc.returncode == 1
    assert (f"{driver.device} exists but the nvidia-uvm kernel module is not loaded (no nvidia-uvm in "
            f"{driver.proc_devices}, so systemd drops DeviceAllow=char-nvidia-uvm)") in proc.stderr


def test_check_refuses_a_node_left_from_an_earlier_load(driver):
    os.mknod(driver.device, 0o666 | stat.S_IFCHR, os.makedev(510, 0))
    driver.proc_devices.write_text("Character devices:\n511 nvidia-uvm\n")
    proc = driver.run("check", str(driver.device))
    assert proc.returncode == 1
    assert f"{driver.device} has major 510 but the loaded nvidia-uvm kernel module has major 511" in proc.stderr


def test_check_passes_silently_for_nvidia_uvms_node(driver):
    os.mknod(driver.device, 0o666 | stat.S_IFCHR, os.makedev(511, 0))
    driver.proc_devices.write_text("Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n")
    proc = driver.run("check", str(driver.device))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_a_block_device_named_nvidia_uvm_is_not_the_module(driver):
    os.mknod(driver.device, 0o666 | stat.S_IFCHR, os.makedev(511, 0))
    driver.proc_devices.write_text("Character devices:\n  1 mem\n\nBlock devices:\n511 nvidia-uvm\n")
    proc = driver.run("check", str(driver.device))
    assert proc.returncode == 1 and "the nvidia-uvm kernel module is not loaded" in proc.stderr


def test_load_runs_nvidia_modprobe_when_the_driver_installed_it(driver):
    proc = driver.run("load", str(driver.device), nvidia_modprobe=True)
    assert proc.returncode == 0, proc.stderr
    assert driver.logged() == ["nvidia-modprobe -u -c=0"]
    assert driver.node() == (True, 511, 0, 0o666)
    assert proc.stdout.splitlines()[-1] == f"revive-nvidia-uvm: {driver.device} is ready (nvidia-uvm major 511)"


def test_load_without_nvidia_modprobe_runs_modprobe_and_makes_both_nodes(driver):
    proc = driver.run("load", str(driver.device))
    assert proc.returncode == 0, proc.stderr
    assert driver.logged() == ["modprobe nvidia-uvm"]
    assert driver.node() == (True, 511, 0, 0o666)
    assert driver.node(f"{driver.device}-tools") == (True, 511, 1, 0o666)
    # Idempotent: a second run (a restart of the unit, udev having loaded the module) changes nothing.
    before = os.stat(driver.device).st_ino
    assert driver.run("load", str(driver.device)).returncode == 0
    assert os.stat(driver.device).st_ino == before


def test_load_replaces_a_stale_node(driver):
    os.mknod(driver.device, 0o600 | stat.S_IFCHR, os.makedev(510, 0))
    proc = driver.run("load", str(driver.device))
    assert proc.returncode == 0, proc.stderr
    assert driver.node() == (True, 511, 0, 0o666)


def test_load_fails_with_the_reason_when_the_module_does_not_load(driver):
    (driver.fakes / "modprobe.fails").write_text("")
    proc = driver.run("load", str(driver.device))
    assert proc.returncode == 1
    assert "modprobe nvidia-uvm failed (exit 1): is the NVIDIA driver installed for this kernel?" in proc.stderr
    assert f"{driver.device} is missing: the nvidia-uvm kernel module is not loaded; see {UNIT}" in proc.stderr
    assert not driver.device.exists()


def test_simulated_load_makes_stand_in_nodes_and_loads_nothing(driver):
    proc = driver.run("load", "--simulated", str(driver.device), nvidia_modprobe=True)
    assert proc.returncode == 0, proc.stderr
    assert driver.logged() == []
    assert driver.node() == (True, 60, 0, 0o666) and driver.node(f"{driver.device}-tools") == (True, 60, 1, 0o666)
    assert "simulated GPUs (no NVIDIA driver on this node): no kernel module loaded" in proc.stdout
    assert proc.stdout.splitlines()[-1] == f"revive-nvidia-uvm: {driver.device} is ready (simulated)"
    # The replicas' check accepts the stand-in (no nvidia-uvm major to compare) and refuses its absence.
    assert driver.run("check", "--simulated", str(driver.device)).returncode == 0
    assert driver.run("check", str(driver.device)).returncode == 1
    driver.device.unlink()
    proc = driver.run("check", "--simulated", str(driver.device))
    assert proc.returncode == 1
    assert (f"{driver.device} is missing: the nvidia-uvm kernel module is not loaded; see {UNIT} (simulated GPUs: "
            "the node is a stand-in that unit makes)") in proc.stderr


@pytest.mark.parametrize("args", [(), ("check",), ("load", "--simulated"), ("check", "relative/nvidia-uvm"),
                                  ("unload", "/dev/nvidia-uvm"), ("check", "/dev/a", "/dev/b")])
def test_bad_arguments_exit_2(driver, args):
    proc = driver.run(*args)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: revive-nvidia-uvm load|check")
