"""The GPU set a plan is for: the GPU facts (what nvml_facts returns under `gpu`) after exclusions, or a
synthetic COUNTxMEMORY_GIB[@CC] what-if in the same shape."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible.module_utils.revive_kv import GiB
from ansible.module_utils.revive_plan.inputs import Decisions, PlanRefusal
from ansible.module_utils.revive_releases import parse_cc

ARCHITECTURE_BY_CC = ((9, "hopper"), (8, "ampere"), (7, "volta"), (6, "pascal"), (5, "maxwell"), (3, "kepler"))


@dataclass
class GpuSet:
    facts: Dict[str, Any]
    devices: List[Dict[str, Any]]
    cc: Tuple[int, int]
    total_bytes: int
    name: str
    architecture: str

    @property
    def indices(self) -> List[int]:
        return [int(d["index"]) for d in self.devices]

    def path(self, i: int, j: int) -> str:
        return str(self.facts["topology"]["matrix"][i][j])

    def socket_of(self, index: int) -> Optional[int]:
        device = next(d for d in self.devices if int(d["index"]) == index)
        return device.get("socket")


def architecture_for_cc(cc: Tuple[int, int]) -> str:
    if cc == (7, 5):
        return "turing"
    if cc >= (8, 9) and cc < (9, 0):
        return "ada"
    for major, name in ARCHITECTURE_BY_CC:
        if cc[0] >= major:
            return name
    return "unknown"


def gpu_set_from_facts(facts: Dict[str, Any], exclude: Sequence[int], decisions: Decisions) -> GpuSet:
    devices = [d for d in facts.get("devices", []) if int(d["index"]) not in set(exclude)]
    if not devices:
        raise PlanRefusal("no GPUs to plan for: the facts list none (after excluding "
                          f"{sorted(exclude) or 'none'}). Check the driver with `bin/revive gpus`.", "GPU facts")
    ccs = {(int(d["cc_major"]), int(d["cc_minor"])) for d in devices}
    totals = {int(d["memory"]["total_bytes"]) - int(d["memory"].get("reserved_bytes") or 0) for d in devices}
    names = sorted({str(d.get("name")) for d in devices})
    if len(ccs) > 1 or len(totals) > 1:
        decisions.warnings.append(
            f"mixed GPUs ({', '.join(names)}): planning for the lowest compute capability and the smallest memory")
    cc = min(ccs)
    for device in devices:
        used = int(device["memory"].get("used_bytes") or 0)
        total = int(device["memory"]["total_bytes"])
        if used > 0.05 * total:
            decisions.warnings.append(
                f"GPU {device['index']}: {used / GiB:.1f} GiB already in use by other processes; vLLM budgets "
                "total x utilisation, not free memory, so it may OOM at start (docs/facts/vllm-volta.md §3.1). "
                "Free the GPU or exclude it.")
    return GpuSet(facts=facts, devices=devices, cc=cc, total_bytes=min(totals), name=names[0],
                  architecture=str(devices[0].get("architecture") or architecture_for_cc(cc)))


def synthetic_gpu_facts(count: int, memory_gib: float, cc: str = "7.0",
                        ram_gib: Optional[int] = None) -> Dict[str, Any]:
    """GPU facts (the shape nvml_facts returns) for a `COUNTxMEMORY_GIB[@CC]` what-if.

    Assumes a PCIe-only server without NVLink: up to 4 GPUs on one socket, more split evenly over two
    sockets (first half on socket 0); PHB between GPUs of a socket, SYS across sockets; P2P supported
    within a socket only; driver 535.104.05 (CUDA 12.2, the field report's driver); memory exactly MEMORY_GIB.
    """
    cc_tuple = parse_cc(cc)
    sockets = 1 if count <= 4 else 2
    per_socket = math.ceil(count / sockets)
    socket_of = [min(i // per_socket, sockets - 1) for i in range(count)]
    matrix = [["X" if i == j else ("PHB" if socket_of[i] == socket_of[j] else "SYS") for j in range(count)]
              for i in range(count)]
    p2p = [["X" if i == j else ("OK" if socket_of[i] == socket_of[j] else "CNS") for j in range(count)]
           for i in range(count)]
    arch = architecture_for_cc(cc_tuple)
    total = int(memory_gib * GiB)
    devices = []
    for i in range(count):
        cpus = list(range(socket_of[i] * 20, socket_of[i] * 20 + 20))
        devices.append({
            "index": i, "name": f"synthetic {arch} GPU ({memory_gib:g} GiB, CC {cc})",
            "pci_bus_id": f"00000000:{0x1A + i:02X}:00.0",
            "memory": {"total_bytes": total, "used_bytes": 0, "free_bytes": total},
            "compute_capability": f"{cc_tuple[0]}.{cc_tuple[1]}", "cc_major": cc_tuple[0], "cc_minor": cc_tuple[1],
            "architecture": arch, "bf16": cc_tuple >= (8, 0), "numa_node": socket_of[i], "socket": socket_of[i],
            "cpus": cpus, "cpu_affinity": f"{cpus[0]}-{cpus[-1]}", "nvlink": None, "processes": [],
        })
    return {
        "simulated": True, "synthetic": True, "driver_version": "535.104.05", "driver_branch": 535,
        "cuda_driver_version": "12.2", "count": count, "devices": devices,
        "topology": {"matrix": matrix, "p2p": {"read": p2p, "write": p2p}},
        "summary": {"nvlink": "none", "sockets": sockets,
                    "gpus_per_socket": {str(s): [i for i in range(count) if socket_of[i] == s]
                                        for s in range(sockets)},
                    "p2p_any": sockets < count, "slowest_path": "SYS" if sockets > 1 else "PHB"},
        "host": {"ram_gib": ram_gib},
        "notes": [f"SYNTHETIC: {count}x {memory_gib:g} GiB CC {cc}; assumed PCIe-only, no NVLink, "
                  f"{sockets} socket(s), PHB within a socket, SYS across"],
    }
