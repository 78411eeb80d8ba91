"""How the lab is reached: the generated inventory, ssh_config, known_hosts and /etc/hosts."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))

from labctl import access  # noqa: E402
from labctl.shape import LabShape, host_address  # noqa: E402
from labctl.state import HostRecord, LabState  # noqa: E402

KEY = Path("/lab/id_ed25519")
KNOWN_HOSTS = Path("/lab/known_hosts")
CONTROL = Path("/lab/cp")
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGn7Vw8jX0lHk7cbV0n0tq3Yd3bXoQmPpZ4fCk2o2o2o"


def lab_state(shape: LabShape, slot: int = 3) -> LabState:
    lab = LabState(slot=slot, bridge=f"rvlab{slot}", rootfs="/r", shape=shape, inventory="/lab/hosts.yml")
    for h in shape.hosts:
        lab.hosts.append(HostRecord(h.name, h.group, host_address(slot, h), h.gpu_profile, f"rvlab{slot}-{h.name}",
                                    f"rvlab{slot}h{h.octet}", "/root", "/upper", "/work"))
    return lab


@pytest.fixture()
def default_lab() -> LabState:
    return lab_state(LabShape(2, ("model-store", "bench1", "lb1"),
                              {"node1": "v100-pcie-8x", "node2": "v100-pcie-8x-degraded"}))


def test_inventory_groups_hosts_and_reaches_them_with_the_labs_key_and_known_hosts(default_lab):
    inventory = yaml.safe_load(access.render_inventory(default_lab, KEY, KNOWN_HOSTS, CONTROL))
    assert inventory["all"]["vars"] == {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": "/lab/id_ed25519",
        "ansible_ssh_common_args": "-o UserKnownHostsFile=/lab/known_hosts -o StrictHostKeyChecking=yes "
                                   "-o IdentitiesOnly=yes -o ControlPath=/lab/cp/%h",
    }
    assert inventory["all"]["children"] == {
        "gpu_nodes": {"hosts": {
            "node1": {"ansible_host": "10.213.3.11", "revive_lab_gpu_profile": "v100-pcie-8x"},
            "node2": {"ansible_host": "10.213.3.12", "revive_lab_gpu_profile": "v100-pcie-8x-degraded"}}},
        "model_store": {"hosts": {"model-store": {"ansible_host": "10.213.3.2"}}},
        "bench": {"hosts": {"bench1": {"ansible_host": "10.213.3.3"}}},
        "lb": {"hosts": {"lb1": {"ansible_host": "10.213.3.4"}}},
        "monitor": {},
    }


def test_ansible_reads_the_inventory_with_the_committed_lab_group_vars(tmp_path):
    lab = lab_state(LabShape(1, (), {"node1": "t4-4x"}))
    (tmp_path / "hosts.yml").write_text(access.render_inventory(lab, KEY, KNOWN_HOSTS, CONTROL))
    shutil.copytree(REPO / "inventory/lab/group_vars", tmp_path / "group_vars")
    out = subprocess.run([str(Path(sys.executable).with_name("ansible-inventory")), "-i", str(tmp_path), "--list"],
                         check=True, capture_output=True, text=True, cwd=REPO).stdout
    listing = json.loads(out)
    node = listing["_meta"]["hostvars"]["node1"]
    assert listing["gpu_nodes"]["hosts"] == ["node1"]
    assert node["revive_lab"] is True
    assert node["revive_lab_gpu_profile"] == "t4-4x"
    assert node["ansible_host"] == "10.213.3.11"
    assert "StrictHostKeyChecking=no" not in node["ansible_ssh_common_args"]


def test_ssh_config_has_no_gssapi_line_and_paramiko_resolves_each_host(default_lab):
    text = access.render_ssh_config(default_lab, KEY, KNOWN_HOSTS)
    assert "gssapi" not in text.lower()  # testinfra + paramiko 5 crash on any GSSAPI line
    config = paramiko.SSHConfig.from_text(text)
    entry = config.lookup("model-store")
    assert entry["hostname"] == "10.213.3.2"
    assert entry["user"] == "root"
    assert entry["identityfile"] == ["/lab/id_ed25519"]
    assert entry["userknownhostsfile"] == "/lab/known_hosts"
    assert entry["stricthostkeychecking"] == "yes"


def test_known_hosts_lets_paramiko_check_a_host_by_name_and_by_address(tmp_path):
    text = access.render_known_hosts({"node1": ("10.213.3.11", ED25519 + " root@node1")})
    assert text == f"node1,10.213.3.11 {ED25519}\n"
    (tmp_path / "known_hosts").write_text(text)
    keys = paramiko.HostKeys(str(tmp_path / "known_hosts"))
    assert keys.lookup("10.213.3.11")["ssh-ed25519"].get_base64() == ED25519.split()[1]
    assert keys.lookup("node1")["ssh-ed25519"].get_base64() == ED25519.split()[1]
    assert keys.lookup("10.213.3.12") is None


def test_every_lab_host_knows_every_other_by_name(default_lab):
    hosts = access.render_etc_hosts(default_lab, "10.213.3.1")
    assert "10.213.3.1\tlab-controller\n" in hosts
    for name, address in [("node1", "10.213.3.11"), ("node2", "10.213.3.12"), ("model-store", "10.213.3.2"),
                          ("bench1", "10.213.3.3"), ("lb1", "10.213.3.4")]:
        assert f"{address}\t{name}\n" in hosts


def test_an_empty_group_still_exists_so_plays_for_it_just_skip():
    lab = lab_state(LabShape(1, (), {"node1": "v100-pcie-8x"}))
    children = yaml.safe_load(access.render_inventory(lab, KEY, KNOWN_HOSTS, CONTROL))["all"]["children"]
    assert children["lb"] == {} and children["bench"] == {} and children["model_store"] == {}


def test_molecule_scenarios_get_the_same_lab_variables_as_the_lab_inventory():
    base = yaml.safe_load((REPO / ".config/molecule/config.yml").read_text())
    lab_vars = {}
    for path in sorted((REPO / "inventory/lab/group_vars/all").glob("*.yml")):
        lab_vars.update(yaml.safe_load(path.read_text()))
    assert base["provisioner"]["inventory"]["group_vars"]["all"] == lab_vars
