"""The node side of a bench run: what the GPU node's units, replicas and GPUs did while the load ran.

Runs on a GPU node (`revive bench-sample`, started by playbooks/benchmark.yml before the load and stopped after
it) with the standard library, plus pynvml when it is importable (the probe venv has it). It reads the node's
release record (/var/lib/revive/releases.json: the replicas of the current release, their units, ports and GPUs)
and samples every `interval` seconds, on the wall clock (the controller places the samples in the bench's levels
by the bench's `clock_zero`):

- per replica unit: `NRestarts`, `ActiveState`, `MainPID` (`systemctl show`); a kill that systemd restarted shows
  as NRestarts going up and a new MainPID, a manual restart as a new MainPID;
- per replica: `GET /health` (0.5.4 has no HTTP status metric: /health is what answers) and the counters of
  `GET /metrics` (samples of `*_total` series, summed over labels: a counter that goes down means the process
  that owned it restarted);
- per GPU of the release: utilisation and memory used (NVML; the lab's fake NVML reports what the twin's engine
  does, named as simulated in the header).

When it stops it reads the journal of the window once: lines of the replicas' units and of the kernel that say
"out of memory" (CUDA's `OutOfMemoryError`, `CUDA out of memory`, the kernel's OOM killer), with their times.

Output: JSON lines, `{"kind": "header", ...}` (node, release, replicas, GPU source), `{"kind": "sample", "t": ...}`
per sample, `{"kind": "journal", "t": ..., "unit": ..., "line": ...}` per OOM line, `{"kind": "end", "t": ...}`.
observe.py turns them into per-level observations. Pure parsing is separated from the probes for the tests.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, Iterable, List, Optional

from ansible.module_utils.revive_serve_address import replica_host, url_host

UNIT_PROPERTIES = ("Id", "NRestarts", "ActiveState", "SubState", "MainPID")
OOM_PATTERN = re.compile(r"out of memory|OutOfMemoryError|oom-kill|Killed process", re.IGNORECASE)
COUNTER_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*_total)(\{[^}]*\})?\s+([^\s]+)")


class SampleError(Exception):
    """The sampler cannot run on this node; the message says what to fix."""


def load_replicas(record_path: str) -> Dict[str, Any]:
    """The current release's replicas from the node's release record: what to watch."""
    try:
        with open(record_path, encoding="utf-8") as handle:
            record = json.load(handle)
    except OSError as exc:
        raise SampleError(f"cannot read the release record {record_path}: {exc.strerror}; provision the node "
                          "(site.yml) before benchmarking it") from None
    except ValueError as exc:
        raise SampleError(f"the release record {record_path} is not JSON: {exc}") from None
    current = record.get("current") if isinstance(record, dict) else None
    if not isinstance(current, dict) or not current.get("replicas"):
        raise SampleError(f"the release record {record_path} has no current release with replicas: nothing is "
                          "serving on this node")
    replicas = []
    for replica in current["replicas"]:
        replicas.append({"name": replica["name"], "unit": replica["unit"], "port": int(replica["port"]),
                         "gpus": [str(g) for g in replica.get("gpus") or []],
                         "tensor_parallel_size": replica.get("tensor_parallel_size"),
                         "argv": [str(word) for word in replica.get("argv") or []],
                         # Where the node reaches it: the address its argv binds (--host).
                         "host": replica_host(replica)})
    return {"release_id": current.get("id"), "vllm_version": current.get("vllm_version"),
            "simulated": bool(current.get("simulated")), "argv": current.get("args"),
            "model": current.get("model"), "replicas": replicas}


def parse_systemctl_show(text: str) -> Dict[str, Dict[str, Any]]:
    """`systemctl show -p ... UNIT...` output (blocks separated by blank lines) -> {unit: properties}."""
    units: Dict[str, Dict[str, Any]] = {}
    for block in text.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" not in props:
            continue
        units[props["Id"]] = {
            "n_restarts": int(props["NRestarts"]) if props.get("NRestarts", "").isdigit() else None,
            "active": props.get("ActiveState"), "sub": props.get("SubState"),
            "main_pid": int(props["MainPID"]) if props.get("MainPID", "").isdigit() else None}
    return units


def parse_counters(text: str) -> Dict[str, float]:
    """Prometheus text exposition -> {counter name: value summed over its label sets} for `*_total` samples."""
    counters: Dict[str, float] = {}
    for line in text.splitlines():
        match = COUNTER_LINE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        counters[match.group(1)] = counters.get(match.group(1), 0.0) + value
    return counters


def oom_lines(journal_json_lines: Iterable[str]) -> List[Dict[str, Any]]:
    """`journalctl -o json` lines -> the ones that report an out-of-memory condition, with wall time and unit."""
    found = []
    for raw in journal_json_lines:
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald sends non-UTF-8 messages as byte arrays
            message = bytes(b for b in message if isinstance(b, int)).decode("utf-8", "replace")
        if not isinstance(message, str) or not OOM_PATTERN.search(message):
            continue
        found.append({"kind": "journal", "t": int(entry.get("__REALTIME_TIMESTAMP", 0)) / 1e6,
                      "unit": entry.get("_SYSTEMD_UNIT") or ("kernel" if entry.get("_TRANSPORT") == "kernel" else ""),
                      "line": message[:500]})
    return found


class Probes:
    """The node-facing reads; tests replace them."""

    def __init__(self, host: str = "", timeout: float = 2.0):
        # "": each replica's own address (load_replicas: the --host its argv binds); else this one for all.
        self.host = host
        self.timeout = timeout
        self.nvml = None
        self.nvml_note = "no NVML"

    def units(self, units: List[str]) -> Dict[str, Dict[str, Any]]:
        argv = ["systemctl", "show", "-p", ",".join(UNIT_PROPERTIES), "--", *units]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return parse_systemctl_show(done.stdout)

    def http(self, port: int, path: str, host: str = "127.0.0.1") -> Dict[str, Any]:
        url = f"http://{url_host(self.host or host)}:{port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as answer:  # noqa: S310 (loopback, our own)
                return {"status": answer.status, "body": answer.read().decode("utf-8", "replace")}
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, "body": ""}
        except (OSError, ValueError) as exc:
            return {"status": None, "error": str(getattr(exc, "reason", exc))[:200], "body": ""}

    def open_nvml(self) -> None:
        try:
            import pynvml  # type: ignore[import-not-found]
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 (ImportError or any NVMLError: GPUs are then not sampled)
            self.nvml_note = f"GPUs not sampled: {exc}"
            return
        self.nvml = pynvml
        self.nvml_note = f"NVML, driver {pynvml.nvmlSystemGetDriverVersion()}"

    def gpus(self, indices: List[str]) -> Dict[str, Dict[str, Any]]:
        if self.nvml is None:
            return {}
        out = {}
        for index in indices:
            try:
                handle = self.nvml.nvmlDeviceGetHandleByIndex(int(index))
                rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                out[index] = {"util": int(rates.gpu), "mem_util": int(rates.memory), "memory_used": int(memory.used)}
            except Exception as exc:  # noqa: BLE001 (one GPU that cannot be read is recorded, not fatal)
                out[index] = {"error": str(exc)[:200]}
        return out

    def journal(self, units: List[str], since: float, until: float) -> List[str]:
        argv = ["journalctl", "--no-pager", "-o", "json", f"--since=@{since:.0f}", f"--until=@{until + 1:.0f}"]
        for unit in units:
            argv += ["-u", unit]
        lines = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.splitlines()
        kernel = subprocess.run(["journalctl", "--no-pager", "-o", "json", "-k", f"--since=@{since:.0f}",
                                 f"--until=@{until + 1:.0f}"], capture_output=True, text=True,
                                check=False).stdout.splitlines()
        return lines + kernel


def sample(watch: Dict[str, Any], probes: Probes, now: Callable[[], float] = time.time) -> Dict[str, Any]:
    """One sample of every replica (unit, /health, /metrics counters) and its GPUs."""
    t = now()
    units = probes.units([r["unit"] for r in watch["replicas"]])
    replicas = {}
    for replica in watch["replicas"]:
        health = probes.http(replica["port"], "/health", replica["host"])
        metrics = probes.http(replica["port"], "/metrics", replica["host"])
        replicas[replica["name"]] = dict(units.get(replica["unit"]) or {}, health=health["status"],
                                         counters=parse_counters(metrics["body"]) if metrics["status"] == 200
                                         else None)
    gpus = probes.gpus(sorted({g for r in watch["replicas"] for g in r["gpus"]}, key=int))
    return {"kind": "sample", "t": round(t, 3), "replicas": replicas, "gpus": gpus}


def run(record_path: str, out_path: str, interval: float, duration: float, stop_file: Optional[str],
        node: str, probes: Optional[Probes] = None, sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.time) -> int:
    """Sample until `stop_file` exists or `duration` seconds passed; returns the number of samples."""
    watch = load_replicas(record_path)
    probes = probes or Probes()
    probes.open_nvml()
    start = now()
    count = 0
    tmp = out_path + ".part"
    with open(tmp, "w", encoding="utf-8") as out:
        header = {"kind": "header", "node": node, "t": round(start, 3), "interval_s": interval,
                  "gpu_source": probes.nvml_note + (" (simulated: the lab's fake NVML)" if watch["simulated"] else ""),
                  **watch}
        out.write(json.dumps(header) + "\n")
        while True:
            out.write(json.dumps(sample(watch, probes, now)) + "\n")
            out.flush()
            count += 1
            if (stop_file and os.path.exists(stop_file)) or now() - start >= duration:
                break
            sleep(max(0.0, start + count * interval - now()))
        end = now()
        units = [r["unit"] for r in watch["replicas"]]
        for line in oom_lines(probes.journal(units, start, end)):
            out.write(json.dumps(line) + "\n")
        out.write(json.dumps({"kind": "end", "t": round(end, 3), "samples": count}) + "\n")
    os.replace(tmp, out_path)
    return count
