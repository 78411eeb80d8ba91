"""monitoring/dashboards/revive.json: the structure Grafana imports (the checklist of grafana/dashboard-linter:
templated data source, unique ids, a query per target) and every panel query evaluated by promtool against
0.5.4-named series, so a renamed metric fails here.

Grafana cannot run here and `promtool query` needs a server, so each query runs as a `promtool test rules`
`promql_expr_test` - `count(<query>) > bool 0`, expecting 1 - over the committed rule files (the panels read
their revive:* series) and input series made from the twin's 0.5.4 exposition (tests/data/metrics/vllm-0.5.4.prom),
HAProxy's (haproxy-2.6.prom) and the GPU exporters' names. A query that returns nothing fails with got: nil.
promtool is needed (Debian 12: apt-get install prometheus); without it these tests fail."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "rules"
CAPTURES = REPO / "tests" / "data" / "metrics"
DASHBOARD = REPO / "monitoring" / "dashboards" / "revive.json"
sys.path.insert(0, str(REPO / "monitoring"))

import render  # noqa: E402

# Grafana's variables as an "All" selection sends them
VARIABLES = {"$model_name": ".*", "$node": ".*"}
TARGET = {**render.TARGET, "instance": "node1:8000", "vllm_version": "0.5.4"}
GPU_SERIES = [  # nvitop-exporter on node1 (the lab's exporter), the replica map and node exporter's restart counter
    *({"series": render._series("gpu_utilization_Percentage", {"job": "nvitop", "instance": "node1:9835",
                                                               "node": "node1", "hostname": "node1", "index": str(i),
                                                               "devicename": "Tesla V100-PCIE-32GB",
                                                               "uuid": f"GPU-{i}"}), "values": f"{60 + i}x20"}
      for i in range(2)),
    *({"series": render._series(name, {"job": "nvitop", "instance": "node1:9835", "node": "node1",
                                       "hostname": "node1", "index": str(i), "devicename": "Tesla V100-PCIE-32GB",
                                       "uuid": f"GPU-{i}"}), "values": f"{value}x20"}
      for i in range(2) for name, value in (("gpu_memory_used_MiB", 30000), ("gpu_memory_total_MiB", 32768))),
    *({"series": render._series("revive_replica_gpu_info", {"job": "node", "instance": "node1:9100", "node": "node1",
                                                            "replica": "0", "gpu": str(i)}), "values": "1x20"}
      for i in range(2)),
    {"series": render._series("node_systemd_service_restart_total", {"job": "node", "instance": "node1:9100",
                                                                     "node": "node1", "name": "vllm-0.service"}),
     "values": "0x10 1x10"},
    {"series": render._series("probe_success", {"job": "vllm-health", "instance": "http://node1:8000/health",
                                                "node": "node1", "replica": "0"}), "values": "1x20"},
]


@pytest.fixture(scope="module")
def dashboard() -> Dict:
    return json.loads(DASHBOARD.read_text())


def queries(dashboard: Dict) -> List[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable the test does not substitute: {expr}"
    return expr


def evaluate(promtool: str, exprs: List[str], tmp: Path) -> subprocess.CompletedProcess:
    for path in RULES.glob("*.yml"):
        if not path.name.endswith("_test.yml"):
            shutil.copy(path, tmp / path.name)
    series = render._input((CAPTURES / "vllm-0.5.4.prom").read_text(), TARGET)
    series += render._input((CAPTURES / "haproxy-2.6.prom").read_text(), {"job": "haproxy", "instance": "lb1:8405"})
    body = {
        "rule_files": render.rule_files(),
        "group_eval_order": render.group_eval_order(),
        "evaluation_interval": "1m",
        "tests": [{"name": "every panel query returns series", "interval": "1m",
                   "input_series": [{"series": s["series"], "values": s["values"].replace("x15", "x20")}
                                    for s in series] + GPU_SERIES,
                   "promql_expr_test": [{"expr": f"count({substitute(expr)}) > bool 0", "eval_time": "16m",
                                         "exp_samples": [{"labels": "{}", "value": 1}]} for expr in exprs]}],
    }
    (tmp / "dashboard_test.yml").write_text(yaml.safe_dump(body, sort_keys=False, width=4096))
    return subprocess.run([promtool, "test", "rules", "dashboard_test.yml"], cwd=tmp, capture_output=True, text=True,
                          timeout=120)


def test_the_dashboard_is_importable(dashboard):
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36 and dashboard["title"]
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["DS_PROMETHEUS", "model_name", "node"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}" and set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24 and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"]["uid"] == "${DS_PROMETHEUS}"


def test_the_issue_s_panels_are_there(dashboard):
    text = "\n".join(queries(dashboard))
    for needed in ("revive:vllm_requests_running", "revive:vllm_requests_waiting", "revive:gpu_utilization:ratio",
                   "revive:vllm_kv_cache_usage:ratio", "revive:vllm_e2e_seconds_bucket:rate5m",
                   "revive:vllm_ttft_seconds_bucket:rate5m", "revive:vllm_tpot_seconds_bucket:rate5m",
                   "revive:vllm_generation_tokens:rate5m", "revive:gpu_memory_used:ratio",
                   "revive:vllm_preemptions:rate5m", "node_systemd_service_restart_total",
                   "haproxy_backend_current_queue", "haproxy_server_current_sessions"):
        assert needed in text, needed
    slo = yaml.safe_load((REPO / "data" / "monitoring-signals.yml").read_text())["slo"]["e2e_p95_seconds"]
    assert f"vector({slo:g})" in text  # the SLO line on the E2E panel


def test_no_panel_uses_a_histogram_quantile_of_a_raw_vllm_family(dashboard):
    for expr in queries(dashboard):
        assert not re.search(r"vllm:[a-z_]+", expr), f"read the revive:vllm_* series, not a release's name: {expr}"


def test_every_panel_query_returns_series_against_0_5_4_names(promtool, dashboard, tmp_path):
    done = evaluate(promtool, queries(dashboard), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_query_with_a_renamed_metric_fails(promtool, tmp_path):
    # 0.10's KV family on a 0.5.4 fleet, and HAProxy's name as an upstream dashboard spells it wrong
    done = evaluate(promtool, ["vllm:kv_cache_usage_perc", "haproxy_backend_queue_current"], tmp_path)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert output.count("got: nil") == 2 and "count(vllm:kv_cache_usage_perc)" in output
