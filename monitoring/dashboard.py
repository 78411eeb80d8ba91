"""The Grafana dashboard (monitoring/dashboards/revive.json), as a table of panels: render() writes the JSON that
monitoring/render.py commits.

Every vLLM query reads the revive:vllm_* series of monitoring/rules/vllm_signals.yml (one name whatever release a
replica runs) and every GPU query the revive:gpu_* series of monitoring/rules/gpu.yml (either exporter). The front
door's panels read HAProxy's built-in exporter (haproxy_backend_current_queue{proxy}, haproxy_server_current_sessions
{proxy, server}, as tests/data/metrics/haproxy-2.6.prom shows them), restarts node exporter's systemd collector.
tests/unit/test_monitoring_dashboard.py evaluates every query with promtool against the twin's 0.5.4 exposition.
Grafana variables: ${DS_PROMETHEUS} (the data source), $model_name, $node; $__rate_interval is not used (the
rules fix the rate windows).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import yaml
# importable once monitoring/render.py (or tests/conftest.py) has called revive_cli.use_module_utils()
from ansible.module_utils.revive_metric_names import load_signal_file

REPO = Path(__file__).resolve().parents[1]
SLO = yaml.safe_load((REPO / "data" / "monitoring-signals.yml").read_text())["slo"]
TTFT = load_signal_file(str(REPO / "data" / "monitoring-signals.yml")).slo.ttft  # the derived bound and SLI edge
VLLM = 'model_name=~"$model_name", node=~"$node"'
NODE = 'node=~"$node"'
UID = "revive-vllm"

# (title, unit, description, [(expr, legend)], width); panels flow left to right in rows of 24 columns.
Target = Tuple[str, str]
PANELS: List[Tuple[str, str, str, List[Target], int]] = [
    ("Running requests", "short", "vllm:num_requests_running per replica (field notes, 'Failures met' 6).",
     [(f"sum by (node, replica) (revive:vllm_requests_running{{{VLLM}}})", "{{node}}/{{replica}}")], 8),
    ("Waiting requests", "short",
     "vllm:num_requests_waiting per replica: a growing queue means the scheduler queue is the latency source.",
     [(f"sum by (node, replica) (revive:vllm_requests_waiting{{{VLLM}}})", "{{node}}/{{replica}}")], 8),
    ("GPU utilisation", "percentunit", "Per GPU, from dcgm-exporter or nvitop-exporter (revive:gpu_utilization:ratio).",
     [(f"revive:gpu_utilization:ratio{{{NODE}}}", "{{node}} GPU {{gpu}}")], 8),
    ("KV cache usage", "percentunit", "GPU KV-cache blocks in use; the alert is at 90 %.",
     [(f"max by (node, replica) (revive:vllm_kv_cache_usage:ratio{{{VLLM}}})", "{{node}}/{{replica}}"),
      ("vector(0.9)", "alert 90 %")], 8),
    ("E2E latency quantiles", "s",
     f"P50/P95/P99 of vllm:e2e_request_latency_seconds over 5 minutes with the SLO (P95 <= {SLO['e2e_p95_seconds']:g} s). "
     "0.5.4's top finite bucket is 60 s: a quantile there reads 60.",
     [(f"histogram_quantile({q}, sum by (le) (revive:vllm_e2e_seconds_bucket:rate5m{{{VLLM}}}))", f"P{int(q * 100)}")
      for q in (0.5, 0.95, 0.99)] + [(f"vector({SLO['e2e_p95_seconds']:g})", "SLO P95")], 8),
    ("TTFT quantiles", "s",
     "Time to first token; 0.5.4's buckets end at 10 s, so P95/P99 are capped there. The bound is derived from the "
     f"E2E SLO ({SLO['e2e_p95_seconds']:g} s - {TTFT.output_tokens} tokens at the production level's "
     f"{TTFT.stream_tok_s:.3g} tok/s per stream = {TTFT.bound_seconds:.3g} s); the tickets count first tokens over "
     f"the SLI edge {TTFT.bucket_le:g} s.",
     [(f"histogram_quantile({q}, sum by (le) (revive:vllm_ttft_seconds_bucket:rate5m{{{VLLM}}}))", f"P{int(q * 100)}")
      for q in (0.5, 0.95, 0.99)] + [(f"vector({TTFT.bound_seconds:.3g})", "TTFT bound"),
                                     (f"vector({TTFT.bucket_le:g})", "SLI edge")], 8),
    ("TPOT quantiles", "s", "Time per output token (0.5.4's buckets end at 2.5 s).",
     [(f"histogram_quantile({q}, sum by (le) (revive:vllm_tpot_seconds_bucket:rate5m{{{VLLM}}}))", f"P{int(q * 100)}")
      for q in (0.5, 0.95)], 8),
    ("E2E SLO: share of requests over the SLI edge", "percentunit",
     f"Requests slower than {SLO['e2e_bucket_le']:g} s (the SLI edge) over 5 minutes and 1 hour, and the budget "
     f"({(1 - SLO['objective']) * 100:g} %).",
     [('revive:vllm_e2e_slo_errors:ratio_rate5m{model_name=~"$model_name"}', "{{model_name}} 5m"),
      ('revive:vllm_e2e_slo_errors:ratio_rate1h{model_name=~"$model_name"}', "{{model_name}} 1h"),
      (f"vector({round(1 - SLO['objective'], 6)})", "budget")], 8),
    ("Tokens per second", "short", "Generated and prompt tokens per second, all replicas of the selection.",
     [(f"sum(revive:vllm_generation_tokens:rate5m{{{VLLM}}})", "generation"),
      (f"sum(revive:vllm_prompt_tokens:rate5m{{{VLLM}}})", "prompt")], 8),
    ("Finished requests per second", "reqps", "vllm:request_success_total by finished_reason.",
     [(f"sum by (finished_reason) (revive:vllm_request_success:rate5m{{{VLLM}}})", "{{finished_reason}}")], 8),
    ("GPU memory used", "percentunit", "Per GPU; vLLM pre-allocates --gpu-memory-utilization, the alert is at 97 %.",
     [(f"revive:gpu_memory_used:ratio{{{NODE}}}", "{{node}} GPU {{gpu}}")], 8),
    ("GPU utilisation spread inside each replica", "percentunit",
     "Busiest minus idlest GPU of a TP group, 15-minute averages; the imbalance alert is at 20 points.",
     [(f"revive:replica_gpu_utilization:spread15m{{{NODE}}}", "{{node}}/{{replica}}")], 8),
    ("Preemptions and swapped requests", "short",
     "Preemptions per second; requests swapped to host memory (0.5.4-0.7.3 only).",
     [(f"sum by (node, replica) (revive:vllm_preemptions:rate5m{{{VLLM}}})", "preempt {{node}}/{{replica}}"),
      (f"sum by (node, replica) (revive:vllm_requests_swapped{{{VLLM}}})", "swapped {{node}}/{{replica}}")], 8),
    ("vLLM unit restarts (1 h)", "short", "systemd's automatic restarts of vllm-N.service (node exporter).",
     [(f'sum by (node, name) (increase(node_systemd_service_restart_total{{name=~"vllm-[0-9]+\\\\.service", {NODE}}}[1h]))',
       "{{node}} {{name}}")], 8),
    ("Replica /health", "short", "Blackbox probe of each replica's /health (1 = up).",
     [(f"probe_success{{replica!=\"\", {NODE}}}", "{{node}}/{{replica}}")], 8),
    ("Front door queue", "short", "Requests HAProxy holds for a free server slot (maxconn), per backend.",
     [("haproxy_backend_current_queue", "{{proxy}}")], 12),
    ("Front door sessions per server", "short", "Open sessions HAProxy has to each vLLM server.",
     [("haproxy_server_current_sessions", "{{proxy}}/{{server}}")], 12),
]


def panel(number: int, title: str, unit: str, description: str, targets: Sequence[Target], x: int, y: int,
          width: int) -> Dict[str, Any]:
    return {
        "id": number,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
        "gridPos": {"h": 8, "w": width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}}
                    for i, (expr, legend) in enumerate(targets)],
    }


def dashboard() -> Dict[str, Any]:
    panels, x, y = [], 0, 0
    for number, (title, unit, description, targets, width) in enumerate(PANELS, start=1):
        if x + width > 24:
            x, y = 0, y + 8
        panels.append(panel(number, title, unit, description, targets, x, y, width))
        x += width
    variable = {"type": "query", "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
                "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
                "current": {"text": "All", "value": "$__all"}}
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "pluginId": "prometheus"}],
        "uid": UID,
        "title": "revive: vLLM on retired GPUs",
        "description": "Generated by monitoring/render.py (monitoring/dashboard.py); see monitoring/README.md.",
        "tags": ["revive", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "DS_PROMETHEUS", "type": "datasource", "query": "prometheus", "label": "Data source"},
            {**variable, "name": "model_name", "label": "Model",
             "definition": "label_values(revive:vllm_requests_running, model_name)",
             "query": {"query": "label_values(revive:vllm_requests_running, model_name)", "refId": "model_name"}},
            {**variable, "name": "node", "label": "Node",
             "definition": "label_values(revive:vllm_requests_running, node)",
             "query": {"query": "label_values(revive:vllm_requests_running, node)", "refId": "node"}},
        ]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"
