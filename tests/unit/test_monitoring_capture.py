"""tests/data/metrics: the committed captures are what the twin (and the front door's HAProxy) serve now - the same
families, types and label keys, re-captured by tools/capture_twin_metrics.py - and each release's capture holds
every family of its `metrics:` list in data/vllm-releases.yml. If the twin changes, re-run the tool, then
monitoring/render.py (the capture tests are generated from these files)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ansible.module_utils.revive_releases import load_release_file

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "data" / "metrics"
sys.path.insert(0, str(REPO / "tools"))

import capture_twin_metrics as tool  # noqa: E402


@pytest.mark.parametrize("spec", tool.CAPTURES, ids=lambda spec: spec.filename)
def test_the_committed_capture_matches_what_the_twin_serves_now(spec, tmp_path):
    committed = (CAPTURES / spec.filename).read_text()
    now = tool.capture(spec, tmp_path)
    assert tool.families(now) == tool.families(committed), \
        f"{spec.filename} is stale: re-run tools/capture_twin_metrics.py and monitoring/render.py"
    assert tool.label_keys(now) == tool.label_keys(committed)


def test_the_committed_haproxy_capture_matches_haproxy_now(tmp_path):
    committed = (CAPTURES / tool.HAPROXY_CAPTURE).read_text()
    now = tool.capture_haproxy(tmp_path)
    assert tool.families(now) == tool.families(committed)
    assert tool.label_keys(now) == tool.label_keys(committed)
    keys = tool.label_keys(committed)
    assert keys["haproxy_backend_current_queue"] == {"proxy"}
    assert keys["haproxy_server_current_sessions"] == {"proxy", "server"}


@pytest.mark.parametrize("filename, release", [("vllm-0.5.4.prom", "0.5.4"), ("vllm-0.8.5.post1.prom", "0.8.5.post1")])
def test_each_capture_holds_its_release_data_metrics(filename, release):
    metrics = load_release_file(str(REPO / "data" / "vllm-releases.yml")).release(release).metrics
    assert set(metrics) <= set(tool.families((CAPTURES / filename).read_text()))


def test_0_5_4_without_the_flag_serves_no_vllm_series():
    families = tool.families((CAPTURES / "vllm-0.5.4-default-mode.prom").read_text())
    assert families and not any(name.startswith("vllm:") for name in families)
