"""NCCL check: the facts behind a P2P hang on PCIe, read-only - ACS control on the bridges above the GPUs
(`lspci -vvv -D`) and IOMMU groups (/sys/kernel/iommu_groups). NCCL troubleshooting guide, "PCI Access Control
Services (ACS)": ACS redirects P2P through the root complex, which can hang P2P or slow it down."""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from ansible.module_utils.revive_nccl.spec import ACS_DOC, Deps, _read

_BDF = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_LSPCI_HEAD = re.compile(r"^((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s")


def normalize_bdf(bus_id: str) -> str:
    """'00000000:1A:00.0' (NVML) or '1a:00.0' (lspci) -> '0000:1a:00.0' (sysfs)."""
    match = _BDF.match(bus_id.strip())
    if not match:
        return bus_id.strip().lower()
    domain = (match.group(1) or "0000")[-4:]
    return f"{domain}:{match.group(2)}:{match.group(3)}.{match.group(4)}".lower()


def parse_lspci_acs(text: str) -> Dict[str, Dict[str, Any]]:
    """`lspci -vvv -D` -> {bdf: {"acs_ctl": {flag: bool} | None, "access_denied": bool, "description": str}}."""
    devices: Dict[str, Dict[str, Any]] = {}
    current: Optional[Dict[str, Any]] = None
    for line in text.splitlines():
        head = _LSPCI_HEAD.match(line)
        if head:
            current = {"acs_ctl": None, "access_denied": False, "description": line[head.end():].strip()}
            devices[normalize_bdf(head.group(1))] = current
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("ACSCtl:"):
            current["acs_ctl"] = {tok[:-1]: tok.endswith("+") for tok in stripped[len("ACSCtl:"):].split()
                                  if tok[-1:] in "+-"}
        elif "<access denied>" in stripped:
            current["access_denied"] = True
    return devices


def _upstream(sysfs_root: str, bdf: str) -> Optional[List[str]]:
    link = os.path.join(sysfs_root, "bus", "pci", "devices", bdf)
    if not os.path.exists(link):
        return None
    parts = os.path.realpath(link).split(os.sep)
    return [p for p in parts[:-1] if _BDF.match(p) and ":" in p]


def read_topology(bus_ids: Dict[int, Optional[str]], deps: Deps, lspci: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """ACS control on the bridges above the GPUs and their IOMMU groups; every missing piece is a note."""
    notes: List[str] = []
    gpus, bridges_seen, shared = [], {}, {}
    for index, bus_id in sorted(bus_ids.items()):
        entry: Dict[str, Any] = {"index": index, "pci_bus_id": bus_id, "upstream": None, "iommu_group": None}
        gpus.append(entry)
        if not bus_id:
            notes.append(f"GPU {index}: no PCI bus id in the GPU facts (pass gpu: the nvml_facts result)")
            continue
        bdf = normalize_bdf(bus_id)
        chain = _upstream(deps.sysfs_root, bdf)
        if chain is None:
            notes.append(f"GPU {index} ({bdf}): not in {deps.sysfs_root}/bus/pci/devices")
            continue
        entry["upstream"] = chain
        for bridge in chain:
            shared.setdefault(bridge, []).append(index)
        group = os.path.join(deps.sysfs_root, "bus", "pci", "devices", bdf, "iommu_group")
        if os.path.exists(group):
            entry["iommu_group"] = os.path.basename(os.path.realpath(group))
    if lspci is None:
        notes.append("lspci not found (pciutils): ACS control of the bridges not read")
    for bridge, members in sorted(shared.items()):
        facts = (lspci or {}).get(bridge) or {}
        acs = facts.get("acs_ctl")
        bridges_seen[bridge] = {"bdf": bridge, "gpus": members, "description": facts.get("description"),
                                "acs_ctl": acs, "acs_enabled": None if acs is None else any(acs.values()),
                                "redirects_p2p": None if acs is None else bool(acs.get("ReqRedir") or
                                                                               acs.get("CmpltRedir"))}
        if facts.get("access_denied") and acs is None:
            notes.append(f"lspci could not read {bridge}'s capabilities (access denied: run as root)")
    groups_dir = os.path.join(deps.sysfs_root, "kernel", "iommu_groups")
    try:
        group_count = len(os.listdir(groups_dir))
    except OSError:
        group_count = 0
    words = [w for w in (_read(deps.cmdline_path) or "").split() if "iommu" in w.lower()]
    gpu_groups: Dict[str, List[str]] = {}
    for entry in gpus:
        if entry["iommu_group"] is not None:
            try:
                gpu_groups[entry["iommu_group"]] = sorted(os.listdir(os.path.join(groups_dir, entry["iommu_group"],
                                                                                  "devices")))
            except OSError:
                gpu_groups[entry["iommu_group"]] = []
    enabled_on = [b for b, f in bridges_seen.items() if f["acs_enabled"]]
    redirect_on = [b for b, f in bridges_seen.items() if f["redirects_p2p"]]
    return {"gpus": gpus, "bridges": list(bridges_seen.values()), "acs_enabled_bridges": enabled_on,
            "acs_redirect_bridges": redirect_on,
            "iommu": {"groups": group_count, "enabled": group_count > 0, "kernel_cmdline": words,
                      "passthrough": "iommu=pt" in words, "gpu_groups": gpu_groups},
            "notes": notes, "summary": _topology_summary(
                sum(1 for f in bridges_seen.values() if f["acs_ctl"] is not None), enabled_on, redirect_on, group_count,
                words)}


def _topology_summary(read: int, enabled_on: List[str], redirect_on: List[str], groups: int, words: List[str]) -> str:
    parts = []
    if redirect_on:
        parts.append(f"ACS redirects P2P on bridge(s) {', '.join(redirect_on)} above the GPUs: P2P goes up to the "
                     f"root complex, which can hang or slow NCCL P2P ({ACS_DOC}); disable ACS in the BIOS or keep "
                     "NCCL_P2P_DISABLE=1")
    elif enabled_on:
        parts.append(f"ACS enabled (no redirect) on bridge(s) {', '.join(enabled_on)}")
    elif read:
        parts.append(f"no ACS control enabled on the {read} bridge(s) read")
    else:
        parts.append("ACS control not read")
    if groups:
        parts.append(f"IOMMU on ({groups} groups" + (", iommu=pt" if "iommu=pt" in words else "") + ")")
    else:
        parts.append("IOMMU off (no groups)")
    return "; ".join(parts)
