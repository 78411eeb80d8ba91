"""The GPU node's guard (role node_firewall, docs/network.md) seen from the other lab hosts: the monitoring host
reaches the replicas' ports (Prometheus scrapes /metrics there) and the exporters' (node exporter 9100,
nvitop-exporter 9835), the model store - neither a front door nor a monitoring host - is refused at once."""
from __future__ import annotations

from lab_testinfra import knock, lab_host, lab_hosts

testinfra_hosts = lab_hosts("model_store") + lab_hosts("monitor")


def test_only_the_monitoring_host_reaches_the_replicas_and_the_exporters(host):
    seen = knock(host, lab_host("node1")["address"], (8000, 8001, 9100, 9835))
    expected = "open" if host.backend.get_hostname() in lab_hosts("monitor") else "refused"
    assert seen == {"8000": expected, "8001": expected, "9100": expected, "9835": expected}, \
        (host.backend.get_hostname(), seen)
