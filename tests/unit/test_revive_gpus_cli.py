"""`bin/revive gpus [--json]` against the fake NVML: what a person reads, what a program parses, and that it
runs with only pynvml installed (no Ansible)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "lab" / "profiles"


@pytest.fixture(scope="session")
def fakenvml() -> Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "lab" / "fakenvml")], check=True, capture_output=True)
    return REPO / "lab" / "fakenvml"


def revive_gpus(fakenvml: Path, profile: str | Path, *args: str) -> subprocess.CompletedProcess:
    path = profile if isinstance(profile, Path) else PROFILES / f"{profile}.json"
    env = dict(os.environ, LD_LIBRARY_PATH=str(fakenvml), FAKE_NVML_PROFILE=str(path),
               FAKE_NVML_UTILIZATION="/nonexistent/utilization.json")
    return subprocess.run([sys.executable, str(REPO / "bin" / "revive"), "gpus", *args], env=env, capture_output=True,
                          text=True, timeout=60)


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
    assert lines[-1] == "Health findings: none"
    assert done.stderr == ""


def test_human_view_of_the_dgx1_matches_the_real_topo_m(fakenvml: Path) -> None:
    done = revive_gpus(fakenvml, "dgx1-v100")
    topo = section(done.stdout, "Topology (as `nvidia-smi topo -m`):", "Legend:")
    rows = [line.split() for line in topo if line.strip()]
    # reference/nvml.md §3b (InternLM/lmdeploy#4423 capture)
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
    findings = [line.split()[:4] for line in lines[start + 1:]]
    assert findings == [
        ["GPU1", "00000000:1B:00.0", "ERROR", "retired_pages_pending:"],
        ["GPU3", "00000000:3E:00.0", "ERROR", "pcie_width:"],
        ["GPU5", "00000000:89:00.0", "ERROR", "ecc_uncorrected:"],
        ["GPU6", "00000000:B1:00.0", "ERROR", "foreign_process:"],
    ]
    assert "compute process pid 48213 (python3) holds 16384 MiB" in lines[start + 4]


CONTRACT_B_KEYS = {"simulated", "driver_version", "driver_branch", "cuda_driver_version", "nvml_version", "count",
                   "devices", "topology", "summary", "notes"}
CONTRACT_B_DEVICE_KEYS = {
    "index", "name", "uuid", "serial", "pci_bus_id", "pci_device_id", "memory", "compute_capability", "cc_major",
    "cc_minor", "architecture", "bf16", "pcie", "numa_node", "cpu_affinity", "cpus", "socket", "power_limit_w",
    "persistence_mode", "temperature_c", "utilization_gpu_pct", "ecc", "ecc_errors", "retired_pages",
    "remapped_rows", "mig_mode", "processes", "nvlink", "notes",
}


@pytest.mark.parametrize("profile", ["t4-4x", "dgx1-v100"])
def test_json_carries_every_contract_b_field(fakenvml: Path, profile: str) -> None:
    done = revive_gpus(fakenvml, profile, "--json")
    assert done.returncode == 0, done.stderr
    gpu = json.loads(done.stdout)
    assert CONTRACT_B_KEYS <= set(gpu)
    for device in gpu["devices"]:
        assert CONTRACT_B_DEVICE_KEYS <= set(device)
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


# Runs bin/revive with every real `ansible` import refused, as on a GPU box with only pynvml installed.
WITHOUT_ANSIBLE = r"""
import runpy, sys
class NoAnsible:
    def find_spec(self, name, path=None, target=None):
        if name == "ansible" or (name.startswith("ansible.") and not name.startswith("ansible.module_utils.revive_")):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, NoAnsible())
sys.argv = ["revive", "gpus", "--json"]
try:
    runpy.run_path(sys.argv_path, run_name="__main__")
except SystemExit as done:
    assert getattr(sys.modules["ansible"], "__file__", None) is None, "the real ansible was imported"
    raise
"""


def test_cli_runs_with_only_pynvml_installed(fakenvml: Path) -> None:
    code = WITHOUT_ANSIBLE.replace("sys.argv_path", repr(str(REPO / "bin" / "revive")))
    env = dict(os.environ, LD_LIBRARY_PATH=str(fakenvml), FAKE_NVML_PROFILE=str(PROFILES / "t4-4x.json"),
               PYTHONPATH=str(REPO / "bin"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["devices"][0]["name"] == "Tesla T4"
