"""The NCCL check's orchestration on real processes, with a fake rank program that speaks the worker's protocol.

The fake (FAKE_WORKER) reads the same spec and argv as module_utils/revive_nccl/worker.py, prints the same
phase lines and NCCL-like output, and writes the same result file; what it does is chosen per rank through
FAKE_NCCL (e.g. ``1:hang_init``) and how fast it "is" through FAKE_NCCL_GBPS / FAKE_NCCL_GBPS_P2P_OFF. So
the launcher, the environment and CPU placement, the deadline, the kill, the error path and the compare
verdicts are tested without torch; test_nccl_module.py runs the real worker once (gloo).
"""
from __future__ import annotations

import os
import sys
import time

import pytest
from ansible.module_utils.revive_nccl import CheckSpec, Deps, NcclCheckError, check, describe

FAKE_WORKER = r'''
import json, os, sys, time
spec = json.load(open(sys.argv[1]))
rank = int(sys.argv[2])
modes = dict(item.split(":") for item in os.environ.get("FAKE_NCCL", "").split(",") if item)
mode = modes.get(str(rank), modes.get("*", "ok"))
seen = dict((k, v) for k, v in os.environ.items() if k.startswith(tuple(spec["seen_prefixes"])))
if mode == "leak":
    seen["NCCL_IB_DISABLE"] = "1"
result = {"rank": rank, "ok": False, "phase": "start", "sizes": [], "seen_env": seen,
          "affinity": sorted(os.sched_getaffinity(0)), "versions": {"torch": "fake", "nccl": "2.0.0"}}
if spec["backend"] == "nccl":
    result["device"] = {"index": rank, "name": "Fake V100",
                        "pci_bus_id": os.environ.get("FAKE_NCCL_BUS_%d" % rank, "00000000:%02X:00.0" % (0x1A + rank))}


def phase(name):
    result["phase"] = name
    sys.stderr.write("REVIVE_NCCL rank=%d phase=%s\n" % (rank, name))
    sys.stderr.flush()


def write():
    path = spec["result_paths"][rank]
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle)
    os.replace(path + ".tmp", path)


phase("import")
phase("init")
print("host:%d:%d [%d] NCCL INFO Channel 00/0 : %d[%d] -> %d[%d] via %s" % (
    os.getpid(), os.getpid(), rank, rank, rank, (rank + 1) % spec["world_size"], (rank + 1) % spec["world_size"],
    "NET/Socket/0" if os.environ.get("NCCL_P2P_DISABLE") == "1" else "P2P/IPC"), flush=True)
if mode == "hang_init":
    print("host:%d:%d [%d] NCCL INFO connecting to rank %d" % (os.getpid(), os.getpid(), rank, 0), flush=True)
    time.sleep(600)
if mode == "error":
    print("host:%d:%d [%d] enqueue.cc:123 NCCL WARN Cuda failure 'peer access is not supported'" % (
        os.getpid(), os.getpid(), rank), flush=True)
    result["error"] = "DistBackendError: NCCL error: unhandled cuda error"
    write()
    sys.exit(1)
if mode == "crash":
    sys.exit(3)
gbps = float(os.environ.get("FAKE_NCCL_GBPS", "10"))
if os.environ.get("NCCL_P2P_DISABLE") == "1":
    gbps = float(os.environ.get("FAKE_NCCL_GBPS_P2P_OFF", gbps))
for size in spec["sizes"]:
    phase("size=%d" % size)
    result["sizes"].append({"bytes": size, "time_s": size / (gbps * 1e9) * (1 + 0.01 * rank)})
phase("barrier")
result["ok"] = True
write()
phase("destroy")
if mode == "hang_teardown":
    time.sleep(600)
phase("done")
'''

SIZES = (1 << 20, 256 << 20)


def replica(gpus=(0, 1), disables=True, cpus=(), numa=None, nvlink=False, **env):
    base = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
            "VLLM_ATTENTION_BACKEND": "XFORMERS"}
    if disables:
        base.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
    base.update(env)
    return {"index": 0, "name": "vllm-0", "gpus": list(gpus), "env": base, "cpus": list(cpus),
            "cpu_list": ",".join(map(str, cpus)), "numa_node": numa, "nvlink": nvlink, "slowest_path": "PHB"}


def spec(**kwargs) -> CheckSpec:
    defaults = dict(python=sys.executable, backend="gloo", sizes=SIZES, iterations=2, warmup=1, timeout_s=20,
                    base_env={"PATH": os.environ["PATH"], "CUDA_HOME": "/usr/local/cuda", "NCCL_SOCKET_IFNAME": "lo"})
    defaults.update(kwargs)
    return CheckSpec(**defaults)


def deps(**kwargs) -> Deps:
    kwargs.setdefault("which", lambda name: None)
    return Deps(worker_source=FAKE_WORKER, **kwargs)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:          # a zombie is not alive
        return handle.read().split(")")[-1].split()[0] != "Z"


def test_a_passing_run_reports_per_size_bandwidth_and_the_exact_environment():
    result = check([replica()], spec(extra_env={"FAKE_NCCL_GBPS": "8", "NCCL_NVLS_ENABLE": "0"}), deps())
    assert result["ok"] is True and result["simulated"] is True and result["backend"] == "gloo"
    (entry,) = result["replicas"]
    run = entry["run"]
    assert run["env"] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_P2P_DISABLE": "1",
                          "NCCL_SHM_DISABLE": "1", "VLLM_ATTENTION_BACKEND": "XFORMERS", "NCCL_DEBUG": "INFO",
                          "FAKE_NCCL_GBPS": "8", "NCCL_NVLS_ENABLE": "0"}
    # time = mean of the ranks' times (1.00x and 1.01x of size / 8 GB/s); busbw = algbw * 2(2-1)/2
    big = run["sizes"][1]
    assert big["bytes"] == 256 << 20 and big["size"] == "256 MiB"
    assert big["algbw_gbps"] == pytest.approx(8 / 1.005, rel=1e-3) and big["busbw_gbps"] == big["algbw_gbps"]
    assert run["peak_busbw_gbps"] == max(r["busbw_gbps"] for r in run["sizes"])
    assert run["transports"] == ["NET/Socket/0"]
    assert [r["phase"] for r in run["ranks"]] == ["done", "done"] and entry["compare"] is None
    assert "vllm-0: peak busbw" in result["msg"]


@pytest.mark.parametrize("world, factor", [(2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_bandwidth_follows_nccl_tests_for_the_world_size(world, factor):
    result = check([replica(gpus=tuple(range(world)))], spec(sizes=(4 << 20,), extra_env={"FAKE_NCCL_GBPS": "10"}),
                   deps())
    row = result["replicas"][0]["run"]["sizes"][0]
    assert result["replicas"][0]["world_size"] == world and len(result["replicas"][0]["run"]["ranks"]) == world
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor, abs=2e-3)


def test_the_ranks_run_on_the_planned_cpus():
    cpu = min(os.sched_getaffinity(0))
    result = check([replica(cpus=(cpu,))], spec(backend="nccl"), deps())
    entry = result["replicas"][0]
    assert result["ok"] is True, result["msg"]
    assert entry["placement"]["applied"] is True and entry["placement"]["cpu_list"] == str(cpu)
    assert [r["affinity"] for r in entry["run"]["ranks"]] == [[cpu], [cpu]]


def test_a_hang_is_killed_at_the_deadline_with_the_phase_and_the_last_nccl_lines():
    started = time.monotonic()
    result = check([replica()], spec(timeout_s=2.0, extra_env={"FAKE_NCCL": "*:hang_init"}), deps())
    elapsed = time.monotonic() - started
    entry = result["replicas"][0]
    assert result["ok"] is False and entry["ok"] is False
    assert 2.0 <= elapsed < 10
    assert "did not finish within the 2 s deadline: rank(s) [0, 1] were killed in phase init" in entry["reason"]
    assert "NCCL INFO connecting to rank 0" in entry["reason"]
    assert any("connecting to" in line for line in entry["run"]["log_tail"]["1"])
    assert [r["rc"] for r in entry["run"]["ranks"]] == [-9, -9]
    assert not any(alive(r["pid"]) for r in entry["run"]["ranks"])
    assert result["msg"].startswith("vllm-0 (GPUs [0, 1]): the all-reduce did not finish")


def test_an_nccl_error_on_one_rank_stops_the_others_at_once_and_quotes_the_warning():
    started = time.monotonic()
    result = check([replica(gpus=(0, 1, 2))], spec(timeout_s=60, extra_env={"FAKE_NCCL": "1:error,*:hang_init"}),
                   deps())
    elapsed = time.monotonic() - started
    entry = result["replicas"][0]
    assert entry["ok"] is False and elapsed < 15         # the grace, not the 60 s deadline
    assert entry["reason"].startswith("rank 1 failed in phase init: DistBackendError: NCCL error: unhandled cuda "
                                      "error; rank(s) [0, 2] stopped too (killed)")
    assert "NCCL WARN Cuda failure 'peer access is not supported'" in entry["reason"]
    assert [r["rc"] for r in entry["run"]["ranks"]] == [-9, 1, -9]


def test_a_rank_that_dies_without_a_result_fails_with_its_status():
    entry = check([replica()], spec(extra_env={"FAKE_NCCL": "0:crash"}), deps())["replicas"][0]
    assert entry["ok"] is False
    assert entry["run"]["reason"].startswith("rank 0 failed in phase init: exited with status 3 without a result")


def test_a_teardown_hang_after_every_rank_reported_still_passes_with_a_note():
    started = time.monotonic()
    result = check([replica()], spec(timeout_s=60, extra_env={"FAKE_NCCL": "*:hang_teardown"}), deps())
    run = result["replicas"][0]["run"]
    assert result["ok"] is True and time.monotonic() - started < 15
    assert run["notes"] == ["every rank reported, then destroy_process_group did not return within 3 s: rank(s) "
                            "[0, 1] killed in teardown"]


@pytest.mark.parametrize("extra, facts, expected", [
    ({"FAKE_NCCL": "1:leak"}, None, "rank 1 saw NCCL/CUDA variables"),
    ({"FAKE_NCCL_BUS_1": "00000000:3D:00.0"},
     {"devices": [{"index": 0, "pci_bus_id": "00000000:1A:00.0"}, {"index": 1, "pci_bus_id": "00000000:1B:00.0"}]},
     "rank 1 ran on the GPU at 00000000:3D:00.0, but the plan's GPU is at 00000000:1B:00.0"),
])
def test_a_rank_that_did_not_get_the_planned_environment_or_gpu_fails(extra, facts, expected):
    result = check([replica(nvlink=True)], spec(backend="nccl", extra_env=extra), deps(), gpu=facts)
    assert result["ok"] is False and expected in result["replicas"][0]["reason"]


@pytest.mark.parametrize("disables, p2p_on, p2p_off, verdict, warned, phrase", [
    (True, 30, 10, "contradicted", True, "without the planned NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 the all-reduce "
                                         "passed and was faster, at 256 MiB: planned busbw"),
    (True, 10, 10, "no_difference", False, "no difference beyond 10%"),
    (False, 30, 10, "confirmed", False, "the planned environment is faster"),
    (False, 10, 30, "contradicted", True, "with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 forced the all-reduce passed "
                                          "and was faster"),
])
def test_compare_flips_the_planners_decision_and_warns_only_on_a_contradiction(disables, p2p_on, p2p_off, verdict,
                                                                               warned, phrase):
    extra = {"FAKE_NCCL_GBPS": str(p2p_on), "FAKE_NCCL_GBPS_P2P_OFF": str(p2p_off)}
    result = check([replica(disables=disables)], spec(compare=True, extra_env=extra), deps())
    entry = result["replicas"][0]
    assert result["ok"] is True
    assert entry["compare"]["verdict"] == verdict and phrase in entry["compare"]["message"]
    assert ("NCCL_P2P_DISABLE" in entry["compare"]["env"]) is (not disables)
    assert entry["compare"]["env"]["FAKE_NCCL_GBPS"] == str(p2p_on)            # extra_env stays in both runs
    assert result["warning_messages"] == ([f"vllm-0: {entry['compare']['message']}"] if warned else [])
    assert entry["notes"] == ([] if warned else [f"vllm-0: {entry['compare']['message']}"])


def test_compare_where_the_flipped_run_hangs_confirms_the_rule_and_the_check_passes():
    replicas = [replica()]
    # The alternative run drops NCCL_P2P_DISABLE; FAKE_NCCL applies to both runs, so hang only without it.
    worker = FAKE_WORKER.replace('mode = modes.get(str(rank), modes.get("*", "ok"))',
                                 'mode = "ok" if os.environ.get("NCCL_P2P_DISABLE") == "1" else "hang_init"')
    result = check(replicas, spec(compare=True, timeout_s=2.0), Deps(worker_source=worker, which=lambda n: None))
    entry = result["replicas"][0]
    assert result["ok"] is True and entry["compare"]["verdict"] == "confirmed"
    assert "the all-reduce failed (the all-reduce did not finish within the 2 s deadline" in entry["compare"]["message"]
    assert result["warning_messages"] == []


def test_single_gpu_replicas_are_skipped_unless_asked():
    skipped = check([replica(gpus=(3,), disables=False)], spec(), deps())
    assert skipped["ok"] is True and skipped["replicas"][0]["skipped"] is True and "(1 skipped)" in skipped["msg"]
    ran = check([replica(gpus=(3,), disables=False)], spec(single_gpu="run"), deps())
    row = ran["replicas"][0]["run"]["sizes"][0]
    assert ran["replicas"][0]["skipped"] is False and row["busbw_gbps"] == 0.0 and row["algbw_gbps"] > 0


def test_check_mode_describes_the_processes_and_starts_none(tmp_path):
    marker = tmp_path / "started"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ntouch {marker}\n")
    python.chmod(0o755)
    result = describe([replica(gpus=(0, 1, 2, 3), cpus=(0,), numa=0)], spec(python=str(python), compare=True),
                      deps(which=lambda name: "/usr/bin/numactl"))
    (entry,) = result["would_run"]
    assert not marker.exists() and result["python_found"] is True
    assert [run["label"] for run in entry["runs"]] == ["planned", "alternative"]
    assert entry["runs"][0]["argv"][3] == ["/usr/bin/numactl", "--membind=0", str(python), "-u", "WORKER", "SPEC", "3"]
    assert entry["placement"] == {"cpu_list": "0", "applied": True, "numa_node": 0, "numactl": "/usr/bin/numactl",
                                  "notes": []}
    assert "NCCL_P2P_DISABLE" not in entry["runs"][1]["env"]
    assert result["msg"].startswith("check mode: nothing started; would run 8 rank process(es)")


def test_a_missing_interpreter_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(NcclCheckError, match="venv exists only after the vllm_runtime role ran"):
        check([replica()], spec(python=str(tmp_path / "no-venv" / "bin" / "python")), deps())


def test_a_rank_that_cannot_start_fails_the_run_with_the_command(tmp_path):
    result = check([replica(cpus=(min(os.sched_getaffinity(0)),), numa=0)], spec(),
                   deps(which=lambda name: str(tmp_path / "numactl"), numa_nodes=lambda: [0]))
    assert result["ok"] is False
    assert result["replicas"][0]["run"]["reason"].startswith(f"could not start rank 0 ({tmp_path / 'numactl'} "
                                                             "--membind=0")
