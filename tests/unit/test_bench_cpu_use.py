"""bench/cpu_use.py: the fleet-scale benchmark's CPU accounting (machine, controller, each lab host)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import cpu_use  # noqa: E402


def test_busy_seconds_leave_out_idle_and_iowait():
    # user nice system idle iowait irq softirq steal guest guest_nice (proc(5)), in ticks
    line = "cpu  1000 50 400 90000 300 20 30 0 700 0\n"
    assert cpu_use.busy_seconds(line, 100) == pytest.approx((1000 + 50 + 400 + 20 + 30 + 0) / 100)


@pytest.mark.parametrize("line", ["cpu0 1 2 3 4 5 6 7 8", "intr 1 2 3 4 5", "cpu 1 2"])
def test_busy_seconds_refuse_another_line(line):
    with pytest.raises(ValueError, match="aggregate cpu line"):
        cpu_use.busy_seconds(line, 100)


def test_cgroup_usage_reads_usage_usec():
    assert cpu_use.cgroup_usage("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n") == 2.5
    with pytest.raises(ValueError, match="usage_usec"):
        cpu_use.cgroup_usage("user_usec 1\n")


def test_sample_reads_each_hosts_recorded_cgroup_v2(tmp_path):
    cgroups = {}
    for host, usec in [("node1", 4_000_000), ("model-store", 1_500_000)]:
        v1, v2 = tmp_path / "systemd" / host, tmp_path / "unified" / host  # as HostRecord.cgroups lists them
        v1.mkdir(parents=True)
        v2.mkdir(parents=True)
        (v1 / "cgroup.procs").write_text("")  # the name=systemd hierarchy keeps no cpu.stat
        (v2 / "cpu.stat").write_text(f"usage_usec {usec}\nuser_usec 0\n")
        cgroups[host] = [str(v1), str(v2)]
    cgroups["gone"] = [str(tmp_path / "systemd" / "gone"), str(tmp_path / "unified" / "gone")]  # stopped
    now = cpu_use.sample(cgroups)
    assert now.hosts == {"node1": 4.0, "model-store": 1.5}
    assert now.busy > 0 and now.controller >= 0


def test_use_splits_controller_nodes_and_other_hosts():
    before = cpu_use.Sample(busy=100.0, controller=10.0, hosts={"node1": 5.0, "node2": 50.0, "lb1": 1.0})
    # node2 restarted in between: its 20 s now are all it spent
    after = cpu_use.Sample(busy=180.0, controller=40.0, hosts={"node1": 25.0, "node2": 20.0, "lb1": 6.0,
                                                               "monitor1": 3.0})
    used = cpu_use.use(before, after, wall=50.0, cpus=2)
    assert used.hosts == {"node1": 20.0, "node2": 20.0, "lb1": 5.0, "monitor1": 3.0}
    assert used.share(["node1", "node2"]) == 40.0
    text = used.summary(["node1", "node2"])
    assert text == ("CPU 80 s busy of 100 (80 % of 2 CPUs): controller 30 s, GPU nodes 40 s (20 s per node), "
                    "other lab hosts 8 s, rest 2 s")
