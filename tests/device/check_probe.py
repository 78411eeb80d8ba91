#!/usr/bin/env python3
"""Compare the GPU probe with nvidia-smi on a machine with real NVIDIA GPUs.

Needs only python3, nvidia-ml-py (pynvml) and nvidia-smi; no Ansible, no network. From a plain checkout:

    python3 tests/device/check_probe.py            # exit 0: every value matches; 1: a mismatch; 2: cannot run

It runs the probe (module_utils/revive_nvml.py, the code nvml_facts and `bin/revive gpus` use), then
`nvidia-smi topo -m` and `nvidia-smi --query-gpu=...`, and prints side by side: the topology matrix,
CPU affinity, NUMA affinity, GPU NUMA ID, and per GPU the name, bus id, memory, PCIe gen/width (max and
current) and power limit. How values are compared is documented in tests/device/README.md.
"""
from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bin"))

from revive_cli import use_module_utils  # noqa: E402

use_module_utils()

from ansible.module_utils.revive_nvml import GpuProbeError, normalize_bus_id, probe  # noqa: E402
from ansible.module_utils.revive_topology import TopoM, parse_topo_m  # noqa: E402

MIB = 1024 * 1024
QUERY_FIELDS = ["index", "name", "pci.bus_id", "memory.total", "pcie.link.gen.max", "pcie.link.width.max",
                "pcie.link.gen.current", "pcie.link.width.current", "power.limit"]
QUERY = ["--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]


@dataclass
class Row:
    what: str
    gpu: str
    probe: str
    smi: str
    ok: bool


def parse_query(text: str) -> list[dict[str, str]]:
    """`nvidia-smi --query-gpu=... --format=csv,noheader,nounits` -> one dict per GPU, keyed by field."""
    rows = []
    for values in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not values:
            continue
        if len(values) != len(QUERY_FIELDS):
            raise ValueError(f"unexpected nvidia-smi --query-gpu line: {','.join(values)!r}")
        rows.append(dict(zip(QUERY_FIELDS, (value.strip() for value in values))))
    return rows


def _shown(value: object) -> str:
    return "N/A" if value is None else str(value)


def memory_matches(total_bytes: Optional[int], smi_mib: str) -> bool:
    """nvidia-smi prints whole MiB (H200: 143771 MiB for a total that is not a whole number of MiB), so the
    values agree when the probe's bytes are within one MiB of nvidia-smi's figure (floor or rounding)."""
    try:
        return total_bytes is not None and abs(total_bytes / MIB - float(smi_mib)) < 1.0
    except ValueError:
        return False


def number_matches(probe_value: Optional[float], smi_value: str, tolerance: float = 0.0) -> bool:
    try:
        return probe_value is not None and abs(float(probe_value) - float(smi_value)) <= tolerance
    except ValueError:
        return False


def compare(gpu: dict, topo: TopoM, queries: list[list[dict[str, str]]]) -> list[Row]:
    """Every compared value as a Row. `queries` holds one or more --query-gpu readings (taken before and
    after the probe): an idle link may change its current generation between reads, so current PCIe
    values match when they equal any reading; everything else must equal the first."""
    rows: list[Row] = []
    devices = gpu["devices"]
    smi_gpus = topo.gpu_labels()
    first = queries[0]
    rows.append(Row("GPU count", "-", str(gpu["count"]), f"{len(smi_gpus)} (topo -m), {len(first)} (query)",
                    gpu["count"] == len(smi_gpus) == len(first)))
    smi_matrix = topo.gpu_matrix()
    for i, device in enumerate(devices):
        label = f"GPU{i}"
        smi_row = topo.rows.get(label, {})
        probe_cells = gpu["topology"]["matrix"][i]
        smi_cells = smi_matrix[i] if i < len(smi_matrix) else []
        rows.append(Row("topo -m row", label, " ".join(probe_cells), " ".join(c or "?" for c in smi_cells),
                        probe_cells == smi_cells))
        rows.append(Row("CPU Affinity", label, _shown(device["cpu_affinity"]), _shown(smi_row.get("CPU Affinity")),
                        _shown(device["cpu_affinity"]) == _shown(smi_row.get("CPU Affinity"))))
        if "NUMA Affinity" in smi_row:
            rows.append(Row("NUMA Affinity", label, _shown(device["numa_affinity"]), _shown(smi_row["NUMA Affinity"]),
                            _shown(device["numa_affinity"]) == _shown(smi_row["NUMA Affinity"])))
        if "GPU NUMA ID" in smi_row:
            rows.append(Row("GPU NUMA ID", label, _shown(device["gpu_numa_id"]), _shown(smi_row["GPU NUMA ID"]),
                            _shown(device["gpu_numa_id"]) == _shown(smi_row["GPU NUMA ID"])))
        smi = next((q for q in first if q["index"] == str(i)), None)
        if smi is None:
            rows.append(Row("query-gpu", label, "present", "missing", False))
            continue
        pcie = device["pcie"]
        readings = [next((q for q in query if q["index"] == str(i)), {}) for query in queries]
        total = (device.get("memory") or {}).get("total_bytes")
        rows.extend([
            Row("name", label, _shown(device["name"]), smi["name"], device["name"] == smi["name"]),
            Row("pci.bus_id", label, _shown(device["pci_bus_id"]), smi["pci.bus_id"],
                device["pci_bus_id"] == normalize_bus_id(smi["pci.bus_id"])),
            Row("memory.total MiB", label, "N/A" if total is None else f"{total / MIB:.2f}", smi["memory.total"],
                memory_matches(total, smi["memory.total"])),
            Row("pcie.link.gen.max", label, _shown(pcie["gen_max"]), smi["pcie.link.gen.max"],
                number_matches(pcie["gen_max"], smi["pcie.link.gen.max"])),
            Row("pcie.link.width.max", label, _shown(pcie["width_max"]), smi["pcie.link.width.max"],
                number_matches(pcie["width_max"], smi["pcie.link.width.max"])),
            Row("pcie.link.gen.current", label, _shown(pcie["gen_current"]),
                "/".join(r.get("pcie.link.gen.current", "?") for r in readings),
                any(number_matches(pcie["gen_current"], r.get("pcie.link.gen.current", "")) for r in readings)),
            Row("pcie.link.width.current", label, _shown(pcie["width_current"]),
                "/".join(r.get("pcie.link.width.current", "?") for r in readings),
                any(number_matches(pcie["width_current"], r.get("pcie.link.width.current", "")) for r in readings)),
            Row("power.limit W", label, _shown(device["power_limit_w"]), smi["power.limit"],
                number_matches(device["power_limit_w"], smi["power.limit"], tolerance=0.005)),
        ])
    return rows


def report(gpu: dict, topo_text: str, rows: list[Row]) -> str:
    lines = [f"probe: {gpu['host']}, driver {gpu['driver_version']}, CUDA {gpu['cuda_driver_version']}, "
             f"library {gpu.get('library_path')}, simulated={gpu['simulated']}"]
    if gpu["simulated"]:
        lines.append("WARNING: the probe loaded the lab's fake NVML, not the driver's; this comparison proves nothing")
    lines += ["", "nvidia-smi topo -m:", topo_text.rstrip(), "", "probe topology matrix:"]
    count = len(gpu["devices"])
    lines.append("\t" + "\t".join(f"GPU{i}" for i in range(count)))
    for i, cells in enumerate(gpu["topology"]["matrix"]):
        lines.append(f"GPU{i}\t" + "\t".join(" X " if cell == "X" else cell for cell in cells))
    lines.append("")
    widths = [max(len(getattr(row, f)) for row in rows + [Row("what", "gpu", "probe", "nvidia-smi", True)])
              for f in ("what", "gpu", "probe", "smi")]
    header = ["what", "gpu", "probe", "nvidia-smi"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  result")
    for row in rows:
        cells = [row.what, row.gpu, row.probe, row.smi]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)) + ("  ok" if row.ok else "  MISMATCH"))
    bad = sum(1 for row in rows if not row.ok)
    lines += ["", f"{len(rows) - bad} matched, {bad} mismatched"]
    return "\n".join(lines) + "\n"


def run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi binary (default: from PATH)")
    args = parser.parse_args(argv)
    try:
        before = parse_query(run([args.nvidia_smi, *QUERY]))
        gpu = probe()
        after = parse_query(run([args.nvidia_smi, *QUERY]))
        topo_text = run([args.nvidia_smi, "topo", "-m"])
        topo = parse_topo_m(topo_text)
    except GpuProbeError as error:
        print(f"check_probe: the probe cannot run: {error}", file=sys.stderr)
        return 2
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired, ValueError) as error:
        detail = getattr(error, "stderr", "") or ""
        print(f"check_probe: nvidia-smi failed: {error} {detail}".rstrip(), file=sys.stderr)
        return 2
    rows = compare(gpu, topo, [before, after])
    sys.stdout.write(report(gpu, topo_text, rows))
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
