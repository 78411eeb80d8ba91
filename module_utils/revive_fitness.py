"""The preflight fitness gate: is this GPU node fit to serve the planned release? And may the fleet go on?

Pure rules over the probe's GPU facts (docs/architecture.md, glossary), the planner's outcome and the inventory's
expectations. Each rule returns Findings that say what is wrong, on which GPU (index and PCI bus id), why
it matters for serving and what to do. A finding is `unfit` (the host is quarantined, not failed) or
`warn` (reported, the host goes on). Used by library/gpu_fitness.py on each node; fleet_summary() is
the end-of-preflight policy used by library/preflight_summary.py on the controller.

The only look at the host itself is process ownership (/proc), so that the node's own vLLM service
(its systemd unit or its user) is never mistaken for a foreign process on a re-run.
"""
from __future__ import annotations

import fnmatch
import os
import pwd
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

UNFIT = "unfit"
WARN = "warn"
VERDICTS = (UNFIT, WARN)

# The last driver branch that still supports each architecture. docs/facts/prior-art.md §7: R580 is the last branch
# for Maxwell, Pascal and Volta (NVIDIA/ansible-role-nvidia-driver PR #89).
LAST_DRIVER_BRANCH = {"maxwell": 580, "pascal": 580, "volta": 580}

MIB = 1024 * 1024


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: str
    what: str
    why: str
    fix: str
    gpu_index: Optional[int] = None
    pci_bus_id: Optional[str] = None

    @property
    def where(self) -> str:
        if self.gpu_index is None:
            return "node"
        return f"GPU {self.gpu_index} ({self.pci_bus_id or 'bus id unknown'})"

    @property
    def message(self) -> str:
        return f"{self.where}: {self.what}. Why it matters: {self.why}. Fix: {self.fix}"

    def as_dict(self) -> dict:
        return {"check": self.check, "verdict": self.verdict, "gpu_index": self.gpu_index,
                "pci_bus_id": self.pci_bus_id, "what": self.what, "why": self.why, "fix": self.fix,
                "message": self.message}


@dataclass(frozen=True)
class Policy:
    """The inventory's expectations and the operator's choices (role variables gpu_preflight_*)."""

    expected_gpu_count: int = 0          # 0: any count
    expected_gpu_name: str = ""          # "": any model
    pcie_width_below_max: str = UNFIT
    pcie_gen_below_max: str = WARN
    own_service_units: Tuple[str, ...] = ("vllm*.service",)
    own_service_users: Tuple[str, ...] = ("vllm",)

    def __post_init__(self) -> None:
        for name in ("pcie_width_below_max", "pcie_gen_below_max"):
            if getattr(self, name) not in VERDICTS:
                raise ValueError(f"{name} must be one of {', '.join(VERDICTS)}, not {getattr(self, name)!r}")


@dataclass(frozen=True)
class PlanOutcome:
    """What the planner said: a release (its version and the driver window from the release data) or a refusal."""

    vllm_version: Optional[str] = None
    cuda: Optional[str] = None
    driver_min_branch: Optional[int] = None
    driver_tested_branch: Optional[int] = None
    refusal_reason: Optional[str] = None
    refusal_source: Optional[str] = None


@dataclass(frozen=True)
class ProcessOwner:
    pid: int
    visible: bool
    user: Optional[str] = None
    unit: Optional[str] = None

    def describe(self) -> str:
        if not self.visible:
            return "not visible in this host's /proc (another PID namespace, e.g. a container, or already gone)"
        return f"user {self.user or '?'}, unit {self.unit or 'none'}"


OwnerLookup = Callable[[int], ProcessOwner]


def unit_from_cgroup(text: str) -> Optional[str]:
    """The systemd unit of a process from /proc/PID/cgroup (cgroup v2 `0::/...` or v1 `N:name=systemd:/...`)."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not (parts[0] == "0" and parts[1] == "" or parts[1] == "name=systemd"):
            continue
        for component in reversed(parts[2].strip().split("/")):
            if component.endswith((".service", ".scope")):
                return component
    return None


def process_owner(pid: int, proc_root: str = "/proc") -> ProcessOwner:
    base = os.path.join(proc_root, str(pid))
    try:
        with open(os.path.join(base, "status"), encoding="utf-8") as handle:
            status = handle.read()
    except OSError:
        return ProcessOwner(pid, visible=False)
    user = None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
            try:
                user = pwd.getpwuid(uid).pw_name
            except KeyError:
                user = str(uid)
    try:
        with open(os.path.join(base, "cgroup"), encoding="utf-8") as handle:
            unit = unit_from_cgroup(handle.read())
    except OSError:
        unit = None
    return ProcessOwner(pid, visible=True, user=user, unit=unit)


def is_own_service(owner: ProcessOwner, policy: Policy) -> bool:
    if not owner.visible:
        return False
    if owner.unit and any(fnmatch.fnmatchcase(owner.unit, pattern) for pattern in policy.own_service_units):
        return True
    return bool(owner.user) and owner.user in policy.own_service_users


# --- the rules, one function each ---------------------------------------------------------------------------

def _gpu(device: dict) -> dict:
    return {"gpu_index": device.get("index"), "pci_bus_id": device.get("pci_bus_id")}


def rule_gpu_count(gpu: dict, policy: Policy) -> List[Finding]:
    count = gpu.get("count", len(gpu.get("devices") or []))
    if not policy.expected_gpu_count or count == policy.expected_gpu_count:
        return []
    return [Finding(
        "gpu_count", UNFIT,
        f"NVML sees {count} GPU(s), the inventory expects {policy.expected_gpu_count} (revive_expected_gpu_count)",
        "the plan and the fleet's capacity assume the expected count; a GPU missing from NVML has usually fallen "
        "off the bus (Xid 79) or lost power, and a replica planned around it would never start",
        "check `dmesg | grep -i xid` and `lspci -d 10de:`, reseat or replace the card, or correct "
        "revive_expected_gpu_count for this host")]


def rule_gpu_name(gpu: dict, policy: Policy) -> List[Finding]:
    if not policy.expected_gpu_name:
        return []
    return [Finding(
        "gpu_name", UNFIT,
        f"the GPU is a {device.get('name')!r}, the inventory expects {policy.expected_gpu_name!r} "
        "(revive_expected_gpu_name)",
        "memory, compute capability and dtype (FP16 versus BF16) decide the release, and the fleet's capacity and "
        "load tests assume one GPU model",
        "move the host to an inventory group whose revive_expected_gpu_name matches it, or replace the card",
        **_gpu(device)) for device in gpu.get("devices") or [] if device.get("name") != policy.expected_gpu_name]


def rule_driver_window(gpu: dict, plan: PlanOutcome) -> List[Finding]:
    findings: List[Finding] = []
    branch = gpu.get("driver_branch")
    if branch is None:
        return findings
    version = gpu.get("driver_version")
    if plan.driver_min_branch is not None and branch < plan.driver_min_branch:
        findings.append(Finding(
            "driver_branch", UNFIT,
            f"driver {version} (R{branch}) is older than R{plan.driver_min_branch}, the lowest branch for vLLM "
            f"{plan.vllm_version} (CUDA {plan.cuda} wheels; data/vllm-releases.yml driver.min_branch)",
            "the server fails at start with 'CUDA driver version is insufficient for CUDA runtime version'",
            f"install driver R{plan.driver_tested_branch or plan.driver_min_branch} (the tested branch), or pin an "
            "older vLLM release in revive_plan_overrides"))
    architectures = sorted({d.get("architecture") for d in gpu.get("devices") or []
                            if d.get("architecture") in LAST_DRIVER_BRANCH})
    for architecture in architectures:
        last = LAST_DRIVER_BRANCH[architecture]
        if branch > last:
            findings.append(Finding(
                "driver_branch", UNFIT,
                f"driver {version} (R{branch}) is newer than R{last}, the last branch that supports "
                f"{architecture.capitalize()} GPUs (docs/facts/prior-art.md §7)",
                "a driver past its last branch does not support these GPUs; CUDA on them fails or they vanish "
                "from NVML after the next reboot",
                f"hold the driver at R{last} or older on {architecture.capitalize()} nodes (e.g. apt-mark hold)"))
    return findings


def rule_memory_retirement(gpu: dict) -> List[Finding]:
    findings = []
    for device in gpu.get("devices") or []:
        pages = device.get("retired_pages")
        if pages and pages.get("pending"):
            findings.append(Finding(
                "retired_pages_pending", UNFIT,
                f"page retirement pending ({pages.get('single_bit')} single-bit, {pages.get('double_bit')} "
                "double-bit retired pages)",
                "until the driver reloads, the failing page stays in use, and vLLM takes most of the memory "
                "(--gpu-memory-utilization 0.92) for weights and KV cache: the next error there corrupts "
                "results or kills the server (Xid 48), taking its whole tensor-parallel group down",
                "drain the node, reload the driver or reboot, then re-run the preflight; if pages keep "
                "retiring, replace the card",
                **_gpu(device)))
        rows = device.get("remapped_rows")
        if rows and (rows.get("pending") or rows.get("failure")):
            failed = bool(rows.get("failure"))
            findings.append(Finding(
                "remapped_rows", UNFIT,
                f"row remapping {'failed' if failed else 'pending'} ({rows.get('uncorrectable')} uncorrectable rows)",
                "the faulty memory rows stay in use until the GPU is reset, and the server's weights and KV cache "
                "cover nearly all of the memory",
                "replace the card (a remapping failure is permanent)" if failed else
                "drain the node and reset the GPU (`nvidia-smi -r`) or reboot, then re-run the preflight",
                **_gpu(device)))
    return findings


def rule_uncorrected_ecc(gpu: dict) -> List[Finding]:
    findings = []
    for device in gpu.get("devices") or []:
        errors = device.get("ecc_errors") or {}
        volatile = errors.get("uncorrected")
        if volatile:
            findings.append(Finding(
                "ecc_uncorrected", UNFIT,
                f"{volatile} uncorrected ECC error(s) since the driver loaded "
                f"({errors.get('uncorrected_aggregate')} in the GPU's lifetime)",
                "an uncorrected error silently corrupts weights or KV cache, or crashes the CUDA context (Xid 48); "
                "a tensor-parallel replica is only as sound as its worst GPU",
                "drain the node, check `nvidia-smi -q -d ECC,PAGE_RETIREMENT`, reboot; if errors recur, replace "
                "the card",
                **_gpu(device)))
    return findings


def rule_pcie_link(gpu: dict, policy: Policy) -> List[Finding]:
    findings = []
    for device in gpu.get("devices") or []:
        pcie = device.get("pcie") or {}
        width, width_max = pcie.get("width_current"), pcie.get("width_max")
        if width is not None and width_max is not None and width < width_max:
            findings.append(Finding(
                "pcie_width", policy.pcie_width_below_max,
                f"PCIe link trained to x{width} of x{width_max}",
                "host<->GPU bandwidth is cut accordingly: model loading slows, and on a PCIe box without NVLink "
                "(NCCL P2P/SHM off) every all-reduce crosses this link, so its whole tensor-parallel group runs at "
                "the slow card's pace",
                "reseat the card and check its riser and slot (`lspci -vv` LnkSta versus LnkCap), then re-run the "
                "preflight; gpu_preflight_pcie_width_below_max: warn accepts it",
                **_gpu(device)))
        gen, gen_max = pcie.get("gen_current"), pcie.get("gen_max")
        if gen is not None and gen_max is not None and gen < gen_max:
            findings.append(Finding(
                "pcie_gen", policy.pcie_gen_below_max,
                f"PCIe link at gen{gen} of gen{gen_max}",
                "idle links often drop to a lower generation to save power and come back under load; a link that "
                "stays low slows loading and all-reduce",
                "re-check under load (`nvidia-smi -q -d PCIE`); if it stays low, check the slot's BIOS setting "
                "and the riser",
                **_gpu(device)))
    return findings


def rule_foreign_processes(gpu: dict, policy: Policy, owner_of: OwnerLookup) -> List[Finding]:
    findings = []
    for device in gpu.get("devices") or []:
        for process in device.get("processes") or []:
            owner = owner_of(int(process["pid"]))
            if is_own_service(owner, policy):
                continue
            used = process.get("used_memory_bytes")
            size = "an unknown amount of memory" if used is None else f"{used // MIB} MiB"
            name = f" ({process['name']})" if process.get("name") else ""
            findings.append(Finding(
                "foreign_process", UNFIT,
                f"process {process['pid']}{name} holds {size}; it is not the vLLM service ({owner.describe()})",
                "vLLM sizes its KV cache from the memory it can take at start (0.92 of the card): what another "
                "process holds comes out of the KV cache or makes the start fail, and its kernels slow every "
                "request",
                f"stop or move process {process['pid']} and re-run the preflight; if it is part of the service, "
                "add its unit or user to gpu_preflight_own_service_units / gpu_preflight_own_service_users",
                **_gpu(device)))
    return findings


def rule_persistence(gpu: dict) -> List[Finding]:
    return [Finding(
        "persistence_off", WARN, "persistence mode is off",
        "without it the driver tears the GPU state down whenever no process holds the device and rebuilds it on "
        "the next open, which slows every service start and probe",
        "enable nvidia-persistenced (or `nvidia-smi -pm 1`)",
        **_gpu(device)) for device in gpu.get("devices") or [] if device.get("persistence_mode") is False]


def rule_plan_refusal(plan: PlanOutcome) -> List[Finding]:
    if not plan.refusal_reason:
        return []
    return [Finding(
        "plan_refused", UNFIT, f"the planner refused: {plan.refusal_reason} [{plan.refusal_source}]",
        "no vLLM release, layout and flags that would run here were found, so nothing can be provisioned",
        "follow the planner's reason, or change the model or revive_plan_overrides; `bin/revive plan` shows the "
        "same decision without Ansible")]


def rule_probe_error(error: Optional[str]) -> List[Finding]:
    if not error:
        return []
    return [Finding(
        "probe_failed", UNFIT, f"the GPU probe failed: {error}",
        "without the GPU facts nothing about this node's fitness or its plan is known",
        "fix what the probe reports (driver, libnvidia-ml.so.1, the probe venv) and re-run the preflight")]


# --- the verdict for one node -------------------------------------------------------------------------------

@dataclass
class Verdict:
    fit: bool
    findings: List[Finding] = field(default_factory=list)

    @property
    def reasons(self) -> List[str]:
        return [f.message for f in self.findings if f.verdict == UNFIT]

    @property
    def warnings(self) -> List[str]:
        return [f.message for f in self.findings if f.verdict == WARN]

    def as_dict(self) -> dict:
        unfit_checks = sorted({f.check for f in self.findings if f.verdict == UNFIT})
        # `warning_messages`, not `warnings`: Ansible takes a module's top-level `warnings` for its own.
        return {"fit": self.fit, "reasons": self.reasons, "warning_messages": self.warnings,
                "unfit_checks": unfit_checks,
                "findings": [f.as_dict() for f in self.findings]}


def evaluate(gpu: Optional[dict], policy: Policy, plan: PlanOutcome, owner_of: OwnerLookup = process_owner,
             probe_error: Optional[str] = None) -> Verdict:
    findings = rule_probe_error(probe_error)
    if gpu is not None:
        findings += (rule_gpu_count(gpu, policy) + rule_gpu_name(gpu, policy) + rule_driver_window(gpu, plan)
                     + rule_memory_retirement(gpu) + rule_uncorrected_ecc(gpu) + rule_pcie_link(gpu, policy)
                     + rule_foreign_processes(gpu, policy, owner_of) + rule_persistence(gpu))
    elif not probe_error:
        findings += rule_probe_error("no GPU facts were given")
    findings += rule_plan_refusal(plan)
    order = {UNFIT: 0, WARN: 1}
    findings.sort(key=lambda f: (order[f.verdict], -1 if f.gpu_index is None else f.gpu_index, f.check))
    return Verdict(fit=not any(f.verdict == UNFIT for f in findings), findings=findings)


# --- the fleet: summary and policy ---------------------------------------------------------------------------

FIT = "fit"
QUARANTINED = "quarantined"
FAILED = "failed"
NOT_PROBED = "not probed"


@dataclass
class HostLine:
    host: str
    status: str
    reasons: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    release: Optional[str] = None
    unfit_checks: List[str] = field(default_factory=list)


@dataclass
class FleetSummary:
    hosts: List[HostLine]
    max_unfit_percent: float

    @property
    def total(self) -> int:
        return len(self.hosts)

    def count(self, status: str) -> int:
        return sum(1 for line in self.hosts if line.status == status)

    @property
    def unfit(self) -> int:
        return self.count(QUARANTINED) + self.count(FAILED)

    @property
    def unfit_percent(self) -> float:
        return round(100.0 * self.unfit / self.total, 1) if self.total else 0.0

    @property
    def exceeded(self) -> bool:
        return self.unfit_percent > self.max_unfit_percent

    @property
    def headline(self) -> str:
        text = (f"{self.count(FIT)} fit, {self.count(QUARANTINED)} quarantined, {self.count(FAILED)} failed"
                f"{', ' + str(self.count(NOT_PROBED)) + ' not probed' if self.count(NOT_PROBED) else ''} of "
                f"{self.total} GPU node(s): {self.unfit_percent:g} % unfit, policy allows at most "
                f"{self.max_unfit_percent:g} % (revive_max_unfit_percent)")
        return text

    @property
    def policy_message(self) -> str:
        if not self.exceeded:
            return f"fleet policy met: {self.headline}"
        return (f"fleet policy: stopping before anything is provisioned: {self.headline}. So many unfit nodes point "
                "at something fleet-wide (a driver rollout, a wrong revive_expected_* value, the model or the "
                "plan). Fix the reasons above, or raise revive_max_unfit_percent deliberately")

    def lines(self) -> List[str]:
        out = [self.headline]
        for line in self.hosts:
            release = f" - {line.release}" if line.release else ""
            out.append(f"{line.host}: {line.status.upper()}{release}")
            out += [f"  unfit: {reason}" for reason in line.reasons]
            out += [f"  warn:  {warning}" for warning in line.warnings]
        return out

    def as_dict(self) -> dict:
        # Counts under `counts`: a top-level `failed` would be read by Ansible as the task's own status.
        return {"lines": self.lines(), "headline": self.headline, "total": self.total,
                "counts": {"fit": self.count(FIT), "quarantined": self.count(QUARANTINED),
                           "failed": self.count(FAILED), "not_probed": self.count(NOT_PROBED)},
                "unfit_percent": self.unfit_percent,
                "max_unfit_percent": self.max_unfit_percent, "exceeded": self.exceeded,
                "policy_message": self.policy_message,
                "hosts": {line.host: {"status": line.status, "reasons": line.reasons, "warnings": line.warnings,
                                      "unfit_checks": line.unfit_checks, "release": line.release}
                          for line in self.hosts}}


def fleet_summary(hosts: List[str], results: Dict[str, Optional[dict]], max_unfit_percent: float) -> FleetSummary:
    """One line per GPU node from its preflight result; a node without one failed (unreachable or a task error).

    A result is gpu_fitness's output plus `probed` (false in check mode before the probe venv exists) and
    `release` (a one-line description of the plan).
    """
    lines = []
    for host in hosts:
        result = results.get(host)
        if not result:
            lines.append(HostLine(host, FAILED, ["the preflight did not finish on this host (unreachable or a task "
                                                 "failed): see the play's output above"]))
        elif not result.get("probed", True):
            lines.append(HostLine(host, NOT_PROBED, warnings=[result.get("note") or "not probed"]))
        else:
            lines.append(HostLine(host, FIT if result.get("fit") else QUARANTINED, list(result.get("reasons") or []),
                                  list(result.get("warnings") or []), result.get("release"),
                                  list(result.get("unfit_checks") or [])))
    return FleetSummary(lines, float(max_unfit_percent))
