"""`bin/revive gpus [--json] [--nccl-record PATH]` against the fake NVML: what a person reads, what a program
parses, the NCCL check's record after the probe, and that it runs with only pynvml installed (no Ansible)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.revive_nccl import CheckSpec, Deps, compare_runs, placement, replica_runs
from ansible.module_utils.revive_nccl import _topology_for
from ansible.module_utils.revive_nccl.ranks import _failure, _size_rows
from test_nccl import LSPCI, fake_sysfs
from test_nccl_ranks import replica as planned_replica

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "lab" / "profiles"
NO_RECORD = Path("/nonexistent/nccl-check.json")


@pytest.fixture(scope="session")
def fakenvml() -> Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "lab" / "fakenvml")], check=True, capture_output=True)
    return REPO / "lab" / "fakenvml"


def revive_gpus(fakenvml: Path, profile: str | Path, *args: str,
                record: Path = NO_RECORD) -> subprocess.CompletedProcess:
    path = profile if isinstance(profile, Path) else PROFILES / f"{profile}.json"
    env = dict(os.environ, LD_LIBRARY_PATH=str(fakenvml), FAKE_NVML_PROFILE=str(path),
               FAKE_NVML_UTILIZATION="/nonexistent/utilization.json")
    return subprocess.run([sys.executable, str(REPO / "bin" / "revive"), "gpus", "--nccl-record", str(record), *args],
                          env=env, capture_output=True, text=True, timeout=60)


def section(text: str, start: str, end: str) -> list[str]:
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    last = next(i for i in range(first + 1, len(lines)) if lines[i].startswith(end))
    return lines[first + 1:last]


def test_human_view_of_the_field_notes_box(fakenvml: Path) -> None:
    done = revive_gpus(fakenvml, "v100-pcie-8x")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"SIMULATED (lab fake NVML, profile {PROFILES / 'v100-pcie-8x.json'})"
    assert lines[1].endswith(": 8 GPU(s), driver 535.104.05 (branch 535), CUDA driver 12.2, NVML 12.535.104.05")
    table = lines[3:12]
    assert table[0].split() == ["GPU", "Name", "Bus-Id", "Memory", "CC", "BF16", "PCIe", "now", "PCIe", "max", "Power",
                                "Temp", "Util", "Persist", "ECC", "Socket", "NUMA"]
    assert table[1].split() == ["0", "Tesla", "V100-PCIE-32GB", "00000000:1A:00.0", "32768", "MiB", "7.0", "no", "gen3",
                                "x16", "gen3", "x16", "250", "W", "33C", "0%", "on", "on", "0", "0"]
    assert table[8].split()[0] == "7" and table[8].split()[-2:] == ["1", "1"]
    topo = section(done.stdout, "Topology (as `nvidia-smi topo -m`):", "Legend:")
    assert topo[0] == "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    assert topo[1] == "GPU0\t X \tPHB\tPHB\tPHB\tSYS\tSYS\tSYS\tSYS\t0-19,40-59\t0\t\tN/A"
    assert topo[8] == "GPU7\tSYS\tSYS\tSYS\tSYS\tPHB\tPHB\tPHB\t X \t20-39,60-79\t1\t\tN/A"
    assert ("Summary: NVLink none; 2 socket(s) with GPUs (socket 0: GPUs 0, 1, 2, 3; socket 1: GPUs 4, 5, 6, 7); "
            "P2P read OK on some pairs; slowest path SYS") in lines
    assert lines[-3:] == ["Health findings: none", "", f"NCCL check: not run on this node (no {NO_RECORD})"]
    assert done.stderr == ""


def test_human_view_of_the_dgx1_matches_the_real_topo_m(fakenvml: Path) -> None:
    done = revive_gpus(fakenvml, "dgx1-v100")
    topo = section(done.stdout, "Topology (as `nvidia-smi topo -m`):", "Legend:")
    rows = [line.split() for line in topo if line.strip()]
    # docs/facts/nvml.md §3b (InternLM/lmdeploy#4423 capture)
    assert rows[1:] == [
        ["GPU0", "X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS", "0-19,40-59", "0", "N/A"],
        ["GPU1", "NV1", "X", "NV2", "NV1", "SYS", "NV2", "SYS", "SYS", "0-19,40-59", "0", "N/A"],
        ["GPU2", "NV1", "NV2", "X", "NV2", "SYS", "SYS", "NV1", "SYS", "0-19,40-59", "0", "N/A"],
        ["GPU3", "NV2", "NV1", "NV2", "X", "SYS", "SYS", "SYS", "NV1", "0-19,40-59", "0", "N/A"],
        ["GPU4", "NV2", "SYS", "SYS", "SYS", "X", "NV1", "NV1", "NV2", "20-39,60-79", "1", "N/A"],
        ["GPU5", "SYS", "NV2", "SYS", "SYS", "NV1", "X", "NV2", "NV1", "20-39,60-79", "1", "N/A"],
        ["GPU6", "SYS", "SYS", "NV1", "SYS", "NV1", "NV2", "X", "NV2", "20-39,60-79", "1", "N/A"],
        ["GPU7", "SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", "X", "20-39,60-79", "1", "N/A"],
    ]
    assert "Summary: NVLink partial;" in done.stdout


def test_human_view_of_the_a100_box_is_nv12_everywhere(fakenvml: Path) -> None:
    done = revive_gpus(fakenvml, "a100-sxm4-8x")
    topo = section(done.stdout, "Topology (as `nvidia-smi topo -m`):", "Legend:")
    cells = {cell.strip() for line in topo[1:] if line for cell in line.split("\t")[1:9]}
    assert cells == {"X", "NV12"}
    assert "slowest path NV12" in done.stdout
    assert " yes " in done.stdout.splitlines()[4]  # BF16 on Ampere


def test_health_findings_of_the_degraded_box(fakenvml: Path) -> None:
    done = revive_gpus(fakenvml, "v100-pcie-8x-degraded")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    start = lines.index("Health findings (4):")
    findings = [line.split()[:4] for line in lines[start + 1:start + 5]]
    assert lines[start + 5] == ""
    assert findings == [
        ["GPU1", "00000000:1B:00.0", "ERROR", "retired_pages_pending:"],
        ["GPU3", "00000000:3E:00.0", "ERROR", "pcie_width:"],
        ["GPU5", "00000000:89:00.0", "ERROR", "ecc_uncorrected:"],
        ["GPU6", "00000000:B1:00.0", "ERROR", "foreign_process:"],
    ]
    assert "compute process pid 48213 (python3) holds 16384 MiB" in lines[start + 4]


GPU_FACTS_KEYS = {"simulated", "driver_version", "driver_branch", "cuda_driver_version", "nvml_version", "count",
                   "devices", "topology", "summary", "notes"}
GPU_FACTS_DEVICE_KEYS = {
    "index", "name", "uuid", "serial", "pci_bus_id", "pci_device_id", "memory", "compute_capability", "cc_major",
    "cc_minor", "architecture", "bf16", "pcie", "numa_node", "cpu_affinity", "cpus", "socket", "power_limit_w",
    "persistence_mode", "temperature_c", "utilization_gpu_pct", "ecc", "ecc_errors", "retired_pages",
    "remapped_rows", "mig_mode", "processes", "nvlink", "notes",
}


@pytest.mark.parametrize("profile", ["t4-4x", "dgx1-v100"])
def test_json_carries_every_gpu_facts_field(fakenvml: Path, profile: str) -> None:
    done = revive_gpus(fakenvml, profile, "--json")
    assert done.returncode == 0, done.stderr
    gpu = json.loads(done.stdout)
    assert GPU_FACTS_KEYS <= set(gpu)
    for device in gpu["devices"]:
        assert GPU_FACTS_DEVICE_KEYS <= set(device)
        assert set(device["memory"]) >= {"total_bytes", "used_bytes", "free_bytes"}
        assert set(device["pcie"]) == {"gen_current", "gen_max", "width_current", "width_max"}
        assert set(device["ecc_errors"]) >= {"corrected", "uncorrected"}
    assert set(gpu["topology"]) >= {"matrix", "p2p"}
    assert set(gpu["topology"]["p2p"]) == {"read", "write", "nvlink", "atomics", "pci"}
    assert set(gpu["summary"]) >= {"nvlink", "sockets", "gpus_per_socket", "p2p_any", "slowest_path"}


def test_broken_profile_is_an_error_with_nothing_on_stdout(fakenvml: Path, tmp_path: Path) -> None:
    done = revive_gpus(fakenvml, tmp_path / "missing.json", "--json")
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == (f"fakenvml: cannot read GPU profile {tmp_path}/missing.json: No such file or directory "
                        "(set FAKE_NVML_PROFILE to a lab/profiles/*.json file)")
    assert lines[1].startswith("revive gpus: NVML initialisation failed on ")


# --- the NCCL check's record: {"at", "release", "result"} as playbooks/provision.yml writes it, where result is the
# nccl_check module's return. Runs, replicas and results have execute()'s, _check_replica()'s and check()'s keys; what
# those compute comes from their pure builders (replica_runs, placement, _size_rows, _failure, compare_runs,
# _topology_for over a fake sysfs and lspci), so a change of shape there shows here.

AT, RELEASE, HOST = "2025-06-02T09:14:07+00:00", "0.8.5.post1-4c1f9e2a", "gpu-node-3"
MiB = 1 << 20
GPU_FACTS = {"devices": [{"index": 0, "pci_bus_id": "00000000:06:00.0"},
                         {"index": 1, "pci_bus_id": "00000000:07:00.0"}]}
FIX = "Fix: see docs/nccl-check.md (what a hang in init means, and the NCCL variables)"


def nccl_spec(backend: str, compare: bool = False) -> CheckSpec:
    return CheckSpec(python="/opt/revive/releases/0.8.5.post1/venv/bin/python", backend=backend,
                     sizes=(1 * MiB, 256 * MiB), compare=compare)


def node_deps(tmp_path: Path) -> Deps:
    """Two V100s behind one PLX switch whose port 04:08.0 redirects P2P (ACS), lspci readable (test_nccl's node)."""
    return Deps(sysfs_root=fake_sysfs(tmp_path / "sys"), cmdline_path="/nonexistent",
                which=lambda name: "/usr/bin/lspci" if name == "lspci" else None, run=lambda argv: (0, LSPCI, ""))


def run_result(plan, spec: CheckSpec, gbps: dict[int, float] | None = None, reason: str | None = None,
               transports: tuple[str, ...] = (), log_tail: list[str] | None = None) -> dict:
    """One run as execute() returns it: per-size rows from _size_rows over the ranks' times, or the failure."""
    n = plan.world_size
    out = {"label": plan.label, "description": plan.description, "world_size": n, "backend": spec.backend,
           "env": dict(plan.own_env), "ok": reason is None, "reason": reason, "sizes": [], "peak_busbw_gbps": None,
           "transports": sorted(transports), "versions": {"torch": "2.1.2+cu118", "python": "3.10.12"},
           "ranks": [{"rank": r, "pid": 41000 + r, "rc": 0 if reason is None else -9, "phase": "done" if reason is None
                      else "init", "affinity": [], "device": None, "error": None} for r in range(n)],
           "duration_s": 6.4}
    if reason is None:
        per_rank = [{"sizes": [{"bytes": size, "time_s": size / (gbps[size] * 1e9) * (1 + 0.01 * r)}
                               for size in spec.sizes]} for r in range(n)]
        out["sizes"] = _size_rows(per_rank, n)
        out["peak_busbw_gbps"] = max(row["busbw_gbps"] for row in out["sizes"])
    else:
        out["log_tail"] = {str(r): log_tail or [] for r in range(n)}
    return out


def replica_result(replica: dict, spec: CheckSpec, deps: Deps, planned: dict | None = None,
                   other: dict | None = None, gpu: dict | None = None) -> dict:
    """One replica as _check_replica() returns it (skipped when no run is given)."""
    out = {"name": replica["name"], "index": replica["index"], "gpus": replica["gpus"],
           "world_size": len(replica["gpus"]), "backend": spec.backend, "simulated": spec.simulated, "ok": True,
           "skipped": False, "reason": None, "duration_s": 0.0, "run": None, "compare": None, "topology": None,
           "placement": None, "warnings": [], "notes": []}
    if planned is None:
        out.update(skipped=True, reason="one GPU: no NCCL traffic to check (single_gpu: skip)")
        return out
    out.update(placement=placement(replica, spec.simulated, deps).as_dict(), run=planned,
               topology=_topology_for(replica, spec, gpu, deps, {}), duration_s=planned["duration_s"])
    if other is not None:
        verdict, message, warn = compare_runs(replica, planned, other, spec.compare_margin)
        out["compare"] = dict(other, verdict=verdict, message=message)
        (out["warnings"] if warn else out["notes"]).append(f"{replica['name']}: {message}")
    if not planned["ok"]:
        facts = (out["topology"] or {}).get("summary")
        out.update(ok=False, reason=f"{planned['reason']}" + (f". Topology: {facts}" if facts else "") +
                   ". Last output of rank 0: " + " | ".join(planned["log_tail"]["0"][-10:]) + f". {FIX}")
    return out


def check_result(spec: CheckSpec, replicas: list[dict]) -> dict:
    """check()'s return as the playbook registers it (exit_json/fail_json add changed and failed)."""
    failed = [r for r in replicas if not r["ok"]]
    checked = [r for r in replicas if not r["skipped"]]
    msg = ("; ".join(f"{r['name']} (GPUs {r['gpus']}): {r['reason']}" for r in failed) if failed else
           f"{len(checked)} replica(s) passed the {spec.backend} all-reduce check" +
           "".join(f"; {r['name']}: peak busbw {r['run']['peak_busbw_gbps']:g} GB/s over {r['world_size']} rank(s)"
                   for r in checked))
    result = {"ok": not failed, "simulated": spec.simulated, "backend": spec.backend, "python": spec.python,
              "replicas": replicas, "warning_messages": [w for r in replicas for w in r["warnings"]],
              "msg": f"{HOST}: {msg}", "changed": False}
    return dict(result, failed=True) if failed else result


def passed_record(tmp_path: Path) -> tuple[str, list[str]]:
    """NCCL on the PCIe box: the planner disabled P2P/SHM (ACS redirects on the switch), vllm-1 has one GPU."""
    spec, deps = nccl_spec("nccl"), node_deps(tmp_path)
    pcie, single = planned_replica(), dict(planned_replica(gpus=(2,)), name="vllm-1", index=1)
    (plan,) = replica_runs(pcie, spec, placement(pcie, False, deps))
    planned = run_result(plan, spec, {1 * MiB: 6.0, 256 * MiB: 10.0}, transports=("NET/Socket/0",))
    result = check_result(spec, [replica_result(pcie, spec, deps, planned, gpu=GPU_FACTS),
                                 replica_result(single, spec, deps)])
    summary = result["replicas"][0]["topology"]["summary"]
    assert summary.startswith("ACS redirects P2P on bridge(s) 0000:04:08.0")    # the builders' facts, not a literal
    return json.dumps({"at": AT, "release": RELEASE, "result": result}, indent=1), [
        f"NCCL check ({{path}}): passed at {AT}, release {RELEASE}, backend nccl",
        "  vllm-0 (GPUs 0, 1): ok",
        "    Size     busbw GB/s",
        "    1 MiB          5.97",
        "    256 MiB        9.95",
        "    Transports: NET/Socket/0",
        f"    Topology: {summary}",
        "    Topology note: lspci could not read 0000:04:10.0's capabilities (access denied: run as root)",
        "  vllm-1 (GPU 2): skipped (one GPU: no NCCL traffic to check (single_gpu: skip))",
    ]


def hung_record(tmp_path: Path) -> tuple[str, list[str]]:
    """NCCL with P2P kept on over the ACS-redirecting switch: both ranks hang in init until the deadline."""
    spec, deps = nccl_spec("nccl"), node_deps(tmp_path)
    pcie = planned_replica(disables=False)
    place = placement(pcie, False, deps)
    (plan,) = replica_runs(pcie, spec, place)
    reason = _failure(plan, spec, place, [{"rank": r, "ok": False, "rc": -9, "phase": "init"} for r in (0, 1)],
                      "deadline", [])
    tail = ["gpu-node-3:41000:41000 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
            "gpu-node-3:41000:41000 [0] NCCL INFO connecting to rank 1"]
    planned = run_result(plan, spec, reason=reason, transports=("P2P/IPC",), log_tail=tail)
    result = check_result(spec, [replica_result(pcie, spec, deps, planned, gpu=GPU_FACTS)])
    entry = result["replicas"][0]
    return json.dumps({"at": AT, "release": RELEASE, "result": result}), [
        f"NCCL check ({{path}}): FAILED at {AT}, release {RELEASE}, backend nccl",
        "  vllm-0 (GPUs 0, 1): FAILED: the all-reduce did not finish within the 180 s deadline: rank(s) [0, 1] were "
        "killed in phase init (init = NCCL communicator set-up, where the notes' hang at 'connecting to' was; "
        f"size=N = an all-reduce of N bytes). Topology: {entry['topology']['summary']}. Last output of rank 0: "
        f"{tail[0]} | {tail[1]}. {FIX}",
        "    Transports: P2P/IPC",
        f"    Topology: {entry['topology']['summary']}",
        "    Topology note: lspci could not read 0000:04:10.0's capabilities (access denied: run as root)",
    ]


def simulated_record(tmp_path: Path) -> tuple[str, list[str]]:
    """gloo on CPU processes (the lab), TP 4, with compare: the flipped run within the margin."""
    spec, deps = nccl_spec("gloo", compare=True), Deps()
    tp4 = planned_replica(gpus=(0, 1, 2, 3))
    planned_plan, flipped_plan = replica_runs(tp4, spec, placement(tp4, True, deps))
    planned = run_result(planned_plan, spec, {1 * MiB: 10.0, 256 * MiB: 10.0})
    flipped = run_result(flipped_plan, spec, {1 * MiB: 10.2, 256 * MiB: 10.2})
    result = check_result(spec, [replica_result(tp4, spec, deps, planned, flipped)])
    return json.dumps({"at": AT, "release": RELEASE, "result": result}), [
        f"NCCL check ({{path}}): passed at {AT}, release {RELEASE}, backend gloo",
        "SIMULATED (gloo on CPU processes)",
        "  vllm-0 (GPUs 0, 1, 2, 3): ok",
        "    Size     busbw GB/s",
        "    1 MiB         14.78",
        "    256 MiB       14.78",
        "    Transports: none reported",
        "    Compare: no_difference: no difference beyond 10%, at 256 MiB: planned busbw 14.778 GB/s (algbw 9.852), "
        "without the planned NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 busbw 15.074 GB/s (algbw 10.049), ratio 1.02",
        "    Topology note: simulated GPUs: this host's PCIe is not the planned server's; ACS/IOMMU not read",
    ]


def missing_record(tmp_path: Path) -> tuple[None, list[str]]:
    return None, ["NCCL check: not run on this node (no {path})"]


def malformed_record(tmp_path: Path) -> tuple[str, list[str]]:
    """Cut off mid-write."""
    return '{"at": "2025-06-02T09:14:07+00:00", "release": ', [
        "NCCL check: {path} is not valid JSON: Expecting value: line 1 column 48 (char 47)"]


def not_a_record(tmp_path: Path) -> tuple[str, list[str]]:
    """Valid JSON, but not what the playbook writes."""
    return json.dumps([{"release": RELEASE}]), [
        'NCCL check: {path} is not an NCCL check record: the top level is not a JSON object (the provision playbook '
        'writes {"at", "release", "result"})']


def unknown_shape(tmp_path: Path) -> tuple[str, list[str]]:
    """A result whose size rows lack the figures (another module version): one line, the rest of the view prints."""
    result = {"ok": True, "backend": "nccl", "replicas": [{"name": "vllm-0", "gpus": [0, 1], "ok": True,
                                                           "run": {"sizes": [{"size": "1 MiB"}]}}]}
    return json.dumps({"at": AT, "release": RELEASE, "result": result}), [
        "NCCL check: {path} is not an NCCL check record this view understands (KeyError: 'busbw_gbps')"]


@pytest.mark.parametrize("build", [passed_record, hung_record, simulated_record, missing_record, malformed_record,
                                   not_a_record, unknown_shape],
                         ids=["passed", "hung-in-init", "simulated-gloo-compare", "missing", "malformed",
                              "not-a-record", "unknown-shape"])
def test_nccl_check_section_after_the_probe(fakenvml: Path, tmp_path: Path, build) -> None:
    text, expected = build(tmp_path)
    record = tmp_path / "nccl-check.json"
    if text is not None:
        record.write_text(text)
    done = revive_gpus(fakenvml, "t4-4x", record=record)
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    start = lines.index("Health findings: none")          # the probe's view, whole, comes first
    assert ": 4 GPU(s), driver " in lines[1]
    assert lines[start + 1] == ""
    assert lines[start + 2:] == [line.replace("{path}", str(record)) for line in expected]


def test_json_is_the_probe_alone_whatever_the_record(fakenvml: Path, tmp_path: Path) -> None:
    record = tmp_path / "nccl-check.json"
    record.write_text(passed_record(tmp_path)[0])
    with_record = revive_gpus(fakenvml, "t4-4x", "--json", record=record)
    without = revive_gpus(fakenvml, "t4-4x", "--json")
    assert with_record.returncode == without.returncode == 0
    assert with_record.stdout == without.stdout
    assert set(json.loads(with_record.stdout)) == set(json.loads(without.stdout))
    assert "NCCL" not in with_record.stdout and "nccl" not in set(json.loads(with_record.stdout))


def test_the_record_defaults_to_what_the_provision_playbook_writes(fakenvml: Path) -> None:
    done = revive_gpus(fakenvml, "t4-4x", "--help")
    assert done.returncode == 0
    assert "--nccl-record PATH" in done.stdout
    assert "(human view only; default: /var/lib/revive/nccl-check.json)" in " ".join(done.stdout.split())
    playbook = (REPO / "playbooks" / "provision.yml").read_text()
    assert "dest: /var/lib/revive/nccl-check.json" in playbook


# Runs bin/revive with every real `ansible` import refused, as on a GPU box with only pynvml installed.
WITHOUT_ANSIBLE = r"""
import runpy, sys
class NoAnsible:
    def find_spec(self, name, path=None, target=None):
        if name == "ansible" or (name.startswith("ansible.") and not name.startswith("ansible.module_utils.revive_")):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, NoAnsible())
sys.argv = ["revive", "gpus"] + ARGS
try:
    runpy.run_path(sys.argv_path, run_name="__main__")
except SystemExit as done:
    assert getattr(sys.modules["ansible"], "__file__", None) is None, "the real ansible was imported"
    raise
"""


def run_without_ansible(fakenvml: Path, *args: str) -> subprocess.CompletedProcess:
    code = WITHOUT_ANSIBLE.replace("sys.argv_path", repr(str(REPO / "bin" / "revive")))
    code = code.replace("ARGS", repr(list(args)))
    env = dict(os.environ, LD_LIBRARY_PATH=str(fakenvml), FAKE_NVML_PROFILE=str(PROFILES / "t4-4x.json"),
               PYTHONPATH=str(REPO / "bin"))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_cli_runs_with_only_pynvml_installed(fakenvml: Path) -> None:
    done = run_without_ansible(fakenvml, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["devices"][0]["name"] == "Tesla T4"


def test_nccl_section_needs_no_ansible_either(fakenvml: Path, tmp_path: Path) -> None:
    text, expected = simulated_record(tmp_path)
    record = tmp_path / "nccl-check.json"
    record.write_text(text)
    done = run_without_ansible(fakenvml, "--nccl-record", str(record))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-len(expected):] == [line.replace("{path}", str(record)) for line in expected]
