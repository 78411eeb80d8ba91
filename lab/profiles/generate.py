#!/usr/bin/env python3
"""Write the lab's GPU hardware profiles (lab/profiles/<name>.json) from one description.

The JSON files are committed and are what the fake libnvidia-ml.so.1 reads; this script only keeps
them consistent (a unit test checks that the committed files equal its output). Run it after editing:

    python3 lab/profiles/generate.py            # rewrite every profile
    python3 lab/profiles/generate.py --check    # exit 1 if a committed profile differs

Values come from docs/facts/nvml.md §2-§5 and the field notes; where a value is a choice rather than a
measurement (bus numbers, serials, subsystem ids) the comment says so.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import uuid
from pathlib import Path
from typing import Any

PROFILES_DIR = Path(__file__).resolve().parent
MIB = 1024 * 1024

# nvmlGpuTopologyLevel_t (docs/facts/nvml.md §1.6)
INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM = 0, 10, 20, 30, 40, 50
# nvmlGpuP2PStatus_t (docs/facts/nvml.md §2.1, topo -p2p legend)
OK, CNS, GNS, TNS, DR, NS, U = 0, 1, 2, 3, 4, 5, 6
LEVEL_SYMBOL = {INTERNAL: "PIX", SINGLE: "PIX", MULTIPLE: "PXB", HOSTBRIDGE: "PHB", NODE: "NODE", SYSTEM: "SYS"}

DRIVER_535 = {"driver_version": "535.104.05", "cuda_driver_version": 12020, "nvml_version": "12.535.104.05"}


def gpu_uuid(profile: str, index: int) -> str:
    # Stable, profile-specific, in NVML's "GPU-xxxxxxxx-xxxx-..." format; not a real card's UUID.
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"revive-lab/{profile}/gpu{index}"))


def serial(base: int, index: int) -> str:
    # 13-digit serials like the V100's "0324917174879" (docs/facts/nvml.md §5); numbers are made up.
    return f"{base + index:013d}"


def idle_health(ecc: bool = True, retired_pages: bool = True, remapped_rows: bool = False) -> dict[str, Any]:
    return {
        "ecc": {
            "current": True,
            "pending": True,
            "errors": {
                "corrected": {"volatile": 0, "aggregate": 0},
                "uncorrected": {"volatile": 0, "aggregate": 0},
            },
        }
        if ecc
        else None,
        # Page retirement is the Kepler..Turing mechanism; Ampere+ answer NOT_SUPPORTED (docs/facts/nvml.md §1.5).
        "retired_pages": {"single_bit": [], "double_bit": [], "pending": False} if retired_pages else None,
        # Row remapping is Ampere+; Volta/Turing answer NOT_SUPPORTED (docs/facts/nvml.md §5).
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
        if remapped_rows
        else None,
    }


def matrix(n: int, cell) -> list[list[int]]:
    return [[cell(i, j) for j in range(n)] for i in range(n)]


def render_expected(levels: list[list[int]], nvlinks: list[list[int]]) -> list[list[str]]:
    """The `nvidia-smi topo -m` GPU block the profile is meant to produce (docs/facts/nvml.md §2.1)."""
    n = len(levels)
    return [
        ["X" if i == j else (f"NV{nvlinks[i][j]}" if nvlinks[i][j] else LEVEL_SYMBOL[levels[i][j]]) for j in range(n)]
        for i in range(n)
    ]


def v100_pcie_8x() -> dict[str, Any]:
    """The field notes' box: 8x V100 32G PCIe, two sockets, one GPU per root port, no NVLink."""
    name = "v100-pcie-8x"
    # Bus numbers: a plausible dual-socket Xeon layout, GPUs 0-3 under socket 0's root ports, 4-7 under socket 1's.
    buses = [0x1A, 0x1B, 0x3D, 0x3E, 0x88, 0x89, 0xB1, 0xB2]
    n = len(buses)
    socket_of = [0, 0, 0, 0, 1, 1, 1, 1]
    affinity = ["0-19,40-59", "20-39,60-79"]  # 2x 20-core Xeon with SMT, as in docs/facts/nvml.md §3b
    gpus = []
    for i, bus in enumerate(buses):
        gpu = {
            "name": "Tesla V100-PCIE-32GB",
            "uuid": gpu_uuid(name, i),
            "serial": serial(324917174879, i),
            "pci_bus_id": f"00000000:{bus:02X}:00.0",
            "pci_device_id": "0x1DB610DE",  # docs/facts/nvml.md §5
            "pci_subsystem_id": "0x124A10DE",  # chosen; no source for the PCIe 32GB board's subsystem id
            "minor_number": i,
            # Newer drivers (R510+) report 32768 MiB for the 32GB V100 (docs/facts/nvml.md §5).
            "memory_total_bytes": 32768 * MIB,
            "memory_used_bytes": 4 * MIB,
            "compute_capability": [7, 0],
            "architecture": "volta",
            "brand": "Tesla",
            "pcie": {"max_gen": 3, "max_width": 16, "cur_gen": 3, "cur_width": 16},
            "cpu_affinity": affinity[socket_of[i]],
            "numa_node": socket_of[i],
            "power_limit_mw": 250000,  # docs/facts/nvml.md §5
            "persistence_mode": True,
            "temperature_c": 33,
            "utilization": {"gpu": 0, "memory": 0},
            **idle_health(),
            "mig_mode": None,  # Ampere+ only
            "nvlink": None,  # PCIe card: NVLink calls answer NOT_SUPPORTED
            "processes": [],
        }
        gpus.append(gpu)
    levels = matrix(n, lambda i, j: 0 if i == j else (HOSTBRIDGE if socket_of[i] == socket_of[j] else SYSTEM))
    same = lambda i, j: socket_of[i] == socket_of[j]  # noqa: E731
    # P2P over one host bridge is offered (the field notes' NCCL tried it and hung); across QPI it is not.
    p2p = {
        "read": matrix(n, lambda i, j: OK if same(i, j) else CNS),
        "write": matrix(n, lambda i, j: OK if same(i, j) else CNS),
        "nvlink": matrix(n, lambda i, j: OK if i == j else NS),
        "atomics": matrix(n, lambda i, j: OK if i == j else NS),
        "pci": matrix(n, lambda i, j: OK if same(i, j) else CNS),
    }
    return {
        "name": name,
        "description": "8x Tesla V100-PCIE-32GB, dual-socket Xeon, GPUs 0-3 on socket 0 and 4-7 on socket 1, "
        "no NVLink: PHB within a socket, SYS across (the field notes' server)",
        **DRIVER_535,
        "host": {"sockets": 2, "cpus_per_socket": 20, "threads_per_core": 2, "ram_gib": 384, "numa_nodes": 2},
        "gpus": gpus,
        "topology": {"common_ancestor": levels},
        "p2p": p2p,
        "expected_topo_m": render_expected(levels, matrix(n, lambda i, j: 0)),
    }


def v100_pcie_8x_degraded() -> dict[str, Any]:
    """The field notes' box with four faults on four different GPUs, each one a preflight reason."""
    profile = copy.deepcopy(v100_pcie_8x())
    profile["name"] = "v100-pcie-8x-degraded"
    for i, gpu in enumerate(profile["gpus"]):
        gpu["uuid"] = gpu_uuid(profile["name"], i)
    gpus = profile["gpus"]
    # GPU 1: a double-bit error retired one page; the retirement waits for the next driver reload.
    gpus[1]["retired_pages"] = {"single_bit": [], "double_bit": [{"address": 0x3F2A1000, "timestamp": 1718000000}],
                                "pending": True}
    # GPU 3: the link trained down to x8 (a reseat or riser problem).
    gpus[3]["pcie"]["cur_width"] = 8
    # GPU 5: uncorrected ECC errors since the driver loaded.
    gpus[5]["ecc"]["errors"]["uncorrected"] = {"volatile": 2, "aggregate": 2}
    gpus[5]["ecc"]["errors"]["corrected"] = {"volatile": 14, "aggregate": 97}
    # GPU 6: someone else's job holds 16 GiB and keeps the GPU busy.
    foreign = 16384 * MIB
    gpus[6]["processes"] = [{"pid": 48213, "used_memory_bytes": foreign, "name": "python3"}]
    gpus[6]["memory_used_bytes"] += foreign
    gpus[6]["utilization"] = {"gpu": 97, "memory": 41}
    gpus[6]["temperature_c"] = 71
    profile["description"] = (
        "v100-pcie-8x with four faults: GPU1 pending retired page (double-bit ECC), GPU3 PCIe link at x8, "
        "GPU5 uncorrected ECC errors, GPU6 a foreign compute process (pid 48213)"
    )
    return profile


# DGX-1 (V100) hybrid cube-mesh: NVLink counts per pair (docs/facts/nvml.md §2.2, go-gpuallocator NewDGX1VoltaNode).
DGX1_NVLINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}


def dgx1_v100() -> dict[str, Any]:
    name = "dgx1-v100"
    # Bus ids 06/07/0A/0B/85/86 from NVIDIA/nccl#671; 89/8A inferred from DGX-1 convention (docs/facts/nvml.md §2.2).
    buses = [0x06, 0x07, 0x0A, 0x0B, 0x85, 0x86, 0x89, 0x8A]
    n = len(buses)
    socket_of = [0, 0, 0, 0, 1, 1, 1, 1]
    affinity = ["0-19,40-59", "20-39,60-79"]
    links = [[0] * n for _ in range(n)]
    for (a, b), count in DGX1_NVLINKS.items():
        links[a][b] = links[b][a] = count
    bus_id = [f"00000000:{bus:02X}:00.0" for bus in buses]
    gpus = []
    for i in range(n):
        # Which link index goes to which peer is not public (docs/facts/nvml.md §2.2); any order with the counts works.
        peers = [j for j in range(n) for _ in range(links[i][j])]
        assert len(peers) == 6, "V100-SXM2 has six NVLinks"
        gpus.append({
            "name": "Tesla V100-SXM2-32GB",
            "uuid": gpu_uuid(name, i),
            "serial": serial(324917174879 + 100, i),
            "pci_bus_id": bus_id[i],
            "pci_device_id": "0x1DB510DE",  # nccl#671
            "pci_subsystem_id": "0x124910DE",  # nccl#671
            "minor_number": i,
            "memory_total_bytes": 32768 * MIB,
            "memory_used_bytes": 4 * MIB,
            "compute_capability": [7, 0],
            "architecture": "volta",
            "brand": "Tesla",
            "pcie": {"max_gen": 3, "max_width": 16, "cur_gen": 3, "cur_width": 16},
            "cpu_affinity": affinity[socket_of[i]],
            "numa_node": socket_of[i],
            "power_limit_mw": 300000,  # docs/facts/nvml.md §5
            "persistence_mode": True,
            "temperature_c": 36,
            "utilization": {"gpu": 0, "memory": 0},
            **idle_health(),
            "mig_mode": None,
            "nvlink": [{"link": k, "state": True, "remote_bus_id": bus_id[peer], "remote_device_type": "gpu",
                        "version": 2} for k, peer in enumerate(peers)],
            "processes": [],
        })

    def level(i: int, j: int) -> int:
        if i == j:
            return 0
        if socket_of[i] != socket_of[j]:
            return SYSTEM
        return SINGLE if i // 2 == j // 2 else HOSTBRIDGE  # PLX pairs (0,1) (2,3) (4,5) (6,7)

    levels = matrix(n, level)
    nv = lambda i, j: i == j or links[i][j] > 0  # noqa: E731
    pcie_p2p = lambda i, j: OK if socket_of[i] == socket_of[j] else CNS  # noqa: E731
    p2p = {
        "read": matrix(n, lambda i, j: OK if nv(i, j) else pcie_p2p(i, j)),
        "write": matrix(n, lambda i, j: OK if nv(i, j) else pcie_p2p(i, j)),
        "nvlink": matrix(n, lambda i, j: OK if nv(i, j) else NS),
        "atomics": matrix(n, lambda i, j: OK if nv(i, j) else NS),
        "pci": matrix(n, pcie_p2p),
    }
    return {
        "name": name,
        "description": "NVIDIA DGX-1 with 8x Tesla V100-SXM2-32GB: NVLink hybrid cube-mesh (NV1/NV2), "
        "PLX pairs, two sockets",
        **DRIVER_535,
        "host": {"sockets": 2, "cpus_per_socket": 20, "threads_per_core": 2, "ram_gib": 512, "numa_nodes": 2},
        "gpus": gpus,
        "topology": {"common_ancestor": levels},
        "p2p": p2p,
        # docs/facts/nvml.md §3b, verbatim (GPU block of the DGX-1 capture)
        "expected_topo_m": [
            ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"],
            ["NV1", "X", "NV2", "NV1", "SYS", "NV2", "SYS", "SYS"],
            ["NV1", "NV2", "X", "NV2", "SYS", "SYS", "NV1", "SYS"],
            ["NV2", "NV1", "NV2", "X", "SYS", "SYS", "SYS", "NV1"],
            ["NV2", "SYS", "SYS", "SYS", "X", "NV1", "NV1", "NV2"],
            ["SYS", "NV2", "SYS", "SYS", "NV1", "X", "NV2", "NV1"],
            ["SYS", "SYS", "NV1", "SYS", "NV1", "NV2", "X", "NV2"],
            ["SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", "X"],
        ],
    }


def t4_4x() -> dict[str, Any]:
    """A single-socket inference box: 4x T4 (Turing, CC 7.5), two per PCIe switch."""
    name = "t4-4x"
    buses = [0x3B, 0x3C, 0x5E, 0x5F]
    n = len(buses)
    gpus = []
    for i, bus in enumerate(buses):
        gpus.append({
            "name": "Tesla T4",
            "uuid": gpu_uuid(name, i),
            "serial": serial(1321020012345, i),
            "pci_bus_id": f"00000000:{bus:02X}:00.0",
            "pci_device_id": "0x1EB810DE",
            "pci_subsystem_id": "0x12A210DE",
            "minor_number": i,
            "memory_total_bytes": 15360 * MIB,
            "memory_used_bytes": 4 * MIB,
            "compute_capability": [7, 5],
            "architecture": "turing",
            "brand": "NVIDIA",
            "pcie": {"max_gen": 3, "max_width": 16, "cur_gen": 3, "cur_width": 16},
            "cpu_affinity": "0-31",
            "numa_node": 0,
            "power_limit_mw": 70000,
            "persistence_mode": True,
            "temperature_c": 30,
            "utilization": {"gpu": 0, "memory": 0},
            **idle_health(),
            "mig_mode": None,
            "nvlink": None,
            "processes": [],
        })
    levels = matrix(n, lambda i, j: 0 if i == j else (SINGLE if i // 2 == j // 2 else HOSTBRIDGE))
    p2p = {
        "read": matrix(n, lambda i, j: OK),
        "write": matrix(n, lambda i, j: OK),
        "nvlink": matrix(n, lambda i, j: OK if i == j else NS),
        "atomics": matrix(n, lambda i, j: OK if i == j else NS),
        "pci": matrix(n, lambda i, j: OK),
    }
    return {
        "name": name,
        "description": "4x Tesla T4 on one socket, two per PCIe switch: PIX within a pair, PHB across",
        **DRIVER_535,
        "host": {"sockets": 1, "cpus_per_socket": 16, "threads_per_core": 2, "ram_gib": 256, "numa_nodes": 1},
        "gpus": gpus,
        "topology": {"common_ancestor": levels},
        "p2p": p2p,
        "expected_topo_m": render_expected(levels, matrix(n, lambda i, j: 0)),
    }


def a100_sxm4_8x() -> dict[str, Any]:
    """DGX A100-style: 8x A100-SXM4-80GB, each with 12 NVLinks into six NVSwitches; two NUMA nodes."""
    name = "a100-sxm4-8x"
    buses = [0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD]  # chosen, DGX A100-like
    switches = [f"00000000:{bus:02X}:00.0" for bus in (0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9)]
    n = len(buses)
    socket_of = [0, 0, 0, 0, 1, 1, 1, 1]
    affinity = ["0-63,128-191", "64-127,192-255"]  # 2x 64-core EPYC with SMT
    gpus = []
    for i, bus in enumerate(buses):
        gpus.append({
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": gpu_uuid(name, i),
            "serial": serial(1562520012345, i),
            "pci_bus_id": f"00000000:{bus:02X}:00.0",
            "pci_device_id": "0x20B210DE",
            "pci_subsystem_id": "0x147F10DE",
            "minor_number": i,
            "memory_total_bytes": 81920 * MIB,
            "memory_used_bytes": 4 * MIB,
            "compute_capability": [8, 0],
            "architecture": "ampere",
            "brand": "NVIDIA",
            "pcie": {"max_gen": 4, "max_width": 16, "cur_gen": 4, "cur_width": 16},
            "cpu_affinity": affinity[socket_of[i]],
            "numa_node": socket_of[i],
            "power_limit_mw": 400000,
            "persistence_mode": True,
            "temperature_c": 31,
            "utilization": {"gpu": 0, "memory": 0},
            **idle_health(retired_pages=False, remapped_rows=True),
            "mig_mode": {"current": False, "pending": False},
            # Two links to each of six NVSwitches; the remote PCI info is the switch (docs/facts/nvml.md §2.1).
            "nvlink": [{"link": k, "state": True, "remote_bus_id": switches[k // 2], "remote_device_type": "switch",
                        "version": 3} for k in range(12)],
            "processes": [],
        })

    def level(i: int, j: int) -> int:
        if i == j:
            return 0
        if socket_of[i] != socket_of[j]:
            return SYSTEM
        return MULTIPLE if i // 2 == j // 2 else NODE

    levels = matrix(n, level)
    # Every pair reaches every other through the switches; P2P over the PCI cap is NS, as measured on H200
    # (docs/facts/nvml.md §6.2).
    p2p = {
        "read": matrix(n, lambda i, j: OK),
        "write": matrix(n, lambda i, j: OK),
        "nvlink": matrix(n, lambda i, j: OK),
        "atomics": matrix(n, lambda i, j: OK),
        "pci": matrix(n, lambda i, j: OK if i == j else NS),
    }
    return {
        "name": name,
        "description": "8x NVIDIA A100-SXM4-80GB on NVSwitch (NV12 between every pair), two NUMA nodes",
        "driver_version": "535.104.05",
        "cuda_driver_version": 12020,
        "nvml_version": "12.535.104.05",
        "host": {"sockets": 2, "cpus_per_socket": 64, "threads_per_core": 2, "ram_gib": 2048, "numa_nodes": 2},
        "gpus": gpus,
        "topology": {"common_ancestor": levels},
        "p2p": p2p,
        "expected_topo_m": [["X" if i == j else "NV12" for j in range(n)] for i in range(n)],
    }


PROFILES = {
    "v100-pcie-8x": v100_pcie_8x,
    "v100-pcie-8x-degraded": v100_pcie_8x_degraded,
    "dgx1-v100": dgx1_v100,
    "t4-4x": t4_4x,
    "a100-sxm4-8x": a100_sxm4_8x,
}


def _format(value: Any, indent: int) -> str:
    """JSON with one line per GPU field and per matrix row, so a profile reads like the machine."""
    compact = json.dumps(value)
    if not isinstance(value, (dict, list)) or len(compact) + indent <= 120:
        return compact
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_format(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return "[\n" + ",\n".join(inner + _format(v, indent + 2) for v in value) + "\n" + pad + "]"


def dumps(profile: dict[str, Any]) -> str:
    return _format(profile, 0) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for name, build in PROFILES.items():
        path = PROFILES_DIR / f"{name}.json"
        text = dumps(build())
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale profiles (run python3 lab/profiles/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
