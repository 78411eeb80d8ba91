"""NCCL check: parameters, constants and what the check reads on the host (see revive_nccl/__init__.py)."""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ansible.module_utils.revive_record.pinning import parse_cpu_list
from ansible.module_utils.revive_nccl.worker import WORKER_SOURCE

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_SIZES = (1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB)
DEFAULT_ITERATIONS = 20         # nccl-tests -n
DEFAULT_WARMUP = 5              # nccl-tests -w
DEFAULT_TIMEOUT_S = 180.0
DEFAULT_MARGIN = 0.10           # a compare result within 10 % is no contradiction
GRACE_S = 3.0                   # after one rank fails, the others get this long to exit on their own
POLL_S = 0.05
LOG_LINES = 30
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"   # systemd's default PATH
PLANNER_VARS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")
SEEN_PREFIXES = ("NCCL_", "CUDA_")
ACS_DOC = ("https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"
           "#pci-access-control-services-acs")
BACKENDS = ("nccl", "gloo")


class NcclCheckError(Exception):
    """The check cannot run as asked (bad parameters or plan): the module fails before starting anything."""


# --- parameters -------------------------------------------------------------------------------------------

def parse_size(value: Any) -> int:
    """1048576, '1MiB', '64KiB', '1GiB', '4M' -> bytes; a positive multiple of 4 (float32 elements)."""
    text = str(value).strip()
    match = re.fullmatch(r"(\d+)\s*([KMG]?)(?:i?B)?", text, re.IGNORECASE)
    if not match:
        raise NcclCheckError(f"size {value!r} is not bytes or N KiB/MiB/GiB (e.g. 1MiB, 256MiB)")
    size = int(match.group(1)) * {"": 1, "K": KiB, "M": MiB, "G": GiB}[match.group(2).upper()]
    if size < 4 or size % 4:
        raise NcclCheckError(f"size {value!r} = {size} bytes: it must be a positive multiple of 4 (float32)")
    return size


def busbw_factor(world_size: int) -> float:
    """nccl-tests' bus bandwidth factor for AllReduce: 2(n-1)/n (doc/PERFORMANCE.md)."""
    return 2.0 * (world_size - 1) / world_size


def human_size(size: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


@dataclass
class CheckSpec:
    python: str
    backend: str = "nccl"
    sizes: Sequence[int] = DEFAULT_SIZES
    iterations: int = DEFAULT_ITERATIONS
    warmup: int = DEFAULT_WARMUP
    timeout_s: float = DEFAULT_TIMEOUT_S
    compare: bool = False
    compare_margin: float = DEFAULT_MARGIN
    extra_env: Dict[str, str] = field(default_factory=dict)
    base_env: Optional[Dict[str, str]] = None      # None: systemd's (PATH, LANG); the device driver passes its own
    single_gpu: str = "skip"
    nccl_debug: str = "INFO"
    log_lines: int = LOG_LINES
    work_dir: Optional[str] = None                  # kept when given; else a temporary directory, removed

    @property
    def simulated(self) -> bool:
        return self.backend == "gloo"

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise NcclCheckError(f"backend {self.backend!r}: use nccl (GPUs) or gloo (CPU processes, the lab)")
        if not self.sizes:
            raise NcclCheckError("sizes is empty: give at least one all-reduce size (e.g. [1MiB, 256MiB])")
        if self.iterations < 1 or self.warmup < 0:
            raise NcclCheckError(f"iterations ({self.iterations}) must be >= 1 and warmup ({self.warmup}) >= 0")
        if self.timeout_s <= 0:
            raise NcclCheckError(f"timeout ({self.timeout_s:g} s) must be positive")
        if self.single_gpu not in ("skip", "run"):
            raise NcclCheckError(f"single_gpu {self.single_gpu!r}: use skip or run")


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


@dataclass
class Deps:
    """What the check reads and runs on the host; tests replace parts."""
    online_cpus: Callable[[], List[int]] = lambda: parse_cpu_list(_read("/sys/devices/system/cpu/online") or "")
    numa_nodes: Callable[[], List[int]] = lambda: parse_cpu_list(_read("/sys/devices/system/node/online") or "0")
    which: Callable[[str], Optional[str]] = shutil.which
    run: Callable[[List[str]], Tuple[int, str, str]] = None  # type: ignore[assignment] # set in __post_init__
    sysfs_root: str = "/sys"
    cmdline_path: str = "/proc/cmdline"
    worker_source: str = WORKER_SOURCE
    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        if self.run is None:
            self.run = _run


def _run(argv: List[str]) -> Tuple[int, str, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return 127, "", str(error)
    return proc.returncode, proc.stdout, proc.stderr

