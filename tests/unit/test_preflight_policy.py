"""The end of the preflight: the per-host summary and the fleet policy (revive_max_unfit_percent)."""
from __future__ import annotations

from ansible.module_utils.revive_fitness import fleet_summary

FIT = {"fit": True, "reasons": [], "warnings": [], "release": "vLLM 0.5.4, 2 x TP 4"}
DEGRADED = {"fit": False, "warnings": [], "release": "vLLM 0.5.4, 2 x TP 4",
            "unfit_checks": ["pcie_width", "retired_pages_pending"],
            "reasons": ["GPU 1 (00000000:1B:00.0): page retirement pending", "GPU 3 (00000000:3E:00.0): x8 of x16"]}


def test_one_quarantined_node_of_three_is_within_a_fifty_percent_policy():
    summary = fleet_summary(["node1", "node2", "node3"], {"node1": FIT, "node2": FIT, "node3": DEGRADED}, 50)
    assert summary.exceeded is False
    assert summary.lines() == [
        "2 fit, 1 quarantined, 0 failed of 3 GPU node(s): 33.3 % unfit, policy allows at most 50 % "
        "(revive_max_unfit_percent)",
        "node1: FIT - vLLM 0.5.4, 2 x TP 4",
        "node2: FIT - vLLM 0.5.4, 2 x TP 4",
        "node3: QUARANTINED - vLLM 0.5.4, 2 x TP 4",
        "  unfit: GPU 1 (00000000:1B:00.0): page retirement pending",
        "  unfit: GPU 3 (00000000:3E:00.0): x8 of x16",
    ]
    assert summary.policy_message.startswith("fleet policy met: 2 fit, 1 quarantined")
    assert summary.as_dict()["hosts"]["node3"]["unfit_checks"] == ["pcie_width", "retired_pages_pending"]
    assert summary.as_dict()["counts"] == {"fit": 2, "quarantined": 1, "failed": 0, "not_probed": 0}


def test_the_policy_stops_the_fleet_when_too_many_nodes_are_unfit():
    summary = fleet_summary(["node1", "node2", "node3"], {"node1": FIT, "node2": DEGRADED, "node3": DEGRADED}, 50)
    assert (summary.unfit, summary.unfit_percent, summary.exceeded) == (2, 66.7, True)
    assert summary.policy_message.startswith(
        "fleet policy: stopping before anything is provisioned: 1 fit, 2 quarantined, 0 failed of 3 GPU node(s): "
        "66.7 % unfit, policy allows at most 50 % (revive_max_unfit_percent).")


def test_a_node_without_a_result_counts_as_failed_and_unfit():
    summary = fleet_summary(["node1", "node2"], {"node1": FIT}, 0)
    assert summary.as_dict()["hosts"]["node2"]["status"] == "failed"
    assert summary.exceeded is True
    assert summary.lines()[2] == "node2: FAILED"


def test_exactly_at_the_limit_is_allowed():
    assert fleet_summary(["a", "b", "c", "d"], {"a": FIT, "b": FIT, "c": FIT, "d": DEGRADED}, 25).exceeded is False


def test_hosts_not_probed_in_check_mode_are_neither_fit_nor_unfit():
    note = "check mode: the probe venv /opt/revive/probe-venv does not exist yet; run without --check once"
    summary = fleet_summary(["node1", "node2"], {"node1": {"probed": False, "note": note}, "node2": FIT}, 0)
    assert summary.exceeded is False
    assert summary.headline.startswith("1 fit, 0 quarantined, 0 failed, 1 not probed of 2 GPU node(s)")
    assert summary.lines()[1:3] == ["node1: NOT PROBED", f"  warn:  {note}"]
