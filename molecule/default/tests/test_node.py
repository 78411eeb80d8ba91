"""The lab node after site.yml (and the release faults of side_effect.yml): a booted systemd host, reachable over SSH
by key only, whose NVML (the lab's fake driver, read by unmodified pynvml) reports exactly its GPU profile, and
whose replicas serve warmed up with no front door."""
import json

from lab_testinfra import lab_host, lab_hosts, nvml_view, profile_as_nvml_view, serve_url

testinfra_hosts = lab_hosts("gpu_nodes")


def test_systemd_finished_booting_with_no_failed_unit(host):
    state = host.run("systemctl is-system-running").stdout.strip()
    assert state == "running", host.run("systemctl --failed --no-pager").stdout


def test_sshd_is_running_and_listening_on_port_22(host):
    assert host.service("ssh").is_running, host.run("journalctl -u ssh --no-pager -n 30").stdout
    assert host.socket("tcp://0.0.0.0:22").is_listening


def test_root_logs_in_with_the_lab_key_only(host):
    effective = dict(line.split(" ", 1) for line in host.check_output("sshd -T").splitlines())
    assert effective["permitrootlogin"] == "without-password"
    assert effective["passwordauthentication"] == "no"


def test_pynvml_reports_exactly_the_nodes_gpu_profile(host):
    profile = lab_host(host.backend.host.name)["gpu_profile"]
    assert nvml_view(host) == profile_as_nvml_view(profile)


def test_with_no_front_door_every_replica_of_the_current_release_runs_warmed_up_and_healthy(host):
    # The scenario has no `lb` host: handover.yml warms the node up and records the report without HAProxy.
    record = json.loads(host.file("/var/lib/revive/releases.json").content_string)
    report = json.loads(host.file("/var/lib/revive/handover.json").content_string)
    replicas = record["current"]["replicas"]
    assert replicas
    assert sorted(report["replicas"]) == sorted(r["name"] for r in replicas)
    for replica in replicas:
        entry = report["replicas"][replica["name"]]
        assert entry["passed"] and entry["release"]["id"] == record["current"]["id"], entry["message"]
        assert host.service(replica["unit"]).is_running
        health = host.run(f"curl -fsS -o /dev/null -w '%{{http_code}}' "
                          f"{serve_url(host.backend.host.name, replica['port'])}/health")
        assert health.stdout == "200", health.stderr
    assert not host.service("haproxy").is_running


def test_a_node_outside_any_serving_group_runs_no_ray(host):
    # A one-node plan never starts Ray (docs/multi-node.md): no Ray unit, no Ray process; the release record has no
    # group section.
    record = json.loads(host.file("/var/lib/revive/releases.json").content_string)
    assert "group" not in record["current"]
    assert not host.file("/etc/systemd/system/revive-ray.service").exists
    assert host.run("pgrep -f 'raylet|gcs_server|ray start'").rc == 1
