"""The fleet's Prometheus configuration (module_utils/revive_monitoring.py): every replica's /metrics and /health
with node/replica/release/vllm_version labels, node and GPU exporters, the front door; sorted and byte-identical for
the same fleet, changed by a replica added, removed or moved to a new release; 0.5.4 without
--disable-frontend-multiprocessing flagged; bad input refused with what, where and how to fix; promtool accepts it."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess

import pytest
import yaml
from ansible.module_utils.revive_monitoring import (
    MonitoringError,
    Settings,
    fleet_config_text,
    fleet_targets,
    releases_needing_flag,
    render,
)
from ansible.module_utils.revive_record.release import HostView, build_release
from ansible.module_utils.revive_record.systemd import StartTiming
from test_release import _plan_json

FLAG = "--disable-frontend-multiprocessing"


@pytest.fixture(scope="module")
def release_data(repo):
    with open(repo / "data" / "vllm-releases.yml", encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def replica(name: str, port: int, flag: bool = True) -> dict:
    argv = ["/opt/vllm/venvs/r/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/srv/m",
            "--port", str(port)] + ([FLAG] if flag else [])
    return {"name": name, "unit": f"{name}.service", "port": port, "argv": argv}


def release(release_id: str = "3f9a1c2e0b7d", version: str = "0.5.4", replicas=None) -> dict:
    return {"id": release_id, "vllm_version": version,
            "replicas": replicas if replicas is not None else [replica("vllm-0", 8000), replica("vllm-1", 8001)]}


SETTINGS = Settings(gpu_exporter="dcgm", gpu_exporter_port=9400)
ADDRESSES = {"node1": "10.213.0.11", "node2": "10.213.0.12", "lb1": "10.213.0.4"}


def fleet(records=None, nodes=("node1", "node2"), settings=SETTINGS, frontdoors=("lb1",), data=None, **kwargs):
    records = records if records is not None else {"node1": release(), "node2": release("aa11bb22cc33",
                                                                                          "0.8.5.post1")}
    return fleet_targets(list(nodes), records, ADDRESSES, list(frontdoors), settings,
                         releases_needing_flag(data) if data else {"0.5.4": True, "0.8.5.post1": False}, **kwargs)


def config_text(release_data, records=None, settings=SETTINGS, nodes=("node1", "node2")):
    records = records if records is not None else {"node1": release(), "node2": release("aa11bb22cc33",
                                                                                          "0.8.5.post1")}
    return fleet_config_text(list(nodes), records, ADDRESSES, ["lb1"], settings, release_data)[0]


def jobs(text: str) -> dict:
    return {job["job_name"]: job for job in yaml.safe_load(text)["scrape_configs"]}


def scraped(text: str, job: str) -> list:
    return [(static["targets"][0], static.get("labels", {})) for static in jobs(text)[job]["static_configs"]]


def test_every_replica_is_scraped_with_its_node_replica_release_and_version(release_data):
    vllm = scraped(config_text(release_data), "vllm")
    assert vllm == [
        ("10.213.0.11:8000", {"node": "node1", "release": "3f9a1c2e0b7d", "replica": "vllm-0",
                              "vllm_metrics": "exported", "vllm_version": "0.5.4"}),
        ("10.213.0.11:8001", {"node": "node1", "release": "3f9a1c2e0b7d", "replica": "vllm-1",
                              "vllm_metrics": "exported", "vllm_version": "0.5.4"}),
        ("10.213.0.12:8000", {"node": "node2", "release": "aa11bb22cc33", "replica": "vllm-0",
                              "vllm_metrics": "exported", "vllm_version": "0.8.5.post1"}),
        ("10.213.0.12:8001", {"node": "node2", "release": "aa11bb22cc33", "replica": "vllm-1",
                              "vllm_metrics": "exported", "vllm_version": "0.8.5.post1"})]
    assert jobs(config_text(release_data))["vllm"]["metrics_path"] == "/metrics"


def test_every_replicas_health_is_probed_through_blackbox_with_the_same_labels(release_data):
    text = config_text(release_data)
    health = jobs(text)["vllm_health"]
    assert health["metrics_path"] == "/probe" and health["params"] == {"module": ["http_health"]}
    assert [target for target, _ in scraped(text, "vllm_health")] == [
        "http://10.213.0.11:8000/health", "http://10.213.0.11:8001/health",
        "http://10.213.0.12:8000/health", "http://10.213.0.12:8001/health"]
    assert [labels for _, labels in scraped(text, "vllm_health")] == [labels for _, labels in scraped(text, "vllm")]
    # The URL goes to blackbox as ?target= and names the instance; blackbox itself is what is scraped.
    assert health["relabel_configs"] == [
        {"source_labels": ["__address__"], "target_label": "__param_target"},
        {"source_labels": ["__param_target"], "target_label": "instance"},
        {"target_label": "__address__", "replacement": "127.0.0.1:9115"}]


def test_node_gpu_and_front_door_exporters_and_the_monitor_hosts_own_services(release_data):
    text = config_text(release_data)
    assert scraped(text, "node") == [("10.213.0.11:9100", {"node": "node1"}), ("10.213.0.12:9100", {"node": "node2"})]
    assert scraped(text, "gpu") == [("10.213.0.11:9400", {"gpu_exporter": "dcgm", "node": "node1"}),
                                    ("10.213.0.12:9400", {"gpu_exporter": "dcgm", "node": "node2"})]
    assert scraped(text, "haproxy") == [("10.213.0.4:8405", {"frontdoor": "lb1"})]
    assert list(jobs(text)) == ["prometheus", "alertmanager", "blackbox", "vllm", "vllm_health", "node", "gpu",
                                "haproxy"]
    config = yaml.safe_load(text)
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    assert config["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]}


def test_the_gpu_exporters_port_follows_the_chosen_exporter(release_data):
    nvitop = config_text(release_data, settings=Settings(gpu_exporter="nvitop", gpu_exporter_port=9835))
    assert scraped(nvitop, "gpu")[0] == ("10.213.0.11:9835", {"gpu_exporter": "nvitop", "node": "node1"})
    with pytest.raises(MonitoringError, match=r"gpu_exporter 'nvidia-smi' is not one of dcgm, nvitop"):
        config_text(release_data, settings=Settings(gpu_exporter="nvidia-smi", gpu_exporter_port=9835))


def test_the_same_fleet_gives_byte_identical_text_whatever_the_input_order(release_data):
    records = {"node2": release("aa11bb22cc33", "0.8.5.post1", [replica("vllm-1", 8001), replica("vllm-0", 8000)]),
               "node1": release()}
    first = config_text(release_data)
    assert config_text(release_data, records=records, nodes=("node2", "node1")) == first
    assert config_text(release_data) == first
    assert "recorded_at" not in first and first.startswith("# Managed by revive")


def test_a_replica_added_removed_or_moved_to_a_new_release_changes_the_config(release_data):
    base = {"node1": release(), "node2": release("aa11bb22cc33", "0.8.5.post1")}
    before = config_text(release_data, records=base)
    added = copy.deepcopy(base)
    added["node1"]["replicas"].append(replica("vllm-2", 8002))
    removed = copy.deepcopy(base)
    removed["node1"]["replicas"].pop()
    moved = copy.deepcopy(base)
    moved["node1"] = release("0c0ffee0ddba", "0.8.5.post1")
    for records, where in ((added, "10.213.0.11:8002"), (removed, None), (moved, "0c0ffee0ddba")):
        after = config_text(release_data, records=records)
        assert after != before
        if where:
            assert where in after
    assert [target for target, _ in scraped(config_text(release_data, records=removed), "vllm")] == [
        "10.213.0.11:8000", "10.213.0.12:8000", "10.213.0.12:8001"]
    assert {labels["release"] for _, labels in scraped(config_text(release_data, records=moved), "vllm")
            if labels["node"] == "node1"} == {"0c0ffee0ddba"}


def test_0_5_4_without_the_metrics_flag_is_labelled_and_warned_about(release_data):
    records = {"node1": release(replicas=[replica("vllm-0", 8000, flag=False), replica("vllm-1", 8001)]),
               "node2": release("aa11bb22cc33", "0.8.5.post1", [replica("vllm-0", 8000, flag=False)])}
    result = fleet(records, data=release_data)
    labels = {(t.labels[0][1], dict(t.labels)["replica"]): dict(t.labels)["vllm_metrics"]
              for t in result.by_job("vllm")}
    # Only the release whose data says it needs the flag (0.5.4, #7188); 0.8.5.post1 exports vllm:* without it.
    assert labels == {("node1", "vllm-0"): "absent", ("node1", "vllm-1"): "exported",
                      ("node2", "vllm-0"): "exported"}
    assert len(result.warnings) == 1
    assert result.warnings[0].startswith("node1 vllm-0 runs vLLM 0.5.4 (release 3f9a1c2e0b7d) without " + FLAG)
    assert "VllmMetricsMissing is expected" in result.warnings[0]
    assert {dict(t.labels)["vllm_metrics"] for t in result.by_job("vllm_health") if dict(t.labels)["node"] == "node1"
            and dict(t.labels)["replica"] == "vllm-0"} == {"absent"}


def test_the_release_datas_flag_table_is_read_from_the_data(release_data):
    needs = releases_needing_flag(release_data)
    assert needs["0.5.4"] is True and needs["0.8.5.post1"] is False
    broken = copy.deepcopy(release_data)
    del broken["releases"]["0.5.4"]["metrics_need_disable_frontend_multiprocessing"]
    with pytest.raises(MonitoringError, match=r"releases\.0\.5\.4\.metrics_need_disable_frontend_multiprocessing"):
        releases_needing_flag(broken)
    with pytest.raises(MonitoringError, match=r"no `releases` mapping"):
        releases_needing_flag({})


def test_a_local_version_suffix_finds_its_release_in_the_data():
    result = fleet({"node1": release(version="0.5.4+sim", replicas=[replica("vllm-0", 8000, flag=False)])},
                   nodes=("node1",))
    assert dict(result.by_job("vllm")[0].labels)["vllm_metrics"] == "absent"
    assert dict(result.by_job("vllm")[0].labels)["vllm_version"] == "0.5.4+sim"


@pytest.mark.parametrize("records,nodes,pattern", [
    ({"node1": release(), "node3": release()}, ("node1",),
     r"release records of node3, which are not among the GPU nodes to monitor \(node1\): add them to "
     r"monitoring_nodes"),
    ({"node1": release()}, ("node1", "node2"),
     r"node2 has no current release in its record /var/lib/revive/releases.json: provision it \(site.yml\)"),
    ({"node1": release(), "node2": None}, ("node1", "node2"), r"node2 has no current release"),
    ({"node1": release(replicas=[replica("vllm-0", 8000), replica("vllm-1", 8000)])}, ("node1",),
     r"node1: replica vllm-1 of release 3f9a1c2e0b7d listens on port 8000, which replica vllm-0 uses too"),
    ({"node1": release(replicas=[replica("vllm-0", 9100)])}, ("node1",),
     r"node1: replica vllm-0 .* port 9100, which node exporter uses too; move the exporter"),
    ({"node1": release(replicas=[replica("vllm-0", 9400)])}, ("node1",), r"which dcgm GPU exporter uses too"),
    ({"node1": release(replicas=[])}, ("node1",), r"node1: the current release 3f9a1c2e0b7d in .* has no replicas"),
    ({"node1": {"vllm_version": "0.5.4", "replicas": []}}, ("node1",), r"node1: the current release .* has no id"),
    ({"node1": release(version="0.4.0")}, ("node1",),
     r"node1 runs vLLM 0.4.0 \(release 3f9a1c2e0b7d\), which data/vllm-releases.yml does not hold"),
    ({"node1": release(replicas=[{"name": "vllm-0"}])}, ("node1",), r"has no name or port"),
    ({"node1": release(replicas=[replica("vllm-0", 70000)])}, ("node1",), r"node1 replica vllm-0 port: 70000"),
    ({}, ("node1", "node1"), r"name a node twice"),
])
def test_bad_input_is_refused_saying_what_where_and_how_to_fix(records, nodes, pattern):
    with pytest.raises(MonitoringError, match=pattern):
        fleet(records, nodes=nodes)


def test_two_nodes_on_one_address_are_refused():
    with pytest.raises(MonitoringError, match=r"node2 and node1 have the same address 10.0.0.9: .* own ansible_host"):
        fleet_targets(["node1", "node2"], {"node1": release(), "node2": release()},
                      {"node1": "10.0.0.9", "node2": "10.0.0.9"}, [], SETTINGS, {"0.5.4": True})


@pytest.mark.parametrize("settings,pattern", [
    (Settings("dcgm", 0), r"gpu_exporter_port: 0 is not a TCP port"),
    (Settings("dcgm", 9400, node_exporter_port=True), r"node_exporter_port: True is not a TCP port"),
    (Settings("dcgm", 9400, scrape_interval="15"), r"scrape_interval '15' is not a Prometheus duration"),
    (Settings("dcgm", 9400, external_labels={"bad-name": "x"}), r"external label 'bad-name'"),
    (Settings("dcgm", 9400, blackbox_address="localhost"), r"'localhost' is not host:port"),
])
def test_bad_settings_are_refused(settings, pattern):
    with pytest.raises(MonitoringError, match=pattern):
        fleet(settings=settings)


def test_check_mode_on_a_fresh_fleet_scrapes_only_the_exporters_of_a_node_without_a_release():
    result = fleet({"node1": release()}, allow_missing=True)
    assert [dict(t.labels)["node"] for t in result.by_job("vllm")] == ["node1", "node1"]
    assert [dict(t.labels)["node"] for t in result.by_job("node")] == ["node1", "node2"]
    assert len(result.warnings) == 1 and "node2 has no current release" in result.warnings[0]


def test_without_replicas_or_front_door_their_jobs_are_left_out(release_data):
    text = fleet_config_text(["node1"], {}, ADDRESSES, [], SETTINGS, release_data, allow_missing=True)[0]
    assert list(jobs(text)) == ["prometheus", "alertmanager", "blackbox", "node", "gpu"]


def test_a_node_without_an_address_is_scraped_by_its_name(release_data):
    text = fleet_config_text(["gpu-a01"], {"gpu-a01": release()}, {}, [], SETTINGS, release_data)[0]
    assert scraped(text, "vllm")[0][0] == "gpu-a01:8000"


def test_the_text_quotes_every_string_so_yaml_reads_it_back_unchanged():
    config = {"global": {"external_labels": {"fleet": "no", "site": "1.0", "x": "a: b # c", "empty": ""}},
              "list": ["on", "8000", 'say "hi"'], "n": 5, "flag": False, "nothing": [], "none": {}}
    assert yaml.safe_load(render(config)) == config


def test_the_real_release_record_shape_is_read(tmp_path_factory, repo, monkeypatch, release_data):
    # A record as vllm_release writes it: build_release from a real plan of the lab's profile.
    monkeypatch.chdir(repo)
    plan = json.loads(_plan_json(str(tmp_path_factory.getbasetemp() / "monitoring-plan"), True))
    built = build_release(plan, "/opt/vllm/venvs/x-1", HostView("node1", tuple(range(80)), (0, 1)), StartTiming())
    text = config_text(release_data, records={"node1": built}, nodes=("node1",))
    expected = [(f"10.213.0.11:{r['port']}", r["name"], built["id"], built["vllm_version"]) for r in built["replicas"]]
    assert [(target, labels["replica"], labels["release"], labels["vllm_version"])
            for target, labels in scraped(text, "vllm")] == sorted(expected)
    needs_flag = releases_needing_flag(release_data)[built["vllm_version"]]
    assert {labels["vllm_metrics"] for _, labels in scraped(text, "vllm")} == {
        "absent" if needs_flag and FLAG not in built["replicas"][0]["argv"] else "exported"}


def test_promtool_accepts_the_config_with_the_rules_directory(tmp_path, release_data, repo, promtool):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "revive.yml").write_text("groups:\n- name: t\n  rules:\n  - alert: VllmDown\n    expr: up{job=\"vllm\"} == 0\n")
    for source in sorted((repo / "monitoring" / "rules").glob("*.yml")):
        if not source.name.endswith("_test.yml"):
            shutil.copy(source, rules / source.name)
    settings = Settings("nvitop", 9835, rule_files=(f"{rules}/*.yml",), external_labels={"fleet": "lab"})
    path = tmp_path / "prometheus.yml"
    path.write_text(config_text(release_data, settings=settings))
    done = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and f"{len(list(rules.glob('*.yml')))} rule files found" in done.stdout
    # And it can fail: a broken rule file named by rule_files fails the same check.
    (rules / "broken.yml").write_text("groups:\n- name: t\n  rules:\n  - alert: X\n    expr: up{\n")
    assert subprocess.run([promtool, "check", "config", str(path)], capture_output=True, timeout=60).returncode != 0


def test_real_prometheus_scrapes_a_replica_with_the_generated_labels(tmp_path, release_data, prometheus):
    # A replica's /metrics as 0.5.4 exposes a gauge, served on loopback; Prometheus 2.42 scrapes it through the
    # generated configuration and the series carries the target's labels.
    import http.server
    import socket
    import threading
    import time
    import urllib.parse
    import urllib.request

    body = b'vllm:num_requests_running{model_name="m"} 3.0\n'

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    def free_port() -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port, web = server.server_address[1], free_port()
    record = release(replicas=[replica("vllm-0", port)])
    settings = Settings("nvitop", 9835, scrape_interval="1s", scrape_timeout="1s", rule_files=(),
                        prometheus_address=f"127.0.0.1:{web}")
    text = fleet_config_text(["node1"], {"node1": record}, {"node1": "127.0.0.1"}, [], settings, release_data)[0]
    (tmp_path / "prometheus.yml").write_text(text)
    proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--web.listen-address=127.0.0.1:{web}", f"--storage.tsdb.path={tmp_path / 'data'}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        query = urllib.parse.urlencode({"query": "vllm:num_requests_running"})
        deadline, found = time.monotonic() + 60, []
        while time.monotonic() < deadline and not found:
            time.sleep(1)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/query?{query}", timeout=5) as answer:
                    found = json.load(answer)["data"]["result"]
            except OSError:
                continue
        assert found, "Prometheus scraped no vllm:num_requests_running in 60 s"
        labels = found[0]["metric"]
        assert {key: labels.get(key) for key in ("job", "node", "replica", "release", "vllm_version", "vllm_metrics",
                                                 "instance")} == {
            "job": "vllm", "node": "node1", "replica": "vllm-0", "release": "3f9a1c2e0b7d", "vllm_version": "0.5.4",
            "vllm_metrics": "exported", "instance": f"127.0.0.1:{port}"}
        assert found[0]["value"][1] == "3"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.shutdown()
