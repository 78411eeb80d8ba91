"""A real (small) lab: `bin/lab up` -> Ansible reaches it -> `bin/lab down` leaves nothing on this machine.

Boots one GPU node and the bench host (two hosts, for a partition between them) with systemd-nspawn in a state
dir of its own (its own bridge and subnet), so it never touches the project's `make demo` lab. Needs root, as the
lab does; a few seconds once the rootfs is cached.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))

from labctl import system  # noqa: E402
from labctl.errors import LabError  # noqa: E402

VENV_BIN = Path(sys.executable).parent


def lab(state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bin/lab"), "--state-dir", str(state_dir), *args],
                          capture_output=True, text=True, timeout=600)


def machine_view(state_dir: Path) -> dict[str, list[str]]:
    """This lab's traces on the machine, found with the system's own tools rather than the lab's code."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    processes = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            processes.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return {
        "netns": netns,
        "links": [line.split(": ")[1].split("@")[0] for line in links.splitlines()],
        "mounts": [m for m in mounts if m.startswith(f"{state_dir}/")],
        "processes": [p for p in processes if p.startswith("systemd-nspawn") and f"--directory={state_dir}/" in p],
        "nft_tables": subprocess.run(["nft", "list", "tables", "bridge"], capture_output=True, text=True,
                                     check=True).stdout.split("\n"),
    }


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory):
    state_dir = tmp_path_factory.mktemp("lab") / "lab"
    up = lab(state_dir, "up", "--nodes", "1", "--support-hosts", "bench1", "--gpu-profile", "v100-pcie-8x")
    assert up.returncode == 0, up.stderr + up.stdout
    status = json.loads(lab(state_dir, "status", "--json").stdout)
    yield state_dir, status
    lab(state_dir, "down")


def test_up_boots_the_node_to_running_systemd(booted):
    _, status = booted
    assert status["up"] is True
    assert [(h["name"], h["group"], h["gpu_profile"], h["system_state"]) for h in status["hosts"]] == [
        ("node1", "gpu_nodes", "v100-pcie-8x", "running"), ("bench1", "bench", None, "running")]
    assert status["hosts"][0]["address"] == status["network"].replace("0/24", "11")


def test_ansible_pings_the_lab_through_its_inventory_with_host_keys_checked(booted):
    state_dir, status = booted
    ping = subprocess.run([str(VENV_BIN / "ansible"), "-i", status["inventory"], "all", "-m", "ansible.builtin.ping"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert "node1 | SUCCESS" in ping.stdout and "bench1 | SUCCESS" in ping.stdout and "pong" in ping.stdout
    assert Path(status["inventory"]).parent == state_dir  # not inventory/lab/hosts.yml: that is the project lab's


def test_the_fake_driver_and_profile_are_where_the_real_ones_would_be(booted):
    state_dir, _ = booted
    ssh = lab(state_dir, "ssh", "node1", "ldconfig -p | grep -c libnvidia-ml.so.1; "
                                         "python3 -c 'import json; print(json.load(open(\"/etc/fake-nvml/profile.json\"))[\"name\"])'")
    assert ssh.returncode == 0, ssh.stderr
    assert ssh.stdout.split() == ["1", "v100-pcie-8x"]


def test_set_profile_swaps_the_running_nodes_profile(booted):
    state_dir, _ = booted
    swap = lab(state_dir, "set-profile", "node1", "v100-pcie-8x-degraded")
    assert swap.returncode == 0, swap.stderr
    name = lab(state_dir, "ssh", "node1", "grep -o '\"name\": \"[^\"]*\"' /etc/fake-nvml/profile.json | head -1")
    assert name.stdout.strip() == '"name": "v100-pcie-8x-degraded"'
    hosts_yml = Path(json.loads(lab(state_dir, "status", "--json").stdout)["inventory"]).read_text()
    assert "revive_lab_gpu_profile: v100-pcie-8x-degraded" in hosts_yml


def test_up_again_with_the_same_hosts_is_a_no_op_and_another_shape_is_refused(booted):
    state_dir, status = booted
    again = lab(state_dir, "up", "--nodes", "1", "--support-hosts", "bench1", "--gpu-profile", "v100-pcie-8x")
    assert again.returncode == 0, again.stderr
    assert "lab: already up with this shape" in again.stdout
    assert json.loads(lab(state_dir, "status", "--json").stdout)["hosts"][0]["pid"] == status["hosts"][0]["pid"]
    other = lab(state_dir, "up", "--nodes", "2", "--support-hosts", "bench1")
    assert other.returncode == 1
    assert "a lab with another shape is up" in other.stderr and "bin/lab up --recreate" in other.stderr


def test_a_partition_cuts_the_path_between_two_hosts_only_and_heals(booted):
    state_dir, status = booted
    address = {h["name"]: h["address"] for h in status["hosts"]}
    gateway = address["node1"].rsplit(".", 1)[0] + ".1"   # the bridge: the controller's address in the lab

    def reaches(host: str, target: str) -> bool:
        return lab(state_dir, "ssh", host, "ping", "-c", "1", "-W", "1", target).returncode == 0

    assert reaches("node1", address["bench1"]) and reaches("bench1", address["node1"])
    down = lab(state_dir, "partition", "node1", "bench1", "down")
    assert down.returncode == 0 and "node1 <-> bench1: path down" in down.stdout, down.stderr
    assert lab(state_dir, "partition", "bench1", "node1", "down").stdout.strip().endswith("path down already")
    assert not reaches("node1", address["bench1"]) and not reaches("bench1", address["node1"])
    assert reaches("node1", gateway) and reaches("bench1", gateway)   # each keeps its link
    up = lab(state_dir, "partition", "node1", "bench1", "up")
    assert up.returncode == 0 and "path up" in up.stdout, up.stderr
    assert reaches("node1", address["bench1"]) and reaches("bench1", address["node1"])
    same = lab(state_dir, "partition", "node1", "node1", "down")
    assert same.returncode == 1 and "a partition needs two hosts, not node1 twice" in same.stderr
    unknown = lab(state_dir, "partition", "node1", "lb9", "down")
    assert unknown.returncode == 1 and "unknown host 'lb9'" in unknown.stderr


def test_down_leaves_no_namespace_link_mount_or_process(booted):
    state_dir, status = booted
    made_netns = {h["netns"] for h in status["hosts"]}
    made_links = {status["bridge"]} | {h["veth"] for h in status["hosts"]}
    # down with a path cut: the bridge's nftables table goes with the bridge
    assert lab(state_dir, "partition", "node1", "bench1", "down").returncode == 0
    before = machine_view(state_dir)
    assert made_netns <= set(before["netns"]) and made_links <= set(before["links"])
    assert f"table bridge {status['bridge']}_cuts" in before["nft_tables"]
    assert before["mounts"] and before["processes"]
    down = lab(state_dir, "down")
    assert down.returncode == 0, down.stderr
    assert "nothing left behind" in down.stdout
    after = machine_view(state_dir)
    assert made_netns & set(after["netns"]) == set()
    assert made_links & set(after["links"]) == set()
    assert after["mounts"] == []
    assert after["processes"] == []
    assert f"table bridge {status['bridge']}_cuts" not in after["nft_tables"]
    assert not Path(status["inventory"]).exists()
    assert json.loads(lab(state_dir, "status", "--json").stdout) == {"state_dir": str(state_dir), "up": False,
                                                                       "hosts": []}


def test_the_lab_refuses_to_run_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match=r"the lab needs root .*run `sudo bin/lab \.\.\.`"):
        system.check_host()


def test_missing_nspawn_names_the_package_to_install(monkeypatch):
    monkeypatch.setattr(system.shutil, "which", lambda tool: None if tool == "systemd-nspawn" else f"/usr/bin/{tool}")
    with pytest.raises(LabError, match=r"missing tools: systemd-nspawn \(package systemd-container\); "
                                       r"on Debian: apt-get install systemd-container"):
        system.check_host()
