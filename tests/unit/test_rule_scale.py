"""module_utils/revive_rule_scale.py: the lab's time-scaled rules. Every duration of a range selector, subquery,
offset, `for:`, `keep_firing_for:` and group interval is scaled with its floor, nothing inside a string literal or a
rule name is touched, scale 1 returns the file itself, bad input is refused naming it; the scaled repository rules
pass `promtool check rules`, and a scaled alert fires in seconds under `promtool test rules` where the production
rule needs minutes."""
from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.revive_rule_scale import (
    RuleScaleError, duration_ms, format_ms, scale_rule_files, scale_rules)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "monitoring"))
import render  # noqa: E402  (monitoring/render.py: the annotations promtool expects)


def one_rule(expr: str, **extra) -> str:
    return yaml.safe_dump({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": expr, **extra}]}]})


def scaled_rule(text: str, scale=0.1, scrape="2s", evaluation="2s") -> dict:
    return yaml.safe_load(scale_rules(text, scale, scrape, evaluation, "t.yml"))["groups"][0]["rules"][0]


def rule_files(repo) -> dict:
    return {p.name: p.read_text() for p in sorted((repo / "monitoring" / "rules").glob("*.yml"))
            if not p.name.endswith("_test.yml")}


@pytest.mark.parametrize("text,ms", [("500ms", 500), ("15s", 15_000), ("5m", 300_000), ("1h30m", 5_400_000),
                                     ("3d", 259_200_000), ("1w", 604_800_000)])
def test_durations_parse_and_format_back(text, ms):
    assert duration_ms(text, "x") == ms
    assert duration_ms(format_ms(ms), "x") == ms


def test_format_ms_writes_the_shortest_exact_duration():
    assert format_ms(90_000) == "1m30s" and format_ms(1_500) == "1s500ms" and format_ms(0) == "0s"
    assert format_ms(3_600_000) == "1h"


def test_scale_1_returns_the_file_byte_for_byte(repo):
    for name, text in rule_files(repo).items():
        assert scale_rules(text, 1, "15s", "15s", name) is text


def test_ranges_offsets_subqueries_and_for_are_scaled_with_their_floors():
    rule = scaled_rule(one_rule("rate(x[10m]) > 0 and max_over_time(y[1h:1m]) > 1 and z offset 30m > 2"
                                " and rate(w[1m]) > 0 and avg_over_time(v[20m:]) > 0", **{"for": "15m",
                                                                                       "keep_firing_for": "10m"}))
    # x 0.1: 10m -> 1m, 1h -> 6m with its 1m step -> 6s, 30m -> 3m; 1m -> 6s is below 4 scrapes of 2s: 8s
    assert rule["expr"] == ("rate(x[1m]) > 0 and max_over_time(y[6m:6s]) > 1 and z offset 3m > 2"
                            " and rate(w[8s]) > 0 and avg_over_time(v[2m:]) > 0")
    assert rule["for"] == "1m30s" and rule["keep_firing_for"] == "1m"


def test_a_for_never_drops_below_one_evaluation_and_zero_stays_zero():
    assert scaled_rule(one_rule("up == 0", **{"for": "1m"}), scale=0.01, evaluation="5s")["for"] == "5s"
    assert scaled_rule(one_rule("up == 0", **{"for": "0s"}))["for"] == "0s"


def test_a_group_interval_is_scaled():
    text = yaml.safe_dump({"groups": [{"name": "g", "interval": "1m", "rules": [{"record": "r", "expr": "up"}]}]})
    assert yaml.safe_load(scale_rules(text, 0.1, "1s", "2s"))["groups"][0]["interval"] == "6s"


def test_string_literals_and_rule_names_are_left_alone():
    expr = ('increase(node_systemd_service_restart_total{name=~"vllm-[0-9]+\\\\.service"}[30m]) >= 3'
            " and revive:vllm_e2e_requests:rate1h * 3600 > 100 and on() label_replace(up, 'a', '[5m]', 'b', '(.+)')"
            ' and absent(q{l=`[1h]`})')
    rule = scaled_rule(one_rule(expr))
    assert rule["expr"] == expr.replace("[30m]", "[3m]")


def test_the_output_says_it_is_time_scaled_and_not_for_production():
    text = scale_rules(one_rule("rate(x[10m]) > 0"), 0.05, "2s", "2s", "vllm_alerts.yml")
    first = text.splitlines()[:3]
    assert first[0].startswith("# TIME-SCALED for the lab") and "vllm_alerts.yml x 0.05" in first[1]
    assert "ranges >= 8s, for: >= 2s" in first[1] and "Not for production" in first[2]


@pytest.mark.parametrize("scale", [0, -1, 1.5, math.nan, math.inf, True, "0.5", None])
def test_a_scale_out_of_range_or_of_the_wrong_type_is_refused(scale):
    with pytest.raises(RuleScaleError, match="monitoring_rule_time_scale: .* must be a number above 0 and at most 1"):
        scale_rules(one_rule("up"), scale, "2s", "2s")


@pytest.mark.parametrize("scrape,evaluation,name", [("2", "2s", "monitoring_scrape_interval"),
                                                    ("2s", "fast", "monitoring_evaluation_interval"),
                                                    (15, "2s", "monitoring_scrape_interval")])
def test_a_bad_interval_is_refused_naming_it(scrape, evaluation, name):
    with pytest.raises(RuleScaleError, match=rf"{name}: .* is not a Prometheus duration"):
        scale_rules(one_rule("up"), 0.5, scrape, evaluation)


@pytest.mark.parametrize("text,message", [("groups: [{name: g}]", "not a Prometheus rule file"),
                                          ("[1, 2]", "not a Prometheus rule file"),
                                          ("groups: [{name: g, rules: [{alert: A}]}]", "rule A: no expr"),
                                          ("groups: [{name: g, rules: [{alert: A, expr: up, for: soon}]}]",
                                           "rule A: for: 'soon' is not a Prometheus duration"),
                                          ("groups: [", "not YAML")])
def test_a_file_that_is_not_a_rule_file_is_refused_naming_it(text, message):
    with pytest.raises(RuleScaleError, match=re.escape(message)):
        scale_rules(text, 0.5, "2s", "2s", "bad.yml")


def test_the_role_filter_takes_every_file_and_names_the_bad_one():
    good = one_rule("rate(x[10m]) > 0")
    out = scale_rule_files({"b.yml": good, "a.yml": good}, 0.1, "2s", "2s")
    assert list(out) == ["a.yml", "b.yml"] and "[1m]" in out["a.yml"]
    with pytest.raises(RuleScaleError, match="^bad.yml: not a Prometheus rule file"):
        scale_rule_files({"a.yml": good, "bad.yml": "groups: 1"}, 0.1, "2s", "2s")
    with pytest.raises(RuleScaleError, match="mapping of file name to text"):
        scale_rule_files(["a.yml"], 0.1, "2s", "2s")


DURATION = re.compile(r'"(?:\\.|[^"\\])*"|\[([0-9a-z]+)(?::([0-9a-z]*))?\]|offset ([0-9a-z]+)')


OUTSIDE = re.compile(r"\[[0-9a-z]+(?::[0-9a-z]*)?\]|offset [0-9a-z]+")


def durations(expr: str) -> list:
    return [d for match in DURATION.finditer(expr) for d in match.groups() if d]


def test_every_duration_of_the_repository_rules_is_scaled_and_nothing_else_changes(repo, tmp_path, promtool):
    scale, floor_ms = 1 / 60, 8_000
    for name, text in rule_files(repo).items():
        before = yaml.safe_load(text)
        after = yaml.safe_load(scale_rules(text, scale, "2s", "2s", name))
        assert [g["name"] for g in after["groups"]] == [g["name"] for g in before["groups"]]
        for group_before, group_after in zip(before["groups"], after["groups"]):
            for old, new in zip(group_before["rules"], group_after["rules"], strict=True):
                assert {k: v for k, v in new.items() if k not in ("expr", "for")} == \
                    {k: v for k, v in old.items() if k not in ("expr", "for")}, name
                want = [format_ms(max(round(duration_ms(d, name) * scale), floor_ms)) for d in durations(old["expr"])]
                assert durations(new["expr"]) == want, (name, old["expr"])
                # outside the durations the expression is the same text
                assert OUTSIDE.sub("D", new["expr"]) == OUTSIDE.sub("D", old["expr"]), name
                if "for" in old:
                    assert new["for"] == format_ms(max(round(duration_ms(old["for"], name) * scale), 2_000))
        (tmp_path / name).write_text(scale_rules(text, scale, "2s", "2s", name))
    proc = subprocess.run([promtool, "check", "rules", *sorted(str(p) for p in tmp_path.glob("*.yml"))],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_scaled_alert_fires_in_seconds_where_the_production_rule_needs_minutes(repo, tmp_path, promtool):
    """VllmQueueBacklog (min over 5m of the waiting queue above 32, for 5m) on the 0.5.4 series: time-scaled x 1/60
    with 2 s scrapes it fires 16 s after the queue built up; the production rule is still pending there."""
    files = {name: text for name, text in rule_files(repo).items() if name in ("vllm_signals.yml", "vllm_alerts.yml")}
    for name, text in scale_rule_files(files, 1 / 60, "2s", "2s").items():
        (tmp_path / ("scaled_" + name)).write_text(text)
        (tmp_path / name).write_text(files[name])
    series = ('vllm:num_requests_waiting{model_name="m", node="node1", replica="vllm-0", vllm_version="0.5.4",'
              ' release="r"}')

    labels = {"severity": "warning", "model_name": "m", "node": "node1", "replica": "vllm-0",
              "vllm_version": "0.5.4", "release": "r"}

    def run(rule_files: list, firing_at: str, quiet_at: str) -> subprocess.CompletedProcess:
        body = {"rule_files": rule_files, "evaluation_interval": "2s", "tests": [{
            "interval": "2s", "input_series": [{"series": series, "values": "0 40x300"}],
            "alert_rule_test": [
                {"eval_time": quiet_at, "alertname": "VllmQueueBacklog", "exp_alerts": []},
                {"eval_time": firing_at, "alertname": "VllmQueueBacklog",
                 "exp_alerts": [{"exp_labels": labels, "value": 40}]}]}]}
        # the annotations as Prometheus expands them (promtool compares them exactly): monitoring/render.py's
        render.fill_annotations(body, render.alert_annotations(), "queue_test.yml")
        test = tmp_path / "queue_test.yml"
        test.write_text(yaml.safe_dump(body, sort_keys=False))
        return subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True, cwd=tmp_path)

    scaled = run(["scaled_vllm_signals.yml", "scaled_vllm_alerts.yml"], firing_at="20s", quiet_at="6s")
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    production = run(["vllm_signals.yml", "vllm_alerts.yml"], firing_at="20s", quiet_at="6s")
    assert production.returncode != 0 and "VllmQueueBacklog" in production.stdout + production.stderr
