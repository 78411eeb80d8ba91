#!/usr/bin/env python3
"""Capture the lab twin's real /metrics exposition per simulated release, for the monitoring rules' tests.

    .venv/bin/python tools/capture_twin_metrics.py [--out tests/data/metrics] [--release 0.5.4 ...]

Each capture runs the twin as a node does (lab/vllm_twin/harness.py: the fake NVML, the v100-pcie-8x profile, the
field notes' 20B at TP 8 with the field notes' flags, docs/field-report.md ('Launch command')), sends the same few
requests (CAPTURE_REQUESTS), then GETs /metrics and writes it unchanged to `vllm-<release>[-<mode>].prom`:
* `vllm-0.5.4.prom`: 0.5.4 with --disable-frontend-multiprocessing (the only mode with vllm:* series, #7188);
* `vllm-0.5.4-default-mode.prom`: 0.5.4 without it: the API answers, /metrics has no vllm:* series
  (the VllmMetricsMissing case, docs/facts/vllm-volta.md §4.2);
* `vllm-0.8.5.post1.prom`: the Volta default in its default (multiprocess) mode, from its wheel's files;
* `haproxy-2.6.prom`: the front door: the frontdoor role's own haproxy.cfg (tests/fixtures/haproxy.py renders it)
  with HAProxy's built-in Prometheus exporter (Debian 12's 2.6 is built with USE_PROMEX) on one more frontend.
Latency values differ between runs (timing); names, types and label keys do not, and
tests/unit/test_monitoring_capture.py checks them against what the twin serves now. The promtool tests use the
captures' series through monitoring/render.py (monitoring/rules/vllm_capture_test.yml).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Set, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import harness  # noqa: E402

SERVED_NAME = "chat-20b"
PROFILE = "v100-pcie-8x"
MODEL_FIXTURE = "internlm2-chat-20b"


@dataclass(frozen=True)
class Capture:
    release: str
    mode: str            # "" (the mode a node runs) or "default-mode" (0.5.4 without the flag)
    args: Tuple[str, ...]

    @property
    def filename(self) -> str:
        return f"vllm-{self.release}{'-' + self.mode if self.mode else ''}.prom"


CAPTURES = (
    Capture("0.5.4", "", ("--disable-frontend-multiprocessing",)),
    Capture("0.5.4", "default-mode", ()),
    Capture("0.8.5.post1", "", ()),
)
# Three short completions and one streamed chat: every histogram and counter of the release gets a series.
CAPTURE_REQUESTS = (
    ("/v1/completions", {"prompt": "Hello, my name is", "max_tokens": 8, "temperature": 0}),
    ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}),
    ("/v1/completions", {"prompt": "Write one line about V100s.", "max_tokens": 4, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
                              "temperature": 0, "stream": True}),
)


def capture(spec: Capture, workdir: Path) -> str:
    """Run the twin for `spec`, send CAPTURE_REQUESTS, return its /metrics text."""
    workdir.mkdir(parents=True, exist_ok=True)
    model = workdir / "model"
    if not model.exists():
        harness.write_model(MODEL_FIXTURE, model, dtype="F16")
    src = None if spec.release == "0.5.4" else harness.release_src(spec.release, workdir / "src")
    env = harness.twin_env(workdir, profile=PROFILE, time_scale=0.0001, extra=dict(harness.FIELD_NOTES_ENV), src=src)
    twin = harness.start(model, [*harness.FIELD_NOTES_FLAGS, *spec.args], env, workdir / "twin.log", timeout=120,
                         served_name=SERVED_NAME)
    try:
        for path, body in CAPTURE_REQUESTS:
            body = dict(body, model=SERVED_NAME)
            if body.get("stream"):
                result = harness.stream(twin, path, body)
                if result.status != 200 or not result.complete:
                    raise RuntimeError(f"{spec.filename}: {path} failed: {result.status} {result.error}")
            else:
                status, _, data = harness.request(twin, "POST", path, body)
                if status != 200:
                    raise RuntimeError(f"{spec.filename}: {path} answered {status}: {data[:200]!r}")
        status, _, metrics = harness.request(twin, "GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"{spec.filename}: /metrics answered {status}")
    finally:
        twin.stop()
    return metrics.decode()


HAPROXY_CAPTURE = "haproxy-2.6.prom"


def capture_haproxy(workdir: Path) -> str:
    """The front door's configuration (two servers, as the role renders them) plus a Prometheus frontend: /metrics."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from fixtures import haproxy as fixture  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    workdir.mkdir(parents=True, exist_ok=True)
    backends = [type("Backend", (), {"port": fixture.free_port()})() for _ in range(2)]
    metrics_port = fixture.free_port()
    config = fixture.render(workdir, backends, fixture.free_port())
    config += (f"\nfrontend prometheus\n    bind 127.0.0.1:{metrics_port}\n"
               "    http-request use-service prometheus-exporter if { path /metrics }\n")
    proxy = fixture.HAProxy(workdir, config).start()
    try:
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=10)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode()
        if response.status != 200:
            raise RuntimeError(f"haproxy /metrics answered {response.status}")
    finally:
        proxy.stop()
    return text


def families(text: str) -> Dict[str, str]:
    """`# TYPE` lines of an exposition: family name -> type."""
    return {parts[2]: parts[3] for parts in (line.split() for line in text.splitlines())
            if len(parts) == 4 and parts[:2] == ["#", "TYPE"]}


def label_keys(text: str) -> Dict[str, Set[str]]:
    """Sample name -> the label keys its series carry (without `le`, whose values are the buckets)."""
    keys: Dict[str, Set[str]] = {}
    for name, labels, _ in harness.iter_metrics(text):
        keys.setdefault(name, set()).update(k for k in labels if k != "le")
    return keys


def write_captures(out: Path, specs: Sequence[Capture], with_haproxy: bool = True) -> List[Path]:
    written = []
    with tempfile.TemporaryDirectory(prefix="capture-twin-") as tmp:
        for spec in specs:
            text = capture(spec, Path(tmp) / spec.filename)
            path = out / spec.filename
            path.write_text(text)
            written.append(path)
        if with_haproxy:
            path = out / HAPROXY_CAPTURE
            path.write_text(capture_haproxy(Path(tmp) / "haproxy"))
            written.append(path)
    return written


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "metrics")
    parser.add_argument("--release", action="append", help="only these releases (default: all captures)")
    args = parser.parse_args(argv)
    specs = [c for c in CAPTURES if not args.release or c.release in args.release]
    for path in write_captures(args.out, specs, with_haproxy=not args.release):
        print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: "
              f"{len(families(path.read_text()))} families")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
