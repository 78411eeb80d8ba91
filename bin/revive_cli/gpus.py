"""revive gpus [--json] [--nccl-record PATH]: this machine's GPUs as the nvml_facts module sees them.

The human view is a device table, the topology matrix laid out like `nvidia-smi topo -m`, a summary,
the health findings and the last NCCL check the provision playbook recorded on the node (--nccl-record,
the nccl_check module's result under `result`). `--json` prints exactly what the module returns under
`gpu`, without the NCCL record. Needs only pynvml (nvidia-ml-py) and a driver, or the lab's fake:

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
NCCL_RECORD = "/var/lib/revive/nccl-check.json"   # playbooks/provision.yml writes it


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


class NcclRecordError(Exception):
    """The NCCL check's record exists but cannot be shown; the message is the view's one line about it."""


def load_nccl_record(path: str) -> Optional[dict]:
    """The record the provision playbook wrote ({"at", "release", "result"}); None when there is none."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise NcclRecordError(f"NCCL check: cannot read {path}: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise NcclRecordError(f"NCCL check: {path} is not valid JSON: {error}") from error
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise NcclRecordError(f"NCCL check: {path} is not valid JSON: {error}") from error
    problem = None
    if not isinstance(record, dict):
        problem = "the top level is not a JSON object"
    elif not isinstance(record.get("result"), dict):
        problem = "it has no \"result\" object (the nccl_check module's return)"
    elif not isinstance(record["result"].get("replicas") or [], list) or \
            not all(isinstance(r, dict) for r in record["result"].get("replicas") or []):
        problem = "its result's \"replicas\" is not a list of objects"
    if problem:
        raise NcclRecordError(f"NCCL check: {path} is not an NCCL check record: {problem} (the provision playbook "
                              "writes {\"at\", \"release\", \"result\"})")
    return record


def _gpu_list(gpus: object) -> str:
    members = list(gpus) if isinstance(gpus, (list, tuple)) else []
    if not members:
        return "no GPUs"
    return f"GPU{'s' if len(members) > 1 else ''} {', '.join(map(str, members))}"


def busbw_table(sizes: list[dict], indent: str) -> list[str]:
    """Per all-reduce size the bus bandwidth (nccl-tests' busbw, GB/s of 1e9 bytes), as the check measured it."""
    rows = [["Size", "busbw GB/s"]] + [[str(row["size"]), f"{float(row['busbw_gbps']):.2f}"] for row in sizes]
    first = max(len(row[0]) for row in rows)
    second = max(len(row[1]) for row in rows)
    return [f"{indent}{row[0].ljust(first)}  {row[1].rjust(second)}" for row in rows]


def replica_lines(replica: dict) -> list[str]:
    head = f"  {replica.get('name') or 'replica'} ({_gpu_list(replica.get('gpus'))}): "
    if replica.get("skipped"):
        return [head + f"skipped ({replica.get('reason') or 'not checked'})"]
    lines = [head + ("ok" if replica.get("ok") else f"FAILED: {replica.get('reason') or 'no reason recorded'}")]
    run = replica.get("run") or {}
    if run.get("sizes"):
        lines.extend(busbw_table(run["sizes"], "    "))
    if run:
        transports = run.get("transports") or []
        lines.append(f"    Transports: {', '.join(transports) if transports else 'none reported'}")
    compare = replica.get("compare")
    if compare and compare.get("verdict"):
        lines.append(f"    Compare: {compare['verdict']}: {compare.get('message') or ''}".rstrip())
    topology = replica.get("topology") or {}
    if topology.get("summary"):
        lines.append(f"    Topology: {topology['summary']}")
    for note in topology.get("notes") or []:
        lines.append(f"    Topology note: {note}")
    return lines


def nccl_section(record: dict, path: str) -> list[str]:
    """The record in words: when, which release and backend, then per replica the outcome and its figures."""
    result = record["result"]
    status = {True: "passed", False: "FAILED"}.get(result.get("ok"), "outcome unknown")
    lines = [f"NCCL check ({path}): {status} at {record.get('at') or 'an unrecorded time'}, release "
             f"{record.get('release') or 'unknown'}, backend {result.get('backend') or 'unknown'}"]
    if result.get("simulated"):
        lines.append("SIMULATED (gloo on CPU processes)")
    replicas = result.get("replicas")
    if not replicas:
        lines.append(f"  {result.get('msg') or 'no replica results in the record'}")
    for replica in replicas or []:
        lines.extend(replica_lines(replica))
    return lines


def nccl_view(path: str) -> str:
    """The NCCL section of the human view; a missing or unreadable record is one line, never an error."""
    try:
        record = load_nccl_record(path)
        lines = (nccl_section(record, path) if record is not None
                 else [f"NCCL check: not run on this node (no {path})"])
    except NcclRecordError as error:
        lines = [str(error)]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        lines = [f"NCCL check: {path} is not an NCCL check record this view understands "
                 f"({type(error).__name__}: {error})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="revive gpus", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the facts the nvml_facts module returns under `gpu`")
    parser.add_argument("--nccl-record", metavar="PATH", default=NCCL_RECORD,
                        help="the NCCL check's record that the provision playbook writes, shown after the probe "
                             "(human view only; default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        gpu = probe()
    except GpuProbeError as error:
        print(f"revive gpus: {error}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(json.dumps(gpu, indent=2) + "\n")
    else:
        sys.stdout.write(human_view(gpu) + "\n" + nccl_view(args.nccl_record))
    return 0
