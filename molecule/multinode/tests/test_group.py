"""The serving group after site.yml and the worker's restart (side_effect.yml): a real Ray cluster of two nodes and 16
GPUs, its head serving the group's one replica through the twin with a placement group over both nodes, the worker
serving no API of its own, and the front door knowing only the head's server."""
import json
import re

from lab_testinfra import lab_hosts, serve_url

testinfra_hosts = lab_hosts("gpu_nodes")


def record(host):
    return json.loads(host.file("/var/lib/revive/releases.json").content_string)["current"]


def unit_show(host, unit, prop):
    return host.check_output(f"systemctl show -p {prop} --value {unit}")


def test_every_member_runs_its_ray_unit_as_the_service_user_from_the_release_venv(host):
    release = record(host)
    ray = host.service("revive-ray.service")
    assert ray.is_running and ray.is_enabled, host.run("journalctl -u revive-ray --no-pager -n 40").stdout
    assert unit_show(host, "revive-ray.service", "User") == "vllm"
    command = unit_show(host, "revive-ray.service", "ExecStart")
    assert f"{release['venv']}/bin/ray" in command
    assert f"--node-ip-address={release['group']['ray']['node_ip_address']}" in command
    if release["group"]["role"] == "head":
        assert "--head" in command and "--include-dashboard=false" in command
    else:
        assert f"--address={release['group']['ray']['address']}" in command
    environment = unit_show(host, "revive-ray.service", "Environment")
    assert f"VLLM_HOST_IP={release['group']['ray']['node_ip_address']}" in environment
    assert "NCCL_SOCKET_IFNAME=" in environment and "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in environment


def test_the_head_serves_the_groups_one_replica_over_both_nodes_and_the_worker_none(host):
    release = record(host)
    group = release["group"]
    assert group["name"] == "mixtral" and [m["role"] for m in group["members"]] == ["head", "worker"]
    if group["role"] == "worker":
        assert release["replicas"] == []
        assert host.run("systemctl list-units --all --no-legend 'vllm-*.service'").stdout.strip() == ""
        assert not host.file("/etc/vllm/vllm.env").exists
        return
    replica = release["replicas"][0]
    assert host.service(replica["unit"]).is_running
    assert "--pipeline-parallel-size 2" in " ".join(replica["argv"])
    assert unit_show(host, replica["unit"], "Requires").split().count("revive-ray.service") == 1
    environment = unit_show(host, replica["unit"], "Environment")
    assert f"RAY_ADDRESS={group['ray']['address']}" in environment
    health = host.run(f"curl -fsS -o /dev/null -w '%{{http_code}}' "
                      f"{serve_url(host.backend.host.name, replica['port'])}/health")
    assert health.stdout == "200", health.stderr


def test_the_ray_cluster_has_both_nodes_and_16_gpus_all_held_by_the_replicas_placement_group(host):
    release = record(host)
    if release["group"]["role"] != "head":
        return
    status = host.run(f"runuser -u vllm -- {release['venv']}/bin/ray status --address {release['group']['ray']['address']}")
    assert status.rc == 0, status.stderr
    active = status.stdout.split("Active:")[1].split("Pending:")[0]
    assert len(re.findall(r"node_[0-9a-f]+", active)) == 2, status.stdout
    assert re.search(r"16\.0/16\.0 GPU \(16\.0 used of 16\.0 reserved in placement groups\)", status.stdout), \
        status.stdout
