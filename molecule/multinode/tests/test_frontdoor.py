"""The front door of the serving group: one server, the head's replica, READY and UP; the worker has none."""
from lab_testinfra import haproxy_servers, lab_hosts

testinfra_hosts = lab_hosts("lb")


def test_the_backend_has_the_heads_replica_only_and_it_serves(host):
    states = haproxy_servers(host)
    assert {name: row["status"].split()[0] for name, row in states.items()} == {"node1-vllm-0": "UP"}, states
