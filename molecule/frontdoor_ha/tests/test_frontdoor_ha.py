"""Two front doors after side_effect.yml: keepalived runs on both with a root-only configuration, only one front door
holds the virtual address - the one that had it when the path between them came back after the partition (the
higher priority, lb1) - and both HAProxys send traffic to every replica."""
import ipaddress
import json
import os
from pathlib import Path

from lab_testinfra import haproxy_servers, lab_host, lab_hosts

testinfra_hosts = lab_hosts("lb")
VIP = str(ipaddress.ip_interface(f"{lab_host('lb1')['address']}/24").network[250])  # molecule.yml: .250 of the /24
REPLICAS = {"node1-vllm-0", "node2-vllm-0"}  # one replica of TP 8 per node (molecule.yml)
RESULTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "frontdoor-ha-results.json"  # side_effect.yml's numbers


def test_keepalived_runs_from_a_root_only_configuration_naming_the_address_the_peer_and_the_tls_port(host):
    service = host.service("keepalived")
    assert service.is_enabled and service.is_running
    config = host.file("/etc/keepalived/keepalived.conf")
    assert (config.user, config.group, config.mode) == ("root", "root", 0o640)
    text = config.content_string
    peer = lab_host({"lb1": "lb2", "lb2": "lb1"}[host.backend.host.name])["address"]
    assert f"{VIP}/24 dev " in text and "nopreempt" in text and "state BACKUP" in text
    assert "/dev/tcp/127.0.0.1/443'" in text  # the health check tracks the TLS port (molecule.yml: TLS on)
    assert peer in text.split("unicast_peer", 1)[1]


def test_only_the_front_door_that_kept_the_address_after_the_partition_holds_it(host):
    healed = json.loads(RESULTS.read_text())["holders"]["healed"]  # side_effect.yml: with the path back, last
    assert len(healed) == 1 and healed[0] in ("lb1", "lb2"), healed
    taken_by = healed[0]
    held = host.run("ip -4 -o addr show to %s/32", VIP).stdout.strip()
    assert bool(held) == (host.backend.host.name == taken_by), (taken_by, held)


def test_each_front_door_sends_traffic_to_every_replica(host):
    states = haproxy_servers(host)
    assert {name: row["status"] for name, row in states.items() if name.startswith("node")} == dict.fromkeys(
        REPLICAS, "UP")
