"""Run the twin from the checkout in tests and benchmarks: model fixtures, a server on a free port, clients.

Used by tests/unit/test_twin_*.py and bench/twin_*.py. The server runs as it does on a lab node:
`python -m vllm.entrypoints.openai.api_server ...` in a subprocess, with the fake libnvidia-ml.so.1
(lab/fakenvml, built by `make fakenvml`) and a GPU profile from lab/profiles.
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
TWIN_SRC = REPO / "lab" / "vllm_twin" / "src"
FAKENVML = REPO / "lab" / "fakenvml"
PROFILES = REPO / "lab" / "profiles"

# The field notes' launch command (docs/field-report.md ('Launch command')), minus --host/--port/--model.
FIELD_NOTES_FLAGS = ["--tensor-parallel-size", "8", "--dtype", "float16", "--gpu-memory-utilization", "0.92",
                     "--max-model-len", "4096", "--max-num-seqs", "128", "--max-num-batched-tokens", "8192",
                     "--enforce-eager", "--swap-space", "16", "--disable-log-requests"]
FIELD_NOTES_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}


def write_model(name: str, directory: Path, dtype: Optional[str] = "F16", size: str = "sparse") -> Path:
    """A model directory from tests/fixtures/models.py: real headers, sparse (no disk) full-size shards."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from fixtures.models import write_model as fixture_write  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    fixture_write(str(directory), name, size=size, dtype=dtype)
    return directory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def release_src(release: str, directory: Path) -> Path:
    """The files of the twin wheel built for `release` (build_wheelhouse.twin_files: the sources, the bundled
    module_utils and vllm/_twin/release.json), written under `directory`: a PYTHONPATH that runs that
    release exactly as its wheel would. 0.5.4 also runs from lab/vllm_twin/src directly."""
    sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))
    try:
        import build_wheelhouse
    finally:
        sys.path.pop(0)
    for name, data in build_wheelhouse.twin_files(release).items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return directory


def twin_env(tmp: Path, profile: str = "v100-pcie-8x", time_scale: float = 0.01,
             extra: Optional[Dict[str, str]] = None, src: Optional[Path] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "NCCL_", "CUDA_"))}
    env.update({
        "PYTHONPATH": str(src or TWIN_SRC),
        "LD_LIBRARY_PATH": str(FAKENVML),
        "FAKE_NVML_PROFILE": str(PROFILES / f"{profile}.json"),
        "FAKE_NVML_UTILIZATION": str(tmp / "utilization.json"),
        "VLLM_SIM_TIME_SCALE": str(time_scale),
        "VLLM_SIM_ENV_FILE": str(tmp / "twin.env"),
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


@dataclass
class Twin:
    process: subprocess.Popen
    port: int
    log_path: Path
    model: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start(model: Path, args: Sequence[str], env: Dict[str, str], log_path: Path, wait: bool = True,
          timeout: float = 60.0, served_name: Optional[str] = None, cpu: Optional[int] = None,
          python: Optional[str] = None) -> Twin:
    """Start the twin; with `wait`, return once /health answers 200 (raises with the log if it exits). `python`:
    the interpreter (default: this one), e.g. a lab node's Python 3.11 venv with Ray (tests/unit/test_twin_ray.py)."""
    port = free_port()
    argv = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), *args]
    if served_name:
        argv += ["--served-model-name", served_name]
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu)] + argv
    handle = open(log_path, "wb")
    process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    handle.close()
    twin = Twin(process, port, log_path, served_name or str(model))
    if wait:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"twin exited with {process.returncode}:\n{twin.log()}")
            try:
                status, _, _ = request(twin, "GET", "/health", timeout=2)
                if status == 200:
                    return twin
            except OSError:
                pass
            if time.monotonic() > deadline:
                twin.stop(signal.SIGKILL)
                raise RuntimeError(f"twin not ready after {timeout}s:\n{twin.log()}")
            time.sleep(0.05)
    return twin


def request(twin: Twin, method: str, path: str, body: Optional[dict] = None, headers: Optional[dict] = None,
            timeout: float = 30.0) -> Tuple[int, Dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", twin.port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body).encode()
        all_headers = {"Content-Type": "application/json"} if body is not None else {}
        all_headers.update(headers or {})
        conn.request(method, path, body=payload, headers=all_headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        conn.close()


@dataclass
class StreamResult:
    status: int
    events: List[str] = field(default_factory=list)     # the data: payloads, in order
    complete: bool = False                                # the chunked body ended with its last chunk
    error: Optional[str] = None
    times: List[float] = field(default_factory=list)      # arrival time of each event (perf_counter)
    sent: float = 0.0

    def chunks(self) -> List[dict]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]


def stream(twin: Twin, path: str, body: dict, headers: Optional[dict] = None, timeout: float = 60.0,
           on_event: Optional[Callable[[str], None]] = None) -> StreamResult:
    """POST and read the SSE stream to its end (or until the server cuts it); `on_event` sees each data: payload
    as it arrives."""
    conn = http.client.HTTPConnection("127.0.0.1", twin.port, timeout=timeout)
    result = StreamResult(status=0, sent=time.perf_counter())
    try:
        all_headers = {"Content-Type": "application/json"}
        all_headers.update(headers or {})
        conn.request("POST", path, body=json.dumps(body).encode(), headers=all_headers)
        response = conn.getresponse()
        result.status = response.status
        if response.status != 200:
            result.events.append(response.read().decode())
            result.complete = True
            return result
        # read1, not readline: http.client's readline hides a truncated chunked body (its peek swallows
        # IncompleteRead), read1 raises it.
        pending = b""
        while True:
            data = response.read1(65536)
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            now = time.perf_counter()
            for line in lines:
                if line.startswith(b"data: "):
                    result.events.append(line[6:].rstrip(b"\r").decode())
                    result.times.append(now)
                    if on_event is not None:
                        on_event(result.events[-1])
        result.complete = True
    except (http.client.IncompleteRead, http.client.RemoteDisconnected, ConnectionError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return result


def iter_metrics(text: str) -> Iterator[Tuple[str, Dict[str, str], float]]:
    """Samples of a Prometheus text exposition: (name, labels, value)."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        if "{" in name_labels:
            name, _, rest = name_labels.partition("{")
            labels = {}
            for item in rest.rstrip("}").split('",'):
                if not item:
                    continue
                key, _, raw = item.partition("=")
                labels[key] = raw.strip('"')
        else:
            name, labels = name_labels, {}
        yield name, labels, float(value)
