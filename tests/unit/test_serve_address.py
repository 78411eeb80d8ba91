"""module_utils/revive_serve_address.py (issue 17 §2): the address a node's replicas bind, refused before anything
changes when it cannot work, and the address every client of a replica uses - on the node, at the front door, in
Prometheus. Through Ansible too: the role's check refuses a bad address with the module's words."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ansible.module_utils.revive_frontdoor import frontdoor_servers
from ansible.module_utils.revive_serve_address import (
    ServeAddressError,
    bound_host,
    node_addresses,
    reach_addresses,
    reach_host,
    release_serve_address,
    replica_host,
    replica_url,
    serve_address,
    url_host,
)

FACTS = {"all_ipv4_addresses": ["10.0.3.11", "192.168.50.4"],
         "all_ipv6_addresses": ["fe80::1", "fd00::11"],
         "default_ipv4": {"address": "192.168.50.4", "interface": "eth1"}}


def plan_release(host: str, ports=(8000, 8001)) -> dict:
    return {"vllm_version": "0.5.4", "args": ["--model", "/m", "--host", host, "--port", str(ports[0])],
            "replicas": [{"name": f"vllm-{i}", "port": port,
                          "args": ["--model", "/m", "--host", host, "--port", str(port)]}
                         for i, port in enumerate(ports)]}


def test_the_node_addresses_come_from_its_facts_without_link_local_ones():
    assert node_addresses(FACTS) == ["10.0.3.11", "192.168.50.4", "fd00::11"]
    prefixed = {"ansible_all_ipv4_addresses": ["10.0.3.11"], "ansible_all_ipv6_addresses": ["FD00:0:0::11"]}
    assert node_addresses(prefixed) == ["10.0.3.11", "fd00::11"]
    assert node_addresses({}) == []


@pytest.mark.parametrize("explicit, expected", [
    ("10.0.3.11", "10.0.3.11"),
    (" 192.168.50.4 ", "192.168.50.4"),
    ("fd00:0::11", "fd00::11"),
    ("0.0.0.0", "0.0.0.0"),
    ("::", "::"),
])
def test_an_operator_address_the_node_holds_or_a_wildcard_is_taken(explicit, expected):
    assert serve_address(FACTS, "10.0.3.11", explicit, "node1") == expected


def test_without_one_the_inventory_address_is_taken_when_the_node_holds_it():
    assert serve_address(FACTS, "10.0.3.11", "", "node1") == "10.0.3.11"
    assert serve_address(FACTS, "10.0.3.11", None, "node1") == "10.0.3.11"


@pytest.mark.parametrize("ansible_host", ["gpu07.example", "203.0.113.9", ""])
def test_an_inventory_name_or_an_address_the_node_does_not_hold_gives_the_default_route(ansible_host):
    # A name (resolved once at start by uvicorn) or a NAT address (not on any interface) cannot be bound.
    assert serve_address(FACTS, ansible_host, "", "node1") == "192.168.50.4"


@pytest.mark.parametrize("explicit, words", [
    ("gpu07.example", ["revive_serve_address of node1 is 'gpu07.example', not an IP address",
                       "10.0.3.11, 192.168.50.4, fd00::11", "0.0.0.0 to listen on every interface"]),
    ("10.9.9.9", ["revive_serve_address of node1 is 10.9.9.9, which node1 does not hold",
                  "(its addresses: 10.0.3.11, 192.168.50.4, fd00::11)", "could not bind it"]),
    ("fe80::1", ["fe80::1, which node1 does not hold"]),
    ("10.0.3.11/24", ["'10.0.3.11/24', not an IP address"]),
    ("127.0.0.1", ["is 127.0.0.1, a loopback address: only the node itself could reach the replicas"]),
    ("::1", ["is ::1, a loopback address"]),
])
def test_an_address_the_replicas_could_not_bind_is_refused_saying_what_to_set(explicit, words):
    with pytest.raises(ServeAddressError) as caught:
        serve_address(FACTS, "10.0.3.11", explicit, "node1")
    for word in words:
        assert word in str(caught.value)


def test_a_node_without_any_usable_address_is_refused():
    with pytest.raises(ServeAddressError, match=r"node1 has no serving address: its ansible_host \(gpu07\) is not an "
                                                r"address it holds and it has no default route; set "
                                                r"revive_serve_address to one of its addresses \(none in its facts\)"):
        serve_address({}, "gpu07", "", "node1")


def test_a_client_on_the_node_reaches_a_wildcard_bind_at_loopback():
    assert reach_host("10.0.3.11") == "10.0.3.11"
    assert reach_host("0.0.0.0") == "127.0.0.1"
    assert reach_host("::") == "::1"
    assert reach_host("") == "127.0.0.1"       # no --host: vLLM binds every interface
    assert reach_host("not-an-ip") == "127.0.0.1"
    assert url_host("fd00::11") == "[fd00::11]" and url_host("[fd00::11]") == "[fd00::11]"
    assert url_host("10.0.3.11") == "10.0.3.11"


def test_the_bound_host_is_read_from_the_argv_in_either_spelling():
    assert bound_host(["--model", "/m", "--host", "10.0.3.11", "--port", "8000"]) == "10.0.3.11"
    assert bound_host(["--host=fd00::11"]) == "fd00::11"
    assert bound_host(["--model", "/m"]) == ""
    assert bound_host(["--host"]) == ""


def test_a_recorded_replica_is_reached_where_its_argv_binds_and_an_old_record_at_loopback():
    new = {"name": "vllm-0", "port": 8001, "argv": ["/v/bin/python", "-m", "x", "--host", "fd00::11", "--port", "8001"]}
    old = {"name": "vllm-0", "port": 8000, "argv": ["/v/bin/python", "-m", "x", "--host", "0.0.0.0", "--port", "8000"]}
    assert replica_host(new) == "fd00::11" and replica_url(new) == "http://[fd00::11]:8001"
    assert replica_url(old) == "http://127.0.0.1:8000"
    assert replica_url({"port": "8002", "args": ["--host", "10.0.3.11"]}) == "http://10.0.3.11:8002"


def test_a_release_names_its_serving_address_only_when_every_replica_binds_the_same_one():
    assert release_serve_address(plan_release("10.0.3.11")) == "10.0.3.11"
    assert release_serve_address(plan_release("0.0.0.0")) == ""
    split = plan_release("10.0.3.11")
    split["replicas"][1]["args"][3] = "192.168.50.4"
    assert release_serve_address(split) == ""
    # A serving group's worker has no replica: its group argv says.
    assert release_serve_address({"args": ["--host", "10.0.3.12"], "replicas": []}) == "10.0.3.12"
    assert release_serve_address({}) == "" and release_serve_address(None) == ""


def test_the_front_door_and_prometheus_reach_a_node_where_its_replicas_listen():
    hostvars = {
        "node1": {"ansible_host": "203.0.113.9", "ansible_facts": {"revive_release": plan_release("10.0.3.11")}},
        "node2": {"ansible_host": "10.0.3.12", "ansible_facts": {"revive_release": plan_release("0.0.0.0")}},
        "node3": {"ansible_facts": {}},
        "lb1": {"ansible_host": "10.0.3.2"},
    }
    servers = frontdoor_servers(["node1", "node2"], hostvars)
    assert {s["name"]: s["address"] for s in servers} == {
        "node1-vllm-0": "10.0.3.11", "node1-vllm-1": "10.0.3.11",    # the bound address, not the NAT one
        "node2-vllm-0": "10.0.3.12", "node2-vllm-1": "10.0.3.12"}    # a wildcard bind: its ansible_host
    assert reach_addresses(["node1", "node2", "node3", "lb1"], hostvars) == {
        "node1": "10.0.3.11", "node2": "10.0.3.12", "node3": "", "lb1": "10.0.3.2"}


def test_a_plan_refuses_a_serve_host_that_is_not_an_ip_address():
    from ansible.module_utils.revive_plan.inputs import PlanInputError, Serve
    assert Serve(host="10.0.3.11").host == "10.0.3.11"
    for bad in ("gpu07.example", "", "10.0.3.11:8000", 7):
        with pytest.raises(PlanInputError, match="serve.host") as caught:
            Serve(host=bad)
        assert "set one of the node's addresses, or 0.0.0.0 for every interface" in str(caught.value)


CHECK = "gpu_preflight : Check the address the replicas will listen on (gpu_preflight_serve_address)"


def run_role_check(repo, tmp_path, address: str) -> tuple:
    """gpu_preflight's first check through ansible-playbook, on this machine's real gathered facts."""
    (tmp_path / "inventory.yml").write_text("all:\n  hosts:\n    node1: {ansible_connection: local}\n")
    (tmp_path / "play.yml").write_text(textwrap.dedent(f"""\
        - name: The preflight's checks, first of all
          hosts: node1
          gather_facts: true
          gather_subset: [network]
          tasks:
            - name: Check the role's variables
              ansible.builtin.include_role:
                name: gpu_preflight
                tasks_from: assert.yml
              vars:
                gpu_preflight_serve_address: {json.dumps(address)}
        """))
    # A fact cache of its own: this machine's facts must not stand in for a lab host named node1 (.cache/facts).
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i",
                           str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml")],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=180)
    report = json.loads(proc.stdout)
    tasks = [(task["task"]["name"], task["hosts"]["node1"]) for play in report["plays"] for task in play["tasks"]]
    return proc.returncode, tasks


def test_the_preflight_refuses_an_address_the_node_does_not_hold_before_anything_else(repo, tmp_path):
    code, tasks = run_role_check(repo, tmp_path, "192.0.2.77")
    assert code == 2
    name, result = tasks[-1]
    assert name == CHECK
    assert result["failed"] is True
    assert result["msg"].startswith("revive_serve_address of node1 is 192.0.2.77, which node1 does not hold (its "
                                    "addresses: "), result["msg"]
    # The role's first task: nothing else of it ran (after the facts it reads).
    assert [n for n, _ in tasks] == ["Gathering Facts", "Check the role's variables", CHECK]


def test_the_preflight_takes_a_wildcard_bind(repo, tmp_path):
    code, tasks = run_role_check(repo, tmp_path, "0.0.0.0")
    check = dict(tasks)[CHECK]
    assert check.get("failed") is not True, check
