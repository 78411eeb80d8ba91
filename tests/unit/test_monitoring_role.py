"""roles/monitoring rendered by Ansible and the module prometheus_config run by Ansible: the exporters' units and
flags (dcgm-exporter's fields with ECC, retired pages and XID counters; nvitop-exporter's explicit --port and
--hostname; node exporter's systemd collector), blackbox's /health module and Alertmanager's configuration
(checked by their own tools, which .ci/run installs), the GPU exporter's port following the one variable, prometheus.yml written,
validated by promtool, idempotent, in check mode and with a diff; playbooks/monitoring.yml skipped cleanly without a
`monitor` group; ansible-doc renders the module and the role."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

BIN = os.path.dirname(sys.executable)
ROLE = Path(__file__).resolve().parents[2] / "roles" / "monitoring"


def ansible_env(repo, tmp_path) -> dict:
    return dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
                ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))


def play(repo, tmp_path, tasks: str, *flags: str, extra: dict | None = None, role_vars: bool = True,
         handlers: str = ""):
    """Run tasks (and handlers) on localhost with the role's defaults and vars loaded; the tasks' results (and the
    return code)."""
    vars_files = (f"    - {ROLE}/defaults/main.yml\n    - {ROLE}/vars/main.yml\n") if role_vars else ""
    path = tmp_path / "play.yml"
    path.write_text("- name: Monitoring\n  hosts: localhost\n  gather_facts: false\n"
                    + (f"  vars_files:\n{vars_files}" if vars_files else "")
                    + "  vars:\n    role_path: " + str(ROLE) + "\n  tasks:\n"
                    + textwrap.indent(textwrap.dedent(tasks), "    ")
                    + ("  handlers:\n" + textwrap.indent(textwrap.dedent(handlers), "    ") if handlers else ""))
    args = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(path), *flags]
    for key, value in (extra or {}).items():
        args += ["-e", json.dumps({key: value})]
    proc = subprocess.run(args, cwd=repo, env=ansible_env(repo, tmp_path), capture_output=True, text=True,
                          timeout=180)
    try:
        tasks_out = json.loads(proc.stdout)["plays"][0]["tasks"]
    except (ValueError, KeyError, IndexError):
        pytest.fail(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc.returncode, {t["task"]["name"]: t["hosts"]["localhost"] for t in tasks_out}


def render(repo, tmp_path, template: str, **variables) -> str:
    dest = tmp_path / template.removesuffix(".j2")
    code, results = play(repo, tmp_path, f"""\
        - name: Render
          ansible.builtin.template:
            src: {ROLE}/templates/{template}
            dest: {dest}
            mode: "0644"
        """, extra=variables)
    assert code == 0, results
    return dest.read_text()


def lines(text: str) -> list:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def exec_start(text: str) -> list:
    return next(line for line in lines(text) if line.startswith("ExecStart=")).removeprefix("ExecStart=").split()


# --- the exporters on a GPU node ----------------------------------------------------------------------------

def test_dcgm_exporter_runs_against_the_host_engine_with_the_revive_fields_on_its_port(repo, tmp_path):
    unit = render(repo, tmp_path, "nvidia-dcgm-exporter.service.j2")
    assert exec_start(unit) == ["/usr/bin/dcgm-exporter", "-f", "/etc/dcgm-exporter/revive-counters.csv",
                                "-a", ":9400", "-c", "15000", "-r", "localhost:5555"]
    assert "After=nvidia-dcgm.service" in lines(unit) and "Wants=nvidia-dcgm.service" in lines(unit)
    assert "AmbientCapabilities=CAP_SYS_ADMIN" not in lines(unit)
    profiled = render(repo, tmp_path, "nvidia-dcgm-exporter.service.j2", monitoring_dcgm_exporter_profiling=True,
                      monitoring_gpu_exporter_port=9500)
    assert "AmbientCapabilities=CAP_SYS_ADMIN" in lines(profiled) and ":9500" in exec_start(profiled)


def test_dcgm_fields_enable_ecc_retired_pages_and_xid_counters(repo, tmp_path):
    rows = [[cell.strip() for cell in line.split(",", 2)]
            for line in lines(render(repo, tmp_path, "revive-counters.csv.j2"))]
    fields = {row[0]: row[1] for row in rows}
    assert all(len(row) == 3 and row[1] in ("gauge", "counter") and row[2] for row in rows), rows
    for name, kind in (("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter"), ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter"),
                       ("DCGM_FI_DEV_RETIRED_SBE", "counter"), ("DCGM_FI_DEV_RETIRED_DBE", "counter"),
                       ("DCGM_FI_DEV_RETIRED_PENDING", "gauge"), ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
                       ("DCGM_EXP_XID_ERRORS_COUNT", "counter"), ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
                       ("DCGM_FI_DEV_FB_USED", "gauge")):
        assert fields.get(name) == kind, name
    assert len(fields) == len(rows), "a field is listed twice"
    assert not any(name.startswith("DCGM_FI_PROF_") for name in fields)
    profiled = lines(render(repo, tmp_path, "revive-counters.csv.j2", monitoring_dcgm_exporter_profiling=True))
    assert any(line.startswith("DCGM_FI_PROF_DRAM_ACTIVE, gauge") for line in profiled)


def test_nvitop_exporter_gets_an_explicit_port_and_hostname(repo, tmp_path):
    unit = render(repo, tmp_path, "nvitop-exporter.service.j2", monitoring_gpu_exporter="nvitop",
                  inventory_hostname="node1")
    assert exec_start(unit) == ["/opt/revive/nvitop-exporter/bin/nvitop-exporter", "--bind-address", "0.0.0.0",
                                "--port", "9835", "--hostname", "node1", "--interval", "5.0"]
    assert "Restart=always" in lines(unit)


def test_node_exporter_runs_the_systemd_collector_with_restart_counts(repo, tmp_path):
    text = render(repo, tmp_path, "prometheus-node-exporter.default.j2")
    (assignment,) = lines(text)
    words = assignment.removeprefix('ARGS="').removesuffix('"').split()
    assert words == ["--web.listen-address=:9100", "--collector.textfile.directory=/var/lib/prometheus/node-exporter",
                     "--collector.systemd", "--collector.systemd.enable-restarts-metrics",
                     "--collector.systemd.unit-include=(vllm-.+|nvidia-dcgm|nvidia-dcgm-exporter|nvitop-exporter)"
                     "[.]service"]
    # The replicas' units (vllm_service: <replica>.service, replicas vllm-0, vllm-1, ...) match; others do not.
    import re
    pattern = re.compile(words[-1].split("=", 1)[1])
    assert pattern.fullmatch("vllm-0.service") and pattern.fullmatch("nvitop-exporter.service")
    assert not pattern.fullmatch("ssh.service")


def test_the_replica_map_names_every_gpu_of_every_replica_for_the_tp_group_rules(repo, tmp_path, promtool):
    """revive-replicas.prom: revive_replica_gpu_info{replica, gpu} = 1 per GPU of each replica, in the exposition
    format node exporter's textfile collector accepts (promtool check metrics), sorted so a re-render is identical."""
    replicas = [{"name": "vllm-1", "gpus": [7, 6, 5, 4]}, {"name": "vllm-0", "gpus": [0, 1, 2, 3]}]
    text = render(repo, tmp_path, "revive-replicas.prom.j2", __monitoring_replicas=replicas)
    samples = [line for line in text.splitlines() if line.startswith("revive_replica_gpu_info")]
    assert samples == [f'revive_replica_gpu_info{{replica="vllm-{r}",gpu="{g}"}} 1'
                       for r, gpus in ((0, range(4)), (1, range(4, 8))) for g in gpus]
    body = "".join(line + "\n" for line in text.splitlines() if not line.startswith("# ") or " HELP " in line
                   or " TYPE " in line)
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert render(repo, tmp_path, "revive-replicas.prom.j2", __monitoring_replicas=list(reversed(replicas))) == text


@pytest.mark.parametrize("kind,port,expected", [("dcgm", 0, 9400), ("nvitop", 0, 9835), ("nvitop", 9999, 9999)])
def test_the_gpu_exporters_port_follows_the_one_variable(repo, tmp_path, kind, port, expected):
    code, results = play(repo, tmp_path, """\
        - name: Port
          ansible.builtin.debug:
            msg: "{{ __monitoring_gpu_exporter_port | int }} {{ __monitoring_gpu_exporter_unit }}"
        """, extra={"monitoring_gpu_exporter": kind, "monitoring_gpu_exporter_port": port})
    assert code == 0
    unit = {"dcgm": "nvidia-dcgm-exporter", "nvitop": "nvitop-exporter"}[kind]
    assert results["Port"]["msg"] == f"{expected} {unit}"


# --- the monitor host ----------------------------------------------------------------------------------------

def test_blackbox_probes_health_for_200_over_ipv4(repo, tmp_path, blackbox_exporter):
    text = render(repo, tmp_path, "blackbox.yml.j2")
    module = yaml.safe_load(text)["modules"]["http_health"]
    assert module == {"prober": "http", "timeout": "5s",
                      "http": {"method": "GET", "valid_status_codes": [200], "preferred_ip_protocol": "ip4",
                               "no_follow_redirects": True}}
    done = subprocess.run([blackbox_exporter, "--config.check", f"--config.file={tmp_path / 'blackbox.yml'}"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


def test_alertmanager_gets_the_route_and_receivers(repo, tmp_path, amtool):
    receivers = [{"name": "oncall", "webhook_configs": [{"url": "http://hooks.example.internal/alert"}]}]
    route = {"receiver": "oncall", "group_by": ["alertname", "node"]}
    text = render(repo, tmp_path, "alertmanager.yml.j2", monitoring_alertmanager_receivers=receivers,
                  monitoring_alertmanager_route=route)
    assert yaml.safe_load(text) == {"route": route, "receivers": receivers}
    default = yaml.safe_load(render(repo, tmp_path, "alertmanager.yml.j2"))
    assert default["route"]["receiver"] == "default" and default["receivers"] == [{"name": "default"}]
    done = subprocess.run([amtool, "check-config", str(tmp_path / "alertmanager.yml")], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_services_command_lines(repo, tmp_path):
    prometheus = lines(render(repo, tmp_path, "prometheus.default.j2"))
    assert prometheus == ['ARGS="--config.file=/etc/prometheus/prometheus.yml --web.listen-address=0.0.0.0:9090 '
                          '--storage.tsdb.retention.time=15d"']
    alertmanager = lines(render(repo, tmp_path, "prometheus-alertmanager.default.j2"))
    assert alertmanager == ['ARGS="--config.file=/etc/prometheus/alertmanager.yml '
                            '--web.listen-address=127.0.0.1:9093 --cluster.listen-address="']
    blackbox = lines(render(repo, tmp_path, "prometheus-blackbox-exporter.default.j2"))
    assert blackbox == ['ARGS="--config.file=/etc/prometheus/blackbox.yml --web.listen-address=127.0.0.1:9115"']


def test_only_rule_files_not_their_promtool_tests_are_installed(repo, tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    for name in ("vllm.yml", "vllm_test.yml", "gpu.yml", "notes.txt"):
        (rules / name).write_text("groups: []\n")
    code, results = play(repo, tmp_path, """\
        - name: Rules
          ansible.builtin.debug:
            msg: "{{ __monitoring_rule_sources | map('basename') | list }}"
        """, extra={"monitoring_rules_dir": str(rules)})
    assert code == 0 and results["Rules"]["msg"] == ["gpu.yml", "vllm.yml"]


def test_the_repositorys_rules_directory_is_the_default(repo, tmp_path):
    code, results = play(repo, tmp_path, """\
        - name: Rules dir
          ansible.builtin.debug:
            msg: "{{ monitoring_rules_dir | realpath }}"
        """)
    assert code == 0 and results["Rules dir"]["msg"] == str((repo / "monitoring" / "rules").resolve())


RULE_TASKS = f"""\
- name: Render
  ansible.builtin.include_tasks: {ROLE}/tasks/rules_render.yml
- name: Install
  ansible.builtin.include_tasks: {ROLE}/tasks/rules_install.yml
"""
RELOAD = """\
- name: Reload prometheus
  ansible.builtin.debug:
    msg: reload
  listen: reload prometheus
"""


def install_rules(repo, tmp_path, *flags, **variables):
    installed = tmp_path / "etc-rules"
    code, results = play(repo, tmp_path, RULE_TASKS, *flags, handlers=RELOAD,
                         extra={"monitoring_prometheus_rules_path": str(installed), **variables})
    return code, results, installed


def repository_rules(repo) -> dict:
    return {p.name: p.read_text() for p in sorted((repo / "monitoring" / "rules").glob("*.yml"))
            if not p.name.endswith("_test.yml")}


def test_the_rules_are_installed_as_they_are_at_scale_1_and_a_second_run_changes_nothing(repo, tmp_path, promtool):
    code, results, installed = install_rules(repo, tmp_path)
    assert code == 0, results
    assert {p.name: p.read_text() for p in installed.iterdir()} == repository_rules(repo)
    assert "Reload prometheus" in results
    said = results.get("Say that the rules are time-scaled (lab only)")
    assert said is None or said.get("skipped"), said
    code, results, _ = install_rules(repo, tmp_path)
    assert code == 0 and not any(r.get("changed") for r in results.values()), results
    assert "Reload prometheus" not in results


def test_a_rule_file_the_repository_no_longer_has_is_removed_with_a_reload(repo, tmp_path, promtool):
    code, results, installed = install_rules(repo, tmp_path)
    assert code == 0, results
    (installed / "retired.yml").write_text("groups: []\n")
    (installed / "notes.txt").write_text("not a rule file\n")
    code, results, _ = install_rules(repo, tmp_path)
    assert code == 0, results
    assert {p.name for p in installed.iterdir()} == set(repository_rules(repo)) | {"notes.txt"}
    assert "Reload prometheus" in results


def test_the_lab_installs_time_scaled_rules_that_promtool_accepts_and_says_so(repo, tmp_path, promtool):
    scaled = {"monitoring_rule_time_scale": 0.0167, "monitoring_scrape_interval": "2s",
              "monitoring_evaluation_interval": "2s"}
    code, results, installed = install_rules(repo, tmp_path, **scaled)
    assert code == 0, results
    assert "TIME-SCALED rules on localhost" in results["Say that the rules are time-scaled (lab only)"]["msg"]
    texts = {p.name: p.read_text() for p in installed.iterdir()}
    assert set(texts) == set(repository_rules(repo))
    assert all(text.startswith("# TIME-SCALED for the lab") for text in texts.values())
    assert "for: 30m" not in texts["gpu.yml"] and "[15m]" not in texts["gpu.yml"]
    code, results, _ = install_rules(repo, tmp_path, **scaled)
    assert code == 0 and not any(r.get("changed") for r in results.values()), results


@pytest.mark.parametrize("scale", [0, -0.5, 2, "nan"])
def test_a_scale_out_of_range_is_refused_before_any_rule_is_written(repo, tmp_path, scale):
    code, results, installed = install_rules(repo, tmp_path, monitoring_rule_time_scale=scale)
    assert code != 0 and not installed.exists()
    failed = next(r for r in results.values() if r.get("failed"))
    assert "monitoring_rule_time_scale" in failed["msg"] and "at most 1" in failed["msg"], failed


# --- the module through Ansible ------------------------------------------------------------------------------

RECORD = {"id": "3f9a1c2e0b7d", "vllm_version": "0.5.4",
          "replicas": [{"name": "vllm-0", "port": 8000, "argv": ["python", "--port", "8000"]}]}
MODULE_TASK = """\
- name: Write
  prometheus_config:
    dest: "{{ dest }}"
    nodes: [node1]
    records: "{{ records }}"
    addresses: {node1: 10.213.0.11, lb1: 10.213.0.4}
    frontdoors: [lb1]
    releases: "{{ lookup('ansible.builtin.file', releases_file) | from_yaml }}"
    gpu_exporter: nvitop
    gpu_exporter_port: 9835
    rule_files: ["{{ rules }}/*.yml"]
    validate: "{{ validate }}"
    mode: "0644"
  register: written
"""


@pytest.fixture
def module_vars(tmp_path, repo, promtool):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "revive.yml").write_text("groups:\n- name: t\n  rules:\n  - alert: Down\n    expr: up == 0\n")
    return {"dest": str(tmp_path / "prometheus.yml"), "records": {"node1": RECORD}, "rules": str(rules),
            "validate": "promtool check config %s",
            "releases_file": str(repo / "data" / "vllm-releases.yml")}


def test_the_module_writes_validates_and_is_idempotent(repo, tmp_path, module_vars):
    code, results = play(repo, tmp_path, MODULE_TASK, "--diff", extra=module_vars, role_vars=False)
    assert code == 0, results
    written = results["Write"]
    text = Path(module_vars["dest"]).read_text()
    assert written["changed"] and written["config"] == text and written["diff"]["before"] == ""
    assert oct(Path(module_vars["dest"]).stat().st_mode & 0o777) == "0o644"
    vllm = [t for t in written["targets"] if t["job"] == "vllm"]
    assert vllm == [{"job": "vllm", "address": "10.213.0.11:8000",
                     "labels": {"node": "node1", "release": "3f9a1c2e0b7d", "replica": "vllm-0",
                                "vllm_metrics": "absent", "vllm_version": "0.5.4"}}]
    # The replica runs 0.5.4 without --disable-frontend-multiprocessing: said as a warning too.
    assert any("VllmMetricsMissing is expected" in w for w in written.get("warnings", [])), written
    again = play(repo, tmp_path, MODULE_TASK, extra=module_vars, role_vars=False)[1]["Write"]
    assert again["changed"] is False and Path(module_vars["dest"]).read_text() == text


def test_check_mode_says_what_would_change_and_writes_nothing(repo, tmp_path, module_vars):
    assert play(repo, tmp_path, MODULE_TASK, extra=module_vars, role_vars=False)[0] == 0
    before = Path(module_vars["dest"]).read_text()
    moved = dict(module_vars, records={"node1": dict(RECORD, id="0c0ffee0ddba", vllm_version="0.8.5.post1")})
    code, results = play(repo, tmp_path, MODULE_TASK, "--check", "--diff", extra=moved, role_vars=False)
    assert code == 0 and results["Write"]["changed"] is True
    assert Path(module_vars["dest"]).read_text() == before
    diff = results["Write"]["diff"]
    assert 'release: "3f9a1c2e0b7d"' in diff["before"] and 'release: "0c0ffee0ddba"' in diff["after"]
    # Check mode on a fresh fleet: a node without a record yet is a warning, not a refusal.
    fresh = dict(module_vars, records={})
    code, results = play(repo, tmp_path, MODULE_TASK, "--check", extra=fresh, role_vars=False)
    assert code == 0 and any("node1 has no current release" in w for w in results["Write"]["warnings"])


def test_a_refusal_names_the_node_and_writes_nothing(repo, tmp_path, module_vars):
    bad = dict(module_vars, records={"node1": RECORD, "node9": RECORD})
    code, results = play(repo, tmp_path, MODULE_TASK, extra=bad, role_vars=False)
    assert code != 0 and "release records of node9, which are not among the GPU nodes" in results["Write"]["msg"]
    assert not Path(module_vars["dest"]).exists()
    code, results = play(repo, tmp_path, MODULE_TASK, extra=dict(module_vars, records={}), role_vars=False)
    assert code != 0 and "node1 has no current release in its record" in results["Write"]["msg"]
    nowhere = str(tmp_path / "no-prometheus" / "prometheus.yml")
    code, results = play(repo, tmp_path, MODULE_TASK, extra=dict(module_vars, dest=nowhere), role_vars=False)
    assert code != 0 and "no-prometheus does not exist: install Prometheus first" in results["Write"]["msg"]


def test_a_config_promtool_rejects_is_not_written(repo, tmp_path, module_vars):
    (Path(module_vars["rules"]) / "broken.yml").write_text("groups:\n- name: t\n  rules:\n  - alert: X\n    expr: up{\n")
    code, results = play(repo, tmp_path, MODULE_TASK, extra=module_vars, role_vars=False)
    assert code != 0 and "failed 'promtool check config %s'" in results["Write"]["msg"], results
    assert "nothing was written" in results["Write"]["msg"] and not Path(module_vars["dest"]).exists()


# --- the playbook and the documentation ----------------------------------------------------------------------

def test_the_playbook_is_skipped_cleanly_without_a_monitor_group(repo, tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"node1": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), "playbooks/monitoring.yml"],
                          cwd=repo, env=ansible_env(repo, tmp_path), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plays = json.loads(proc.stdout)["plays"]
    ran = [task["task"]["name"] for p in plays for task in p["tasks"]]
    assert "Node exporter and the GPU exporter" not in ran and not any(p["play"]["name"].startswith("Prometheus")
                                                                       and p["tasks"] for p in plays)


def test_ansible_doc_renders_the_module_and_the_role(repo):
    module = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", "prometheus_config"], cwd=repo,
                            capture_output=True, text=True, timeout=60)
    assert module.returncode == 0, module.stderr
    for text in ("vllm_metrics", "gpu_exporter", "validate", "RETURN VALUES", "targets"):
        assert text in module.stdout, text
    role = subprocess.run([os.path.join(BIN, "ansible-doc"), "-t", "role", "-r", "roles", "monitoring"], cwd=repo,
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    assert role.returncode == 0, role.stderr
    for text in ("ENTRY POINT: *main*", "ENTRY POINT: *exporters*", "monitoring_gpu_exporter", "nvitop"):
        assert text in role.stdout, text
