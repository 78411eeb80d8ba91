"""Probe the local GPUs through unmodified pynvml (nvidia-ml-py) and return its GPU facts (`gpu`).

Used by library/nvml_facts.py (on the node) and by `bin/revive gpus` (locally, without Ansible). Every
NVML call a card may not support yields null plus a note instead of an exception: a read-only probe never fails on
a missing optional capability (docs/facts/nvml.md §1.3). The pynvml traps of docs/facts/nvml.md §0.6 are handled
here. Topology symbols, summary and findings are the pure functions of revive_topology.py.
"""
from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ansible.module_utils.revive_topology import (
    P2P_CAPS,
    assign_sockets,
    cpus_from_mask,
    format_cpu_list,
    p2p_symbols,
    parse_cpu_list,
    summarize,
    topology_matrix,
)

# nvmlDeviceArchitecture_t (pynvml NVML_DEVICE_ARCH_*)
ARCHITECTURES = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere", 8: "ada",
                 9: "hopper", 10: "blackwell"}

# Affinity bitmask sizes: 64 ids per word. 16 words = 1024 CPUs, 4 words = 256 NUMA nodes.
CPU_MASK_WORDS = 16
NODE_MASK_WORDS = 4
NVML_AFFINITY_SCOPE_NODE = 0
NVLINK_DEVICE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}

SYSFS_CPU = Path("/sys/devices/system/cpu")
SYSFS_NODE = Path("/sys/devices/system/node")
SYSFS_PCI = Path("/sys/bus/pci/devices")


class GpuProbeError(Exception):
    """The probe cannot run at all on this host; the message says what, where and how to fix it."""


def architecture_from_cc(major: int, minor: int) -> str:
    """Architecture name from the compute capability, for drivers without nvmlDeviceGetArchitecture."""
    if major == 7:
        return "turing" if minor >= 5 else "volta"
    if major == 8:
        return "ada" if minor >= 9 else "ampere"
    return {3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell", 12: "blackwell"}.get(major, "unknown")


def cuda_version_string(value: int) -> str:
    """12020 -> "12.2" (nvmlSystemGetCudaDriverVersion encodes 1000*major + 10*minor)."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def normalize_bus_id(bus_id: Any) -> Optional[str]:
    """"0000:07:00.0" / "00000000:07:00.0" / bytes -> "00000000:07:00.0" (NVML's upper-case form)."""
    text = _text(bus_id)
    if not text:
        return None
    try:
        domain, bus, rest = text.split(":")
        device, function = rest.split(".")
        return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{int(function, 16):X}"
    except ValueError:
        return text.upper()


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point fd 1 at stderr while NVML runs: the CUDA toolkit stub prints a banner on stdout
    (docs/facts/nvml.md §0.7), which would corrupt an Ansible module's JSON or `gpus --json`."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def loaded_nvml_path() -> Optional[str]:
    """The file the dynamic loader actually mapped for libnvidia-ml (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                if "libnvidia-ml" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        return None
    return None


class _Calls:
    """Runs NVML calls for one scope (a GPU or the system), turning "not there" into None plus a note."""

    def __init__(self, pynvml: Any, notes: list[str]):
        self.nvml = pynvml
        self.notes = notes
        self.unsupported = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)
        # nvidia-ml-py >= 12.550 wraps FunctionNotFound of the process queries in NVMLLibraryMismatchError,
        # which is not an NVMLError (docs/facts/nvml.md §0.6).
        self.mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)

    def get(self, what: str, fn: Callable, *args: Any, quiet: bool = False) -> Any:
        try:
            return fn(*args)
        except self.unsupported as error:
            if not quiet:
                if isinstance(error, self.nvml.NVMLError_FunctionNotFound):
                    self.notes.append(f"{what}: not available in this driver's NVML (FUNCTION_NOT_FOUND)")
                else:
                    self.notes.append(f"{what}: not supported on this GPU (NVML NOT_SUPPORTED)")
            return None
        except self.nvml.NVMLError as error:
            if not quiet:
                self.notes.append(f"{what}: NVML error: {error}")
            return None
        except Exception as error:  # pylint: disable=broad-except
            if self.mismatch is not None and isinstance(error, self.mismatch):
                if not quiet:
                    self.notes.append(f"{what}: driver's NVML lacks the versioned call nvidia-ml-py uses ({error})")
                return None
            raise


class _Said:
    text = ""


@contextmanager
def stderr_captured() -> Iterator[_Said]:
    """Collect what the library prints on stderr (the lab fake names a broken profile there) so an init
    failure can quote it; the text is still passed on to the real stderr afterwards."""
    said = _Said()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            data = sink.read()
            if data:
                os.write(2, data)
            said.text = data.decode("utf-8", "replace").strip()


def _init(pynvml: Any, host: str) -> None:
    with stderr_captured() as said:
        try:
            pynvml.nvmlInit()
            return
        except pynvml.NVMLError as error:
            failure = error
    raise _init_error(pynvml, failure, host, said.text.splitlines()[-1] if said.text else "")


def _init_error(pynvml: Any, error: Exception, host: str, said: str) -> GpuProbeError:
    if isinstance(error, pynvml.NVMLError_LibraryNotFound):
        return GpuProbeError(f"NVIDIA driver not installed or libnvidia-ml.so.1 not on the loader path on {host}")
    path = loaded_nvml_path() or "libnvidia-ml.so.1"
    if isinstance(error, pynvml.NVMLError_DriverNotLoaded):
        if "stubs" in path:
            return GpuProbeError(
                f"{path} on {host} is the CUDA toolkit's link-time stub, not the driver's NVML (it answers "
                "DRIVER_NOT_LOADED): remove the CUDA stubs directory from LD_LIBRARY_PATH / ld.so.conf"
            )
        return GpuProbeError(
            f"NVML on {host} ({path}) reports DRIVER_NOT_LOADED: the NVIDIA kernel module is not loaded "
            "(check `lsmod | grep nvidia` and dmesg), or the loader found the CUDA toolkit's stub "
            "libnvidia-ml.so before the driver's"
        )
    detail = f": the library said: {said}" if said else "; check `nvidia-smi` on that host"
    return GpuProbeError(f"NVML initialisation failed on {host}: {error} (library {path}){detail}")


def _fake_profile(pynvml: Any) -> Optional[str]:
    """The lab fake's profile path, or None for a real driver (which lacks the extra symbol)."""
    try:
        fn = getattr(pynvml.nvmlLib, "reviveFakeNvmlProfilePath")
    except AttributeError:
        return None
    fn.restype = ctypes.c_char_p
    return _text(fn())


def _profile_name(path: Optional[str]) -> Optional[str]:
    """The `name` inside the fake's profile (e.g. "v100-pcie-8x"), for reports; None when unreadable."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            name = json.load(handle).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def _package_of(cpu: int) -> Optional[int]:
    try:
        return int((SYSFS_CPU / f"cpu{cpu}" / "topology" / "physical_package_id").read_text())
    except (OSError, ValueError):
        return None


def _node_cpus(node: int) -> Optional[list[int]]:
    try:
        return parse_cpu_list((SYSFS_NODE / f"node{node}" / "cpulist").read_text())
    except (OSError, ValueError):
        return None


def _sysfs_numa_node(bus_id: Optional[str]) -> Optional[int]:
    """NUMA node of a PCI device from sysfs (-1 there means "no NUMA information")."""
    if not bus_id:
        return None
    domain, rest = bus_id.split(":", 1)
    try:
        value = int((SYSFS_PCI / f"{int(domain, 16):04x}:{rest.lower()}" / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _device(pynvml: Any, handle: Any, index: int, simulated: bool) -> dict:
    notes: list[str] = []
    calls = _Calls(pynvml, notes)
    get = calls.get

    pci = get("pci_info", pynvml.nvmlDeviceGetPciInfo, handle)
    bus_id = normalize_bus_id(pci.busId) if pci is not None else None
    memory = get("memory", pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2, quiet=True)
    reserved = getattr(memory, "reserved", None)
    if memory is None:
        # Drivers before R510 have only the v1 struct (docs/facts/nvml.md §1.5).
        memory = get("memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
    cc = get("compute_capability", pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    cc_major, cc_minor = (int(cc[0]), int(cc[1])) if cc else (None, None)
    arch_code = get("architecture", pynvml.nvmlDeviceGetArchitecture, handle, quiet=True)
    if arch_code in ARCHITECTURES:
        architecture = ARCHITECTURES[arch_code]
    elif cc_major is not None:
        architecture = architecture_from_cc(cc_major, cc_minor)
    else:
        architecture = "unknown"

    mask = get("cpu_affinity", pynvml.nvmlDeviceGetCpuAffinity, handle, CPU_MASK_WORDS)
    cpus = cpus_from_mask(mask) if mask is not None else None
    # "NUMA Affinity" in topo -m: the memory affinity mask; on x86 GetNumaNodeId is NOT_SUPPORTED
    # (docs/facts/nvml.md §2.1).
    node_mask = get("numa_node", pynvml.nvmlDeviceGetMemoryAffinity, handle, NODE_MASK_WORDS,
                    NVML_AFFINITY_SCOPE_NODE)
    nodes = cpus_from_mask(node_mask) if node_mask is not None else []
    if not nodes and not simulated:
        sysfs_node = _sysfs_numa_node(bus_id)
        nodes = [sysfs_node] if sysfs_node is not None else []
    numa_node = nodes[0] if len(nodes) == 1 else None
    if len(nodes) > 1:
        notes.append(f"numa_node: GPU is equally close to NUMA nodes {format_cpu_list(nodes)}")

    temperature = get("temperature", pynvml.nvmlDeviceGetTemperatureV, handle, 0, quiet=True)
    if temperature is None:
        temperature = get("temperature_c", pynvml.nvmlDeviceGetTemperature, handle, 0)
    power = get("power_limit", pynvml.nvmlDeviceGetPowerManagementLimit, handle)
    persistence = get("persistence_mode", pynvml.nvmlDeviceGetPersistenceMode, handle)
    utilization = get("utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)

    ecc_mode = get("ecc", pynvml.nvmlDeviceGetEccMode, handle)
    ecc = {"current": bool(ecc_mode[0]), "pending": bool(ecc_mode[1])} if ecc_mode else None
    ecc_errors: dict[str, Optional[int]] = {}
    for kind, error_type in (("corrected", 0), ("uncorrected", 1)):
        for suffix, counter in (("", 0), ("_aggregate", 1)):
            # Only meaningful with ECC on (nvml.h: "Requires ECC Mode to be enabled"); no note for a known off.
            value = get(f"ecc_errors.{kind}{suffix}", pynvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter,
                        quiet=not (ecc and ecc["current"]))
            ecc_errors[f"{kind}{suffix}"] = None if value is None else int(value)

    retired_pages = None
    single = get("retired_pages", pynvml.nvmlDeviceGetRetiredPages, handle, 0)
    if single is not None:
        double = get("retired_pages", pynvml.nvmlDeviceGetRetiredPages, handle, 1)
        pending = get("retired_pages", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        if double is not None and pending is not None:
            retired_pages = {"single_bit": len(single), "double_bit": len(double), "pending": bool(pending)}
    rows = get("remapped_rows", pynvml.nvmlDeviceGetRemappedRows, handle)
    remapped_rows = (
        {"correctable": int(rows[0]), "uncorrectable": int(rows[1]), "pending": bool(rows[2]), "failure": bool(rows[3])}
        if rows
        else None
    )
    mig = get("mig_mode", pynvml.nvmlDeviceGetMigMode, handle)
    mig_mode = {"current": bool(mig[0]), "pending": bool(mig[1])} if mig else None

    procs = get("processes", pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
    processes = None
    if procs is not None:
        processes = []
        for proc in procs:
            name = get("process_name", pynvml.nvmlSystemGetProcessName, proc.pid, quiet=True)
            processes.append({"pid": int(proc.pid), "used_memory_bytes": proc.usedGpuMemory, "name": _text(name)})

    pcie = {
        "gen_current": get("pcie.gen_current", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "gen_max": get("pcie.gen_max", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        "width_current": get("pcie.width_current", pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        "width_max": get("pcie.width_max", pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
    }
    gpu_numa_id = get("gpu_numa_id", pynvml.nvmlDeviceGetNumaNodeId, handle)

    return {
        "index": index,
        "name": _text(get("name", pynvml.nvmlDeviceGetName, handle)),
        "uuid": _text(get("uuid", pynvml.nvmlDeviceGetUUID, handle)),
        "serial": _text(get("serial", pynvml.nvmlDeviceGetSerial, handle)),
        "pci_bus_id": bus_id,
        "pci_device_id": f"0x{pci.pciDeviceId:08X}" if pci is not None else None,
        "minor_number": get("minor_number", pynvml.nvmlDeviceGetMinorNumber, handle),
        "memory": {
            "total_bytes": int(memory.total),
            "used_bytes": int(memory.used),
            "free_bytes": int(memory.free),
            "reserved_bytes": None if reserved is None else int(reserved),
        }
        if memory is not None
        else None,
        "compute_capability": f"{cc_major}.{cc_minor}" if cc else None,
        "cc_major": cc_major,
        "cc_minor": cc_minor,
        "architecture": architecture,
        "bf16": (cc_major, cc_minor) >= (8, 0) if cc else None,
        "pcie": pcie,
        "numa_node": numa_node,
        "numa_affinity": format_cpu_list(nodes) if nodes else None,
        "gpu_numa_id": gpu_numa_id,
        "cpu_affinity": format_cpu_list(cpus) if cpus else None,
        "cpus": cpus,
        "socket": None,  # filled by probe() once every GPU's affinity is known
        "power_limit_w": power / 1000.0 if power is not None else None,
        "persistence_mode": bool(persistence) if persistence is not None else None,
        "temperature_c": temperature,
        "utilization_gpu_pct": utilization.gpu if utilization is not None else None,
        "utilization_memory_pct": utilization.memory if utilization is not None else None,
        "ecc": ecc,
        "ecc_errors": ecc_errors,
        "retired_pages": retired_pages,
        "remapped_rows": remapped_rows,
        "mig_mode": mig_mode,
        "processes": processes,
        "nvlink": _nvlink(pynvml, calls, handle),
        "notes": notes,
    }


def _nvlink(pynvml: Any, calls: _Calls, handle: Any) -> Optional[dict]:
    """Active links with their remote bus id; None when the card has no NVLink (NOT_SUPPORTED)."""
    if calls.get("nvlink", pynvml.nvmlDeviceGetNvLinkState, handle, 0) is None:
        return None
    links = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        # Past the card's last link NVML answers INVALID_ARGUMENT or NOT_SUPPORTED (docs/facts/nvml.md §1.6).
        state = calls.get("nvlink", pynvml.nvmlDeviceGetNvLinkState, handle, link, quiet=True)
        if not state:
            continue
        remote = calls.get(f"nvlink[{link}].remote", pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        kind = calls.get(f"nvlink[{link}].remote_device_type", pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle,
                         link, quiet=True)
        links.append({
            "link": link,
            "peer_bus_id": normalize_bus_id(remote.busId) if remote is not None else None,
            "peer_index": None,
            "remote_device_type": NVLINK_DEVICE_TYPES.get(kind, "unknown") if kind is not None else None,
        })
    return {"active_links": len(links), "links": links}


def probe(host: Optional[str] = None) -> dict:
    """This machine's GPU facts (`gpu`; docs/architecture.md, glossary).

    Raises GpuProbeError when NVML cannot be used at all."""
    host = host or socket.gethostname()
    try:
        import pynvml  # nvidia-ml-py, pinned in requirements.txt
    except ImportError as error:
        raise GpuProbeError(
            f"pynvml (nvidia-ml-py) is not installed for {sys.executable} on {host}: install the pinned "
            "nvidia-ml-py into the interpreter that runs the probe"
        ) from error
    with stdout_to_stderr():
        _init(pynvml, host)
        try:
            return _probe(pynvml, host)
        finally:
            pynvml.nvmlShutdown()


def _probe(pynvml: Any, host: str) -> dict:
    notes: list[str] = []
    calls = _Calls(pynvml, notes)
    profile = _fake_profile(pynvml)
    if profile:
        notes.append(f"SIMULATED: lab fake NVML (libnvidia-ml.so.1 reading profile {profile}), not a real driver")
    driver = _text(calls.get("driver_version", pynvml.nvmlSystemGetDriverVersion))
    cuda = calls.get("cuda_driver_version", pynvml.nvmlSystemGetCudaDriverVersion)
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
    except pynvml.NVMLError as error:
        raise GpuProbeError(f"NVML on {host} cannot enumerate GPUs: {error}; check `nvidia-smi -L` there") from error
    devices = [_device(pynvml, handle, index, bool(profile)) for index, handle in enumerate(handles)]

    index_of_bus = {device["pci_bus_id"]: device["index"] for device in devices}
    direct = [[0] * count for _ in range(count)]
    switch_links = [0] * count
    for device in devices:
        for link in (device["nvlink"] or {}).get("links", []):
            link["peer_index"] = index_of_bus.get(link["peer_bus_id"])
            if link["peer_index"] is not None:
                direct[device["index"]][link["peer_index"]] += 1
            else:
                switch_links[device["index"]] += 1

    levels: list[list[Optional[int]]] = [[None] * count for _ in range(count)]
    statuses = {cap: [[None] * count for _ in range(count)] for cap in P2P_CAPS}
    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            levels[i][j] = calls.get(f"topology GPU{i}-GPU{j}", pynvml.nvmlDeviceGetTopologyCommonAncestor,
                                     handles[i], handles[j])
            for cap, cap_index in P2P_CAPS.items():
                statuses[cap][i][j] = calls.get(f"p2p.{cap} GPU{i}-GPU{j}", pynvml.nvmlDeviceGetP2PStatus,
                                                handles[i], handles[j], cap_index)
    matrix = topology_matrix(levels, direct, switch_links, statuses["nvlink"])
    p2p = {cap: p2p_symbols(statuses[cap]) for cap in P2P_CAPS}

    assignment = assign_sockets([d["cpus"] for d in devices], [d["numa_node"] for d in devices],
                                _package_of, _node_cpus)
    for device, sock in zip(devices, assignment.sockets):
        device["socket"] = sock
    notes.extend(assignment.notes)
    summary = summarize(matrix, p2p["read"], assignment.sockets)
    summary["socket_rule"] = assignment.rule

    return {
        "simulated": bool(profile),
        "simulated_profile": profile,
        "simulated_profile_name": _profile_name(profile),
        "host": host,
        "library_path": loaded_nvml_path(),
        "driver_version": driver,
        "driver_branch": int(driver.split(".")[0]) if driver and driver.split(".")[0].isdigit() else None,
        "cuda_driver_version": cuda_version_string(cuda) if cuda else None,
        "cuda_driver_version_int": cuda,
        "nvml_version": _text(calls.get("nvml_version", pynvml.nvmlSystemGetNVMLVersion)),
        "count": count,
        "devices": devices,
        "topology": {"matrix": matrix, "p2p": p2p, "common_ancestor": levels},
        "summary": summary,
        "notes": notes,
    }


# Readings that move between two probes of an unchanged machine: they do not make a facts file "changed".
# (Idle PCIe links down-train their generation to save power, so gen_current flaps too.)
VOLATILE_DEVICE_KEYS = ("temperature_c", "utilization_gpu_pct", "utilization_memory_pct", "notes")
VOLATILE_MEMORY_KEYS = ("used_bytes", "free_bytes", "reserved_bytes")


def stable_view(gpu: dict) -> dict:
    """The facts without the volatile readings: what decides whether a saved facts file is out of date."""
    view = json.loads(json.dumps(gpu))
    for device in view.get("devices", []):
        for key in VOLATILE_DEVICE_KEYS:
            device.pop(key, None)
        for key in VOLATILE_MEMORY_KEYS:
            (device.get("memory") or {}).pop(key, None)
        (device.get("pcie") or {}).pop("gen_current", None)
        for process in device.get("processes") or []:
            process.pop("used_memory_bytes", None)
    return view


def facts_file_text(gpu: dict) -> str:
    return json.dumps(gpu, indent=2, sort_keys=True) + "\n"


@dataclass
class FactsFileUpdate:
    changed: bool
    before: str  # current file content ("" when absent)
    after: str   # what the file holds after the update


def plan_facts_file(path: str, gpu: dict) -> FactsFileUpdate:
    """Whether the facts file at `path` needs rewriting: only when the stable facts differ (or it is
    missing/unreadable). Nothing is written here; the caller writes `after` unless in check mode."""
    try:
        with open(path, encoding="utf-8") as handle:
            before = handle.read()
    except FileNotFoundError:
        return FactsFileUpdate(True, "", facts_file_text(gpu))
    try:
        saved = json.loads(before)
    except ValueError:
        return FactsFileUpdate(True, before, facts_file_text(gpu))
    if isinstance(saved, dict) and stable_view(saved) == stable_view(gpu):
        return FactsFileUpdate(False, before, before)
    return FactsFileUpdate(True, before, facts_file_text(gpu))
