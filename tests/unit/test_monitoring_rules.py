"""monitoring/rules: promtool accepts every rule file and passes every *_test.yml beside them; the generated files
equal a fresh render of the data (monitoring/render.py --check); every vllm:* family a rule names is in the release
data of every release the rule selects, and the hand-written rules name none; every alert carries summary,
description, runbook and severity and is tested firing and not firing; the TTFT tickets read the derived edge; a
renamed metric fails the promtool tests.

promtool is Prometheus's (Debian 12: `apt-get install prometheus`, which .ci/run installs); without it these tests
fail, they do not skip."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "rules"
sys.path.insert(0, str(REPO / "monitoring"))

import render  # noqa: E402
from ansible.module_utils.revive_releases import load_release_file  # noqa: E402

RULE_FILES = sorted(p for p in RULES.glob("*.yml") if not p.name.endswith("_test.yml"))
TEST_FILES = sorted(RULES.glob("*_test.yml"))
HAND_WRITTEN = [p for p in RULE_FILES if p.name != "vllm_signals.yml"]


def run(promtool: str, *args: str, cwd: Path = RULES) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def rules_of(path: Path):
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_every_rule_file(promtool):
    done = run(promtool, "check", "rules", *[p.name for p in RULE_FILES])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_FILES)


def test_promtool_passes_every_rule_test(promtool):
    assert {p.name for p in TEST_FILES} >= {"vllm_alerts_test.yml", "vllm_slo_test.yml", "gpu_test.yml",
                                            "vllm_capture_test.yml"}
    done = run(promtool, "test", "rules", *[p.name for p in TEST_FILES])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(TEST_FILES)


def test_the_committed_files_equal_a_fresh_render():
    stale = [str(path.relative_to(REPO)) for path, text in render.outputs().items()
             if not path.exists() or path.read_text() != text]
    assert not stale, f"run .venv/bin/python monitoring/render.py and commit: {stale}"


def test_every_vllm_family_a_rule_selects_is_in_each_selected_release():
    releases = load_release_file(str(REPO / "data" / "vllm-releases.yml")).releases
    found = 0
    for rule in rules_of(RULES / "vllm_signals.yml"):
        for family, regex in re.findall(r'(vllm:[a-z0-9_]+)\{[^}]*vllm_version=~"((?:[^"\\]|\\.)*)"', rule["expr"]):
            pattern = re.compile(regex.replace("\\\\", "\\"))
            selected = [v for v in releases if pattern.fullmatch(v)]
            assert selected, (rule.get("record"), regex)
            base = re.sub(r"_(bucket|count|sum)$", "", family)
            for version in selected:
                assert base in releases[version].metrics, f"{rule.get('record')}: {base} is not in {version}'s metrics"
            found += 1
    assert found >= 20


def test_hand_written_rules_name_no_vllm_family():
    for path in HAND_WRITTEN:
        text = "\n".join(r["expr"] for r in rules_of(path))
        assert re.findall(r"vllm:[a-z_]+", text) == [], f"{path.name}: read revive:vllm_* (vllm_signals.yml) instead"


def alerts():
    return [(path.name, rule) for path in RULE_FILES for rule in rules_of(path) if "alert" in rule]


def test_every_alert_says_what_it_means_and_what_to_do():
    # the list: queue, latency SLO, KV, preemptions/swaps, GPU memory, imbalance (TP group and replicas),
    # retired pages / ECC / XID, replica down, unit restarts, metrics missing
    assert {"VllmQueueGrowing", "VllmLatencySloFastBurn", "VllmLatencySloSlowBurn", "VllmLatencySloBudgetBurn",
            "VllmTtftSloFastBurn", "VllmTtftSloSlowBurn",
            "VllmKvCacheNearlyFull", "VllmPreemptions", "VllmRequestsSwapped", "GpuMemoryNearlyFull",
            "GpuUtilizationImbalanceInReplica", "GpuUtilizationImbalanceAcrossReplicas", "GpuRetiredPagesPending",
            "GpuUncorrectableEccErrors", "GpuXidCritical", "VllmReplicaDown", "VllmUnitRestarted",
            "VllmMetricsMissing"} <= {rule["alert"] for _, rule in alerts()}
    for name, rule in alerts():
        assert {"summary", "description", "runbook"} <= set(rule.get("annotations", {})), (name, rule["alert"])
        assert rule["labels"]["severity"] in ("page", "ticket", "warning", "info"), rule["alert"]


def test_every_alert_is_tested_firing_and_not_firing_and_every_record_is_used():
    firing, quiet, exprs = set(), set(), []
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
            exprs += [case["expr"] for case in test.get("promql_expr_test", [])]
    names = {rule["alert"] for _, rule in alerts()}
    assert names - firing == set() and names - quiet == set()
    dashboard = json.loads((REPO / "monitoring" / "dashboards" / "revive.json").read_text())
    used = "\n".join(exprs + [r["expr"] for p in RULE_FILES for r in rules_of(p)]
                     + [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]])
    records = {r["record"] for p in RULE_FILES for r in rules_of(p) if "record" in r}
    unused = [record for record in records if not re.search(re.escape(record) + r"(?![\w:])", used)]
    assert unused == [], "recorded but read by no rule, test or panel"

def test_the_ttft_tickets_read_the_derived_edge_and_say_how_it_was_derived():
    signal_map, _ = render.load()
    ttft = signal_map.slo.ttft
    assert (round(ttft.bound_seconds, 2), ttft.bucket_le) == (3.67, 5.0)
    signals = rules_of(RULES / "vllm_signals.yml")
    within = [r for r in signals if r.get("record", "").startswith("revive:vllm_ttft_seconds_within_slo:rate")]
    assert sorted(r["record"].rsplit("rate", 1)[1] for r in within) == sorted(render.TTFT_WINDOWS)
    for rule in within:
        assert 'vllm:time_to_first_token_seconds_bucket{le="5.0", ' in rule["expr"], rule["record"]
    by_name = {rule["alert"]: rule for rule in signals if "alert" in rule}
    for alert, severity, long_window, short_window, burn, hold in render.TTFT_BURN_PAIRS:
        rule = by_name[alert]
        assert rule["labels"]["severity"] == severity == "ticket" and rule["for"] == hold
        assert f"revive:vllm_ttft_slo_errors:ratio_rate{long_window} > {round(burn * 0.05, 6)}" in rule["expr"]
        assert f"ratio_rate{short_window} > " in rule["expr"] and "revive:vllm_ttft_requests:rate1h" in rule["expr"]
        text = rule["annotations"]["description"]
        assert "12 s - 200 tokens / (768 tok/s / 32 streams) = 3.67 s" in text and 'le="5.0"' in text
        assert "maxconn" in rule["annotations"]["runbook"] and "add a replica" in rule["annotations"]["runbook"]


def test_a_renamed_metric_fails_the_capture_tests(promtool, tmp_path):
    """The 0.5.4 KV family renamed in the rules (as if the data named 0.10's family for 0.5.4): promtool fails."""
    for path in RULE_FILES:
        shutil.copy(path, tmp_path / path.name)
    shutil.copy(RULES / "vllm_capture_test.yml", tmp_path)
    signals = tmp_path / "vllm_signals.yml"
    text = signals.read_text()
    assert "vllm:gpu_cache_usage_perc{" in text
    signals.write_text(text.replace("vllm:gpu_cache_usage_perc{", "vllm:kv_cache_usage_perc{"))
    done = run(promtool, "test", "rules", "vllm_capture_test.yml", cwd=tmp_path)
    assert done.returncode != 0
    assert "revive:vllm_kv_cache_usage:ratio" in done.stdout + done.stderr
