"""The lab's shape: which hosts, their groups, addresses and GPU profiles, and the errors for bad requests."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))

from labctl.errors import LabError  # noqa: E402
from labctl.shape import (DEFAULT_SUPPORT_HOSTS, SUPPORT_HOSTS, LabShape, build_shape,  # noqa: E402
                          controller_address, host_address, known_profiles, parse_support_hosts, profile_path,
                          slot_network)


@pytest.fixture()
def profiles(tmp_path: Path) -> Path:
    for name in ("v100-pcie-8x", "v100-pcie-8x-degraded", "t4-4x"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"name": name, "gpus": [{}]}))
    return tmp_path


def test_default_lab_is_two_v100_nodes_plus_model_store_bench_and_lb(profiles):
    shape = build_shape(2, [], parse_support_hosts("model-store,bench1,lb1"), profiles)
    assert [(h.name, h.group, h.gpu_profile) for h in shape.hosts] == [
        ("node1", "gpu_nodes", "v100-pcie-8x"),
        ("node2", "gpu_nodes", "v100-pcie-8x"),
        ("model-store", "model_store", None),
        ("bench1", "bench", None),
        ("lb1", "lb", None),
    ]


def test_addresses_are_fixed_per_host_inside_the_labs_own_subnet(profiles):
    shape = build_shape(3, [], ("lb1",), profiles)
    assert str(slot_network(0)) == "10.213.0.0/24"
    assert controller_address(0) == "10.213.0.1"
    assert {h.name: host_address(7, h) for h in shape.hosts} == {
        "node1": "10.213.7.11", "node2": "10.213.7.12", "node3": "10.213.7.13", "lb1": "10.213.7.4"}


def test_one_node_can_get_its_own_profile(profiles):
    shape = build_shape(3, ["node2=v100-pcie-8x-degraded"], (), profiles)
    assert shape.node_profiles == {"node1": "v100-pcie-8x", "node2": "v100-pcie-8x-degraded",
                                   "node3": "v100-pcie-8x"}


def test_a_bare_profile_name_applies_to_every_node_and_host_overrides_win(profiles):
    shape = build_shape(2, ["node1=v100-pcie-8x", "t4-4x"], (), profiles)
    assert shape.node_profiles == {"node1": "v100-pcie-8x", "node2": "t4-4x"}


def test_unknown_profile_error_lists_the_known_ones(profiles):
    with pytest.raises(LabError) as err:
        build_shape(2, ["h100-8x"], (), profiles)
    assert str(err.value) == (f"unknown GPU profile 'h100-8x'; known profiles ({profiles}): "
                              "t4-4x, v100-pcie-8x, v100-pcie-8x-degraded")


def test_profile_for_a_host_that_is_not_a_gpu_node_is_refused(profiles):
    with pytest.raises(LabError, match=r"'node3' is not a GPU node of this lab \(GPU nodes: node1, node2\)"):
        build_shape(2, ["node3=t4-4x"], (), profiles)


def test_a_profile_without_a_gpus_list_is_refused(profiles):
    (profiles / "broken.json").write_text('{"name": "broken"}')
    with pytest.raises(LabError, match="broken.json has no `gpus` list"):
        build_shape(1, ["broken"], (), profiles)


def test_support_hosts_keep_a_canonical_order_and_none_means_none():
    assert parse_support_hosts("lb1, model-store") == ("model-store", "lb1")
    assert parse_support_hosts("none") == ()


def test_unknown_support_host_is_refused_with_the_choices():
    with pytest.raises(LabError,
                       match="unknown support host\\(s\\) db; choose from model-store, bench1, lb1, monitor1, lb2"):
        parse_support_hosts("db,lb1")


def test_lb2_is_a_second_front_door_only_where_it_is_named(profiles):
    assert "lb2" not in build_shape(1, [], DEFAULT_SUPPORT_HOSTS, profiles).to_json()["support_hosts"]
    assert LabShape().support_hosts == DEFAULT_SUPPORT_HOSTS
    shape = build_shape(1, [], parse_support_hosts("lb2,lb1,bench1"), profiles)
    assert [(h.name, h.group, host_address(0, h)) for h in shape.hosts if h.group == "lb"] == [
        ("lb1", "lb", "10.213.0.4"), ("lb2", "lb", "10.213.0.6")]
    assert len({h.octet for h in build_shape(2, [], tuple(SUPPORT_HOSTS), profiles).hosts}) == 2 + len(SUPPORT_HOSTS)


def test_node_count_is_bounded(profiles):
    with pytest.raises(LabError, match="the lab runs 0 to 32 GPU nodes"):
        build_shape(33, [], (), profiles)


def test_shape_survives_the_state_file_round_trip(profiles):
    shape = build_shape(2, ["node2=t4-4x"], ("bench1",), profiles)
    assert LabShape.from_json(json.loads(json.dumps(shape.to_json()))) == shape


def test_cli_lists_the_repository_profiles_for_an_unknown_name():
    proc = subprocess.run([sys.executable, str(REPO / "bin/lab"), "up", "--gpu-profile", "no-such-gpu"],
                          capture_output=True, text=True)
    known = sorted(p.stem for p in (REPO / "lab/profiles").glob("*.json"))
    assert proc.returncode == 1
    assert "v100-pcie-8x" in known
    assert proc.stderr.strip().endswith(f"known profiles ({REPO / 'lab/profiles'}): {', '.join(known)}")


def test_profile_names_are_listable_and_unknown_names_list_the_known_ones() -> None:
    profiles_dir = REPO / "lab" / "profiles"
    assert known_profiles(profiles_dir) == ["a100-sxm4-8x", "dgx1-v100", "t4-4x", "v100-pcie-8x",
                                            "v100-pcie-8x-degraded"]
    assert profile_path(profiles_dir, "t4-4x") == profiles_dir / "t4-4x.json"
    with pytest.raises(LabError) as error:
        profile_path(profiles_dir, "v100-sxm-16x")
    assert str(error.value) == (f"unknown GPU profile 'v100-sxm-16x'; known profiles ({profiles_dir}): a100-sxm4-8x, "
                                "dgx1-v100, t4-4x, v100-pcie-8x, v100-pcie-8x-degraded")
