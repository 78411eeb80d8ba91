"""The twin's own settings and fault knobs: environment variables, never vLLM arguments.

Read once at start from the process environment and, if present, an env file (KEY=VALUE lines; the
process environment wins), so the lab inventory can drive them per node without touching the unit.
Every knob in effect is logged at start and shown in /version (lab/vllm_twin/README.md lists them).
"""
from __future__ import annotations

import os
import shlex
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

from vllm._twin.tokens import ANSWER_LENGTH_MEDIAN, ANSWER_LENGTH_SIGMA
from vllm._twin.utilization import DEFAULT_UTILIZATION_FILE

ENV_FILE_VARIABLE = "VLLM_SIM_ENV_FILE"
DEFAULT_ENV_FILE = "/etc/vllm-sim/twin.env"

DEFAULT_COLD_START_REQUESTS = 20
DEFAULT_COLD_START_FACTOR = 4.0
# VLLM_SIM_ANSWER_MEDIAN's upper end: a median answer longer than any context the twin serves is a typo.
MAX_ANSWER_MEDIAN = 131072
# VLLM_SIM_NODE_LINK_GBIT: the planner's default link between a serving group's nodes (revive_plan NodeGroup.link_gbit)
# and its bound (inputs.py `group.link_gbit`: above 0, at most 10 000 Gbit/s)
DEFAULT_NODE_LINK_GBIT = 25.0
MAX_NODE_LINK_GBIT = 10000.0


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Settings:
    # baseline behaviour (not faults)
    time_scale: float = 1.0                   # VLLM_SIM_TIME_SCALE: every modelled duration x this
    cold_start_requests: int = DEFAULT_COLD_START_REQUESTS  # VLLM_SIM_COLD_START_REQUESTS
    cold_start_factor: float = DEFAULT_COLD_START_FACTOR    # VLLM_SIM_COLD_START_FACTOR
    answer_median: float = ANSWER_LENGTH_MEDIAN  # VLLM_SIM_ANSWER_MEDIAN: tokens, EOS included
    utilization_file: str = DEFAULT_UTILIZATION_FILE  # FAKE_NVML_UTILIZATION
    # VLLM_SIM_NODE_LINK_GBIT: the network between the nodes of a pipeline (Gbit/s), which vLLM has no argument for
    node_link_gbit: float = DEFAULT_NODE_LINK_GBIT
    # VLLM_SIM_METRICS_CLOCK: "wall" (as vLLM: the latency histograms observe elapsed wall seconds) or "modelled"
    # (they observe modelled seconds, wall / time_scale, so a time-scaled lab's histograms read like the node's)
    metrics_clock: str = "wall"
    # fault knobs (issue 8)
    warmup_requests: Optional[int] = None     # VLLM_SIM_FAULT_WARMUP_REQUESTS: cold start lasts this long
    latency_drift_per_minute: float = 0.0     # VLLM_SIM_FAULT_LATENCY_DRIFT
    error_rate: float = 0.0                   # VLLM_SIM_FAULT_ERROR_RATE
    errors_after_requests: Optional[int] = None  # VLLM_SIM_FAULT_ERRORS_AFTER
    crash_after_requests: Optional[int] = None   # VLLM_SIM_FAULT_CRASH_AFTER_REQUESTS
    crash_after_seconds: Optional[float] = None  # VLLM_SIM_FAULT_CRASH_AFTER_SECONDS
    crash_exit_code: int = 1                  # VLLM_SIM_FAULT_CRASH_EXIT_CODE
    decode_slowdown: float = 1.0              # VLLM_SIM_FAULT_DECODE_SLOWDOWN
    busy_gpu_rank: Optional[int] = None       # VLLM_SIM_FAULT_BUSY_GPU
    busy_gpu_extra_percent: int = 30          # VLLM_SIM_FAULT_BUSY_GPU_EXTRA
    fail_after_load: Optional[str] = None     # VLLM_SIM_FAULT_FAIL_AFTER_LOAD
    seed: int = 0                             # VLLM_SIM_FAULT_SEED: the error-rate draw
    env_file: Optional[str] = None

    def faults(self) -> Dict[str, object]:
        """The fault knobs that are set (empty when the twin runs clean)."""
        defaults = Settings()
        names = ("warmup_requests", "latency_drift_per_minute", "error_rate", "errors_after_requests",
                 "crash_after_requests", "crash_after_seconds", "decode_slowdown", "busy_gpu_rank",
                 "fail_after_load")
        active = {name: getattr(self, name) for name in names if getattr(self, name) != getattr(defaults, name)}
        if "busy_gpu_rank" in active:
            active["busy_gpu_extra_percent"] = self.busy_gpu_extra_percent
        if "crash_after_requests" in active or "crash_after_seconds" in active:
            active["crash_exit_code"] = self.crash_exit_code
        if "error_rate" in active:
            active["seed"] = self.seed
        return active

    def report(self) -> Dict[str, object]:
        """What /version shows under "twin"."""
        return {
            "time_scale": self.time_scale,
            "cold_start": {"requests": self.effective_cold_start_requests(), "factor": self.cold_start_factor},
            "answer_length": {"median": self.answer_median, "sigma": ANSWER_LENGTH_SIGMA},
            "utilization_file": self.utilization_file,
            "metrics_clock": self.metrics_clock,
            "node_link_gbit": self.node_link_gbit,
            "env_file": self.env_file,
            "faults": self.faults(),
        }

    def metrics_duration_factor(self) -> float:
        """What the latency histograms multiply an elapsed wall duration by (metrics_clock)."""
        return 1.0 / self.time_scale if self.metrics_clock == "modelled" else 1.0

    def node_link_bytes_per_s(self) -> float:
        """The node link in bytes/s, as the planner converts it (revive_plan NodeGroup.link_bytes_per_s)."""
        return self.node_link_gbit * 1e9 / 8

    def effective_cold_start_requests(self) -> int:
        return self.warmup_requests if self.warmup_requests is not None else self.cold_start_requests

    def as_dict(self) -> Dict[str, object]:
        return asdict(self)


# variable -> (field, parser)
_VARIABLES: List[Tuple[str, str, str]] = [
    ("VLLM_SIM_TIME_SCALE", "time_scale", "positive_float"),
    ("VLLM_SIM_COLD_START_REQUESTS", "cold_start_requests", "non_negative_int"),
    ("VLLM_SIM_COLD_START_FACTOR", "cold_start_factor", "factor"),
    ("VLLM_SIM_ANSWER_MEDIAN", "answer_median", "answer_length"),
    ("FAKE_NVML_UTILIZATION", "utilization_file", "text"),
    ("VLLM_SIM_METRICS_CLOCK", "metrics_clock", "clock"),
    ("VLLM_SIM_NODE_LINK_GBIT", "node_link_gbit", "link_gbit"),
    ("VLLM_SIM_FAULT_WARMUP_REQUESTS", "warmup_requests", "non_negative_int"),
    ("VLLM_SIM_FAULT_LATENCY_DRIFT", "latency_drift_per_minute", "non_negative_float"),
    ("VLLM_SIM_FAULT_ERROR_RATE", "error_rate", "fraction"),
    ("VLLM_SIM_FAULT_ERRORS_AFTER", "errors_after_requests", "non_negative_int"),
    ("VLLM_SIM_FAULT_CRASH_AFTER_REQUESTS", "crash_after_requests", "non_negative_int"),
    ("VLLM_SIM_FAULT_CRASH_AFTER_SECONDS", "crash_after_seconds", "non_negative_float"),
    ("VLLM_SIM_FAULT_CRASH_EXIT_CODE", "crash_exit_code", "exit_code"),
    ("VLLM_SIM_FAULT_DECODE_SLOWDOWN", "decode_slowdown", "factor"),
    ("VLLM_SIM_FAULT_BUSY_GPU", "busy_gpu_rank", "non_negative_int"),
    ("VLLM_SIM_FAULT_BUSY_GPU_EXTRA", "busy_gpu_extra_percent", "percent"),
    ("VLLM_SIM_FAULT_FAIL_AFTER_LOAD", "fail_after_load", "text"),
    ("VLLM_SIM_FAULT_SEED", "seed", "int"),
]
KNOWN_VARIABLES = [name for name, _, _ in _VARIABLES] + [ENV_FILE_VARIABLE]


def _parse(variable: str, kind: str, raw: str):
    def fail(expected: str):
        raise SettingsError(f"{variable}={raw!r}: expected {expected}. Fix or unset it (lab/vllm_twin/README.md).")
    if kind == "text":
        return raw
    if kind == "clock":
        if raw not in ("wall", "modelled"):
            fail("wall or modelled")
        return raw
    try:
        if kind in ("int", "non_negative_int", "exit_code", "percent"):
            value = int(raw)
        else:
            value = float(raw)
    except ValueError:
        fail("a number")
    if kind == "positive_float" and not value > 0:
        fail("a number > 0")
    if kind == "link_gbit" and not 0 < value <= MAX_NODE_LINK_GBIT:
        fail(f"a link speed in Gbit/s above 0 and at most {MAX_NODE_LINK_GBIT:g}")
    if kind == "answer_length" and not 1 <= value <= MAX_ANSWER_MEDIAN:
        fail(f"a number of tokens between 1 and {MAX_ANSWER_MEDIAN}")
    if kind in ("non_negative_int", "non_negative_float") and value < 0:
        fail("a number >= 0")
    if kind == "fraction" and not 0 <= value <= 1:
        fail("a fraction between 0 and 1")
    if kind == "factor" and value < 1:
        fail("a factor >= 1")
    if kind == "exit_code" and not 1 <= value <= 255:
        fail("an exit status between 1 and 255")
    if kind == "percent" and not 0 <= value <= 100:
        fail("a percentage between 0 and 100")
    return value


def read_env_file(path: str) -> Dict[str, str]:
    values: Dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("export "):
                line = line[len("export "):]
            key, sep, value = line.partition("=")
            if not sep:
                raise SettingsError(f"{path}:{number}: expected KEY=VALUE, got {line!r}")
            parts = shlex.split(value) if value.strip() else [""]
            values[key.strip()] = parts[0] if parts else ""
    return values


def load(environ: Optional[Dict[str, str]] = None) -> Settings:
    environ = dict(os.environ if environ is None else environ)
    env_file = environ.get(ENV_FILE_VARIABLE, DEFAULT_ENV_FILE)
    merged: Dict[str, str] = {}
    used_file: Optional[str] = None
    if env_file and os.path.isfile(env_file):
        merged.update(read_env_file(env_file))
        used_file = env_file
    merged.update({k: v for k, v in environ.items() if k.startswith("VLLM_SIM_") or k == "FAKE_NVML_UTILIZATION"})
    unknown = sorted(k for k in merged if k.startswith("VLLM_SIM_") and k not in KNOWN_VARIABLES)
    if unknown:
        raise SettingsError(f"unknown twin setting(s) {', '.join(unknown)}; known: {', '.join(KNOWN_VARIABLES)}")
    values: Dict[str, object] = {"env_file": used_file}
    for variable, name, kind in _VARIABLES:
        raw = merged.get(variable)
        if raw is None or raw == "":
            continue
        values[name] = _parse(variable, kind, raw)
    return Settings(**values)  # type: ignore[arg-type]
