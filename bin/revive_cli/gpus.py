"""revive gpus [--json]: this machine's GPUs as the nvml_facts module sees them.

The human view is a device table, the topology matrix laid out like `nvidia-smi topo -m`, a summary
and the health findings. `--json` prints exactly what the module returns under `gpu`. Needs only
pynvml (nvidia-ml-py) and a driver, or the lab's fake:

    LD_LIBRARY_PATH=lab/fakenvml FAKE_NVML_PROFILE=lab/profiles/v100-pcie-8x.json bin/revive gpus
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from ansible.module_utils.revive_nvml import GpuProbeError, probe
from ansible.module_utils.revive_topology import health_findings, render_topo_m

MIB = 1024 * 1024


def _value(value: object, suffix: str = "", missing: str = "N/A") -> str:
    return missing if value is None else f"{value}{suffix}"


def _link(gen: Optional[int], width: Optional[int]) -> str:
    return "N/A" if gen is None or width is None else f"gen{gen} x{width}"


def _onoff(value: Optional[bool]) -> str:
    return "N/A" if value is None else ("on" if value else "off")


def device_table(gpu: dict) -> str:
    header = ["GPU", "Name", "Bus-Id", "Memory", "CC", "BF16", "PCIe now", "PCIe max", "Power", "Temp", "Util",
              "Persist", "ECC", "Socket", "NUMA"]
    rows = [header]
    for device in gpu["devices"]:
        memory, pcie, ecc = device.get("memory") or {}, device.get("pcie") or {}, device.get("ecc")
        total = memory.get("total_bytes")
        rows.append([
            str(device["index"]),
            _value(device.get("name")),
            _value(device.get("pci_bus_id")),
            "N/A" if total is None else f"{total // MIB} MiB",
            _value(device.get("compute_capability")),
            "N/A" if device.get("bf16") is None else ("yes" if device["bf16"] else "no"),
            _link(pcie.get("gen_current"), pcie.get("width_current")),
            _link(pcie.get("gen_max"), pcie.get("width_max")),
            "N/A" if device.get("power_limit_w") is None else f"{device['power_limit_w']:.0f} W",
            _value(device.get("temperature_c"), "C"),
            _value(device.get("utilization_gpu_pct"), "%"),
            _onoff(device.get("persistence_mode")),
            "N/A" if ecc is None else _onoff(ecc.get("current")),
            _value(device.get("socket")),
            _value(device.get("numa_node")),
        ])
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def summary_line(gpu: dict) -> str:
    summary = gpu["summary"]
    sockets = "; ".join(f"socket {sock}: GPUs {', '.join(map(str, gpus))}"
                        for sock, gpus in summary["gpus_per_socket"].items())
    return (f"NVLink {summary['nvlink']}; {summary['sockets']} socket(s) with GPUs ({sockets or 'unknown'}); "
            f"P2P read {'OK on some pairs' if summary['p2p_any'] else 'on no pair'}; "
            f"slowest path {summary['slowest_path'] or 'N/A'}")


def human_view(gpu: dict) -> str:
    parts = []
    if gpu["simulated"]:
        parts.append(f"SIMULATED (lab fake NVML, profile {gpu['simulated_profile']})")
    parts.append(
        f"{gpu['host']}: {gpu['count']} GPU(s), driver {_value(gpu['driver_version'])} "
        f"(branch {_value(gpu['driver_branch'])}), CUDA driver {_value(gpu['cuda_driver_version'])}, "
        f"NVML {_value(gpu['nvml_version'])}"
    )
    parts.append("")
    parts.append(device_table(gpu))
    if gpu["count"]:
        parts.append("")
        parts.append("Topology (as `nvidia-smi topo -m`):")
        parts.append(render_topo_m(gpu).rstrip("\n"))
        parts.append("")
        parts.append("Summary: " + summary_line(gpu))
    parts.append("")
    findings = health_findings(gpu)
    if findings:
        parts.append(f"Health findings ({len(findings)}):")
        for finding in findings:
            parts.append(f"  GPU{finding.gpu} {finding.pci_bus_id or ''}  {finding.severity.upper():7}  "
                         f"{finding.check}: {finding.message}")
    else:
        parts.append("Health findings: none")
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="revive gpus", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the facts the nvml_facts module returns under `gpu`")
    args = parser.parse_args(argv)
    try:
        gpu = probe()
    except GpuProbeError as error:
        print(f"revive gpus: {error}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(json.dumps(gpu, indent=2) + "\n")
    else:
        sys.stdout.write(human_view(gpu))
    return 0
