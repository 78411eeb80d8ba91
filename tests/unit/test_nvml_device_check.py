"""tests/device/check_probe.py, the real-hardware comparison, exercised here with the fake NVML and a
stand-in nvidia-smi that prints what the real one would (or something different, to see it fail)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "device" / "check_probe.py"
MIB = 1024 * 1024

spec = importlib.util.spec_from_file_location("check_probe", SCRIPT)
check_probe = importlib.util.module_from_spec(spec)
sys.modules["check_probe"] = check_probe  # dataclasses look their module up there
spec.loader.exec_module(check_probe)


@pytest.fixture(scope="session")
def fakenvml() -> Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "lab" / "fakenvml")], check=True, capture_output=True)
    return REPO / "lab" / "fakenvml"


# What nvidia-smi prints on the field notes' box (tab-separated topo -m with a NIC column and legend).
V100_TOPO_M = "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" + "".join(
    f"GPU{i}\t" + "\t".join(" X " if i == j else ("PHB" if i // 4 == j // 4 else "SYS") for j in range(8))
    + f"\t{'PHB' if i < 4 else 'SYS'}\t{'0-19,40-59' if i < 4 else '20-39,60-79'}\t{i // 4}\t\tN/A\n"
    for i in range(8)
) + "NIC0\t" + "\t".join("PHB" if j < 4 else "SYS" for j in range(8)) + "\t X \n\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n"
BUSES = ["1A", "1B", "3D", "3E", "88", "89", "B1", "B2"]


def v100_query(power: str = "250.00", gen_current: str = "3") -> str:
    return "".join(f"{i}, Tesla V100-PCIE-32GB, 00000000:{bus}:00.0, 32768, 3, 16, {gen_current}, 16, {power}\n"
                   for i, bus in enumerate(BUSES))


def fake_nvidia_smi(tmp_path: Path, topo: str, query: str) -> Path:
    (tmp_path / "topo.txt").write_text(topo)
    (tmp_path / "query.txt").write_text(query)
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"name = 'topo.txt' if sys.argv[1:3] == ['topo', '-m'] else 'query.txt'\n"
        f"sys.stdout.write(open({str(tmp_path)!r} + '/' + name).read())\n"
    )
    script.chmod(0o755)
    return script


def run_check(fakenvml: Path, smi: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_LIBRARY_PATH=str(fakenvml), FAKE_NVML_PROFILE=str(REPO / "lab/profiles/v100-pcie-8x.json"))
    return subprocess.run([sys.executable, str(SCRIPT), "--nvidia-smi", str(smi)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_matching_machine_passes_and_prints_both_sides(fakenvml: Path, tmp_path: Path) -> None:
    done = run_check(fakenvml, fake_nvidia_smi(tmp_path, V100_TOPO_M, v100_query()))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING: the probe loaded the lab's fake NVML" in done.stdout
    assert done.stdout.rstrip().endswith("97 matched, 0 mismatched")  # GPU count + 8 GPUs x 12 values
    row = next(line for line in done.stdout.splitlines() if line.startswith("topo -m row") and " GPU4 " in line)
    assert row.split()[-1] == "ok"
    assert "SYS SYS SYS SYS X PHB PHB PHB" in row


def test_any_difference_is_a_mismatch_and_exit_1(fakenvml: Path, tmp_path: Path) -> None:
    topo = V100_TOPO_M.replace("GPU2\tPHB\tPHB", "GPU2\tPIX\tPHB")
    done = run_check(fakenvml, fake_nvidia_smi(tmp_path, topo, v100_query(power="300.00")))
    assert done.returncode == 1
    mismatches = [line.split()[:3] for line in done.stdout.splitlines() if line.endswith("MISMATCH")]
    power = [["power.limit", "W", f"GPU{i}"] for i in range(8)]
    assert mismatches == power[:2] + [["topo", "-m", "row"]] + power[2:]
    assert "GPU2  PHB PHB X PHB SYS SYS SYS SYS" in done.stdout and "PIX PHB X PHB SYS SYS SYS SYS" in done.stdout
    assert done.stdout.rstrip().endswith("88 matched, 9 mismatched")


def test_nvidia_smi_missing_is_exit_2(fakenvml: Path, tmp_path: Path) -> None:
    done = run_check(fakenvml, tmp_path / "no-such-nvidia-smi")
    assert done.returncode == 2
    assert done.stderr.startswith("check_probe: nvidia-smi failed: ")


def h200_facts(total_bytes: int) -> dict:
    device = {"name": "NVIDIA H200", "pci_bus_id": "00000000:18:00.0", "cpu_affinity": "0-31", "numa_affinity": "0",
              "gpu_numa_id": None, "memory": {"total_bytes": total_bytes}, "power_limit_w": 700.0,
              "pcie": {"gen_max": 5, "width_max": 16, "gen_current": 5, "width_current": 16}}
    return {"count": 2, "devices": [device, dict(device, pci_bus_id="00000000:2A:00.0")],
            "topology": {"matrix": [["X", "NV18"], ["NV18", "X"]]}}


# docs/facts/nvml.md §6.2, the 2x H200 machine
H200_TOPO_M = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
               "GPU0\t X \tNV18\t0-31\t0\t\tN/A\nGPU1\tNV18\t X \t0-31\t0\t\tN/A\n")
H200_QUERY = ("0, NVIDIA H200, 00000000:18:00.0, 143771, 5, 16, 5, 16, 700.00\n"
              "1, NVIDIA H200, 00000000:2A:00.0, 143771, 5, 16, 1, 16, 700.00\n")


def test_h200_memory_compares_within_one_mib_and_idle_links_may_down_train() -> None:
    topo = check_probe.parse_topo_m(H200_TOPO_M)
    query = check_probe.parse_query(H200_QUERY)
    idle_later = check_probe.parse_query(H200_QUERY.replace("5, 16, 1, 16", "5, 16, 5, 16"))
    rows = check_probe.compare(h200_facts(143771 * MIB + 700 * 1024), topo, [query, idle_later])
    assert [row.what for row in rows if not row.ok] == []
    rows = check_probe.compare(h200_facts(143773 * MIB), topo, [query])
    assert [(row.what, row.gpu) for row in rows if not row.ok] == [
        ("memory.total MiB", "GPU0"), ("memory.total MiB", "GPU1"), ("pcie.link.gen.current", "GPU1")]
