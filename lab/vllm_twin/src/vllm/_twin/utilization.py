"""Per-GPU utilisation the twin reports through the fake NVML's override file.

lab/fakenvml reads `$FAKE_NVML_UTILIZATION` (default /run/fake-nvml/utilization.json),
`{"<gpu index>": {"gpu": N, "memory": M}}`, on every nvmlDeviceGetUtilizationRates call, so
`nvidia-smi`-style readers see what the engine does: the share of wall time the GPUs were busy over the
last second (NCCL kernels spin while they wait, so communication counts as busy, as on real GPUs), and
the share of it spent reading memory. Several replicas on one node share the file: each rewrites only
its own GPUs, under an flock, through a temporary file and rename (no reader sees half a file), at most
once a second. A replica whose pipeline stages run on other nodes of a Ray cluster (0.5.4's Ray executor,
vllm/_twin/ray_executor.py) hands the same percentages to `remote`, which has its Ray worker on each other node
write them for that node's GPUs (vllm/_twin/ray_worker.py).
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

WRITE_INTERVAL_SECONDS = 1.0
DEFAULT_UTILIZATION_FILE = "/run/fake-nvml/utilization.json"  # lab/fakenvml's default for FAKE_NVML_UTILIZATION


class UtilizationReporter:
    def __init__(self, path: str, nvml_indices: List[int], busy_rank: Optional[int] = None, busy_extra: int = 0,
                 log=None):
        self.path = path
        self.indices = list(nvml_indices)
        self.busy_rank = busy_rank
        self.busy_extra = busy_extra
        self.log = log
        self.window_start = time.monotonic()
        self.busy = 0.0
        self.memory_busy = 0.0
        self.disabled = False
        self.last: Dict[str, Dict[str, int]] = {}
        # (gpu %, memory %) for the replica's GPUs on other nodes, None when the replica goes away
        self.remote: Optional[Callable[[Optional[Tuple[int, int]]], None]] = None
        self.last_remote: Optional[Tuple[int, int]] = None

    def record(self, busy_seconds: float, memory_seconds: float) -> None:
        self.busy += busy_seconds
        self.memory_busy += memory_seconds
        self.maybe_flush()

    def maybe_flush(self, force: bool = False) -> None:
        now = time.monotonic()
        elapsed = now - self.window_start
        if not force and elapsed < WRITE_INTERVAL_SECONDS:
            return
        gpu = min(100, int(round(100.0 * self.busy / max(elapsed, 1e-9))))
        memory = min(100, int(round(100.0 * self.memory_busy / max(elapsed, 1e-9))))
        self.window_start, self.busy, self.memory_busy = now, 0.0, 0.0
        values = {}
        for rank, index in enumerate(self.indices):
            extra = self.busy_extra if rank == self.busy_rank else 0
            values[str(index)] = {"gpu": min(100, gpu + extra), "memory": memory}
        if values != self.last:
            self.write(values)
            self.last = values
        if self.remote is not None and (gpu, memory) != self.last_remote:
            self.remote((gpu, memory))
            self.last_remote = (gpu, memory)

    def clear(self) -> None:
        """Remove this replica's GPUs from the file (the process is going away)."""
        self.write({str(i): None for i in self.indices})
        if self.remote is not None:
            self.remote(None)
            self.remote = None

    def write(self, values: Dict[str, Optional[Dict[str, int]]]) -> None:
        if self.disabled:
            return
        directory = os.path.dirname(self.path) or "."
        try:
            os.makedirs(directory, exist_ok=True)
            with open(self.path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    with open(self.path, encoding="utf-8") as handle:
                        current = json.load(handle)
                    if not isinstance(current, dict):
                        current = {}
                except (OSError, ValueError):
                    current = {}
                for key, value in values.items():
                    if value is None:
                        current.pop(key, None)
                    else:
                        current[key] = value
                fd, tmp = tempfile.mkstemp(prefix=".utilization.", dir=directory)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(current, handle, sort_keys=True)
                os.chmod(tmp, 0o644)
                os.replace(tmp, self.path)
        except OSError as exc:
            self.disabled = True
            if self.log:
                self.log(f"GPU utilisation is not reported: cannot write {self.path}: {exc.strerror}. Set "
                         "FAKE_NVML_UTILIZATION to a writable path (the fake NVML reads the same variable).")
