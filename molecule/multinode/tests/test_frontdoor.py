"""The front door of the serving group: one server, the head's replica, READY and UP; the worker has none; TLS with
the key in one root-only file."""
import os
from pathlib import Path

from lab_testinfra import haproxy_servers, lab_hosts

testinfra_hosts = lab_hosts("lb")


def test_the_backend_has_the_heads_replica_only_and_it_serves(host):
    states = haproxy_servers(host)
    assert {name: row["status"].split()[0] for name, row in states.items()} == {"node1-vllm-0": "UP"}, states


def test_the_tls_key_is_readable_by_root_only_and_only_in_its_pem_file(host):
    tls_dir = host.file("/etc/haproxy/tls")
    assert (tls_dir.user, tls_dir.group, tls_dir.mode) == ("root", "root", 0o700)
    pem = host.file("/etc/haproxy/tls/frontdoor.pem")
    assert (pem.user, pem.group, pem.mode) == ("root", "root", 0o600)
    assert "PRIVATE KEY" in pem.content_string and "BEGIN CERTIFICATE" in pem.content_string
    config = host.file("/etc/haproxy/haproxy.cfg").content_string
    assert "ssl crt /etc/haproxy/tls/frontdoor.pem" in config and "PRIVATE KEY" not in config
    assert "ssl-min-ver TLSv1.2" in config
    # Nothing else on the host holds the key (a line of the lab key's own text): not Ansible's temporary files, not
    # HAProxy's state, not the journal
    key = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "lab", "tls", "frontdoor.key").read_text().splitlines()[1]
    found = host.run("grep -rlaF -- %s /etc /var/lib/haproxy /var/log /root /tmp /var/tmp /run", key)
    assert found.stdout.split() == ["/etc/haproxy/tls/frontdoor.pem"], found.stdout
