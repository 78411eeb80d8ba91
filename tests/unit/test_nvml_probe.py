"""The GPU probe (module_utils/revive_nvml.py, revive_topology.py): pure derivations, then the whole probe
through unmodified pynvml against every lab profile, then the error paths a real host can hit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible.module_utils import revive_nvml
from ansible.module_utils.revive_nvml import (
    GpuProbeError,
    architecture_from_cc,
    cuda_version_string,
    normalize_bus_id,
    plan_facts_file,
    stable_view,
)
from ansible.module_utils.revive_topology import (
    LEGEND,
    CpuListError,
    assign_sockets,
    cpus_from_mask,
    format_cpu_list,
    health_findings,
    parse_cpu_list,
    parse_topo_m,
    render_topo_m,
    summarize,
    topo_cell,
    topology_matrix,
)

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "lab" / "profiles"
NAMES = sorted(path.stem for path in PROFILES.glob("*.json"))

# docs/facts/nvml.md §3b: 8x V100 SXM2 (DGX-1 cube-mesh) with NUMA columns, InternLM/lmdeploy#4423, verbatim.
DGX1_TOPO_M = """\
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      NV1     NV1     NV2     NV2     SYS     SYS     SYS     0-19,40-59      0               N/A
GPU1    NV1      X      NV2     NV1     SYS     NV2     SYS     SYS     0-19,40-59      0               N/A
GPU2    NV1     NV2      X      NV2     SYS     SYS     NV1     SYS     0-19,40-59      0               N/A
GPU3    NV2     NV1     NV2      X      SYS     SYS     SYS     NV1     0-19,40-59      0               N/A
GPU4    NV2     SYS     SYS     SYS      X      NV1     NV1     NV2     20-39,60-79     1               N/A
GPU5    SYS     NV2     SYS     SYS     NV1      X      NV2     NV1     20-39,60-79     1               N/A
GPU6    SYS     SYS     NV1     SYS     NV1     NV2      X      NV2     20-39,60-79     1               N/A
GPU7    SYS     SYS     SYS     NV1     NV2     NV1     NV2      X      20-39,60-79     1               N/A
"""

# docs/facts/nvml.md §3b: the pytorch DDP benchmark README capture, NIC rows/columns and an older legend.
DGX1_WITH_NICS = """\
--- nvidia-smi topo -m ---

        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    mlx5_2  mlx5_0  mlx5_3  mlx5_1  CPU Affinity
GPU0     X      NV1     NV1     NV2     NV2     SYS     SYS     SYS     SYS     PIX     SYS     PHB     0-19,40-59
GPU1    NV1      X      NV2     NV1     SYS     NV2     SYS     SYS     SYS     PIX     SYS     PHB     0-19,40-59
GPU2    NV1     NV2      X      NV2     SYS     SYS     NV1     SYS     SYS     PHB     SYS     PIX     0-19,40-59
GPU3    NV2     NV1     NV2      X      SYS     SYS     SYS     NV1     SYS     PHB     SYS     PIX     0-19,40-59
GPU4    NV2     SYS     SYS     SYS      X      NV1     NV1     NV2     PIX     SYS     PHB     SYS     0-19,40-59
GPU5    SYS     NV2     SYS     SYS     NV1      X      NV2     NV1     PIX     SYS     PHB     SYS     0-19,40-59
GPU6    SYS     SYS     NV1     SYS     NV1     NV2      X      NV2     PHB     SYS     PIX     SYS     0-19,40-59
GPU7    SYS     SYS     SYS     NV1     NV2     NV1     NV2      X      PHB     SYS     PIX     SYS     0-19,40-59
mlx5_2  SYS     SYS     SYS     SYS     PIX     PIX     PHB     PHB      X      SYS     PHB     SYS
mlx5_0  PIX     PIX     PHB     PHB     SYS     SYS     SYS     SYS     SYS      X      SYS     PHB
mlx5_3  SYS     SYS     SYS     SYS     PHB     PHB     PIX     PIX     PHB     SYS      X      SYS
mlx5_1  PHB     PHB     PIX     PIX     SYS     SYS     SYS     SYS     SYS     PHB     SYS      X

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe switches (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing a single PCIe switch
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# docs/facts/nvml.md §6.2: the 2x H200 machine, tab-separated as nvidia-smi prints it.
H200_TOPO_M = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
               "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
               "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n")

# docs/facts/nvml.md §2: the legend of current drivers, verbatim.
CURRENT_LEGEND = """\
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""


def tokens(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------
# Pure derivations


@pytest.mark.parametrize(
    ("level", "direct", "switch", "nvlink_ok", "symbol"),
    [
        (10, 0, 0, False, "PIX"),
        (0, 0, 0, False, "PIX"),
        (20, 0, 0, False, "PXB"),
        (30, 0, 0, False, "PHB"),
        (40, 0, 0, False, "NODE"),
        (50, 0, 0, False, "SYS"),
        (10, 1, 0, True, "NV1"),  # DGX-1 PLX pair with one link: NV# wins over PIX
        (30, 0, 18, True, "NV18"),  # H200: HOSTBRIDGE level, yet NV18 (docs/facts/nvml.md §6.2)
        (30, 0, 18, False, "PHB"),  # switch links without NVLink P2P: no NV#
        (None, 0, 0, False, "N/A"),
    ],
)
def test_topo_cell(level, direct, switch, nvlink_ok, symbol) -> None:
    assert topo_cell(level, direct, switch, nvlink_ok) == symbol


def test_topology_matrix_uses_the_smaller_switch_link_count_of_a_pair() -> None:
    levels = [[None, 30], [30, None]]
    matrix = topology_matrix(levels, [[0, 0], [0, 0]], [12, 6], [[None, 0], [0, None]])
    assert matrix == [["X", "NV6"], ["NV6", "X"]]


def test_cpu_lists_round_trip_in_nvidia_smi_form() -> None:
    mask = [(1 << 20) - 1 | (((1 << 20) - 1) << 40), 0]
    cpus = cpus_from_mask(mask)
    assert format_cpu_list(cpus) == "0-19,40-59"
    assert parse_cpu_list("0-19,40-59") == cpus
    assert format_cpu_list([5, 0, 1, 2, 64, 127, 126]) == "0-2,5,64,126-127"
    assert cpus_from_mask([0, 1 << 3]) == [67]
    assert parse_cpu_list("0-3,8\n") == [0, 1, 2, 3, 8]


def test_the_cpu_list_parser_reads_systemd_form_merges_overlaps_and_refuses_the_rest() -> None:
    """revive_topology.parse_cpu_list is the one CPU-list parser (nvidia-smi, sysfs, systemd's CPUAffinity=)."""
    assert parse_cpu_list("3 5-6") == [3, 5, 6]
    assert parse_cpu_list("0-4,2-6 5,1") == [0, 1, 2, 3, 4, 5, 6]
    with pytest.raises(CpuListError, match=r"range '9-3' runs backwards"):
        parse_cpu_list("9-3")
    with pytest.raises(CpuListError, match=r"'x' is not N or N-M"):
        parse_cpu_list("x")


def test_sockets_from_sysfs_when_the_cpus_exist() -> None:
    # A real dual-socket box: CPUs 0-19,40-59 on package 0, 20-39,60-79 on package 1.
    package = {cpu: (0 if cpu < 20 or 40 <= cpu < 60 else 1) for cpu in range(80)}
    sets = [parse_cpu_list("20-39,60-79"), parse_cpu_list("0-19,40-59")]
    result = assign_sockets(sets, [1, 0], package.get, lambda node: None)
    assert (result.sockets, result.rule, result.notes) == ([1, 0], "sysfs", [])


def test_socket_of_a_gpu_whose_affinity_spans_packages_comes_from_its_numa_node() -> None:
    package = {cpu: cpu // 4 for cpu in range(8)}
    node_cpus = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    result = assign_sockets([list(range(8)), list(range(8)), list(range(8))], [1, 0, None], package.get, node_cpus.get)
    assert result.sockets == [1, 0, None]
    assert result.notes == ["GPU 2: socket unknown: its CPU affinity and NUMA node span several CPU packages"]


def test_sockets_grouped_by_affinity_sets_when_the_cpus_are_not_on_this_kernel() -> None:
    # The lab: a 2-CPU machine pretending to be a dual-socket server.
    package = {0: 0, 1: 0}
    sets = [parse_cpu_list("20-39,60-79"), parse_cpu_list("0-19,40-59"), parse_cpu_list("0-19,40-59"), None]
    result = assign_sockets(sets, [1, 0, 0, None], package.get, lambda node: None)
    assert (result.sockets, result.rule) == ([1, 0, 0, None], "affinity-groups")
    assert len(result.notes) == 1 and "does not have" in result.notes[0]


def test_summary_classifies_nvlink_and_finds_the_slowest_path() -> None:
    read_ok = [["X", "OK", "CNS"], ["OK", "X", "CNS"], ["CNS", "CNS", "X"]]
    partial = [["X", "NV2", "SYS"], ["NV2", "X", "PHB"], ["SYS", "PHB", "X"]]
    assert summarize(partial, read_ok, [0, 0, 1]) == {
        "nvlink": "partial",
        "sockets": 2,
        "gpus_per_socket": {"0": [0, 1], "1": [2]},
        "p2p_any": True,
        "slowest_path": "SYS",
    }
    full = [["X", "NV2", "NV1"], ["NV2", "X", "NV12"], ["NV1", "NV12", "X"]]
    none_ok = [["X", "NS", "NS"], ["NS", "X", "NS"], ["NS", "NS", "X"]]
    summary = summarize(full, none_ok, [None, None, None])
    assert (summary["nvlink"], summary["slowest_path"], summary["p2p_any"], summary["sockets"]) == ("full", "NV1", False, 0)
    single = summarize([["X"]], [["X"]], [0])
    assert (single["nvlink"], single["slowest_path"]) == ("none", None)


def test_parse_topo_m_reads_gpu_and_nic_rows_and_ignores_the_legend() -> None:
    parsed = parse_topo_m(DGX1_WITH_NICS)
    assert parsed.gpu_labels() == [f"GPU{i}" for i in range(8)]
    assert parsed.columns[8:] == ["mlx5_2", "mlx5_0", "mlx5_3", "mlx5_1"]
    assert parsed.gpu_matrix()[0] == ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    assert parsed.rows["GPU3"]["cells"]["mlx5_1"] == "PIX"
    assert parsed.rows["GPU5"]["CPU Affinity"] == "0-19,40-59"
    assert parsed.rows["mlx5_0"]["CPU Affinity"] is None
    assert "NUMA Affinity" not in parsed.rows["GPU0"]


def test_parse_topo_m_reads_tab_separated_output_with_numa_columns() -> None:
    parsed = parse_topo_m(H200_TOPO_M)
    assert parsed.gpu_matrix() == [["X", "NV18"], ["NV18", "X"]]
    assert parsed.rows["GPU1"]["CPU Affinity"] == "0-31"
    assert parsed.rows["GPU1"]["NUMA Affinity"] == "0"
    assert parsed.rows["GPU1"]["GPU NUMA ID"] == "N/A"
    with pytest.raises(ValueError):
        parse_topo_m("No devices were found\n")


def test_rendered_topo_m_parses_back_to_the_same_matrix() -> None:
    gpu = {
        "devices": [
            {"cpu_affinity": "0-31", "numa_affinity": "0", "gpu_numa_id": None},
            {"cpu_affinity": "0-31", "numa_affinity": "0", "gpu_numa_id": None},
        ],
        "topology": {"matrix": [["X", "NV18"], ["NV18", "X"]]},
    }
    text = render_topo_m(gpu)
    assert text.startswith(H200_TOPO_M)  # byte for byte what nvidia-smi printed on the H200 (docs/facts/nvml.md §6.2)
    assert text.endswith(CURRENT_LEGEND + "\n")
    assert LEGEND == CURRENT_LEGEND
    assert parse_topo_m(text).gpu_matrix() == [["X", "NV18"], ["NV18", "X"]]


def test_small_helpers() -> None:
    assert [architecture_from_cc(*cc) for cc in ((7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (6, 1), (4, 0))] == [
        "volta", "turing", "ampere", "ampere", "ada", "hopper", "pascal", "unknown"]
    assert cuda_version_string(12020) == "12.2" and cuda_version_string(11080) == "11.8"
    assert normalize_bus_id(b"0000:07:00.0") == "00000000:07:00.0"
    assert normalize_bus_id("00000000:b1:00.0") == "00000000:B1:00.0"
    assert normalize_bus_id("FFFFFFFF:FF:FF.0") == "FFFFFFFF:FF:FF.0"


def facts(**device_overrides) -> dict:
    device = {
        "index": 0, "pci_bus_id": "00000000:1A:00.0", "retired_pages": {"single_bit": 0, "double_bit": 0, "pending": False},
        "remapped_rows": None, "ecc_errors": {"uncorrected": 0, "uncorrected_aggregate": 0},
        "pcie": {"gen_current": 3, "gen_max": 3, "width_current": 16, "width_max": 16},
        "processes": [], "persistence_mode": True, "temperature_c": 33, "utilization_gpu_pct": 0,
        "memory": {"total_bytes": 100, "used_bytes": 4, "free_bytes": 96, "reserved_bytes": 0},
    }
    device.update(device_overrides)
    return {"host": "h", "devices": [device]}


def test_health_findings_name_the_gpu_the_problem_and_the_fix() -> None:
    assert health_findings(facts()) == []
    sick = facts(
        retired_pages={"single_bit": 2, "double_bit": 1, "pending": True},
        remapped_rows={"correctable": 0, "uncorrectable": 3, "pending": False, "failure": True},
        ecc_errors={"uncorrected": 4, "uncorrected_aggregate": 9},
        pcie={"gen_current": 1, "gen_max": 3, "width_current": 8, "width_max": 16},
        processes=[{"pid": 77, "used_memory_bytes": 512 * 1024 * 1024, "name": "python3"}],
        persistence_mode=False,
    )
    found = [(f.gpu, f.pci_bus_id, f.check, f.severity) for f in health_findings(sick)]
    assert found == [
        (0, "00000000:1A:00.0", "retired_pages_pending", "error"),
        (0, "00000000:1A:00.0", "remapped_rows", "error"),
        (0, "00000000:1A:00.0", "ecc_uncorrected", "error"),
        (0, "00000000:1A:00.0", "pcie_width", "error"),
        (0, "00000000:1A:00.0", "pcie_gen", "warning"),
        (0, "00000000:1A:00.0", "foreign_process", "error"),
        (0, "00000000:1A:00.0", "persistence_off", "warning"),
    ]
    messages = [f.message for f in health_findings(sick)]
    assert messages[0].startswith("page retirement pending (2 single-bit, 1 double-bit retired)")
    assert messages[2].startswith("4 uncorrected ECC errors since the driver loaded (9 lifetime)")
    assert messages[3].startswith("PCIe link at x8 of x16")
    assert messages[5].startswith("compute process pid 77 (python3) holds 512 MiB")
    # Lifetime-only uncorrected errors (already handled by page retirement) are not a finding.
    assert health_findings(facts(ecc_errors={"uncorrected": 0, "uncorrected_aggregate": 5})) == []


def test_facts_file_changes_only_when_stable_facts_change(tmp_path: Path) -> None:
    path = tmp_path / "gpu-facts.json"
    first = facts()
    update = plan_facts_file(str(path), first)
    assert update.changed and update.before == ""
    path.write_text(update.after)
    warmer = facts(temperature_c=70, utilization_gpu_pct=99,
                   memory={"total_bytes": 100, "used_bytes": 50, "free_bytes": 50, "reserved_bytes": 0},
                   pcie={"gen_current": 1, "gen_max": 3, "width_current": 16, "width_max": 16})
    assert plan_facts_file(str(path), warmer).changed is False
    narrower = facts(pcie={"gen_current": 3, "gen_max": 3, "width_current": 8, "width_max": 16})
    assert plan_facts_file(str(path), narrower).changed is True
    busy = facts(processes=[{"pid": 9, "used_memory_bytes": 1, "name": "x"}])
    assert plan_facts_file(str(path), busy).changed is True
    assert "temperature_c" not in stable_view(warmer)["devices"][0]
    path.write_text("{not json")
    assert plan_facts_file(str(path), first).changed is True


# ---------------------------------------------------------------------------------------------------
# The whole probe through pynvml and the fake library, one subprocess per profile


@pytest.fixture(scope="session")
def fakenvml() -> Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "lab" / "fakenvml")], check=True, capture_output=True)
    return REPO / "lab" / "fakenvml"


PROBE = (
    "import json, sys; sys.path.insert(0, 'bin'); from revive_cli import use_module_utils; use_module_utils(); "
    "from ansible.module_utils.revive_nvml import probe; print(json.dumps(probe()))"
)


@pytest.fixture(scope="session")
def probed(fakenvml: Path) -> dict[str, dict]:
    results = {}
    for name in NAMES:
        env = dict(os.environ, LD_LIBRARY_PATH=str(fakenvml), FAKE_NVML_PROFILE=str(PROFILES / f"{name}.json"),
                   FAKE_NVML_UTILIZATION="/nonexistent/utilization.json")
        done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        results[name] = json.loads(done.stdout)
    return results


@pytest.mark.parametrize("name", NAMES)
def test_probe_matrix_equals_the_profiles_expected_topo_m(probed: dict, name: str) -> None:
    profile = json.loads((PROFILES / f"{name}.json").read_text())
    assert probed[name]["topology"]["matrix"] == profile["expected_topo_m"]


def test_dgx1_renders_the_real_dgx1_topo_m_verbatim(probed: dict) -> None:
    rendered = render_topo_m(probed["dgx1-v100"])
    assert tokens(rendered.split("Legend:")[0]) == tokens(DGX1_TOPO_M)
    assert parse_topo_m(DGX1_WITH_NICS).gpu_matrix() == probed["dgx1-v100"]["topology"]["matrix"]
    gpu0 = probed["dgx1-v100"]["devices"][0]
    assert gpu0["nvlink"]["active_links"] == 6
    assert sorted(link["peer_index"] for link in gpu0["nvlink"]["links"]) == [1, 2, 3, 3, 4, 4]
    assert probed["dgx1-v100"]["summary"]["nvlink"] == "partial"


def test_a100_is_nv12_everywhere_through_the_switches(probed: dict) -> None:
    gpu = probed["a100-sxm4-8x"]
    assert {cell for row in gpu["topology"]["matrix"] for cell in row} == {"X", "NV12"}
    links = gpu["devices"][0]["nvlink"]["links"]
    assert len(links) == 12 and {link["peer_index"] for link in links} == {None}
    assert {link["remote_device_type"] for link in links} == {"switch"}
    assert gpu["summary"] == {"nvlink": "full", "sockets": 2, "gpus_per_socket": {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]},
                              "p2p_any": True, "slowest_path": "NV12", "socket_rule": "affinity-groups"}
    device = gpu["devices"][0]
    assert (device["architecture"], device["bf16"], device["compute_capability"]) == ("ampere", True, "8.0")
    assert device["retired_pages"] is None
    assert "retired_pages: not supported on this GPU (NVML NOT_SUPPORTED)" in device["notes"]
    assert device["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert device["mig_mode"] == {"current": False, "pending": False}


def test_v100_pcie_box_is_what_the_field_notes_describe(probed: dict) -> None:
    gpu = probed["v100-pcie-8x"]
    assert gpu["simulated"] is True
    assert gpu["simulated_profile"] == str(PROFILES / "v100-pcie-8x.json")
    assert gpu["simulated_profile_name"] == "v100-pcie-8x"
    assert gpu["notes"][0].startswith("SIMULATED: lab fake NVML")
    assert (gpu["driver_version"], gpu["driver_branch"], gpu["cuda_driver_version"], gpu["nvml_version"], gpu["count"]) == (
        "535.104.05", 535, "12.2", "12.535.104.05", 8)
    assert gpu["summary"] == {"nvlink": "none", "sockets": 2, "gpus_per_socket": {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]},
                              "p2p_any": True, "slowest_path": "SYS", "socket_rule": "affinity-groups"}
    for device in gpu["devices"]:
        socket = 0 if device["index"] < 4 else 1
        assert device["name"] == "Tesla V100-PCIE-32GB"
        assert (device["compute_capability"], device["cc_major"], device["cc_minor"]) == ("7.0", 7, 0)
        assert (device["architecture"], device["bf16"]) == ("volta", False)
        assert device["pci_device_id"] == "0x1DB610DE"
        assert device["memory"]["total_bytes"] == 32768 * 1024 * 1024
        assert device["pcie"] == {"gen_current": 3, "gen_max": 3, "width_current": 16, "width_max": 16}
        assert device["power_limit_w"] == 250.0
        assert (device["socket"], device["numa_node"], device["gpu_numa_id"]) == (socket, socket, None)
        assert device["cpu_affinity"] == ["0-19,40-59", "20-39,60-79"][socket]
        assert device["cpus"] == parse_cpu_list(device["cpu_affinity"])
        assert device["ecc"] == {"current": True, "pending": True}
        assert device["ecc_errors"] == {"corrected": 0, "corrected_aggregate": 0, "uncorrected": 0,
                                        "uncorrected_aggregate": 0}
        assert device["retired_pages"] == {"single_bit": 0, "double_bit": 0, "pending": False}
        assert (device["remapped_rows"], device["mig_mode"], device["nvlink"], device["processes"]) == (None, None, None, [])
        assert device["notes"] == [
            "remapped_rows: not supported on this GPU (NVML NOT_SUPPORTED)",
            "mig_mode: not supported on this GPU (NVML NOT_SUPPORTED)",
            "gpu_numa_id: not supported on this GPU (NVML NOT_SUPPORTED)",
            "nvlink: not supported on this GPU (NVML NOT_SUPPORTED)",
        ]
    assert gpu["topology"]["p2p"]["read"][0] == ["X", "OK", "OK", "OK", "CNS", "CNS", "CNS", "CNS"]
    assert gpu["topology"]["p2p"]["nvlink"][0] == ["X"] + ["NS"] * 7


def test_t4_box_has_pix_pairs_on_one_socket(probed: dict) -> None:
    gpu = probed["t4-4x"]
    assert gpu["summary"]["gpus_per_socket"] == {"0": [0, 1, 2, 3]}
    assert gpu["summary"]["slowest_path"] == "PHB"
    assert {d["architecture"] for d in gpu["devices"]} == {"turing"}
    assert {d["compute_capability"] for d in gpu["devices"]} == {"7.5"}


def test_degraded_box_shows_four_faults_on_four_gpus(probed: dict) -> None:
    gpu = probed["v100-pcie-8x-degraded"]
    devices = gpu["devices"]
    assert devices[1]["retired_pages"] == {"single_bit": 0, "double_bit": 1, "pending": True}
    assert devices[3]["pcie"]["width_current"] == 8
    assert devices[5]["ecc_errors"]["uncorrected"] == 2
    assert devices[6]["processes"] == [{"pid": 48213, "used_memory_bytes": 16384 * 1024 * 1024, "name": "python3"}]
    assert devices[6]["utilization_gpu_pct"] == 97
    findings = [(f.gpu, f.check) for f in health_findings(gpu)]
    assert findings == [(1, "retired_pages_pending"), (3, "pcie_width"), (5, "ecc_uncorrected"), (6, "foreign_process")]


# ---------------------------------------------------------------------------------------------------
# Error paths: no library, driver not loaded, the CUDA stub, library-mismatch on process queries


def test_missing_library_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with pytest.raises(GpuProbeError) as error:
        revive_nvml.probe(host="gpu-node-7")
    assert str(error.value) == "NVIDIA driver not installed or libnvidia-ml.so.1 not on the loader path on gpu-node-7"


def test_driver_not_loaded_message_names_the_kernel_module(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def not_loaded() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", not_loaded)
    monkeypatch.setattr(revive_nvml, "loaded_nvml_path", lambda: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.104.05")
    with pytest.raises(GpuProbeError) as error:
        revive_nvml.probe(host="gpu-node-7")
    assert str(error.value).startswith("NVML on gpu-node-7 (/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.104.05) "
                                       "reports DRIVER_NOT_LOADED: the NVIDIA kernel module is not loaded")


# A stand-in for the CUDA toolkit's stubs/libnvidia-ml.so (docs/facts/nvml.md §0.7, §6.3): same SONAME,
# init answers DRIVER_NOT_LOADED (9), every call prints a banner on stdout.
CUDA_STUB = r"""
#include <stdio.h>
static void banner(void) { printf("WARNING: You should always run with libnvidia-ml.so that is installed with your NVIDIA Display Driver.\n"); fflush(stdout); }
int nvmlInitWithFlags(unsigned int flags) { (void)flags; banner(); return 9; }
int nvmlInit_v2(void) { banner(); return 9; }
int nvmlShutdown(void) { banner(); return 1; }
const char *nvmlErrorString(int r) { (void)r; return "WARNING: You should always run with libnvidia-ml.so that is installed with your NVIDIA Display Driver."; }
"""


def test_cuda_stub_is_named_and_its_stdout_banner_never_reaches_stdout(tmp_path: Path) -> None:
    stubs = tmp_path / "cuda" / "lib64" / "stubs"
    stubs.mkdir(parents=True)
    (tmp_path / "stub.c").write_text(CUDA_STUB)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(stubs / "libnvidia-ml.so.1"),
                    str(tmp_path / "stub.c")], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(stubs))
    done = subprocess.run([sys.executable, str(REPO / "bin" / "revive"), "gpus", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "WARNING: You should always run with libnvidia-ml.so" in done.stderr  # went to stderr instead
    assert (f"revive gpus: {stubs}/libnvidia-ml.so.1 on " in done.stderr
            and "is the CUDA toolkit's link-time stub, not the driver's NVML" in done.stderr)


MISMATCH = r"""
import json, sys
sys.path.insert(0, 'bin')
from revive_cli import use_module_utils; use_module_utils()
import pynvml
def old_driver(handle):
    raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")
pynvml.nvmlDeviceGetComputeRunningProcesses = old_driver
from ansible.module_utils.revive_nvml import probe
device = probe()["devices"][0]
print(json.dumps([device["processes"], [n for n in device["notes"] if n.startswith("processes")]]))
"""


def test_library_mismatch_on_process_queries_is_a_note_not_a_crash(fakenvml: Path) -> None:
    env = dict(os.environ, LD_LIBRARY_PATH=str(fakenvml), FAKE_NVML_PROFILE=str(PROFILES / "t4-4x.json"))
    done = subprocess.run([sys.executable, "-c", MISMATCH], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    processes, notes = json.loads(done.stdout)
    assert processes is None
    assert notes == ["processes: driver's NVML lacks the versioned call nvidia-ml-py uses "
                     "(Unversioned function called and the pyNVML version does not match)"]


def test_parse_topo_m_strips_the_ansi_underline_real_nvidia_smi_prints(repo) -> None:
    # Captured verbatim from `nvidia-smi topo -m | tee` on a 2x H200 machine (driver 580.159.04).
    captured = (repo / "tests/data/h200x2-topo-m.txt").read_text()
    assert "\x1b[4m" in captured
    parsed = parse_topo_m(captured)
    assert parsed.gpu_matrix() == [["X", "NV18"], ["NV18", "X"]]
    assert parsed.rows["GPU1"]["CPU Affinity"] == "0-31"
    assert parsed.rows["GPU1"]["GPU NUMA ID"] == "N/A"
