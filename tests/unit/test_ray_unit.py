"""A serving group member's Ray unit and address (module_utils/revive_ray_unit.py, revive_cluster.cluster_endpoint;
issue 16): the head's and a worker's `ray start` argv with fixed ports and the stage's GPUs, the environment vLLM's
workers inherit, bad port settings refused by name; the member's address and interface from its facts."""
from __future__ import annotations

import pytest
from ansible.module_utils.revive_cluster import cluster_endpoint
from ansible.module_utils.revive_ray_unit import RayUnitError, check_ports, ray_unit
from ansible.module_utils.revive_record.systemd import parse_exec_words

PORTS = {"node_manager": 6381, "object_manager": 6382, "runtime_env_agent": 6383, "dashboard_agent_grpc": 6384,
         "dashboard_agent_listen": 52365, "metrics_export": 6385, "min_worker": 10002, "max_worker": 10100,
         "ray_client_server": 10001, "dashboard": 8265}
VENV = "/opt/vllm/venvs/0.5.4-abc"


def release(role, **ray):
    settings = {"address": "10.0.0.1:6379", "port": 6379, "node_ip_address": "10.0.0.2" if role == "worker"
                else "10.0.0.1", "num_gpus": 8, "expected_nodes": 2, "expected_gpus": 16,
                "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NCCL_SOCKET_IFNAME": "eth0",
                        "VLLM_HOST_IP": "10.0.0.2" if role == "worker" else "10.0.0.1"}}
    settings.update(ray)
    return {"group": {"name": "g", "role": role, "ray": settings}}


def test_the_heads_ray_start_has_the_gcs_port_fixed_ports_and_no_dashboard():
    unit = ray_unit(release("head"), VENV, "/var/lib/vllm/ray", PORTS, {"HF_HUB_OFFLINE": "1"})
    assert unit["argv"] == [
        f"{VENV}/bin/ray", "start", "--block", "--head", "--port=6379", "--node-ip-address=10.0.0.1",
        "--num-gpus=8", "--temp-dir=/var/lib/vllm/ray", "--disable-usage-stats", "--node-manager-port=6381",
        "--object-manager-port=6382", "--runtime-env-agent-port=6383", "--dashboard-agent-grpc-port=6384",
        "--dashboard-agent-listen-port=52365", "--metrics-export-port=6385", "--min-worker-port=10002",
        "--max-worker-port=10100", "--include-dashboard=false", "--ray-client-server-port=10001"]
    assert parse_exec_words(unit["exec_start"]) == unit["argv"]
    assert unit["env"]["HF_HUB_OFFLINE"] == "1" and unit["env"]["RAY_USAGE_STATS_ENABLED"] == "0"
    assert '"VLLM_HOST_IP=10.0.0.1"' in unit["environment"] and unit["environment"] == sorted(unit["environment"])
    with_dashboard = ray_unit(release("head"), VENV, "/var/lib/vllm/ray", PORTS, {}, dashboard=True)
    assert "--include-dashboard=true" in with_dashboard["argv"] and "--dashboard-port=8265" in with_dashboard["argv"]


def test_a_worker_joins_the_heads_address_with_its_own_ip_and_the_plans_variables_win():
    unit = ray_unit(release("worker"), VENV, "/var/lib/vllm/ray", PORTS, {"VLLM_HOST_IP": "wrong", "A": "1"})
    assert unit["argv"][3:6] == ["--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2", "--num-gpus=8"]
    assert "--head" not in unit["argv"] and not any(a.startswith("--ray-client-server-port") for a in unit["argv"])
    assert unit["env"]["VLLM_HOST_IP"] == "10.0.0.2" and unit["env"]["A"] == "1"


@pytest.mark.parametrize("role", ["spare", None])
def test_a_spare_or_a_lone_node_has_no_ray_unit(role):
    with pytest.raises(RayUnitError, match=f"group role is {role!r}"):
        ray_unit({"group": {"role": role}} if role else {}, VENV, "/var/lib/vllm/ray", PORTS, {})


@pytest.mark.parametrize("change, words", [
    ({"node_manager": 0}, "ray_cluster_ports.node_manager is 0: it must be a TCP port"),
    ({"node_manager": "6381"}, "ray_cluster_ports.node_manager is '6381'"),
    ({"node_manager": True}, "ray_cluster_ports.node_manager is True"),
    ({"object_manager": 6381}, "object_manager and node_manager are both 6381"),
    ({"metrics_export": 6379}, "gcs (the group's ray_port) and metrics_export are both 6379"),
    ({"min_worker": 10200}, "min_worker 10200 is above max_worker 10100"),
    ({"node_manager": 10050}, "node_manager 10050 lies in the worker range 10002-10100"),
    ({"extra": 1}, "unknown extra"),
])
def test_bad_port_settings_are_refused_by_name(change, words):
    with pytest.raises(RayUnitError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_ports(dict(PORTS, **change), 6379)
    with pytest.raises(RayUnitError, match="missing dashboard"):
        check_ports({k: v for k, v in PORTS.items() if k != "dashboard"}, 6379)


FACTS = {"interfaces": ["lo", "host0", "eth-b"], "default_ipv4": {"address": "192.168.1.5", "interface": "eth-b"},
         "lo": {"device": "lo", "ipv4": {"address": "127.0.0.1"}},
         "host0": {"device": "host0", "ipv4": {"address": "10.213.0.11"},
                   "ipv4_secondaries": [{"address": "10.213.0.99"}], "ipv6": [{"address": "fd00::11"}]},
         "eth_b": {"device": "eth-b", "ipv4": {"address": "192.168.1.5"}}}


@pytest.mark.parametrize("args, expected", [
    (("10.213.0.11",), {"address": "10.213.0.11", "interface": "host0"}),
    (("node1.lab",), {"address": "192.168.1.5", "interface": "eth-b"}),
    (("192.168.1.5",), {"address": "192.168.1.5", "interface": "eth-b"}),
    (("10.213.0.11", "10.213.0.99"), {"address": "10.213.0.99", "interface": "host0"}),
    (("", "fd00::11"), {"address": "fd00::11", "interface": "host0"}),
    (("", "10.9.9.9"), {"address": "10.9.9.9", "interface": ""}),
    (("", "10.9.9.9", "ib0"), {"address": "10.9.9.9", "interface": "ib0"}),
])
def test_a_members_address_and_interface_come_from_its_facts(args, expected):
    assert cluster_endpoint(FACTS, *args) == expected
    assert cluster_endpoint({}, "node1.lab") == {"address": "", "interface": ""}


def test_the_default_routes_interface_stands_when_the_interface_facts_miss_it():
    facts = {"interfaces": ["lo"], "default_ipv4": {"address": "10.213.1.12", "interface": "eth0"}}
    assert cluster_endpoint(facts, "10.213.1.12") == {"address": "10.213.1.12", "interface": "eth0"}
