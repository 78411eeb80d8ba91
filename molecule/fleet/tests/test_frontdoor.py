"""The front door after the rolls: HAProxy enabled and valid, every replica of the fleet UP, runtime states kept
across a reload."""
from __future__ import annotations

import json
import os
from pathlib import Path

from lab_testinfra import haproxy_runtime as runtime
from lab_testinfra import haproxy_servers as servers
from lab_testinfra import lab_hosts

testinfra_hosts = lab_hosts("lb")
REPLICAS = ("vllm-0", "vllm-1")


def expected_servers() -> set:
    return {f"{node}-{replica}" for node in lab_hosts("gpu_nodes") for replica in REPLICAS}


def test_haproxy_is_enabled_running_and_its_configuration_valid(host):
    service = host.service("haproxy")
    assert service.is_enabled and service.is_running, host.check_output("journalctl -u haproxy -n 30 --no-pager")
    assert host.run("haproxy -c -f /etc/haproxy/haproxy.cfg").rc == 0
    config = host.file("/etc/haproxy/haproxy.cfg").content_string
    for line in ("balance leastconn", "option http-server-close", "retry-on conn-failure empty-response",
                 # timeout server: the scenario's 20 s (molecule.yml, frontdoor_timeout_server), not the role's 180 s
                 "option redispatch", "option httpchk GET /health", "timeout queue 120s", "timeout server 20s",
                 "load-server-state-from-file global", "stats socket /run/haproxy/admin.sock mode 660 level admin",
                 "http-response set-header X-Revive-Server %s"):
        assert f"    {line}\n" in config, line
    for name in expected_servers():
        assert f"    server {name} " in config and f"{name} " in config
    # every replica: the limit the last bench applied (side_effect.yml's last step; the plan's 16 streams before it,
    # <= --max-num-seqs 64), and in maintenance until handed over
    results = json.loads((Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "fleet-results.json").read_text())
    assert results["frontdoor_maxconn"] >= 1
    assert config.count(f" maxconn {results['frontdoor_maxconn']} disabled\n") == len(expected_servers()), config


def test_every_replica_serves_after_the_rolls(host):
    states = servers(host)
    # "UP 1/3": up, with one failed check on the way down
    assert {name: states[name]["status"].split()[0] for name in expected_servers()} == \
        {name: "UP" for name in expected_servers()}


def test_a_reload_keeps_runtime_states(host):
    server = f"{lab_hosts('gpu_nodes')[0]}-vllm-1"
    runtime(host, f"set server vllm/{server} state drain")
    try:
        host.check_output("systemctl reload haproxy")
        assert servers(host)[server]["status"].startswith("DRAIN")  # "DRAIN 1/3" while a check fails
        assert host.file("/var/lib/haproxy/server-state").contains(f" {server} ")
    finally:
        runtime(host, f"set server vllm/{server} state ready")
    assert servers(host)[server]["status"].startswith("UP")
