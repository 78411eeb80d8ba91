"""The lab's fake libnvidia-ml.so.1 driven by unmodified pynvml, one fresh subprocess per scenario
(pynvml loads the library once per process, docs/facts/nvml.md §1.1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))

from labctl.shape import known_profiles, profile_path  # noqa: E402

PROFILES_DIR = REPO / "lab" / "profiles"
PROFILES = known_profiles(PROFILES_DIR)
MIB = 1024 * 1024


@pytest.fixture(scope="session")
def fakenvml() -> Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "lab" / "fakenvml")], check=True, capture_output=True)
    return REPO / "lab" / "fakenvml"


def run_python(code: str, fakenvml: Path, profile: str | Path, **env: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ, LD_LIBRARY_PATH=str(fakenvml), FAKE_NVML_PROFILE=str(profile),
                       FAKE_NVML_UTILIZATION=env.pop("FAKE_NVML_UTILIZATION", "/nonexistent/utilization.json"), **env)
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=60)


def load_profile(name: str) -> dict:
    return json.loads((PROFILES_DIR / f"{name}.json").read_text())


# Everything pynvml returns for a machine, as JSON on stdout (any stray byte from the library breaks the parse).
DUMP = r"""
import json, pynvml as n
def attempt(fn, *args):
    try:
        value = fn(*args)
    except n.NVMLError as error:
        return {"error": type(error).__name__}
    if isinstance(value, bytes):
        value = value.decode()
    return value
n.nvmlInit()
out = {"driver": n.nvmlSystemGetDriverVersion(), "cuda": n.nvmlSystemGetCudaDriverVersion(),
       "cuda_v2": n.nvmlSystemGetCudaDriverVersion_v2(), "nvml": n.nvmlSystemGetNVMLVersion(),
       "count": n.nvmlDeviceGetCount(), "gpus": []}
handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(out["count"])]
for i, h in enumerate(handles):
    pci = n.nvmlDeviceGetPciInfo(h)
    m1 = n.nvmlDeviceGetMemoryInfo(h)
    m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    util = n.nvmlDeviceGetUtilizationRates(h)
    g = {
        "name": n.nvmlDeviceGetName(h), "uuid": n.nvmlDeviceGetUUID(h), "serial": n.nvmlDeviceGetSerial(h),
        "index": n.nvmlDeviceGetIndex(h), "minor": n.nvmlDeviceGetMinorNumber(h),
        "brand": n.nvmlDeviceGetBrand(h), "arch": n.nvmlDeviceGetArchitecture(h),
        "bus_id": pci.busId, "bus_id_legacy": pci.busIdLegacy, "domain": pci.domain, "bus": pci.bus,
        "device": pci.device, "pci_device_id": pci.pciDeviceId, "pci_subsystem_id": pci.pciSubSystemId,
        "mem_v1": [m1.total, m1.used, m1.free], "mem_v2": [m2.total, m2.reserved, m2.used, m2.free],
        "cc": list(n.nvmlDeviceGetCudaComputeCapability(h)),
        "pcie": [n.nvmlDeviceGetMaxPcieLinkGeneration(h), n.nvmlDeviceGetMaxPcieLinkWidth(h),
                 n.nvmlDeviceGetCurrPcieLinkGeneration(h), n.nvmlDeviceGetCurrPcieLinkWidth(h),
                 n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h)],
        "cpu_mask": [int(w) for w in n.nvmlDeviceGetCpuAffinity(h, 16)],
        "cpu_mask_socket": [int(w) for w in n.nvmlDeviceGetCpuAffinityWithinScope(h, 16, 1)],
        "node_mask": [int(w) for w in n.nvmlDeviceGetMemoryAffinity(h, 1, 0)],
        "numa_id": attempt(n.nvmlDeviceGetNumaNodeId, h),
        "power": [n.nvmlDeviceGetPowerManagementLimit(h), n.nvmlDeviceGetEnforcedPowerLimit(h)],
        "persistence": n.nvmlDeviceGetPersistenceMode(h),
        "temperature": [n.nvmlDeviceGetTemperature(h, 0), n.nvmlDeviceGetTemperatureV(h, 0)],
        "util": [util.gpu, util.memory],
        "ecc_mode": attempt(n.nvmlDeviceGetEccMode, h),
        "ecc": [[attempt(n.nvmlDeviceGetTotalEccErrors, h, t, c) for c in (0, 1)] for t in (0, 1)],
        "retired": [attempt(n.nvmlDeviceGetRetiredPages, h, 0), attempt(n.nvmlDeviceGetRetiredPages_v2, h, 1)],
        "retired_pending": attempt(n.nvmlDeviceGetRetiredPagesPendingStatus, h),
        "remapped": attempt(n.nvmlDeviceGetRemappedRows, h),
        "mig": attempt(n.nvmlDeviceGetMigMode, h),
        "processes": [[p.pid, p.usedGpuMemory, n.nvmlSystemGetProcessName(p.pid)]
                      for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
        "nvlink_state0": attempt(n.nvmlDeviceGetNvLinkState, h, 0),
        "links": [],
    }
    if not isinstance(g["nvlink_state0"], dict):
        link = 0
        while True:
            state = attempt(n.nvmlDeviceGetNvLinkState, h, link)
            if isinstance(state, dict):
                g["link_past_end"] = state
                break
            g["links"].append([state, n.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId,
                               n.nvmlDeviceGetNvLinkRemoteDeviceType(h, link), n.nvmlDeviceGetNvLinkVersion(h, link),
                               [n.nvmlDeviceGetNvLinkCapability(h, link, c) for c in range(6)]])
            link += 1
    out["gpus"].append(g)
out["ancestor"] = [[n.nvmlDeviceGetTopologyCommonAncestor(a, b) for b in handles] for a in handles]
out["p2p"] = [[[n.nvmlDeviceGetP2PStatus(a, b, cap) for b in handles] for a in handles] for cap in range(5)]
out["nearest_hostbridge"] = [len(n.nvmlDeviceGetTopologyNearestGpus(h, 30)) for h in handles]
n.nvmlShutdown()
print(json.dumps(out))
"""

ARCH = {"volta": 5, "turing": 6, "ampere": 7}
BRAND = {"Tesla": 2, "NVIDIA": 14}


def cpus_of(mask: list[int]) -> list[int]:
    return [64 * w + b for w, word in enumerate(mask) for b in range(64) if word >> b & 1]


def expand(cpu_list: str) -> list[int]:
    cpus = []
    for part in cpu_list.split(","):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


@pytest.mark.parametrize("name", PROFILES)
def test_pynvml_reports_the_profile_exactly(fakenvml: Path, name: str) -> None:
    profile = load_profile(name)
    result = run_python(DUMP, fakenvml, profile_path(PROFILES_DIR, name))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    seen = json.loads(result.stdout)
    assert (seen["driver"], seen["nvml"]) == (profile["driver_version"], profile["nvml_version"])
    assert seen["cuda"] == seen["cuda_v2"] == profile["cuda_driver_version"]
    assert seen["count"] == len(profile["gpus"])
    for index, (got, want) in enumerate(zip(seen["gpus"], profile["gpus"])):
        assert (got["name"], got["uuid"], got["serial"]) == (want["name"], want["uuid"], want["serial"])
        assert (got["index"], got["minor"]) == (index, want["minor_number"])
        assert got["arch"] == ARCH[want["architecture"]] and got["brand"] == BRAND[want["brand"]]
        assert got["bus_id"] == want["pci_bus_id"]
        assert got["bus_id_legacy"] == want["pci_bus_id"][4:]
        assert (got["domain"], got["bus"], got["device"]) == (0, int(want["pci_bus_id"][9:11], 16), 0)
        assert got["pci_device_id"] == int(want["pci_device_id"], 16)
        assert got["pci_subsystem_id"] == int(want["pci_subsystem_id"], 16)
        total, used = want["memory_total_bytes"], want["memory_used_bytes"]
        assert got["mem_v1"] == [total, used, total - used]
        assert got["mem_v2"] == [total, 0, used, total - used]
        assert got["cc"] == want["compute_capability"]
        pcie = want["pcie"]
        assert got["pcie"] == [pcie["max_gen"], pcie["max_width"], pcie["cur_gen"], pcie["cur_width"], pcie["max_gen"]]
        assert cpus_of(got["cpu_mask"]) == expand(want["cpu_affinity"]) == cpus_of(got["cpu_mask_socket"])
        assert cpus_of(got["node_mask"]) == [want["numa_node"]]
        assert got["numa_id"] == {"error": "NVMLError_NotSupported"}  # x86: nvidia-smi prints N/A
        assert got["power"] == [want["power_limit_mw"]] * 2
        assert got["persistence"] == int(want["persistence_mode"])
        assert got["temperature"] == [want["temperature_c"]] * 2
        assert got["util"] == [want["utilization"]["gpu"], want["utilization"]["memory"]]
        errors = want["ecc"]["errors"]
        assert got["ecc_mode"] == [1, 1]
        assert got["ecc"] == [[errors[kind]["volatile"], errors[kind]["aggregate"]] for kind in ("corrected", "uncorrected")]
        if want["retired_pages"] is None:
            assert got["retired"] == [{"error": "NVMLError_NotSupported"}] * 2
            assert got["retired_pending"] == {"error": "NVMLError_NotSupported"}
        else:
            pages = want["retired_pages"]
            assert got["retired"][0] == pages["single_bit"]
            assert got["retired"][1] == pages["double_bit"]
            assert got["retired_pending"] == int(pages["pending"])
        rows = want["remapped_rows"]
        assert got["remapped"] == ({"error": "NVMLError_NotSupported"} if rows is None else
                                   [rows["correctable"], rows["uncorrectable"], int(rows["pending"]), int(rows["failure"])])
        mig = want["mig_mode"]
        assert got["mig"] == ({"error": "NVMLError_NotSupported"} if mig is None else [int(mig["current"]), int(mig["pending"])])
        assert got["processes"] == [[p["pid"], p["used_memory_bytes"], p["name"]] for p in want["processes"]]
        if want["nvlink"] is None:
            assert got["nvlink_state0"] == {"error": "NVMLError_NotSupported"}
        else:
            types = {"gpu": 0, "switch": 2}
            assert got["links"] == [[int(link["state"]), link["remote_bus_id"], types[link["remote_device_type"]],
                                     link["version"], [1, 1, 1, 1, 0, 1]] for link in want["nvlink"]]
            assert got["link_past_end"] == {"error": "NVMLError_InvalidArgument"}
    assert seen["ancestor"] == profile["topology"]["common_ancestor"]
    assert seen["p2p"] == [profile["p2p"][cap] for cap in ("read", "write", "nvlink", "atomics", "pci")]
    levels = profile["topology"]["common_ancestor"]
    assert seen["nearest_hostbridge"] == [sum(1 for j, level in enumerate(row) if j != i and level <= 30)
                                          for i, row in enumerate(levels)]


PROTOCOLS = r"""
import ctypes, json
lib = ctypes.CDLL("libnvidia-ml.so.1")
out = {}
out["count_before_init"] = lib.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint()))
out["name_before_init"] = lib.nvmlDeviceGetName(None, ctypes.create_string_buffer(96), 96)
out["shutdown_before_init"] = lib.nvmlShutdown()
out["init"] = [lib.nvmlInitWithFlags(0), lib.nvmlInit_v2()]
h = [ctypes.c_void_p() for _ in range(8)]
for i in range(8):
    lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h[i]))
out["handle_out_of_range"] = lib.nvmlDeviceGetHandleByIndex_v2(8, ctypes.byref(ctypes.c_void_p()))
out["bogus_handle"] = lib.nvmlDeviceGetName(ctypes.c_void_p(8), ctypes.create_string_buffer(96), 96)
name = "Tesla V100-PCIE-32GB"
for fn, value in (("nvmlDeviceGetName", name), ("nvmlDeviceGetUUID", None), ("nvmlDeviceGetSerial", "0324917174879")):
    buf = ctypes.create_string_buffer(96)
    full = getattr(lib, fn)(h[0], buf, 96)
    length = len(buf.value)
    out[fn] = [full, getattr(lib, fn)(h[0], ctypes.create_string_buffer(96), length),
               getattr(lib, fn)(h[0], ctypes.create_string_buffer(96), length + 1), buf.value.decode()]
out["driver_short"] = lib.nvmlSystemGetDriverVersion(ctypes.create_string_buffer(80), 10)
count = ctypes.c_uint(0)
out["dbe_first"] = [lib.nvmlDeviceGetRetiredPages(h[1], 1, ctypes.byref(count), None), count.value]
pages = (ctypes.c_ulonglong * 4)(); stamps = (ctypes.c_ulonglong * 4)(); count = ctypes.c_uint(4)
out["dbe_second"] = [lib.nvmlDeviceGetRetiredPages_v2(h[1], 1, ctypes.byref(count), pages, stamps), count.value,
                     pages[0], stamps[0]]
count = ctypes.c_uint(0)
out["sbe_none"] = [lib.nvmlDeviceGetRetiredPages(h[1], 0, ctypes.byref(count), None), count.value]
out["bad_cause"] = lib.nvmlDeviceGetRetiredPages(h[1], 2, ctypes.byref(ctypes.c_uint(0)), None)
class V1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]
count = ctypes.c_uint(0)
out["procs_first"] = [lib.nvmlDeviceGetComputeRunningProcesses_v3(h[6], ctypes.byref(count), None), count.value]
count = ctypes.c_uint(0)
out["procs_idle"] = [lib.nvmlDeviceGetComputeRunningProcesses_v3(h[0], ctypes.byref(count), None), count.value]
v1 = (V1 * 2)(); count = ctypes.c_uint(2)
out["procs_v1"] = [lib.nvmlDeviceGetComputeRunningProcesses(h[6], ctypes.byref(count), v1), count.value,
                   v1[0].pid, v1[0].usedGpuMemory, ctypes.sizeof(V1)]
class Mem2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
mem = Mem2(version=0x01000028)
out["mem_v2_wrong_version"] = lib.nvmlDeviceGetMemoryInfo_v2(h[0], ctypes.byref(mem))
class Temp(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("sensorType", ctypes.c_uint), ("temperature", ctypes.c_int)]
out["temp_v_wrong_version"] = lib.nvmlDeviceGetTemperatureV(h[0], ctypes.byref(Temp(version=1)))
out["temp_bad_sensor"] = lib.nvmlDeviceGetTemperature(h[0], 1, ctypes.byref(ctypes.c_uint()))
out["nvlink_pcie"] = lib.nvmlDeviceGetNvLinkState(h[0], 0, ctypes.byref(ctypes.c_uint()))
out["p2p_bad_index"] = lib.nvmlDeviceGetP2PStatus(h[0], h[1], 5, ctypes.byref(ctypes.c_uint()))
out["ecc_bad_type"] = lib.nvmlDeviceGetTotalEccErrors(h[0], 2, 0, ctypes.byref(ctypes.c_ulonglong()))
out["process_name_unknown"] = lib.nvmlSystemGetProcessName(1, ctypes.create_string_buffer(64), 64)
by_bus = ctypes.c_void_p()
out["by_bus_id"] = [lib.nvmlDeviceGetHandleByPciBusId_v2(b"0000:3E:00.0", ctypes.byref(by_bus)), by_bus.value == h[3].value]
lib.nvmlErrorString.restype = ctypes.c_char_p
out["error_strings"] = [lib.nvmlErrorString(code).decode() for code in (1, 3, 7, 999)]
# Ref-counted: two inits above, so the first shutdown keeps the library up, the second brings it down.
out["shutdowns"] = [lib.nvmlShutdown(), lib.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint())),
                    lib.nvmlShutdown(), lib.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint())),
                    lib.nvmlDeviceGetName(h[0], ctypes.create_string_buffer(96), 96), lib.nvmlShutdown()]
lib.reviveFakeNvmlProfilePath.restype = ctypes.c_char_p
out["profile_path"] = lib.reviveFakeNvmlProfilePath().decode()
print(json.dumps(out))
"""


def test_call_protocols_match_the_real_library(fakenvml: Path) -> None:
    profile = profile_path(PROFILES_DIR, "v100-pcie-8x-degraded")
    result = run_python(PROTOCOLS, fakenvml, profile)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    uninitialized, invalid, not_supported, insufficient, mismatch = 1, 2, 3, 7, 25
    assert out["count_before_init"] == out["name_before_init"] == out["shutdown_before_init"] == uninitialized
    assert out["init"] == [0, 0]
    assert out["handle_out_of_range"] == out["bogus_handle"] == invalid
    # A buffer of exactly len(value) has no room for the NUL: INSUFFICIENT_SIZE; one more byte fits.
    assert out["nvmlDeviceGetName"] == [0, insufficient, 0, "Tesla V100-PCIE-32GB"]
    assert out["nvmlDeviceGetUUID"][:3] == [0, insufficient, 0] and out["nvmlDeviceGetUUID"][3].startswith("GPU-")
    assert out["nvmlDeviceGetSerial"] == [0, insufficient, 0, "0324917174879"]
    assert out["driver_short"] == insufficient
    assert out["dbe_first"] == [insufficient, 1]
    assert out["dbe_second"] == [0, 1, 0x3F2A1000, 1718000000]
    assert out["sbe_none"] == [0, 0]
    assert out["bad_cause"] == invalid
    assert out["procs_first"] == [insufficient, 1]
    assert out["procs_idle"] == [0, 0]
    assert out["procs_v1"] == [0, 1, 48213, 16384 * MIB, 16]
    assert out["mem_v2_wrong_version"] == out["temp_v_wrong_version"] == mismatch
    assert out["temp_bad_sensor"] == invalid
    assert out["nvlink_pcie"] == not_supported
    assert out["p2p_bad_index"] == out["ecc_bad_type"] == invalid
    assert out["process_name_unknown"] == 6  # NOT_FOUND
    assert out["by_bus_id"] == [0, True]
    assert out["error_strings"] == ["Uninitialized", "Not Supported", "Insufficient Size", "Unknown Error"]
    assert out["shutdowns"] == [0, 0, 0, uninitialized, uninitialized, uninitialized]
    assert out["profile_path"] == str(profile)
    assert result.stderr == ""


INIT_ONLY = r"""
import pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as error:
    raise SystemExit(f"{type(error).__name__}")
raise SystemExit("init succeeded")
"""


def broken_profile(tmp_path: Path, mutate) -> Path:
    profile = load_profile("t4-4x")
    mutate(profile)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(profile))
    return path


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "cannot read GPU profile {path}: No such file or directory (set FAKE_NVML_PROFILE"),
        ("not-json", "GPU profile {path} is not valid JSON: "),
        ("wrong-type", "GPU profile {path}: gpus[2].pcie.cur_width: expected an integer"),
        ("missing-key", "GPU profile {path}: gpus[0].uuid: missing (expected a string)"),
        ("matrix-size", "GPU profile {path}: p2p.atomics: expected a 4x4 matrix (one row per GPU)"),
        ("bad-affinity", "GPU profile {path}: gpus[1].cpu_affinity: \"0-x\" is not a CPU list"),
        ("bad-arch", "GPU profile {path}: gpus[3].architecture: unknown value \"vulta\" (known: \"kepler\""),
    ],
)
def test_malformed_profile_fails_init_with_one_stderr_line(fakenvml: Path, tmp_path: Path, case: str,
                                                           expected: str) -> None:
    mutations = {
        "wrong-type": lambda p: p["gpus"][2]["pcie"].update(cur_width="16"),
        "missing-key": lambda p: p["gpus"][0].pop("uuid"),
        "matrix-size": lambda p: p["p2p"]["atomics"].pop(),
        "bad-affinity": lambda p: p["gpus"][1].update(cpu_affinity="0-x"),
        "bad-arch": lambda p: p["gpus"][3].update(architecture="vulta"),
    }
    if case == "missing":
        path = tmp_path / "absent.json"
    elif case == "not-json":
        path = tmp_path / "broken.json"
        path.write_text('{"gpus": [')
    else:
        path = broken_profile(tmp_path, mutations[case])
    result = run_python(INIT_ONLY, fakenvml, path)
    # SystemExit with a message: the message goes to stderr after the library's line.
    lines = result.stderr.splitlines()
    assert lines[-1] == "NVMLError_Unknown"
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("fakenvml: " + expected.format(path=path)), lines[0]
    assert result.stdout == ""


UTILIZATION = r"""
import json, os, sys, pynvml
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
read = lambda: [[u.gpu, u.memory] for u in map(pynvml.nvmlDeviceGetUtilizationRates, handles)]
first = read()
path = os.environ["FAKE_NVML_UTILIZATION"]
with open(path + ".tmp", "w") as f:
    f.write(sys.argv[1])
os.replace(path + ".tmp", path)
second = read()
print(json.dumps([first, second, read()]))
"""


def test_utilization_override_file_is_read_on_every_call(fakenvml: Path, tmp_path: Path) -> None:
    path = tmp_path / "utilization.json"
    path.write_text(json.dumps({"2": {"gpu": 55, "memory": 12}, "0": {"gpu": 7}}))
    code = UTILIZATION.replace("sys.argv[1]", repr(json.dumps({"1": {"gpu": 99, "memory": 98}})))
    result = run_python(code, fakenvml, profile_path(PROFILES_DIR, "v100-pcie-8x-degraded"),
                        FAKE_NVML_UTILIZATION=str(path))
    assert result.returncode == 0, result.stderr
    first, second, third = json.loads(result.stdout)
    assert first == [[7, 0], [0, 0], [55, 12]]  # GPU0 only gpu overridden, GPU1 from the profile
    assert second == third == [[0, 0], [99, 98], [0, 0]]  # the rewritten file, without a re-init
    assert result.stderr == ""


def test_unparsable_utilization_file_falls_back_to_the_profile_with_one_warning(fakenvml: Path,
                                                                                  tmp_path: Path) -> None:
    path = tmp_path / "utilization.json"
    path.write_text("{not json")
    code = ("import pynvml, json; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(6); "
            "print(json.dumps([pynvml.nvmlDeviceGetUtilizationRates(h).gpu for _ in range(3)]))")
    result = run_python(code, fakenvml, profile_path(PROFILES_DIR, "v100-pcie-8x-degraded"),
                        FAKE_NVML_UTILIZATION=str(path))
    assert json.loads(result.stdout) == [97, 97, 97]
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"fakenvml: utilization override {path} ignored: ")


def test_library_has_the_soname_and_every_symbol_the_probe_needs(fakenvml: Path) -> None:
    library = fakenvml / "libnvidia-ml.so.1"
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libnvidia-ml.so.1]" in dynamic
    listing = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                             check=True).stdout
    symbols = {line.split()[-1] for line in listing.splitlines() if line.strip()}
    required = {  # docs/facts/nvml.md §0.2, §0.5, §1.5
        "nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetNVMLVersion",
        "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
        "nvmlDeviceGetSerial", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetArchitecture", "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetP2PStatus", "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkCapability", "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetCpuAffinity", "nvmlDeviceGetCpuAffinityWithinScope", "nvmlDeviceGetMemoryAffinity",
        "nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPages_v2", "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMigMode",
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetIndex", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetBrand",
        "nvmlDeviceGetTopologyNearestGpus", "reviveFakeNvmlProfilePath",
    }
    assert required - symbols == set()
    # Only the API is exported: jansson and the fake's helpers stay private.
    assert {name for name in symbols if not name.startswith("nvml")} == {"reviveFakeNvmlProfilePath"}


def test_committed_profiles_equal_the_generator_output() -> None:
    result = subprocess.run([sys.executable, str(REPO / "lab" / "profiles" / "generate.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_field_notes_box_profile() -> None:
    profile = load_profile("v100-pcie-8x")
    assert {gpu["name"] for gpu in profile["gpus"]} == {"Tesla V100-PCIE-32GB"}
    assert len(profile["gpus"]) == 8
    assert (profile["driver_version"], profile["cuda_driver_version"]) == ("535.104.05", 12020)
    assert [gpu["cpu_affinity"] for gpu in profile["gpus"]] == ["0-19,40-59"] * 4 + ["20-39,60-79"] * 4
    assert {gpu["power_limit_mw"] for gpu in profile["gpus"]} == {250000}
    assert {gpu["memory_total_bytes"] for gpu in profile["gpus"]} == {32768 * MIB}
    assert all(gpu["nvlink"] is None and gpu["remapped_rows"] is None and gpu["mig_mode"] is None
               for gpu in profile["gpus"])


def test_degraded_profile_has_four_faults_on_four_gpus() -> None:
    healthy, degraded = load_profile("v100-pcie-8x"), load_profile("v100-pcie-8x-degraded")
    differing = {}
    for index, (good, bad) in enumerate(zip(healthy["gpus"], degraded["gpus"])):
        keys = sorted(k for k in good if k != "uuid" and good[k] != bad[k])
        if keys:
            differing[index] = keys
    assert differing == {
        1: ["retired_pages"],
        3: ["pcie"],
        5: ["ecc"],
        6: ["memory_used_bytes", "processes", "temperature_c", "utilization"],
    }
    assert degraded["gpus"][1]["retired_pages"]["pending"] is True
    assert degraded["gpus"][3]["pcie"]["cur_width"] == 8
    assert degraded["gpus"][5]["ecc"]["errors"]["uncorrected"]["volatile"] == 2
