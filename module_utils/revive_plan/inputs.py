"""What the planner is asked (workload, operator overrides, serving settings, package source) and how it
answers: one reason per decision, warnings, or a refusal."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

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


@dataclass
class Workload:
    max_model_len: Optional[int] = None
    concurrency: int = NOTES_CONCURRENCY
    slo_p95_e2e_s: float = NOTES_SLO_P95_S
    slo_output_tokens: int = NOTES_OUTPUT_TOKENS
    typical_prompt_tokens: int = NOTES_PROMPT_TOKENS
    metrics: bool = True


@dataclass
class Overrides:
    vllm_version: Optional[str] = None
    tensor_parallel_size: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    swap_space: Optional[float] = None
    exclude_gpus: Sequence[int] = ()
    allow_bf16_conversion: bool = True


@dataclass
class PackageSource:
    """Where the nodes' packages come from (the runtime role's source): the public index, a mirror, a wheelhouse."""

    type: str = "index"
    index_url: str = PUBLIC_INDEX

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


@dataclass(frozen=True)
class PlanRequest:
    """Everything the operator asks of one plan besides the GPU and model facts and the release data."""

    workload: Workload
    overrides: Overrides
    serve: Serve
    host_ram_bytes: Optional[int]
    source: PackageSource


@dataclass
class Decisions:
    reasons: List[Dict[str, Any]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    def add(self, decision: str, value: Any, reason: str, source: str) -> None:
        self.reasons.append({"decision": decision, "value": value, "reason": reason, "source": source})
