"""A GPU node's guard (module_utils/revive_firewall.py, role node_firewall): the rules it makes from a release, what
it refuses, and the rules loaded by the real `nft` in a network namespace, probed over real TCP from an allowed and a
refused source (.ci/run installs nftables; the test needs root, as the lab does)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from ansible.module_utils.revive_firewall import FirewallError, guard, ray_ports
from ansible.module_utils.revive_monitoring import MonitoringError, exporter_ports

NFT = shutil.which("nft") or "/usr/sbin/nft"
if not os.path.exists(NFT):
    raise RuntimeError("these tests need nftables (Debian: apt-get install nftables; .ci/run installs it)")

RAY = {"node_manager": 6381, "object_manager": 6382, "min_worker": 10002, "max_worker": 10199, "dashboard": 8265}


def release(ports=(8000, 8001), role=None, members=()):
    out = {"replicas": [{"name": f"vllm-{n}", "port": p} for n, p in enumerate(ports)]}
    if role:
        out["group"] = {"role": role, "ray": {"port": 6379}, "members": [{"address": a} for a in members]}
    return out


def test_vllm_ports_only_from_the_front_door_monitoring_and_extra_sources():
    made = guard(release(), ["10.0.0.4"], ["10.0.0.5"], ["192.168.7.0/24", "fd00::9"], RAY)
    assert made["vllm_ports"] == [8000, 8001] and made["ray_ports"] == [] and not made["open"]
    text = made["ruleset"]
    assert text.splitlines()[2:4] == ["table inet revive_guard", "delete table inet revive_guard"]
    assert "elements = { 10.0.0.4, 10.0.0.5, 192.168.7.0/24 }" in text and "flags interval" in text
    assert "tcp dport { 8000, 8001 } ip saddr @service_v4 accept" in text
    assert "tcp dport { 8000, 8001 } ip6 saddr @service_v6 accept" in text
    assert 'tcp dport { 8000, 8001 } counter reject with tcp reset comment "vllm: not an allowed source"' in text
    assert "policy accept;" in text and 'iif "lo" accept' in text
    assert made["report"] == ["vLLM ports 8000, 8001: only from 10.0.0.4, 10.0.0.5, 192.168.7.0/24, fd00::9 and "
                              "the node itself"]


def test_without_a_front_door_or_sources_the_vllm_ports_stay_open_and_it_says_so():
    made = guard(release(), [], [], [], RAY)
    assert made["open"] and "reject" not in made["ruleset"]
    assert made["report"][0].startswith("vLLM ports 8000, 8001: OPEN to every source")


def test_a_group_head_guards_ray_for_the_members_and_a_worker_has_only_ray():
    head = guard(release(role="head", members=["10.0.0.11", "10.0.0.12"]), ["10.0.0.4"], [], [], RAY)
    assert head["ray_ports"] == ["6379", "6381", "6382", "8265", "10002-10199"]
    assert "tcp dport { 6379, 6381, 6382, 8265, 10002-10199 } ip saddr @cluster_v4 accept" in head["ruleset"]
    assert "set cluster_v4 { type ipv4_addr; elements = { 10.0.0.11, 10.0.0.12 } }" in head["ruleset"]
    worker = guard(release(ports=(), role="worker", members=["10.0.0.11", "10.0.0.12"]), ["10.0.0.4"], [], [], RAY)
    assert worker["vllm_ports"] == [] and worker["ray_ports"] and "vllm:" not in worker["ruleset"]
    assert ray_ports(release(role="spare"), RAY) == []


def test_exporter_ports_only_from_the_monitoring_hosts_and_extra_sources_not_the_front_door():
    made = guard(release(), ["10.0.0.4"], ["10.0.0.5"], ["192.168.7.0/24"], RAY, exporter_ports=[9835, 9100, 9100])
    text = made["ruleset"]
    assert made["exporter_ports"] == [9100, 9835]
    assert "set metrics_v4 { type ipv4_addr; flags interval; elements = { 10.0.0.5, 192.168.7.0/24 } }" in text
    assert "tcp dport { 9100, 9835 } ip saddr @metrics_v4 accept" in text and "@metrics_v6" not in text
    assert 'tcp dport { 9100, 9835 } counter reject with tcp reset comment "exporters: not an allowed source"' in text
    assert made["report"][-1] == "exporter ports 9100, 9835: only from 10.0.0.5, 192.168.7.0/24 and the node itself"
    assert "metrics" not in guard(release(), ["10.0.0.4"], ["10.0.0.5"], [], RAY)["ruleset"]
    alone = guard(release(ports=()), ["10.0.0.4"], [], [], RAY, exporter_ports=[9100])
    assert "reject" not in alone["ruleset"] and alone["report"] == [
        "exporter ports 9100: OPEN to every source - no monitoring host or revive_firewall_allow entry"]
    frontdoor = guard({}, [], ["10.0.0.5"], [], RAY, exporter_ports=[8405])   # a front door host: its exporter only
    assert "set service_v4" not in frontdoor["ruleset"] and "set metrics_v4" in frontdoor["ruleset"]
    assert frontdoor["report"] == ["exporter ports 8405: only from 10.0.0.5 and the node itself"]


def test_the_exporter_ports_are_the_monitoring_roles(repo):
    defaults = yaml.safe_load((repo / "roles/monitoring/defaults/main.yml").read_text())
    own = yaml.safe_load((repo / "roles/monitoring/vars/main.yml").read_text())["__monitoring_gpu_exporter_ports"]
    assert exporter_ports(defaults, own) == [defaults["monitoring_node_exporter_port"], own[defaults[
        "monitoring_gpu_exporter"]]] == [9100, 9400]
    assert exporter_ports(defaults, own, "nvitop") == [9100, 9835]
    assert exporter_ports(defaults, own, "nvitop", "9500", 9101) == [9101, 9500]
    with pytest.raises(MonitoringError, match="monitoring_gpu_exporter 'dgcm' is not one of dcgm, nvitop"):
        exporter_ports(defaults, own, "dgcm")
    with pytest.raises(MonitoringError, match="monitoring_node_exporter_port: 'x' is not a TCP port"):
        exporter_ports(defaults, own, node_exporter_port="x")


def test_the_ray_defaults_are_the_ray_cluster_roles(repo):
    defaults = yaml.safe_load((repo / "roles/ray_cluster/defaults/main.yml").read_text())["ray_cluster_ports"]
    elements = ray_ports(release(role="head"), defaults)
    assert f"{defaults['min_worker']}-{defaults['max_worker']}" in elements and str(defaults["dashboard"]) in elements


@pytest.mark.parametrize("kwargs, needle", [
    ({"ssh_port": 8000}, "the SSH port 8000 is among the ports to guard"),
    ({"ssh_port": 10100, "role": "head"}, "the SSH port 10100 is among the ports to guard"),
    ({"frontdoors": ["lb1.example.internal"]}, "'lb1.example.internal' is not an IP address or network"),
    ({"frontdoors": [""]}, "'' is not an IP address or network"),
    ({"ports": (0,)}, "is not a port number (1-65535)"),
    ({"ray": {"min_worker": 11000, "max_worker": 10000}, "role": "head"}, "min_worker 11000 is above max_worker"),
    ({"exporters": [22]}, "the SSH port 22 is among the ports to guard"),
    ({"exporters": [8000]}, "the exporter port 8000 is also a vLLM or Ray port of this node"),
    ({"exporters": [10050], "role": "head"}, "the exporter port 10050 is also a vLLM or Ray port of this node"),
    ({"exporters": [70000]}, "an exporter's port: 70000 is not a port number"),
])
def test_what_would_lock_out_ssh_or_not_parse_is_refused(kwargs, needle):
    made = release(ports=kwargs.get("ports", (8000,)), role=kwargs.get("role"), members=["10.0.0.11"])
    with pytest.raises(FirewallError) as refused:
        guard(made, kwargs.get("frontdoors", ["10.0.0.4"]), [], [], kwargs.get("ray", RAY), kwargs.get("ssh_port", 22),
              kwargs.get("exporters", ()))
    assert needle in str(refused.value)


# --- the real nft, real TCP -------------------------------------------------------------------------------------

def ip(*args: str, netns: str = "") -> None:
    argv = (["ip", "netns", "exec", netns] if netns else []) + ["ip", *args]
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture
def node():
    """Namespace `srv` (the node) with two links: one to an allowed client `ok`, one to a refused client `no`."""
    tag = f"fw{os.getpid() % 100000}"
    names = {"srv": f"{tag}s", "ok": f"{tag}a", "no": f"{tag}b"}
    for name in names.values():
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for n, client in ((1, "ok"), (2, "no")):
            ip("link", "add", f"{tag}v{n}", "type", "veth", "peer", "name", f"{tag}p{n}")
            ip("link", "set", f"{tag}v{n}", "netns", names["srv"])
            ip("link", "set", f"{tag}p{n}", "netns", names[client])
            ip("addr", "add", f"10.251.{n}.1/24", "dev", f"{tag}v{n}", netns=names["srv"])
            ip("addr", "add", f"10.251.{n}.2/24", "dev", f"{tag}p{n}", netns=names[client])
            for side, link in (("srv", f"{tag}v{n}"), (client, f"{tag}p{n}")):
                ip("link", "set", link, "up", netns=names[side])
                ip("link", "set", "lo", "up", netns=names[side])
        listener = subprocess.Popen(["ip", "netns", "exec", names["srv"], sys.executable, "-c", textwrap.dedent("""
            import socket, threading
            def serve(port):
                s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("0.0.0.0", port)); s.listen(16)
                while True:
                    c, _ = s.accept(); c.sendall(b"hi"); c.close()
            for port in (8000, 6379, 9100, 2222):
                threading.Thread(target=serve, args=(port,), daemon=True).start()
            threading.Event().wait()
            """)])
        yield names, listener
    finally:
        if "listener" in locals():
            listener.kill()
            listener.wait()
        for name in names.values():
            subprocess.run(["ip", "netns", "del", name], check=False)


def probe(netns: str, address: str, port: int) -> str:
    code = (f"import socket\ntry:\n s = socket.create_connection(({address!r}, {port}), timeout=3)\n"
            f" print(s.recv(2).decode())\nexcept ConnectionRefusedError:\n print('refused')\n"
            f"except OSError as e:\n print('error', e)\n")
    out = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=20)
    return out.stdout.strip()


def test_the_loaded_rules_refuse_other_sources_and_leave_everything_else_alone(node, tmp_path):
    names, _ = node
    made = guard(release(ports=(8000,), role="head", members=["10.251.1.1", "10.251.1.2"]), [], ["10.251.1.2"], [],
                 RAY, ssh_port=2222, exporter_ports=[9100])
    rules = tmp_path / "firewall.nft"
    rules.write_text(made["ruleset"])
    deadline = time.monotonic() + 10
    while probe(names["ok"], "10.251.1.1", 8000) != "hi":   # the listener is up
        assert time.monotonic() < deadline, "the test's listener did not start"
        time.sleep(0.1)
    assert probe(names["no"], "10.251.2.1", 8000) == "hi"   # open before the rules
    for _ in range(2):   # loading twice replaces the table: same rules, no error
        subprocess.run(["ip", "netns", "exec", names["srv"], NFT, "-c", "-f", str(rules)], check=True)
        subprocess.run(["ip", "netns", "exec", names["srv"], NFT, "-f", str(rules)], check=True)
    listed = subprocess.run(["ip", "netns", "exec", names["srv"], NFT, "list", "ruleset"], check=True,
                            capture_output=True, text=True).stdout
    assert listed.count("table inet revive_guard") == 1
    assert probe(names["ok"], "10.251.1.1", 8000) == "hi"        # the monitoring host
    assert probe(names["no"], "10.251.2.1", 8000) == "refused"   # anyone else: a reset, at once
    assert probe(names["ok"], "10.251.1.1", 6379) == "hi"        # a group member's Ray
    assert probe(names["no"], "10.251.2.1", 6379) == "refused"
    assert probe(names["ok"], "10.251.1.1", 9100) == "hi"        # the monitoring host scrapes node exporter
    assert probe(names["no"], "10.251.2.1", 9100) == "refused"
    assert probe(names["srv"], "10.251.2.1", 9100) == "hi"
    assert probe(names["no"], "10.251.2.1", 2222) == "hi"        # the SSH port and all else: untouched
    assert probe(names["srv"], "10.251.2.1", 8000) == "hi"       # the node itself, at its own address
    subprocess.run(["ip", "netns", "exec", names["srv"], NFT, "delete", "table", "inet", "revive_guard"], check=True)
    assert probe(names["no"], "10.251.2.1", 8000) == "hi"        # the unit's stop removes exactly the guard
