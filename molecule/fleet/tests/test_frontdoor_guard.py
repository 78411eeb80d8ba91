"""The front door host's guard (playbooks/tasks/frontdoor_guard.yml, docs/network.md §1) seen from the other lab
hosts after the rolls: HAProxy's Prometheus port answers the monitoring host only - the bench host, a client, is
refused at once - while the clients' port serves everyone."""
from __future__ import annotations

from lab_testinfra import knock, lab_host, lab_hosts

testinfra_hosts = lab_hosts("bench") + lab_hosts("monitor")


def test_only_the_monitoring_host_reaches_the_front_doors_metrics(host):
    seen = knock(host, lab_host(lab_hosts("lb")[0])["address"], (8405, 80))
    metrics = "open" if host.backend.get_hostname() in lab_hosts("monitor") else "refused"
    assert seen == {"8405": metrics, "80": "open"}, (host.backend.get_hostname(), seen)
