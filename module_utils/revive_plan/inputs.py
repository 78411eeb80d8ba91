"""What the planner is asked (workload, operator overrides, serving settings, package source) and how it
answers: one reason per decision, warnings, or a refusal.

Every numeric and enumerated input is checked when its dataclass is built (`BOUNDS`, docs/inputs.md): a value
out of range or of the wrong type raises PlanInputError, which bin/revive plan and library/vllm_plan.py render
with the input's name as their user writes it. What depends on the node's GPUs (`check_against_gpus`) is a
PlanRefusal instead: that node cannot run it, another may (the preflight quarantines it).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence

from ansible.module_utils.revive_bounds import Bound, InputError
from ansible.module_utils.revive_bounds import shown as _shown

# Defaults from docs/field-report.md ('Acceptance targets (the operator's SLO)'), ('Load test method').
NOTES_CONCURRENCY = 32
NOTES_SLO_P95_S = 12.0
NOTES_OUTPUT_TOKENS = 200
NOTES_PROMPT_TOKENS = 256

PUBLIC_INDEX = "https://pypi.org/simple"


class PlanRefusal(Exception):
    """The combination will not run; `reason` says why and what to change, `source` where the rule is."""

    def __init__(self, reason: str, source: str):
        super().__init__(reason)
        self.reason = reason
        self.source = source


class PlanError(Exception):
    """The planner produced something the release would reject (a bug in the planner or the data)."""


# An input out of its range or of the wrong type (module_utils/revive_bounds.py): `field` is its path
# ("workload.max_model_len"), which is also its name in library/vllm_plan.py.
PlanInputError = InputError


# The planner's inputs and their bounds, by path; docs/inputs.md has the same table with the reasons.
BOUNDS: Dict[str, Bound] = {
    "workload.max_model_len": Bound(int, 1, optional=True, why="and at most the model's maximum"),
    "workload.concurrency": Bound(int, 1),
    "workload.slo_p95_e2e_s": Bound(float, 0, high=10 ** 6, low_open=True),
    "workload.slo_output_tokens": Bound(int, 1),
    "workload.typical_prompt_tokens": Bound(int, 1),
    "overrides.tensor_parallel_size": Bound(int, 1, optional=True, unset=0,
                                            why="and at most the GPUs left after exclude_gpus"),
    "overrides.pipeline_parallel_size": Bound(int, 1, high=64, optional=True, unset=0,
                                              why="pipeline stages, one per node; at most the serving group's nodes"),
    "overrides.gpu_memory_utilization": Bound(float, 0, high=1, low_open=True, optional=True,
                                              why="a fraction of each GPU's memory"),
    "overrides.max_num_seqs": Bound(int, 1, optional=True),
    "overrides.max_num_batched_tokens": Bound(int, 1, optional=True, unset=0),
    "overrides.swap_space": Bound(float, 0, high=2 ** 20, optional=True, why="GiB per GPU"),
    "serve.base_port": Bound(int, 1, high=65535, why="a TCP port; replica N listens on base_port + N"),
    "group.nodes": Bound(int, 1, high=64, why="identical GPU nodes that serve one model together"),
    "group.link_gbit": Bound(float, 0, high=10 ** 4, low_open=True, why="Gbit/s between the group's nodes"),
    "group.ray_port": Bound(int, 1, high=65535, why="the Ray head's GCS port"),
    "host_ram_bytes": Bound(int, 1, high=2 ** 62, optional=True),
    # The front ends' own units for host RAM (bin/revive plan, library/vllm_plan.py); 0 is "unknown", as before.
    "host_ram_gib": Bound(float, 0, high=2 ** 32, optional=True, unset=0, unset_means="unknown"),
    "host_ram_mb": Bound(int, 0, high=2 ** 42, optional=True, unset=0, unset_means="unknown"),
}
GPU_INDEX = Bound(int, 0, high=1023)
SOURCE_TYPES = ("index", "mirror", "wheelhouse")


def check_bounds(section: str, values: Any) -> None:
    """Raise PlanInputError for the first field of dataclass `values` outside BOUNDS[f"{section}.{name}"]."""
    for item in fields(values):
        bound = BOUNDS.get(f"{section}.{item.name}")
        if bound is not None:
            bound.check(f"{section}.{item.name}", getattr(values, item.name))


def check_gpu_indices(path: str, value: Any) -> None:
    """A list of GPU indices, each a GPU_INDEX (what `revive gpus` numbers them)."""
    allowed = f"a list of GPU indices, each a whole number from 0 to {_shown(GPU_INDEX.high)}"
    try:
        if not isinstance(value, (list, tuple)):
            raise PlanInputError(path, value, allowed, "")
        for index in value:
            GPU_INDEX.check(path, index)
    except PlanInputError:
        raise PlanInputError(path, value, allowed, "list the indices `bin/revive gpus` shows, e.g. [3, 5]") from None


def check_flag(path: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise PlanInputError(path, value, "true or false", f"set {path} to true or false")


def check_against_gpus(overrides: "Overrides", indices: Sequence[int]) -> None:
    """The overrides that depend on the node's GPUs: refused (not an input error) since another node may fit."""
    unknown = sorted(set(overrides.exclude_gpus) - set(indices))
    if unknown:
        raise PlanRefusal(f"exclude_gpus (--exclude-gpus) names GPU(s) {unknown} that this node does not have; its "
                          f"GPUs are {sorted(indices)}. Fix: exclude only indices `bin/revive gpus` lists.",
                          "GPU facts; docs/inputs.md")
    left = len(set(indices) - set(overrides.exclude_gpus))
    if indices and not left:
        raise PlanRefusal(f"exclude_gpus (--exclude-gpus) {sorted(overrides.exclude_gpus)} excludes every GPU of "
                          "this node: nothing is left to plan for. Fix: exclude fewer GPUs, or leave the node out.",
                          "GPU facts; docs/inputs.md")
    tp = overrides.tensor_parallel_size
    if tp and indices and tp > left:
        raise PlanRefusal(f"tensor_parallel_size (--tensor-parallel-size) {tp} is more than the {left} GPU(s) this "
                          f"node has after exclusions. Fix: set at most {left}, or leave it out to let the planner "
                          "choose.", "GPU facts; docs/inputs.md")


@dataclass
class Workload:
    max_model_len: Optional[int] = None
    concurrency: int = NOTES_CONCURRENCY
    slo_p95_e2e_s: float = NOTES_SLO_P95_S
    slo_output_tokens: int = NOTES_OUTPUT_TOKENS
    typical_prompt_tokens: int = NOTES_PROMPT_TOKENS
    metrics: bool = True

    def __post_init__(self) -> None:
        check_bounds("workload", self)
        check_flag("workload.metrics", self.metrics)


@dataclass
class Overrides:
    vllm_version: Optional[str] = None
    tensor_parallel_size: Optional[int] = None
    # Stages across the serving group's nodes (one per node); None or 0: the fewest that hold the workload.
    pipeline_parallel_size: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    swap_space: Optional[float] = None
    exclude_gpus: Sequence[int] = ()
    allow_bf16_conversion: bool = True
    allow_long_max_model_len: bool = False   # max_model_len above the model's own (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)

    def __post_init__(self) -> None:
        check_bounds("overrides", self)
        check_flag("overrides.allow_bf16_conversion", self.allow_bf16_conversion)
        check_flag("overrides.allow_long_max_model_len", self.allow_long_max_model_len)
        if self.vllm_version is not None and (not isinstance(self.vllm_version, str) or not self.vllm_version):
            raise PlanInputError("overrides.vllm_version", self.vllm_version, "a release of data/vllm-releases.yml",
                                 "set a version string such as \"0.8.5.post1\", or leave it out")
        check_gpu_indices("overrides.exclude_gpus", self.exclude_gpus)


@dataclass
class PackageSource:
    """Where the nodes' packages come from (the runtime role's source): the public index, a mirror, a wheelhouse."""

    type: str = "index"
    index_url: str = PUBLIC_INDEX

    def __post_init__(self) -> None:
        if self.type not in SOURCE_TYPES:
            raise PlanInputError("package_source.type", self.type, f"one of {', '.join(SOURCE_TYPES)}",
                                 f"set one of {', '.join(SOURCE_TYPES)}")

    @property
    def is_public_index(self) -> bool:
        return self.type == "index" and self.index_url.rstrip("/") in (PUBLIC_INDEX, "https://pypi.python.org/simple")

    def describe(self) -> str:
        return "PyPI" if self.is_public_index else f"{self.type} {self.index_url}" if self.type != "wheelhouse" \
            else "a wheelhouse"


@dataclass
class Serve:
    model_path: Optional[str] = None
    served_model_name: Optional[str] = None
    host: str = "0.0.0.0"
    base_port: int = 8000

    def __post_init__(self) -> None:
        check_bounds("serve", self)
        try:
            ipaddress.ip_address(self.host if isinstance(self.host, str) else "")
        except ValueError:
            raise PlanInputError("serve.host", self.host, "an IP address to bind (vLLM's --host)",
                                 "set one of the node's addresses, or 0.0.0.0 for every interface") from None


@dataclass
class NodeGroup:
    """The nodes that serve one model together (issue 16): `nodes` members with the same GPUs, linked at
    `link_gbit`. One node is a single-node plan; more are planned TP inside a node, PP across nodes."""

    nodes: int = 1
    link_gbit: float = 25.0

    def __post_init__(self) -> None:
        check_bounds("group", self)

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbit * 1e9 / 8


@dataclass(frozen=True)
class PlanRequest:
    """Everything the operator asks of one plan besides the GPU and model facts and the release data."""

    workload: Workload
    overrides: Overrides
    serve: Serve
    host_ram_bytes: Optional[int]
    source: PackageSource
    group: NodeGroup = field(default_factory=NodeGroup)

    def __post_init__(self) -> None:
        BOUNDS["host_ram_bytes"].check("host_ram_bytes", self.host_ram_bytes)


def check_ports(serve: Serve, replicas: int) -> None:
    """The last replica's port (base_port + replicas - 1) must still be a TCP port."""
    if serve.base_port + replicas - 1 > 65535:
        raise PlanInputError("serve.base_port", serve.base_port, f"at most {65536 - replicas} for {replicas} "
                             "replicas (replica N listens on base_port + N, a TCP port up to 65535)",
                             f"set base_port to at most {65536 - replicas}")


@dataclass
class Decisions:
    reasons: List[Dict[str, Any]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    def add(self, decision: str, value: Any, reason: str, source: str) -> None:
        self.reasons.append({"decision": decision, "value": value, "reason": reason, "source": source})
