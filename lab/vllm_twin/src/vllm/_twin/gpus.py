"""The GPUs the twin runs on: read through pynvml (in the lab: the fake libnvidia-ml.so.1 and its
profile), made visible the way CUDA does it (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES).

CUDA numbers devices FASTEST_FIRST unless CUDA_DEVICE_ORDER=PCI_BUS_ID; with identical GPUs (every lab
profile) the fastest-first order is the PCI order too. CUDA_VISIBLE_DEVICES lists indices into that
order or GPU UUIDs (a unique prefix is enough); the list ends at the first entry that is invalid or a
duplicate; an empty value or -1 hides every GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from vllm._revive import module_utils

# nvmlGpuP2PCapsIndex_t, as literal ints (module_utils/revive_topology.py P2P_CAPS).
P2P_READ = 0
P2P_NVLINK = 2
P2P_OK = 0
# Memory the driver keeps on a GPU that CUDA does not report in its total when NVML's v2 struct gives no
# `reserved` figure: torch.cuda.mem_get_info on a V100-32GB reports 34089730048 of NVML's 34359738368.
DEFAULT_DRIVER_RESERVED_FRACTION = 1.0 - 34089730048 / 34359738368


class NoGpuError(RuntimeError):
    pass


@dataclass
class Gpu:
    nvml_index: int
    name: str
    uuid: str
    pci_bus_id: str
    compute_capability: Tuple[int, int]
    architecture: str
    nvml_total_bytes: int
    cuda_total_bytes: int
    used_bytes: int          # memory other processes hold (NVML used)


@dataclass
class Topology:
    """Links between the visible GPUs of one tensor-parallel group."""

    slowest_path: str                 # NV / PIX / PXB / PHB / NODE / SYS
    all_nvlink: bool
    all_p2p: bool
    nvlink_connected: bool            # NVLink hops reach every GPU of the group (NCCL rings over NVLink)
    matrix: List[List[str]] = field(default_factory=list)


def _architecture(name: str, cc: Tuple[int, int]) -> str:
    major, minor = cc
    if major >= 9:
        return "hopper"
    if major == 8:
        return "ada" if minor >= 9 else "ampere"
    if major == 7:
        return "turing" if minor >= 5 else "volta"
    if major == 6:
        return "pascal"
    if major == 5:
        return "maxwell"
    return "kepler"


def order_and_visibility(gpus: Sequence[Gpu], environ: Dict[str, str]) -> List[Gpu]:
    """The GPUs CUDA shows this process, in CUDA's order."""
    if environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID":
        ordered = sorted(gpus, key=lambda g: g.pci_bus_id)
    else:
        # Fastest first: higher compute capability first, PCI order among equals.
        ordered = sorted(gpus, key=lambda g: (-g.compute_capability[0], -g.compute_capability[1], g.pci_bus_id))
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(ordered)
    visible: List[Gpu] = []
    for token in [t.strip() for t in spec.split(",")]:
        chosen: Optional[Gpu] = None
        if token.lstrip("-").isdigit():
            index = int(token)
            if 0 <= index < len(ordered):
                chosen = ordered[index]
        elif token.startswith("GPU-"):
            matches = [g for g in ordered if g.uuid.startswith(token)]
            if len(matches) == 1:
                chosen = matches[0]
        if chosen is None or chosen in visible:
            break
        visible.append(chosen)
    return visible


def discover(environ: Dict[str, str]) -> Tuple[List[Gpu], object]:
    """All GPUs NVML reports, then the visible ones in CUDA order. Returns (visible, pynvml module)."""
    try:
        import pynvml
    except ImportError as exc:
        raise NoGpuError("No CUDA GPUs are available") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NoGpuError("No CUDA GPUs are available") from exc
    gpus: List[Gpu] = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(pynvml.nvmlDeviceGetName(handle))
        cc = tuple(int(x) for x in pynvml.nvmlDeviceGetCudaComputeCapability(handle))
        reserved = 0
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)
            reserved = int(getattr(memory, "reserved", 0) or 0)
        except (pynvml.NVMLError, AttributeError, TypeError):
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        total = int(memory.total)
        if not reserved:
            reserved = int(total * DEFAULT_DRIVER_RESERVED_FRACTION)
        gpus.append(Gpu(
            nvml_index=index, name=name, uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId), compute_capability=(cc[0], cc[1]),
            architecture=_architecture(name, (cc[0], cc[1])), nvml_total_bytes=total,
            cuda_total_bytes=total - reserved, used_bytes=max(0, int(memory.used) - reserved)))
    return order_and_visibility(gpus, environ), pynvml


def topology(pynvml, group: Sequence[Gpu]) -> Topology:
    """Slowest path and link kinds between every pair of `group` (NVML indices)."""
    if len(group) <= 1:
        return Topology("X", False, False, False, [["X"]])
    topo = module_utils("revive_topology")
    handles = [pynvml.nvmlDeviceGetHandleByIndex(g.nvml_index) for g in group]
    order = topo.PATH_ORDER
    slowest = "NV"
    all_nvlink = all_p2p = True
    matrix: List[List[str]] = []
    nvlink_pairs = []
    for i, a in enumerate(handles):
        row = []
        for j, b in enumerate(handles):
            if i == j:
                row.append("X")
                continue
            try:
                nvlink = pynvml.nvmlDeviceGetP2PStatus(a, b, P2P_NVLINK) == P2P_OK
            except pynvml.NVMLError:
                nvlink = False
            try:
                p2p = pynvml.nvmlDeviceGetP2PStatus(a, b, P2P_READ) == P2P_OK
            except pynvml.NVMLError:
                p2p = False
            if nvlink:
                cell = "NV"
                nvlink_pairs.append((i, j))
            else:
                level = pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b)
                cell = topo.LEVEL_SYMBOLS.get(int(level), "SYS")
            row.append(cell)
            all_nvlink &= nvlink
            all_p2p &= p2p
            if order.index(cell) > order.index(slowest):
                slowest = cell
        matrix.append(row)
    connected = module_utils("revive_perf").nvlink_reaches_all(range(len(handles)), nvlink_pairs)
    return Topology(slowest, all_nvlink, all_p2p, connected, matrix)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def host_ram_bytes(environ: Dict[str, str]) -> Tuple[int, str]:
    """Host RAM for the swap-space check: the lab profile's `host.ram_gib` when the fake NVML names one
    (the simulated server's RAM), else /proc/meminfo (what psutil would report)."""
    profile = environ.get("FAKE_NVML_PROFILE", "/etc/fake-nvml/profile.json")
    try:
        import json
        with open(profile, encoding="utf-8") as handle:
            ram_gib = json.load(handle)["host"]["ram_gib"]
        return int(float(ram_gib) * (1 << 30)), f"lab profile {profile}"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024, "/proc/meminfo"
    return 0, "unknown"

