"""The lab node after converge, idempotence and the release faults: the planned release (A) serves under
systemd, exactly as planned, sandboxed, with its secret out of sight, and the record tells what happened."""
from __future__ import annotations

import functools
import json
import os
import shlex

import pytest
from lab_testinfra import connect_verified, lab_host, lab_hosts, serve_url

testinfra_hosts = lab_hosts("gpu_nodes")
SSH_CONFIG = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "lab", "ssh_config")
PLAN = "/var/lib/revive/plan.json"
RECORD = "/var/lib/revive/releases.json"
ENV_FILE = "/etc/vllm/vllm.env"
API_KEY = "revive-lab-key"  # .config/molecule/config.yml (revive_api_key)
UVM_UNIT = "revive-nvidia-uvm.service"


def read_json(host, path: str) -> dict:
    return json.loads(host.check_output(f"cat {shlex.quote(path)}"))


def journal(host, unit: str) -> str:
    return host.run(f"journalctl -u {unit} --no-pager -n 60").stdout


@functools.cache
def store_manifest() -> dict:
    client = connect_verified("model-store", SSH_CONFIG)
    try:
        _, stdout, _ = client.exec_command("cat /srv/models/tiny-chat/rev1/revive-manifest.json")
        return json.loads(stdout.read())
    finally:
        client.close()


@pytest.fixture
def plan(host) -> dict:
    return read_json(host, PLAN)["release"]


@pytest.fixture
def record(host) -> dict:
    return read_json(host, RECORD)


def main_pid_argv(host, unit: str) -> list:
    pid = host.check_output(f"systemctl show -p MainPID --value {unit}")
    assert pid != "0", journal(host, unit)
    return host.run(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.splitlines()


def test_one_active_unit_per_planned_replica(host, plan):
    units = [f"{replica['name']}.service" for replica in plan["replicas"]]
    assert units == ["vllm-0.service", "vllm-1.service"]
    for unit in units:
        service = host.service(unit)
        assert service.is_running and service.is_enabled, journal(host, unit)


def test_each_replica_runs_the_plans_argv_exactly_from_the_release_venv(host, plan, record):
    venv = record["current"]["venv"]
    assert venv.startswith("/opt/vllm/venvs/0.8.5.post1-")
    for replica in plan["replicas"]:
        expected = [f"{venv}/bin/python"] + plan["entrypoint"] + replica["args"]
        assert main_pid_argv(host, f"{replica['name']}.service") == expected


def test_each_replica_has_the_plans_environment_and_port(host, plan):
    for replica in plan["replicas"]:
        pid = host.check_output(f"systemctl show -p MainPID --value {replica['name']}.service")
        environ = dict(line.split("=", 1) for line in
                       host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines() if "=" in line)
        for name, value in replica["env"].items():
            assert environ.get(name) == value, name
        # Issue 17 §2: bound to the node's serving address (its lab address), not to every interface.
        address = lab_host(host.backend.host.name)["address"]
        assert replica["args"][replica["args"].index("--host") + 1] == address
        assert host.socket(f"tcp://{address}:{replica['port']}").is_listening
        assert not host.socket(f"tcp://0.0.0.0:{replica['port']}").is_listening
        assert host.check_output(f"python3 -c \"import urllib.request as u; "
                                 f"print(u.urlopen('{serve_url(host.backend.host.name, replica['port'])}"
                                 "/health').status)\"") == "200"
        loopback = host.run(f"curl -sS -o /dev/null --max-time 5 http://127.0.0.1:{replica['port']}/health")
        assert loopback.rc == 7, (loopback.rc, loopback.stderr)  # curl 7: connection refused


def test_the_venv_holds_the_pins_without_flash_attention(host, record):
    python = record["current"]["python"]
    listed = host.check_output(f"{python} -m pip list --format=json --disable-pip-version-check")
    versions = {item["name"].lower(): item["version"] for item in json.loads(listed)}
    assert (versions["vllm"], versions["torch"], versions["xformers"]) == ("0.8.5.post1+sim", "2.6.0+sim",
                                                                           "0.0.29.post2+sim")
    assert "flash-attn" not in versions
    assert host.check_output(f"{python} -c 'import vllm; print(vllm.__version__)'") == "0.8.5.post1+sim"


def test_the_venv_holds_exactly_its_lock(host, record):
    """pip installed the lab lock and nothing else: every distribution in the venv (pip's own aside) is locked."""
    python = record["current"]["python"]
    listed = host.check_output(f"{python} -m pip list --format=json --disable-pip-version-check")
    installed = {item["name"].lower().replace("_", "-") for item in json.loads(listed)} - {"pip", "setuptools"}
    lock = host.file("/var/cache/revive/locks/vllm-0.8.5.post1-py3.11.txt").content_string
    locked = {line.split("==")[0].lower().replace("_", "-") for line in lock.splitlines() if "==" in line
              and not line.startswith((" ", "#"))}
    assert installed == locked


def test_the_promoted_model_is_byte_identical_to_the_source(host, plan):
    model = next(plan["replicas"][0]["args"][i + 1] for i, a in enumerate(plan["replicas"][0]["args"]) if a == "--model")
    assert model == "/data/models/tiny-chat/rev1"
    lines = host.check_output(f"cd {model} && sha256sum $(find . -type f ! -name revive-manifest.json | sort)")
    on_node = {path[2:]: digest for digest, path in (line.split() for line in lines.splitlines())}
    assert on_node == {entry["path"]: entry["sha256"] for entry in store_manifest()["files"]}


def test_the_service_user_has_no_login_shell_and_reads_the_model(host):
    user = host.user("vllm")
    assert user.shell == "/usr/sbin/nologin" and user.group == "vllm"
    assert host.run("runuser -u vllm -- head -c 8 /data/models/tiny-chat/rev1/config.json").rc == 0


def test_the_env_file_is_root_only_and_holds_the_key(host):
    env_file = host.file(ENV_FILE)
    assert (env_file.user, env_file.group, env_file.mode) == ("root", "root", 0o600)
    assert f"VLLM_API_KEY={API_KEY}" in env_file.content_string.splitlines()


def test_the_api_key_is_needed_and_never_visible(host, plan):
    port = plan["replicas"][0]["port"]
    probe = ("import urllib.request as u, urllib.error as e\n"
             f"r = u.Request('{serve_url(host.backend.host.name, port)}/v1/models')\n"
             "try:\n    print(u.urlopen(r).status)\nexcept e.HTTPError as x:\n    print(x.code)\n")
    assert host.check_output(f"python3 -c {shlex.quote(probe)}") == "401"
    assert API_KEY not in host.check_output("ps -eo args")
    assert API_KEY not in host.check_output("journalctl --no-pager -o cat")
    for unit in ("vllm-0.service", "vllm-1.service"):
        assert API_KEY not in host.check_output(f"systemctl show {unit}")
        assert API_KEY not in host.file(f"/etc/systemd/system/{unit}").content_string


def test_the_units_verify_clean(host):
    result = host.run("systemd-analyze verify /etc/systemd/system/vllm-0.service /etc/systemd/system/vllm-1.service")
    assert (result.rc, result.stdout + result.stderr) == (0, "")


def test_the_sandbox_exposure_stays_low(host):
    out = host.check_output("systemd-analyze security --no-pager vllm-0.service | tail -n 1")
    score = float(out.split("vllm-0.service:")[1].split()[0])
    assert score <= 2.0, host.check_output("systemd-analyze security --no-pager vllm-0.service")


def test_units_stop_the_api_server_first_and_start_means_serving(host):
    for unit in ("vllm-0.service", "vllm-1.service"):
        shown = dict(line.split("=", 1) for line in host.check_output(
            f"systemctl show {unit} -p KillMode -p Restart -p NoNewPrivileges -p ProtectSystem -p DevicePolicy "
            "-p User -p LimitNOFILE -p StartLimitBurst").splitlines())
        assert shown == {"KillMode": "mixed", "Restart": "always", "NoNewPrivileges": "yes",
                         "ProtectSystem": "strict", "DevicePolicy": "closed", "User": "vllm", "LimitNOFILE": "65536",
                         "StartLimitBurst": "3"}
        # the health wait asks the address the replica listens on (issue 17 §2)
        address = lab_host(host.backend.host.name)["address"]
        assert f"vllm-wait-healthy --host {address} --port" in host.check_output(
            f"systemctl show -p ExecStartPost {unit}")


def test_the_record_has_release_a_current_and_the_last_failure(host, plan, record):
    current = record["current"]
    assert current["args"] == plan["replicas"][0]["args"]
    assert [r["argv"][3:] for r in current["replicas"]] == [r["args"] for r in plan["replicas"]]
    failure = record["last_failure"]
    # The last fault of side_effect.yml: release E kept crashing within its start window.
    assert failure["restored"] == current["id"] and failure["restored_serving"] is True
    assert failure["release"]["args"] == current["args"] and failure["release"]["id"] != current["id"]
    assert "automatic restart(s) within 3 s of its start" in failure["message"]
    assert "is serving again" in failure["message"]


def shown(host, unit: str, *properties: str) -> dict:
    args = " ".join(f"-p {name}" for name in properties)
    return dict(line.split("=", 1) for line in host.check_output(f"systemctl show {args} {unit}").splitlines())


def test_the_nvidia_uvm_loader_ran_before_each_replica(host, plan):
    loader = shown(host, UVM_UNIT, "ActiveState", "SubState", "Result", "UnitFileState", "Type", "RemainAfterExit",
                   "Before", "ActiveEnterTimestampMonotonic")
    assert {key: loader[key] for key in ("ActiveState", "SubState", "Result", "UnitFileState", "Type",
                                         "RemainAfterExit")} == {
        "ActiveState": "active", "SubState": "exited", "Result": "success", "UnitFileState": "enabled",
        "Type": "oneshot", "RemainAfterExit": "yes"}, journal(host, UVM_UNIT)
    for replica in plan["replicas"]:
        unit = f"{replica['name']}.service"
        assert unit in loader["Before"].split()
        replica_shown = shown(host, unit, "After", "Wants", "Requires", "ExecStartPre",
                              "ExecMainStartTimestampMonotonic")
        assert UVM_UNIT in replica_shown["After"].split() and UVM_UNIT in replica_shown["Wants"].split()
        assert UVM_UNIT not in replica_shown["Requires"].split()
        assert "revive-nvidia-uvm check --simulated /dev/nvidia-uvm" in replica_shown["ExecStartPre"]
        # The loader's last run ended before vLLM of the replica's current run started.
        assert int(loader["ActiveEnterTimestampMonotonic"]) < int(replica_shown["ExecMainStartTimestampMonotonic"])


def test_the_simulated_nvidia_uvm_node_is_a_stand_in_and_says_so(host):
    # Major 60 (local/experimental use): the lab has no NVIDIA driver, the loader loaded nothing.
    assert host.check_output("stat -c '%F %t:%T %a %U' /dev/nvidia-uvm") == "character special file 3c:0 666 root"
    assert host.check_output("stat -c '%F %t:%T' /dev/nvidia-uvm-tools") == "character special file 3c:1"
    loader_journal = journal(host, UVM_UNIT)
    assert "simulated GPUs (no NVIDIA driver on this node): no kernel module loaded" in loader_journal
    assert "revive-nvidia-uvm: /dev/nvidia-uvm is ready (simulated)" in loader_journal
    assert "(simulated GPUs: stand-in nodes)" in host.check_output(f"systemctl show -p Description --value {UVM_UNIT}")


def test_a_replica_refused_to_start_without_the_node_and_said_why(host):
    # side_effect.yml removed the node and restarted vllm-1 before the releases.
    assert ("revive-nvidia-uvm: /dev/nvidia-uvm is missing: the nvidia-uvm kernel module is not loaded; see "
            "revive-nvidia-uvm.service") in host.check_output("journalctl -u vllm-1.service --no-pager -o cat")


def test_the_loader_unit_verifies_clean(host):
    result = host.run(f"systemd-analyze verify /etc/systemd/system/{UVM_UNIT}")
    assert (result.rc, result.stdout + result.stderr) == (0, "")
