"""The NCCL check's pure parts, table by table: sizes, bus bandwidth, environment, CPU/NUMA placement, the compare
verdicts, the ACS/IOMMU facts from lspci and sysfs, and check mode on the planner's own replicas."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from ansible.module_utils.revive_nccl import (
    CheckSpec,
    Deps,
    NcclCheckError,
    alternative,
    busbw_factor,
    check,
    compare_runs,
    describe,
    parse_lspci_acs,
    parse_size,
    placement,
    read_topology,
    run_env,
    validate_replica,
)
from fixtures.gpus import lab_facts
from fixtures.models import write_model
from test_nccl_ranks import FAKE_WORKER, replica

MiB = 1 << 20


@pytest.mark.parametrize("value, expected", [
    (1048576, MiB), ("1MiB", MiB), ("1 MiB", MiB), ("64KiB", 64 << 10), ("4M", 4 * MiB), ("1GiB", 1 << 30),
    ("256mib", 256 * MiB), ("4", 4),
])
def test_sizes_take_bytes_or_units(value, expected):
    assert parse_size(value) == expected


@pytest.mark.parametrize("value, message", [
    ("1 TB", "is not bytes or N KiB/MiB/GiB"), ("-4", "is not bytes"), (6, "multiple of 4"), (0, "multiple of 4"),
])
def test_bad_sizes_say_what_is_accepted(value, message):
    with pytest.raises(NcclCheckError, match=re.escape(message)):
        parse_size(value)


@pytest.mark.parametrize("world, factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_bandwidth_factor_is_nccl_tests_all_reduce(world, factor):
    assert busbw_factor(world) == factor


@pytest.mark.parametrize("field, value, message", [
    ("backend", "mpi", "use nccl (GPUs) or gloo"), ("sizes", (), "sizes is empty"), ("iterations", 0, "must be >= 1"),
    ("warmup", -1, "warmup (-1)"), ("timeout_s", 0, "must be positive"), ("single_gpu", "maybe", "use skip or run"),
])
def test_bad_parameters_are_refused_before_anything_runs(field, value, message):
    spec = CheckSpec(python=sys.executable, **{field: value})
    with pytest.raises(NcclCheckError, match=re.escape(message)):
        check([replica()], spec, Deps(worker_source=FAKE_WORKER))


@pytest.mark.parametrize("changes, message", [
    ({"gpus": []}, "the replica lists no gpus"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0,2"}}, "env CUDA_VISIBLE_DEVICES='0,2' does not name its gpus [0, 1]"),
    ({"env": {}}, "env CUDA_VISIBLE_DEVICES='' does not name"),
])
def test_an_inconsistent_replica_is_refused(changes, message):
    with pytest.raises(NcclCheckError, match=re.escape(message)):
        validate_replica(dict(replica(), **changes))


def host(cpus=(0, 1), nodes=(0,), numactl=None) -> Deps:
    return Deps(online_cpus=lambda: list(cpus), numa_nodes=lambda: list(nodes), which=lambda name: numactl)


@pytest.mark.parametrize("planned, numa, simulated, deps, applied, numa_bound, note", [
    ((0, 1), 0, False, host(numactl="/usr/bin/numactl"), "0-1", 0, None),
    ((0, 1), 0, False, host(), "0-1", None, "numactl not found: memory not bound to NUMA node 0"),
    ((1,), None, True, host(), "1", None, None),
    ((0, 20), 0, True, host(), "", None, "planned CPUs 0,20, NUMA node 0: not applied, the GPUs are simulated"),
    ((0,), 1, True, host(), "", None, "not applied, the GPUs are simulated"),
    ((), None, False, host(), "", None, "the plan pins no CPUs for this replica"),
])
def test_cpu_and_numa_placement_follows_the_unit(planned, numa, simulated, deps, applied, numa_bound, note):
    place = placement(replica(cpus=planned, numa=numa), simulated, deps)
    assert place.as_dict()["cpu_list"] == applied and place.numa_node == numa_bound
    assert (note is None and place.notes == []) or (note is not None and note in place.notes[0])


@pytest.mark.parametrize("planned, numa, message", [
    ((0, 20), 0, "the plan pins CPUs 0,20 (NUMA node 0) but this host has no CPUs 20 (online CPUs 0-1, nodes 0)"),
    ((0,), 1, "this host has no NUMA node 1"),
])
def test_a_plan_for_other_hardware_is_refused_on_real_gpus(planned, numa, message):
    with pytest.raises(NcclCheckError, match=re.escape(message)):
        placement(replica(cpus=planned, numa=numa), False, host())


@pytest.mark.parametrize("env, extra, base, expected_own", [
    ({"NCCL_P2P_DISABLE": "1"}, {}, None, {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO"}),
    ({"NCCL_DEBUG": "WARN"}, {"NCCL_NVLS_ENABLE": "0"}, None, {"NCCL_DEBUG": "WARN", "NCCL_NVLS_ENABLE": "0"}),
    ({}, {}, {"PATH": "/bin", "NCCL_P2P_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "7"}, {"NCCL_DEBUG": "INFO"}),
])
def test_the_ranks_get_the_plans_variables_and_nothing_else_of_nccl_or_cuda(env, extra, base, expected_own):
    spec = CheckSpec(python="python", extra_env=extra, base_env=base)
    full, own = run_env({"env": env}, spec)
    assert own == expected_own
    assert {k: v for k, v in full.items() if k.startswith(("NCCL_", "CUDA_"))} == expected_own
    assert full["PATH"] == ("/bin" if base else "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


@pytest.mark.parametrize("env, drop, add, description", [
    ({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "0,1"},
     ["NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"], {}, "without the planned NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, [], {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
     "with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 forced"),
    ({"NCCL_P2P_DISABLE": "1"}, [], {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}, "forced"),
])
def test_the_compare_run_flips_the_planners_p2p_decision(env, drop, add, description):
    got_drop, got_add, got_description = alternative({"env": env})
    assert (got_drop, got_add) == (drop, add) and description in got_description


def run_result(ok, busbw=None, reason=None, description="without the planned NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"):
    sizes = [] if not ok else [{"bytes": 256 * MiB, "size": "256 MiB", "algbw_gbps": busbw / 1.5, "busbw_gbps": busbw}]
    return {"ok": ok, "reason": reason, "sizes": sizes, "peak_busbw_gbps": busbw, "description": description}


@pytest.mark.parametrize("disables, planned, other, verdict, warn, phrase", [
    (True, run_result(False, reason="deadline"), run_result(True, 9.0), "contradicted", True,
     "the planned run failed but without the planned NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 it passed (peak busbw 9 "
     "GB/s): the planner disables P2P/SHM here (no NVLink, paths cross PHB), and this node says otherwise"),
    (True, run_result(False, reason="deadline"), run_result(False, reason="NCCL error"), "both_failed", False,
     "both runs failed (without the planned NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: NCCL error)"),
    (True, run_result(True, 3.0), run_result(False, reason="the all-reduce did not finish"), "confirmed", False,
     "the all-reduce failed (the all-reduce did not finish): the planner disables P2P/SHM here"),
    (False, run_result(True, 3.0), run_result(False, reason="x", description="with ... forced"), "alternative_failed",
     False, "the all-reduce failed (x); the planned run passed"),
    (True, run_result(True, 3.0), run_result(True, 3.2), "no_difference", False, "ratio 1.07"),
    (True, run_result(True, 3.0), run_result(True, 6.0), "contradicted", True,
     "at 256 MiB: planned busbw 3 GB/s (algbw 2), without the planned NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 busbw 6 "
     "GB/s (algbw 4), ratio 2.00"),
])
def test_compare_verdicts(disables, planned, other, verdict, warn, phrase):
    got_verdict, message, got_warn = compare_runs(replica(disables=disables), planned, other, 0.1)
    assert (got_verdict, got_warn) == (verdict, warn) and phrase in message


def test_compare_on_one_gpu_says_there_is_nothing_to_compare():
    # On one H200 (tests/device/results) both runs time a ~16 us launch: 1 MiB to 256 MiB "at" 64 GB/s to 14 TB/s.
    verdict, message, warn = compare_runs(replica(gpus=(0,), disables=False), run_result(True, 0.0),
                                          run_result(True, 0.0), 0.1)
    assert (verdict, warn) == ("no_peers", False) and message.startswith("world size 1: no rank to exchange data")


LSPCI = """\
0000:00:03.0 PCI bridge: Intel Corporation Xeon E7 v4/Xeon E5 v4/Xeon E3 v4/Xeon D PCI Express Root Port 3 (rev 01)
\tControl: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+
\tBus: primary=00, secondary=03, subordinate=07, sec-latency=0
\tCapabilities: [150 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
\tKernel driver in use: pcieport

0000:04:08.0 PCI bridge: PLX Technology, Inc. PEX 8747 48-Lane, 5-Port PCI Express Gen 3 (8.0 GT/s) Switch (rev ca)
\tCapabilities: [148 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-

0000:04:10.0 PCI bridge: PLX Technology, Inc. PEX 8747 48-Lane, 5-Port PCI Express Gen 3 (8.0 GT/s) Switch (rev ca)
\tCapabilities: <access denied>

0000:06:00.0 3D controller: NVIDIA Corporation GV100GL [Tesla V100 PCIe 32GB] (rev a1)
\tSubsystem: NVIDIA Corporation Device 124a
"""


def test_lspci_acs_control_lines_are_read_per_device():
    devices = parse_lspci_acs(LSPCI)
    assert sorted(devices) == ["0000:00:03.0", "0000:04:08.0", "0000:04:10.0", "0000:06:00.0"]
    assert devices["0000:00:03.0"]["acs_ctl"] == {"SrcValid": True, "TransBlk": False, "ReqRedir": False,
                                                  "CmpltRedir": False, "UpstreamFwd": False, "EgressCtrl": False,
                                                  "DirectTrans": False}
    assert devices["0000:04:08.0"]["acs_ctl"]["ReqRedir"] is True
    assert devices["0000:04:10.0"] == {"acs_ctl": None, "access_denied": True,
                                       "description": "PCI bridge: PLX Technology, Inc. PEX 8747 48-Lane, 5-Port PCI "
                                                      "Express Gen 3 (8.0 GT/s) Switch (rev ca)"}
    assert parse_lspci_acs("00:1f.2 SATA controller: Intel\n")["0000:00:1f.2"]["acs_ctl"] is None


def fake_sysfs(root) -> str:
    """Two V100s behind one PLX switch under root port 00:03.0, each in its own IOMMU group."""
    chain = root / "devices" / "pci0000:00" / "0000:00:03.0" / "0000:03:00.0"
    for port, gpu, group in (("0000:04:08.0", "0000:06:00.0", "30"), ("0000:04:10.0", "0000:07:00.0", "31")):
        device = chain / port / gpu
        device.mkdir(parents=True)
        (root / "kernel" / "iommu_groups" / group / "devices").mkdir(parents=True, exist_ok=True)
        (root / "kernel" / "iommu_groups" / group / "devices" / gpu).symlink_to(device)
        (device / "iommu_group").symlink_to(root / "kernel" / "iommu_groups" / group)
        (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
        (root / "bus" / "pci" / "devices" / gpu).symlink_to(os.path.relpath(device, root / "bus" / "pci" / "devices"))
    (root / "kernel" / "iommu_groups" / "2" / "devices").mkdir(parents=True)
    return str(root)


def test_acs_and_iommu_facts_for_the_gpus_of_a_replica(tmp_path):
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt quiet\n")
    deps = Deps(sysfs_root=fake_sysfs(tmp_path / "sys"), cmdline_path=str(cmdline))
    facts = read_topology({0: "00000000:06:00.0", 1: "00000000:07:00.0", 2: None}, deps, parse_lspci_acs(LSPCI))
    assert [g["upstream"] for g in facts["gpus"][:2]] == [["0000:00:03.0", "0000:03:00.0", "0000:04:08.0"],
                                                          ["0000:00:03.0", "0000:03:00.0", "0000:04:10.0"]]
    assert [(g["index"], g["iommu_group"]) for g in facts["gpus"]] == [(0, "30"), (1, "31"), (2, None)]
    bridges = {b["bdf"]: b for b in facts["bridges"]}
    assert bridges["0000:00:03.0"]["gpus"] == [0, 1] and bridges["0000:04:08.0"]["gpus"] == [0]
    assert bridges["0000:03:00.0"]["acs_ctl"] is None and bridges["0000:03:00.0"]["acs_enabled"] is None
    assert facts["acs_enabled_bridges"] == ["0000:00:03.0", "0000:04:08.0"]
    assert facts["acs_redirect_bridges"] == ["0000:04:08.0"]
    assert facts["iommu"] == {"groups": 3, "enabled": True, "kernel_cmdline": ["intel_iommu=on", "iommu=pt"],
                              "passthrough": True, "gpu_groups": {"30": ["0000:06:00.0"], "31": ["0000:07:00.0"]}}
    assert facts["notes"] == ["GPU 2: no PCI bus id in the GPU facts (pass gpu: the nvml_facts result)",
                              "lspci could not read 0000:04:10.0's capabilities (access denied: run as root)"]
    assert facts["summary"].startswith("ACS redirects P2P on bridge(s) 0000:04:08.0 above the GPUs")
    assert facts["summary"].endswith("; IOMMU on (3 groups, iommu=pt)")


def test_without_lspci_or_iommu_the_facts_say_so(tmp_path):
    deps = Deps(sysfs_root=str(tmp_path / "empty"), cmdline_path=str(tmp_path / "none"))
    facts = read_topology({0: "00000000:06:00.0"}, deps, None)
    assert facts["notes"] == [f"GPU 0 (0000:06:00.0): not in {tmp_path / 'empty'}/bus/pci/devices",
                              "lspci not found (pciutils): ACS control of the bridges not read"]
    assert facts["summary"] == "ACS control not read; IOMMU off (no groups)"


def test_a_failed_pcie_replica_reports_the_facts_behind_the_hang(tmp_path):
    gpu = {"devices": [{"index": 0, "pci_bus_id": "00000000:06:00.0"}, {"index": 1, "pci_bus_id": "00000000:07:00.0"}]}
    calls = []

    def lspci(argv):
        calls.append(argv)
        return 0, LSPCI, ""
    deps = Deps(worker_source=FAKE_WORKER, sysfs_root=fake_sysfs(tmp_path / "sys"), cmdline_path="/nonexistent",
                which=lambda name: "/usr/bin/lspci" if name == "lspci" else None, run=lspci)
    spec = CheckSpec(python=sys.executable, sizes=(MiB,), iterations=1, warmup=0, timeout_s=2,
                     extra_env={"FAKE_NCCL": "*:hang_init", "FAKE_NCCL_BUS_0": "00000000:06:00.0",
                                "FAKE_NCCL_BUS_1": "00000000:07:00.0"})
    result = check([replica(), dict(replica(), name="vllm-1")], spec, deps, gpu=gpu)
    assert calls == [["/usr/bin/lspci", "-vvv", "-D"]]                       # once for all replicas
    entry = result["replicas"][0]
    assert entry["ok"] is False and entry["topology"]["acs_redirect_bridges"] == ["0000:04:08.0"]
    assert "Topology: ACS redirects P2P on bridge(s) 0000:04:08.0" in entry["reason"]
    assert "Fix: see docs/nccl-check.md" in entry["reason"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory, repo):
    """The planner's own output for the notes' 20B on the PCIe box and on the NVLink box (bin/revive plan)."""
    model = write_model(str(tmp_path_factory.mktemp("models") / "chat-20b"), "internlm2-chat-20b", dtype="F16",
                        config_only=True)
    out = {}
    for profile in ("v100-pcie-8x", "dgx1-v100"):
        proc = subprocess.run([sys.executable, str(repo / "bin" / "revive"), "plan", "--model", model, "--gpus",
                               profile, "--json"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out[profile] = json.loads(proc.stdout)
    return out


@pytest.mark.parametrize("profile, nccl_vars, alternative_env, topology, placement_note", [
    ("v100-pcie-8x", {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}, {},
     {"notes": ["simulated GPUs: this host's PCIe is not the planned server's; ACS/IOMMU not read"]},
     "not applied, the GPUs are simulated"),
    # TP 8 over the hybrid cube mesh: some NVLink, P2P kept on; across both sockets, so no pinning.
    ("dgx1-v100", {}, {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}, None, "the plan pins no CPUs"),
])
def test_check_mode_on_the_planners_replicas(plans, profile, nccl_vars, alternative_env, topology, placement_note):
    plan = plans[profile]
    spec = CheckSpec(python=sys.executable, backend="gloo", compare=True)
    result = describe(plan["replicas"], spec, Deps(), gpu=lab_facts(profile))
    assert [e["name"] for e in result["would_run"]] == [r["name"] for r in plan["replicas"]]
    for entry, planned in zip(result["would_run"], plan["replicas"]):
        runs = {run["label"]: run for run in entry["runs"]}
        assert runs["planned"]["env"] == dict(planned["env"], NCCL_DEBUG="INFO")
        assert {k: v for k, v in runs["planned"]["env"].items() if k.startswith("NCCL_") and k != "NCCL_DEBUG"} == \
            nccl_vars
        assert {k: v for k, v in runs["alternative"]["env"].items() if k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")} \
            == alternative_env
        assert len(runs["planned"]["argv"]) == entry["world_size"] == len(planned["gpus"])
        assert entry["topology"] == topology and entry["simulated"] is True
        assert placement_note in entry["placement"]["notes"][0]
