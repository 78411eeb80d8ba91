"""module_utils/revive_serving_group.py: a serving group's members must match in GPUs, driver and Python patch
version (Ray refuses a mismatch); the refusal names every odd member and what it has, against what the others
have; revive_serving_group in the inventory forms the groups."""
from __future__ import annotations

import copy

import pytest
from ansible.module_utils.revive_serving_group import GroupRefusal, check_group, group_members, unfit_members
from fixtures.gpus import lab_facts


@pytest.fixture(scope="module")
def v100():
    return lab_facts("v100-pcie-8x")


def member(facts, python="3.11.2", **changes):
    facts = copy.deepcopy(facts)
    facts.update(changes)
    return {"gpu": facts, "python_version": python}


def test_identical_members_give_the_groups_signature(v100):
    common = check_group("mixtral", {"node1": member(v100), "node2": member(v100)})
    assert common == {"gpu_count": 8, "gpu_name": "Tesla V100-PCIE-32GB", "gpu_memory_bytes": 32 * 2 ** 30,
                      "compute_capability": "7.0", "driver_version": "535.104.05", "python_version": "3.11.2"}


def test_one_member_is_a_group(v100):
    assert check_group("solo", {"node1": member(v100)})["gpu_count"] == 8


def test_the_odd_driver_and_python_are_named_against_the_others(v100):
    members = {"node1": member(v100), "node2": member(v100, driver_version="550.54.15"),
               "node3": member(v100, python="3.11.4")}
    with pytest.raises(GroupRefusal) as refused:
        check_group("mixtral", members)
    message = str(refused.value)
    assert "serving group 'mixtral' (node1, node2, node3) is not identical" in message
    assert "NVIDIA driver: node2 has 550.54.15, the others 535.104.05" in message
    assert "Python (patch version included; Ray refuses a mismatch): node3 has 3.11.4, the others 3.11.2" in message
    assert "Fix: give every member the same GPUs" in message and "revive_serving_group" in message


def test_fewer_or_other_gpus_are_named(v100):
    fewer = member(v100)
    fewer["gpu"]["devices"] = fewer["gpu"]["devices"][:4]
    smaller = member(v100)
    for device in smaller["gpu"]["devices"]:
        device["memory"]["total_bytes"] = 16 * 2 ** 30
        device["name"] = "Tesla V100-PCIE-16GB"
    with pytest.raises(GroupRefusal) as refused:
        check_group("g", {"a": member(v100), "b": member(v100), "c": fewer, "d": smaller})
    message = str(refused.value)
    assert "GPU count: c has 4, the others 8" in message
    assert "GPU model: d has Tesla V100-PCIE-16GB, the others Tesla V100-PCIE-32GB" in message
    assert "GPU memory: d has 16.0 GiB, the others 32.0 GiB" in message


def test_a_tie_is_judged_against_the_first_member(v100):
    with pytest.raises(GroupRefusal, match="NVIDIA driver: b has 550.54.15, the others 535.104.05"):
        check_group("g", {"b": member(v100, driver_version="550.54.15"), "a": member(v100)})


def test_an_empty_group_is_refused():
    with pytest.raises(GroupRefusal, match="has no member: set revive_serving_group: g on its nodes"):
        check_group("g", {})


def test_the_inventory_variable_names_the_members_and_an_unprobed_member_is_kept_bare():
    probed = {"host": "node2", "gpu": {"devices": [{}]}, "python_version": "3.11.2", "address": "10.0.0.2",
              "interface": "eth0"}
    hostvars = {"node2": {"revive_serving_group": "mixtral", "gpu_preflight_member": probed},
                "node1": {"revive_serving_group": "mixtral"},
                "node3": {"revive_serving_group": "other", "gpu_preflight_member": dict(probed, host="node3")},
                "node4": {"revive_serving_group": ""}, "lb1": {"revive_serving_group": "mixtral"}}
    members = group_members(hostvars, ["node4", "node3", "node2", "node1"], "mixtral")
    assert members == [{"host": "node1"}, probed]


def test_a_member_is_held_back_by_an_unfit_head_or_worker_never_by_a_spare():
    release = {"group": {"name": "g", "members": [{"host": "node1", "role": "head"},
                                                 {"host": "node2", "role": "worker"},
                                                 {"host": "node3", "role": "spare"}]}}
    hostvars = {"node1": {"gpu_preflight_result": {"fit": True, "reasons": []}},
                "node2": {"gpu_preflight_result": {"fit": False, "reasons": ["GPU 3: 2 retired pages pending"]}},
                "node3": {"gpu_preflight_result": {"fit": False, "reasons": ["no driver"]}}}
    assert unfit_members(release, hostvars) == ["node2 (GPU 3: 2 retired pages pending)"]
    assert unfit_members(release, {"node1": hostvars["node1"]}) == ["node2 (no preflight result)"]
    assert unfit_members({"replicas": []}, hostvars) == []
