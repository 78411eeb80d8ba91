"""GPU topology as `nvidia-smi topo -m` shows it, from NVML answers: pure functions, no NVML import.

revive_nvml.py gathers the raw answers (common-ancestor levels, NVLink peers, P2P status, affinities);
this module turns them into the symbols, the summary and the health findings of the GPU facts, renders the
`topo -m` text, and parses real `nvidia-smi topo -m` output for the device check (tests/device/).
The derivation follows docs/facts/nvml.md §2.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

# nvmlGpuTopologyLevel_t -> topo -m symbol (docs/facts/nvml.md §2.1). INTERNAL (dual-GPU board) prints PIX.
LEVEL_SYMBOLS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# nvmlGpuP2PStatus_t -> `nvidia-smi topo -p2p` symbol (docs/facts/nvml.md §2.1)
P2P_SYMBOLS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}

# nvmlGpuP2PCapsIndex_t, passed as literal ints: pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,)
# (docs/facts/nvml.md §0.6), which ctypes rejects.
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "pci": 4}

# Fastest to slowest, the order the GPU facts' summary.slowest_path uses.
PATH_ORDER = ["NV", "PIX", "PXB", "PHB", "NODE", "SYS"]

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""


def topo_cell(level: Optional[int], direct_links: int, switch_links: int, nvlink_p2p_ok: bool) -> str:
    """One off-diagonal `topo -m` cell (docs/facts/nvml.md §2.1).

    NV# wins over the PCIe level. Direct GPU-GPU links (DGX-1) count the links whose remote PCI bus id is
    the peer GPU. On NVSwitch systems the remote is the switch (or FFFFFFFF:FF:FF.0 on H200), so nvidia-smi
    prints NV<this pair's switch-connected links> when P2P over NVLink is OK: NV12 on A100, NV18 on H200.
    """
    if direct_links > 0:
        return f"NV{direct_links}"
    if nvlink_p2p_ok and switch_links > 0:
        return f"NV{switch_links}"
    if level is None:
        return "N/A"
    return LEVEL_SYMBOLS.get(level, "N/A")


def topology_matrix(
    levels: list[list[Optional[int]]],
    direct_links: list[list[int]],
    switch_links: list[int],
    nvlink_p2p: list[list[Optional[int]]],
) -> list[list[str]]:
    """The GPU block of `nvidia-smi topo -m`: "X" on the diagonal, NV#/PIX/PXB/PHB/NODE/SYS elsewhere."""
    count = len(levels)
    return [
        [
            "X"
            if i == j
            else topo_cell(
                levels[i][j],
                direct_links[i][j],
                min(switch_links[i], switch_links[j]),
                nvlink_p2p[i][j] == 0,
            )
            for j in range(count)
        ]
        for i in range(count)
    ]


def p2p_symbols(statuses: list[list[Optional[int]]]) -> list[list[Optional[str]]]:
    """nvmlGpuP2PStatus_t ints -> `topo -p2p` symbols; "X" on the diagonal, None where NVML failed."""
    return [
        ["X" if i == j else (None if status is None else P2P_SYMBOLS.get(status, "U")) for j, status in enumerate(row)]
        for i, row in enumerate(statuses)
    ]


def cpus_from_mask(words: Iterable[int]) -> list[int]:
    """CPU ids from an NVML affinity bitmask (64 CPUs per word, lowest bit = CPU 0 of the word)."""
    return [64 * index + bit for index, word in enumerate(words) for bit in range(64) if (int(word) >> bit) & 1]


def format_cpu_list(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5", the form nvidia-smi prints under "CPU Affinity"."""
    ranges: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = None
    for cpu in ordered + [None]:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(ranges)


class CpuListError(ValueError):
    """A CPU list with an item that is not N or N-M, or a range that runs backwards."""


def parse_cpu_list(text: Optional[str]) -> list[int]:
    """"0-19,40-59" -> [0..19, 40..59], sorted, each CPU once: the inverse of format_cpu_list.

    Also reads the kernel's sysfs lists (with their newline) and systemd's space-separated form ("3 5-6");
    anything else raises CpuListError (a ValueError) naming the item.
    """
    cpus: set[int] = set()
    for part in re.split(r"[,\s]+", (text or "").strip()):
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise CpuListError(f"CPU list {text!r}: {part!r} is not N or N-M")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high < low:
            raise CpuListError(f"CPU list {text!r}: range {part!r} runs backwards")
        cpus.update(range(low, high + 1))
    return sorted(cpus)


@dataclass
class SocketAssignment:
    sockets: list[Optional[int]]
    rule: str
    notes: list[str] = field(default_factory=list)


def assign_sockets(
    cpu_sets: list[Optional[list[int]]],
    numa_nodes: list[Optional[int]],
    package_of: Callable[[int], Optional[int]],
    node_cpus: Callable[[int], Optional[list[int]]],
) -> SocketAssignment:
    """Which CPU socket each GPU hangs off.

    Rule "sysfs": when every CPU in every GPU's NVML affinity exists on this kernel, a GPU's socket is the
    physical package (/sys/devices/system/cpu/cpuN/topology/physical_package_id) of its CPUs. When a
    GPU's affinity spans packages (some BIOSes/containers report all CPUs), its NUMA node's CPUs decide.
    Rule "affinity-groups": when the affinity names CPUs this kernel does not have (the lab's fake NVML on
    a 2-core machine, where the profile describes a dual-socket server), sockets are numbered by the
    distinct affinity sets in order of their lowest CPU: NVML reports one set per socket/NUMA node, so
    the grouping is the socket split the real machine would have.
    `package_of` / `node_cpus` read sysfs in production; tests pass plain functions.
    """
    known = [cpus for cpus in cpu_sets if cpus]
    all_present = bool(known) and all(package_of(cpu) is not None for cpus in known for cpu in cpus)
    if all_present:
        sockets: list[Optional[int]] = []
        notes: list[str] = []
        for index, (cpus, node) in enumerate(zip(cpu_sets, numa_nodes)):
            packages = {package_of(cpu) for cpu in cpus or []}
            if len(packages) != 1 and node is not None:
                packages = {package_of(cpu) for cpu in node_cpus(node) or []}
            if len(packages) == 1:
                sockets.append(packages.pop())
            else:
                sockets.append(None)
                notes.append(f"GPU {index}: socket unknown: its CPU affinity and NUMA node span several CPU packages")
        return SocketAssignment(sockets, "sysfs", notes)
    groups = sorted({tuple(cpus) for cpus in known}, key=lambda cpus: cpus[0])
    sockets = [groups.index(tuple(cpus)) if cpus else None for cpus in cpu_sets]
    notes = []
    if known:
        notes.append(
            "sockets numbered by distinct GPU CPU-affinity sets: the affinity names CPUs this kernel "
            "does not have (/sys/devices/system/cpu)"
        )
    return SocketAssignment(sockets, "affinity-groups", notes)


def path_class(symbol: str) -> str:
    return "NV" if symbol.startswith("NV") else symbol


def _slowest(matrix: list[list[str]], pairs: list[tuple[int, int]]) -> Optional[str]:
    """The slowest symbol among GPU pairs: SYS over NODE over ... over NV#, fewest links among NV#."""
    symbols = [matrix[i][j] for i, j in pairs if path_class(matrix[i][j]) in PATH_ORDER]
    if not symbols:
        return None

    def rank(symbol: str) -> tuple[int, int]:
        links = int(symbol[2:]) if symbol.startswith("NV") and symbol[2:].isdigit() else 0
        return PATH_ORDER.index(path_class(symbol)), -links

    return max(symbols, key=rank)


def summarize(matrix: list[list[str]], p2p_read: list[list[Optional[str]]], sockets: list[Optional[int]]) -> dict:
    """Contract B's summary: NVLink coverage, GPUs per socket, any P2P, the slowest GPU-GPU path class."""
    pairs = [(i, j) for i in range(len(matrix)) for j in range(len(matrix)) if i != j]
    nvlinked = sum(1 for i, j in pairs if matrix[i][j].startswith("NV"))
    if not pairs or nvlinked == 0:
        nvlink = "none"
    elif nvlinked == len(pairs):
        nvlink = "full"
    else:
        nvlink = "partial"
    per_socket: dict[str, list[int]] = {}
    for index, sock in enumerate(sockets):
        if sock is not None:
            per_socket.setdefault(str(sock), []).append(index)
    return {
        "nvlink": nvlink,
        "sockets": len(per_socket),
        "gpus_per_socket": dict(sorted(per_socket.items(), key=lambda item: int(item[0]))),
        "p2p_any": any(p2p_read[i][j] == "OK" for i, j in pairs),
        "slowest_path": _slowest(matrix, pairs),
    }


def render_topo_m(gpu: dict) -> str:
    """`nvidia-smi topo -m` laid out as the real tool prints it (tab-separated, " X " on the diagonal)."""
    devices = gpu["devices"]
    matrix = gpu["topology"]["matrix"]
    lines = ["\t" + "".join(f"GPU{i}\t" for i in range(len(devices))) + "CPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for i, device in enumerate(devices):
        cells = "\t".join(" X " if cell == "X" else cell for cell in matrix[i])
        numa = device.get("numa_affinity") or "N/A"
        gpu_numa = "N/A" if device.get("gpu_numa_id") is None else str(device["gpu_numa_id"])
        lines.append(f"GPU{i}\t{cells}\t{device.get('cpu_affinity') or 'N/A'}\t{numa}\t\t{gpu_numa}")
    return "\n".join(lines) + "\n\n" + LEGEND + "\n"


@dataclass
class TopoM:
    """Parsed `nvidia-smi topo -m`: every row (GPUs and NICs) with its cells and trailing columns."""
    columns: list[str]
    rows: dict[str, dict]

    def gpu_labels(self) -> list[str]:
        return sorted((c for c in self.columns if re.fullmatch(r"GPU\d+", c)), key=lambda c: int(c[3:]))

    def gpu_matrix(self) -> list[list[str]]:
        gpus = self.gpu_labels()
        return [[self.rows[a]["cells"].get(b) for b in gpus] for a in gpus]


_TRAILING = ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def parse_topo_m(text: str) -> TopoM:
    """Parse real `nvidia-smi topo -m` output: GPU and NIC rows/columns, then the legend (ignored).

    Tolerant of tabs or spaces, NIC columns (mlx5_0, NIC0), missing trailing columns on NIC rows, old
    drivers without "NUMA Affinity"/"GPU NUMA ID", and anything after "Legend:".
    """
    # Real nvidia-smi underlines the header with ANSI escapes even when stdout is a pipe (seen on R580).
    lines = _ANSI_ESCAPE.sub("", text).splitlines()
    header_at = next((n for n, line in enumerate(lines) if re.search(r"(^|\s)GPU0(\s|$)", line)), None)
    if header_at is None:
        raise ValueError("no `nvidia-smi topo -m` header (a line with GPU0) found")
    header = lines[header_at]
    trailing = [name for name in _TRAILING if name in header]
    for name in trailing:
        header = header.replace(name, "")
    columns = header.split()
    rows: dict[str, dict] = {}
    for line in lines[header_at + 1:]:
        if line.strip().startswith("Legend") or line.strip().startswith("NIC Legend"):
            break
        tokens = line.split()
        if not tokens or tokens[0] not in columns:
            continue
        label, rest = tokens[0], tokens[1:]
        cells = dict(zip(columns, rest[: len(columns)]))
        extra = rest[len(columns):]
        row = {"cells": cells}
        for index, name in enumerate(trailing):
            row[name] = extra[index] if index < len(extra) else None
        rows[label] = row
    return TopoM(columns, rows)


@dataclass
class Finding:
    gpu: int
    pci_bus_id: Optional[str]
    check: str
    severity: str  # "error": unfit to serve until fixed; "warning": works, but fix it
    message: str

    def as_dict(self) -> dict:
        return {
            "gpu": self.gpu,
            "pci_bus_id": self.pci_bus_id,
            "check": self.check,
            "severity": self.severity,
            "message": self.message,
        }


def health_findings(gpu: dict) -> list[Finding]:
    """Health problems visible in the facts, one Finding per GPU and problem, in GPU order.

    The preflight role decides what is fatal; these are what `bin/revive gpus` shows a person.
    """
    findings: list[Finding] = []
    for device in gpu["devices"]:
        index, bus = device["index"], device.get("pci_bus_id")

        def add(check: str, severity: str, message: str) -> None:
            findings.append(Finding(index, bus, check, severity, message))

        pages = device.get("retired_pages")
        if pages and pages.get("pending"):
            add("retired_pages_pending", "error",
                f"page retirement pending ({pages['single_bit']} single-bit, {pages['double_bit']} double-bit "
                "retired): reload the driver or reboot, then re-check; if it recurs, replace the card")
        rows = device.get("remapped_rows")
        if rows and (rows.get("pending") or rows.get("failure")):
            what = "row remapping failed" if rows.get("failure") else "row remapping pending"
            add("remapped_rows", "error", f"{what} ({rows['uncorrectable']} uncorrectable rows): reset the GPU "
                "or reboot; a failure means the card must be replaced")
        errors = device.get("ecc_errors") or {}
        volatile, aggregate = errors.get("uncorrected"), errors.get("uncorrected_aggregate")
        if (volatile or 0) > 0:
            add("ecc_uncorrected", "error",
                f"{volatile} uncorrected ECC errors since the driver loaded ({aggregate} lifetime): results on "
                "this GPU cannot be trusted; drain it and check `nvidia-smi -q -d ECC`")
        pcie = device.get("pcie") or {}
        if None not in (pcie.get("width_current"), pcie.get("width_max")) and pcie["width_current"] < pcie["width_max"]:
            add("pcie_width", "error",
                f"PCIe link at x{pcie['width_current']} of x{pcie['width_max']}: halves host<->GPU bandwidth; "
                "reseat the card or check the riser/slot")
        if None not in (pcie.get("gen_current"), pcie.get("gen_max")) and pcie["gen_current"] < pcie["gen_max"]:
            add("pcie_gen", "warning",
                f"PCIe link at gen{pcie['gen_current']} of gen{pcie['gen_max']}: idle links may down-train to save "
                "power; re-check under load before acting")
        for process in device.get("processes") or []:
            used = process.get("used_memory_bytes")
            size = "unknown memory" if used is None else f"{used // (1024 * 1024)} MiB"
            name = f" ({process['name']})" if process.get("name") else ""
            add("foreign_process", "error",
                f"compute process pid {process['pid']}{name} holds {size}: stop it or move it before serving")
        if device.get("persistence_mode") is False:
            add("persistence_off", "warning",
                "persistence mode off: the driver re-initialises the GPU on every open (slow starts); "
                "enable nvidia-persistenced")
    return findings
