"""A serving group member's plan (module_utils/revive_plan/group.py, module_utils/revive_cluster.py; issue 16): every
member computes the same group plan and takes its part - the head's replica with Ray's address and its own IP and
interface, workers and spares without a replica; odd members and unusable addresses are refused by name; a group
whose one node suffices gives every member its own single-node plan; the operator's pipeline_parallel_size."""
from __future__ import annotations

import copy

import pytest
from ansible.module_utils.revive_cluster import ClusterError, check_members, member_release
from ansible.module_utils.revive_model import model_from_config
from ansible.module_utils.revive_plan import (NodeGroup, Overrides, PackageSource, PlanInputError, PlanRefusal,
                                              Serve, Workload, plan_release)
from ansible.module_utils.revive_plan.group import plan_member
from ansible.module_utils.revive_releases import load_release_file
from fixtures.gpus import lab_facts, lab_ram_bytes
from fixtures.models import model_config

V100 = "v100-pcie-8x"
MIRROR = PackageSource("mirror", "https://pypi.internal.example/simple")


@pytest.fixture(scope="module")
def releases(repo):
    return load_release_file(str(repo / "data" / "vllm-releases.yml"))


def model(name, size="full"):
    return model_from_config(model_config(name, size=size, dtype="F16"), f"/data/models/{name}")


def members(count=2, python="3.11.2", facts=None, **changes):
    result = [{"host": f"node{n + 1}", "gpu": copy.deepcopy(facts or lab_facts(V100)), "python_version": python,
               "address": f"10.213.0.{n + 11}", "interface": "host0"} for n in range(count)]
    for host, change in changes.items():
        next(m for m in result if m["host"] == host).update(change)
    return result


def request(overrides=None, workload=None):
    return (workload or Workload(), overrides or Overrides(vllm_version="0.5.4"), Serve(), lab_ram_bytes(V100),
            MIRROR)


def member_plan(releases, member, group_members, name="mixtral", overrides=None, fixture="mixtral-8x22b-instruct",
                size="full", nodes=1):
    return plan_member(plan_release, group_members[0]["gpu"], model(fixture, size), releases, request(overrides),
                       NodeGroup(nodes=nodes), name, group_members, member)


def test_the_head_serves_the_group_with_rays_address_and_its_own_ip_and_interface(releases):
    group = members()
    head = member_plan(releases, "node1", group)
    assert head["pipeline_parallel_size"] == 2 and len(head["replicas"]) == 1
    env = head["replicas"][0]["env"]
    assert env["RAY_ADDRESS"] == "10.213.0.11:6379" and env["VLLM_HOST_IP"] == "10.213.0.11"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "host0"
    assert env["NCCL_P2P_DISABLE"] == "1" and head["env"] == env
    args = head["replicas"][0]["args"]
    assert args[args.index("--distributed-executor-backend") + 1] == "ray"
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    section = head["group"]
    assert section["role"] == "head" and section["stage"] == 0 and section["head"] == "node1"
    assert section["ray"] == {
        "address": "10.213.0.11:6379", "port": 6379, "node_ip_address": "10.213.0.11", "num_gpus": 8,
        "expected_nodes": 2, "expected_gpus": 16,
        "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
                "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "VLLM_ATTENTION_BACKEND": "XFORMERS",
                "VLLM_HOST_IP": "10.213.0.11", "NCCL_SOCKET_IFNAME": "host0", "GLOO_SOCKET_IFNAME": "host0"}}
    assert [(m["host"], m["role"], m["stage"]) for m in section["members"]] == [("node1", "head", 0),
                                                                                ("node2", "worker", 1)]


def test_a_worker_runs_ray_with_its_own_ip_and_no_replica_and_every_member_plans_the_same_group(releases):
    group = members()
    head, worker = (member_plan(releases, host, group) for host in ("node1", "node2"))
    assert worker["replicas"] == [] and worker["env"] == {} and worker["args"] == head["replicas"][0]["args"]
    assert worker["group"]["role"] == "worker" and worker["group"]["stage"] == 1
    assert worker["group"]["ray"]["node_ip_address"] == "10.213.0.12"
    assert worker["group"]["ray"]["env"]["VLLM_HOST_IP"] == "10.213.0.12"
    assert worker["group"]["ray"]["address"] == head["group"]["ray"]["address"]
    same = ("vllm_version", "kv_cache", "settings", "pipeline_parallel_size", "tensor_parallel_size")
    assert {key: worker[key] for key in same} == {key: head[key] for key in same}


def test_members_beyond_the_stages_are_spares_that_run_nothing(releases):
    group = members(3)
    spare = member_plan(releases, "node3", group)
    assert spare["group"]["role"] == "spare" and spare["group"]["stage"] is None
    assert spare["replicas"] == [] and spare["group"]["ray"]["num_gpus"] == 0 and spare["group"]["ray"]["env"] == {}
    assert any("the group has 3 nodes and 2 hold the model" in w for w in spare["warnings"])


def test_the_operators_stage_count_is_taken_and_more_stages_than_members_is_refused(releases):
    group = members(3)
    three = member_plan(releases, "node3", group, overrides=Overrides(vllm_version="0.5.4", pipeline_parallel_size=3))
    assert three["pipeline_parallel_size"] == 3 and three["group"]["role"] == "worker"
    assert any("pipeline_parallel_size 3 is the operator's" in w for w in three["warnings"])
    with pytest.raises(PlanRefusal, match=r"pipeline_parallel_size \(--pipeline-parallel-size\) 4 needs 4 nodes, one "
                                          r"stage each, and the serving group has 3"):
        member_plan(releases, "node1", group, overrides=Overrides(vllm_version="0.5.4", pipeline_parallel_size=4))
    with pytest.raises(PlanInputError, match="overrides.pipeline_parallel_size is 65"):
        Overrides(pipeline_parallel_size=65)


def test_a_small_model_forced_across_two_nodes_serves_as_one_replica_on_ray(releases):
    forced = Overrides(vllm_version="0.5.4", tensor_parallel_size=8, pipeline_parallel_size=2)
    head = member_plan(releases, "node1", members(), overrides=forced, size="tiny")
    assert head["pipeline_parallel_size"] == 2 and head["tensor_parallel_size"] == 8
    assert head["group"]["ray"]["expected_gpus"] == 16


def test_one_node_enough_plans_every_member_alone_without_ray(releases):
    group = members()
    alone = member_plan(releases, "node2", group, fixture="internlm2-chat-20b")
    single = plan_release(group[1]["gpu"], model("internlm2-chat-20b"), releases, *request(), NodeGroup(nodes=1))
    assert "group" not in alone and alone["pipeline_parallel_size"] == 1
    assert alone["replicas"] == single["replicas"]
    assert alone["warnings"][-1].startswith("serving group 'mixtral': one node holds the model")


def test_odd_members_are_refused_by_name_before_anything_is_planned(releases):
    facts = lab_facts(V100)
    fewer = dict(copy.deepcopy(facts), devices=facts["devices"][:4])
    group = members(3, node2={"python_version": "3.11.4"}, node3={"gpu": fewer})
    with pytest.raises(PlanRefusal) as refused:
        member_plan(releases, "node1", group)
    text = str(refused.value)
    assert "GPU count: node3 has 4, the others 8" in text
    assert "Python (patch version included; Ray refuses a mismatch): node2 has 3.11.4, the others 3.11.2" in text


def test_a_model_that_cannot_pipeline_is_refused_with_vllms_words(releases):
    forced = Overrides(vllm_version="0.5.4", tensor_parallel_size=8, pipeline_parallel_size=2)
    with pytest.raises(PlanRefusal, match="Pipeline parallelism is only supported for the following  architectures"):
        member_plan(releases, "node1", members(), overrides=forced, fixture="internlm2-chat-20b", size="tiny")


@pytest.mark.parametrize("change, words", [
    ({"address": "node2.lab"}, "node2 has cluster address 'node2.lab', not an IP address"),
    ({"address": ""}, "node2 has cluster address '', not an IP address"),
    ({"interface": ""}, "node2 has no network interface for 10.213.0.12"),
    ({"address": "10.213.0.11"}, "members share the cluster address 10.213.0.11"),
])
def test_an_unusable_cluster_address_is_refused_naming_the_member(releases, change, words):
    with pytest.raises(PlanRefusal, match=words.replace("(", r"\(").replace(")", r"\)")):
        member_plan(releases, "node1", members(node2=change))


def test_ipv6_addresses_are_bracketed_in_rays_address():
    release = {"pipeline_parallel_size": 2, "replicas": [{"env": {}, "gpus": [0, 1]}]}
    group = [{"host": "a", "address": "fd00::1", "interface": "eth0"},
             {"host": "b", "address": "fd00::2", "interface": "eth0"}]
    assert member_release(release, "g", group, "b")["group"]["ray"]["address"] == "[fd00::1]:6379"


def test_the_cluster_refuses_a_plan_it_cannot_split_and_a_stranger():
    group = [{"host": "a", "address": "10.0.0.1", "interface": "eth0"}]
    with pytest.raises(ClusterError, match="a Ray cluster serves one replica over 2 or more pipeline stages"):
        member_release({"pipeline_parallel_size": 1, "replicas": [{}]}, "g", group, "a")
    with pytest.raises(ClusterError, match="the plan needs 2 nodes and the group has 1"):
        member_release({"pipeline_parallel_size": 2, "replicas": [{"gpus": [0]}]}, "g", group, "a")
    two = group + [{"host": "b", "address": "10.0.0.2", "interface": "eth0"}]
    with pytest.raises(ClusterError, match="c is not a member of serving group 'g'"):
        member_release({"pipeline_parallel_size": 2, "replicas": [{"gpus": [0]}]}, "g", two, "c")
    assert [m["host"] for m in check_members("g", list(reversed(two)))] == ["a", "b"]
