"""The inventory check (module_utils/revive_inventory.py, library/revive_inventory_check.py, roles/validate_inventory):
every mistake in an inventory's site-wide settings refused before anything runs, with what, where and how to fix.

One table of cases over a fleet shaped like the Molecule fleet scenario, each starting from the lab's committed
settings (inventory/lab/group_vars/all/), changing what the case says and naming every message it must produce;
then the pieces that must agree with each other (revive_defaults' spec, the stage table, the role's marker), and
the whole wiring through ansible-playbook on a localhost-only inventory.
"""
from __future__ import annotations

import copy
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.revive_inventory import (
    STAGE_NEEDS,
    STAGES,
    UNDEFINED,
    check_inventory,
    secrets,
    where,
)

REPO = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)
SPEC = yaml.safe_load((REPO / "roles/revive_defaults/meta/argument_specs.yml").read_text())["argument_specs"]["main"][
    "options"]
LAB = {name: value for path in sorted((REPO / "inventory/lab/group_vars/all").glob("*.yml"))
       for name, value in yaml.safe_load(path.read_text()).items() if name.startswith("revive_")}
GROUPS = {"all": ["node1", "node2", "model-store", "bench1", "lb1"], "ungrouped": [], "gpu_nodes": ["node1", "node2"],
          "model_store": ["model-store"], "bench": ["bench1"], "lb": ["lb1"]}
SITE = ["preflight", "provision", "handover"]
EVERY_HOST = ("on every host of the run (bench1, lb1, model-store, node1, node2; group_vars/all/ sets it for all of "
              "them)")
GPU_NODES = "on the hosts of group gpu_nodes (node1, node2; group_vars/gpu_nodes/ or group_vars/all/)"
NODE1 = "on host node1 (host_vars/node1/, or the group_vars/ of a group it is in)"
DECLARED = "roles/revive_defaults/defaults/main.yml"

# (id, stages, {host or "all": {variable: value, or None to remove it}}, groups or None, every message expected)
CASES = [
    ("the lab's settings are complete for every stage", list(STAGES), {}, None, []),
    ("mounted was renamed to node_path", SITE, {"all": {"revive_model_source_type": "mounted"}}, None, [
        f"revive_model_source_type 'mounted' was renamed to 'node_path' - {EVERY_HOST}. Fix: set "
        "revive_model_source_type: node_path (Where the model is - model_store (a directory on the first host of "
        "group model_store, the rsync source), controller (a directory on the Ansible controller) or node_path (a path "
        "already mounted on every node, e.g. NFS))"]),
    ("node_path is accepted", SITE, {"all": {"revive_model_source_type": "node_path"}}, None, []),
    ("a source type outside its choices", SITE, {"all": {"revive_model_source_type": "nfs"}}, None, [
        f"revive_model_source_type must be one of model_store, controller, node_path (got 'nfs') - {EVERY_HOST}. Fix: "
        "set revive_model_source_type to one of model_store, controller, node_path (Where the model is - model_store "
        "(a directory on the first host of group model_store, the rsync source), controller (a directory on the "
        "Ansible controller) or node_path (a path already mounted on every node, e.g. NFS))"]),
    ("provisioning needs the API key on the GPU nodes", ["provision"], {"all": {"revive_api_key": None}}, None, [
        "revive_api_key is not set - needed on the hosts of group gpu_nodes (node1, node2). Fix: set it in "
        "inventory/<yours>/group_vars/all/ (The key clients send as Authorization - Bearer <key> on /v1/*; keep it "
        f"in a vault; see {DECLARED})"]),
    ("the hand-over needs it on the bench host too", ["handover"], {"all": {"revive_api_key": None}}, None, [
        "revive_api_key is not set - needed on hosts bench1, node1, node2. Fix: set it in "
        "inventory/<yours>/group_vars/all/ (The key clients send as Authorization - Bearer <key> on /v1/*; keep it "
        f"in a vault; see {DECLARED})"]),
    ("the preflight alone needs no API key", ["preflight"], {"all": {"revive_api_key": None}}, None, []),
    ("a site set in group_vars/gpu_nodes/ only is complete for the preflight", ["preflight"],
     {"bench1": {name: None for name in LAB}, "lb1": {name: None for name in LAB},
      "model-store": {name: None for name in LAB}}, None, []),
    ("the preflight's variables are each refused when missing", ["preflight"],
     {"all": {"revive_model_name": None, "revive_max_unfit_percent": None, "revive_lock_dir": None}}, None, [
         "revive_model_name is not set - needed on the hosts of group gpu_nodes (node1, node2). Fix: set it in "
         f"inventory/<yours>/group_vars/all/ (The model every GPU node serves; also the served model name; see "
         f"{DECLARED})",
         "revive_lock_dir is not set - needed on the hosts of group gpu_nodes (node1, node2). Fix: set it in "
         "inventory/<yours>/group_vars/all/ (Directory of the release locks on the controller "
         f"(vllm-<version>-py<X.Y>.txt, from bin/revive lock); empty means the project's data/locks, a relative path "
         f"is relative to the project; see {DECLARED})",
         "revive_max_unfit_percent is not set - needed on the hosts of group gpu_nodes (node1, node2). Fix: set it in "
         "inventory/<yours>/group_vars/all/ (Largest share of unfit (quarantined or failed) GPU nodes, in percent, "
         "with which the run goes on; above it the preflight stops the run before anything is provisioned; see "
         f"{DECLARED})"]),
    ("null is not set", ["preflight"], {"all": {"revive_expected_gpu_name": "__null__"}}, None, [
        "revive_expected_gpu_name is not set - needed on the hosts of group gpu_nodes (node1, node2). Fix: set it in "
        "inventory/<yours>/group_vars/all/ (GPU model every GPU node must have, as NVML names it; empty checks "
        f"nothing; see {DECLARED})"]),
    ("a typo is not a site-wide variable", SITE, {"node1": {"revive_modle_name": "chat"}}, None, [
        f"revive_modle_name is not a site-wide variable - {NODE1}. Fix: did you mean revive_model_name? Every "
        f"revive_* variable is declared in {DECLARED}; rename it or remove it"]),
    ("a name like no other has no suggestion", SITE, {"node1": {"revive_colour": "blue"}}, None, [
        f"revive_colour is not a site-wide variable - {NODE1}. Fix: Every revive_* variable is declared in "
        f"{DECLARED}; rename it or remove it"]),
    ("numbers as strings (-e) and a YAML date are accepted", SITE,
     {"all": {"revive_concurrency": "32", "revive_max_unfit_percent": "20", "revive_slo_p95_e2e_s": "12.5",
              "revive_model_revision": datetime.date(2024, 6, 1), "revive_nccl_check_compare": "false",
              "revive_rolling_serial": "2"}}, None, []),
    ("a word for a number", SITE, {"node1": {"revive_concurrency": "many"}}, None, [
        f"revive_concurrency must be a whole number (got 'many') - {NODE1}. Fix: set revive_concurrency to a whole "
        "number (Concurrent requests each node must serve)"]),
    ("a boolean is neither a number nor a name", SITE,
     {"all": {"revive_expected_gpu_count": True, "revive_expected_gpu_name": False}}, None, [
         f"revive_expected_gpu_count must be a whole number (got True) - {EVERY_HOST}. Fix: set "
         "revive_expected_gpu_count to a whole number (GPUs every GPU node must have; 0 checks nothing)",
         f"revive_expected_gpu_name must be a string (got False) - {EVERY_HOST}. Fix: set revive_expected_gpu_name "
         "to a string (GPU model every GPU node must have, as NVML names it; empty checks nothing)"]),
    ("a list for a mapping", SITE, {"all": {"revive_plan_overrides": ["tensor_parallel_size=4"]}}, None, [
        f"revive_plan_overrides must be a mapping (got ['tensor_parallel_size=4']) - {EVERY_HOST}. Fix: set "
        "revive_plan_overrides to a mapping (Operator choices that replace the planner's (vllm_plan's overrides - "
        "vllm_version, tensor_parallel_size, pipeline_parallel_size, gpu_memory_utilization, max_num_seqs, "
        "max_num_batched_tokens, swap_space, exclude_gpus, allow_bf16_conversion); each is still checked)"]),
    ("an expectation set for the GPU nodes only", SITE,
     {"node1": {"revive_expected_gpu_count": -8}, "node2": {"revive_expected_gpu_count": -8}}, None, [
         f"revive_expected_gpu_count is -8, it must be at least 0 - {GPU_NODES}. Fix: set a value at least 0"]),
    ("the workload's bounds", SITE,
     {"all": {"revive_concurrency": 0, "revive_slo_p95_e2e_s": 0, "revive_slo_output_tokens": 0,
              "revive_max_model_len": -1}}, None, [
         f"revive_max_model_len is -1, it must be at least 0 - {EVERY_HOST}. Fix: set a value at least 0",
         f"revive_concurrency is 0, it must be at least 1 - {EVERY_HOST}. Fix: set a value at least 1",
         f"revive_slo_p95_e2e_s is 0, it must be more than 0 - {EVERY_HOST}. Fix: set a value more than 0",
         f"revive_slo_output_tokens is 0, it must be at least 1 - {EVERY_HOST}. Fix: set a value at least 1"]),
    ("an empty model name and a relative model path", SITE,
     {"all": {"revive_model_name": " ", "revive_model_source_path": "models/tiny-chat"}}, None, [
         f"revive_model_name is empty - {EVERY_HOST}. Fix: set the model's name",
         f"revive_model_source_path is 'models/tiny-chat', not an absolute path - {EVERY_HOST}. Fix: give the model "
         "directory's absolute path at its source, e.g. /srv/models/<name>/<revision>"]),
    ("a mirror without its URL", SITE, {"all": {"revive_pip_source": {"type": "mirror"}}}, None, [
        f"revive_pip_source is a mirror without index_url - {EVERY_HOST}. Fix: add index_url: <the mirror's "
        "simple-index URL>"]),
    ("a wheelhouse without its directory", SITE, {"all": {"revive_pip_source": {"type": "wheelhouse"}}}, None, [
        f"revive_pip_source is a wheelhouse without a directory - {EVERY_HOST}. Fix: add wheelhouse: <a directory of "
        "wheels on the controller> (the lab's: .lab/wheelhouse)"]),
    ("a misspelt key and an unknown source type", SITE,
     {"all": {"revive_pip_source": {"type": "pypi", "index-url": "https://pypi.org/simple"}}}, None, [
         "revive_pip_source has no key 'index-url' (its keys: type, index_url, trusted_host, wheelhouse) - "
         f"{EVERY_HOST}. Fix: use 'index_url' instead",
         "revive_pip_source key 'type' must be one of index, mirror, wheelhouse (got 'pypi') - "
         f"{EVERY_HOST}. Fix: set revive_pip_source.type to one of index, mirror, wheelhouse (The kind of source - "
         "index, mirror or wheelhouse)"]),
    ("an index without a type is the public index", SITE,
     {"all": {"revive_pip_source": {"index_url": "https://pypi.org/simple"}}}, None, []),
    ("percentages", list(STAGES), {"all": {"revive_max_unfit_percent": 150, "revive_rolling_max_fail_percent": -1}},
     None, [
         f"revive_max_unfit_percent is 150, a share in percent from 0 to 100 - {EVERY_HOST}. Fix: set a percentage "
         "from 0 to 100",
         f"revive_rolling_max_fail_percent is -1, a share in percent from 0 to 100 - {EVERY_HOST}. Fix: set a "
         "percentage from 0 to 100"]),
    ("serial 0 would roll every node at once", ["rolling"], {"all": {"revive_rolling_serial": 0}}, None, [
        f"revive_rolling_serial is 0, which would re-provision every node at once - {EVERY_HOST}. Fix: set a number "
        "of nodes (at least 1) or a percentage such as \"25%\""]),
    ("a percentage for serial", ["rolling"], {"all": {"revive_rolling_serial": "25%"}}, None, []),
    ("a percentage out of range and a word for serial", ["rolling"],
     {"node1": {"revive_rolling_serial": "150%"}, "node2": {"revive_rolling_serial": "half"}}, None, [
         f"revive_rolling_serial is '150%', not a percentage from 1% to 100% - {NODE1}. Fix: set a number of nodes "
         "(at least 1) or a percentage such as \"25%\"",
         "revive_rolling_serial is 'half', neither a number of nodes nor a percentage - on host node2 "
         "(host_vars/node2/, or the group_vars/ of a group it is in). Fix: set a number of nodes (at least 1) or a "
         "percentage such as \"25%\""]),
    ("serving group settings", SITE, {"node1": {"revive_serving_group": "mixtral a", "revive_ray_port": 0,
                                                "revive_cluster_address": "node1.lab", "revive_node_link_gbit": 0},
                                      "node2": {"revive_serving_group": "mixtral-a",
                                                "revive_cluster_address": "10.0.0.2"}}, None, [
        f"revive_serving_group is 'mixtral a', not a serving group name - {NODE1}. Fix: use letters, digits and ._- "
        "(e.g. mixtral-a), the same on every member, or \"\" for a node that serves alone",
        f"revive_node_link_gbit is 0.0 - {NODE1}. Fix: set the Gbit/s between the serving group's nodes, above 0 and at "
        "most 10000",
        f"revive_ray_port is 0, not a TCP port - {NODE1}. Fix: set a port from 1 to 65535",
        f"revive_cluster_address is 'node1.lab', not an IP address - {NODE1}. Fix: set the IP the serving group's "
        "nodes reach this node at, or \"\" to take it from the node's facts"]),
    ("a value that does not resolve", SITE, {"all": {"revive_api_key": UNDEFINED}}, None, [
        f"revive_api_key does not resolve: its value names an undefined variable (a vault variable not loaded?) - "
        f"{EVERY_HOST}. Fix: define what it refers to (e.g. pass --ask-vault-pass or --vault-password-file), or set "
        "the value itself"]),
    ("the API key is never shown", SITE, {"all": {"revive_api_key": {"key": "s3cret"}}}, None, [
        f"revive_api_key must be a string (got (hidden)) - {EVERY_HOST}. Fix: set revive_api_key to a string (The "
        "key clients send as Authorization - Bearer <key> on /v1/*; keep it in a vault)"]),
    ("an empty API key", ["provision"], {"all": {"revive_api_key": ""}}, None, [
        f"revive_api_key is empty - {EVERY_HOST}. Fix: set the API key (from a vault)"]),
    ("a setting with a default may be left out", SITE,
     {"all": {"revive_preflight_summary_path": None, "revive_nccl_check_compare": None}}, None, []),
    ("explicit null for a setting with a default", SITE, {"node1": {"revive_provision_restart_serving": "__null__"}},
     None, [f"revive_provision_restart_serving is set to null - {NODE1}. Fix: remove it to get the default False, or "
            "set a value"]),
    ("the roll needs a front door", ["rolling"], {}, dict(GROUPS, lb=[]), [
        "group lb has no host, and the rolling stage needs the front door (HAProxy) the roll drains nodes through. "
        "Fix: add the host(s) to group lb in the inventory (see inventory/example/hosts.yml)"]),
    ("the site needs GPU nodes", SITE, {}, dict(GROUPS, gpu_nodes=[]), [
        "group gpu_nodes has no host, and the preflight stage needs the GPU nodes. Fix: add the host(s) to group "
        "gpu_nodes in the inventory (see inventory/example/hosts.yml)"]),
]


def fleet(changes: dict) -> dict:
    """Every host with the lab's settings (group_vars/all/), then the case's changes ("all" first, then per host;
    None removes a variable, "__null__" sets it to null)."""
    hosts = {host: copy.deepcopy(LAB) for host in GROUPS["all"]}
    for target in sorted(changes, key=lambda name: name != "all"):
        for host in (GROUPS["all"] if target == "all" else [target]):
            for name, value in changes[target].items():
                if value is None:
                    hosts[host].pop(name, None)
                else:
                    hosts[host][name] = None if value == "__null__" else value
    return hosts


@pytest.mark.parametrize("stages,changes,groups,expected", [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_every_mistake_is_refused_with_what_where_and_how_to_fix(stages, changes, groups, expected):
    report = check_inventory(SPEC, fleet(changes), groups or GROUPS, stages)
    assert report.messages == expected
    assert report.ok is (not expected)


def test_every_mistake_of_a_run_is_reported_at_once_in_the_order_of_the_declaration():
    report = check_inventory(SPEC, fleet({"all": {"revive_api_key": None, "revive_model_source_type": "mounted"},
                                          "node2": {"revive_concurrency": "many", "revive_typo": 1}}), GROUPS, SITE)
    assert [(m.variable, m.hosts) for m in report.mistakes] == [
        ("revive_model_source_type", ("bench1", "lb1", "model-store", "node1", "node2")),
        ("revive_concurrency", ("node2",)),
        ("revive_api_key", ("bench1", "node1", "node2")),
        ("revive_typo", ("node2",)),
    ]
    assert report.msg.startswith("the inventory has 4 mistake(s) in its site-wide settings; nothing has run:\n- "
                                 "revive_model_source_type 'mounted' was renamed to 'node_path'")
    assert report.as_dict()["mistakes"][1] == {
        "variable": "revive_concurrency", "what": "must be a whole number (got 'many')",
        "fix": "set revive_concurrency to a whole number (Concurrent requests each node must serve)",
        "hosts": ["node2"], "message": report.messages[1]}


def test_a_valid_inventory_says_how_many_hosts_were_checked():
    report = check_inventory(SPEC, fleet({}), GROUPS, SITE)
    assert (report.ok, report.msg, report.as_dict()["mistakes"]) == (
        True, "the site-wide settings of 5 host(s) are complete and valid", [])


def test_an_unknown_stage_is_a_programming_error():
    with pytest.raises(ValueError, match=r"unknown stage\(s\) deploy; the stages are preflight, provision, handover"):
        check_inventory(SPEC, fleet({}), GROUPS, ["deploy"])


@pytest.mark.parametrize("hosts,checked,needed,expected", [
    (["node2", "node1"], ["node1", "node2"], False, "on every host of the run (node1, node2; group_vars/all/ sets it "
                                                    "for all of them)"),
    (["node1", "node2"], GROUPS["all"], False, GPU_NODES),
    (["node1", "node2"], GROUPS["all"], True, "needed on the hosts of group gpu_nodes (node1, node2)"),
    (["node1"], ["node1"], False, "on the hosts of group gpu_nodes (node1; group_vars/gpu_nodes/ or group_vars/all/)"),
    (["lb1"], GROUPS["all"], False, "on the hosts of group lb (lb1; group_vars/lb/ or group_vars/all/)"),
    (["node1"], GROUPS["all"], False, NODE1),
    (["bench1", "node1"], GROUPS["all"], False, "on hosts bench1, node1 (their host_vars/, or the group_vars/ of a "
                                                "group they share)"),
    (["bench1", "node1"], GROUPS["all"], True, "needed on hosts bench1, node1"),
    ([f"n{i:02}" for i in range(8)], [f"n{i:02}" for i in range(9)], True,
     "needed on hosts n00, n01, n02, n03, n04, n05 and 2 more"),
], ids=["all", "a group", "a group, needed", "a limit of one", "a group of one", "one host", "some hosts",
        "some hosts, needed", "many hosts"])
def test_where_names_the_hosts_and_the_file_that_sets_the_value(hosts, checked, needed, expected):
    assert where(hosts, checked, GROUPS, needed=needed) == expected


def test_secrets_are_the_values_of_the_no_log_variables():
    hosts = fleet({"node1": {"revive_api_key": "other-key"}, "node2": {"revive_api_key": UNDEFINED}})
    assert secrets(SPEC, hosts) == ["other-key", "revive-lab-key"]


# --- the pieces that must agree

def test_every_variable_without_a_default_is_needed_by_a_stage_and_only_those():
    required = {name for name, option in SPEC.items() if "default" not in option}
    needed = {name for groups in STAGE_NEEDS.values() for names in groups.values() for name in names}
    assert needed == required
    assert list(STAGE_NEEDS) == list(STAGES)


def test_the_declaration_names_every_revive_variable_the_inventories_set():
    example = {name for path in sorted((REPO / "inventory/example/group_vars/all").glob("*.yml"))
               for name in yaml.safe_load(path.read_text()) if name.startswith("revive_")}
    config = yaml.safe_load((REPO / ".config/molecule/config.yml").read_text())
    molecule = {name for name in config["provisioner"]["inventory"]["group_vars"]["all"] if name.startswith("revive_")}
    assert (set(LAB) | example | molecule | {"revive_lab_gpu_profile"}) <= set(SPEC)


def test_the_example_inventory_is_complete_for_every_stage():
    example = {name: value for path in sorted((REPO / "inventory/example/group_vars/all").glob("*.yml"))
               for name, value in yaml.safe_load(path.read_text()).items() if name.startswith("revive_")}
    report = check_inventory(SPEC, {host: example for host in GROUPS["all"]}, GROUPS, list(STAGES))
    assert report.messages == []


def test_the_role_passes_the_modules_marker_for_a_value_that_does_not_resolve():
    assert f"default('{UNDEFINED}')" in (REPO / "roles/validate_inventory/vars/main.yml").read_text()


def test_the_role_and_the_module_offer_the_same_stages():
    role = yaml.safe_load((REPO / "roles/validate_inventory/defaults/main.yml").read_text())
    module = yaml.safe_load((REPO / "library/revive_inventory_check.py").read_text().split('DOCUMENTATION = r"""')[1]
                            .split('"""')[0])
    assert role["validate_inventory_stages"] == module["options"]["stages"]["default"] == SITE
    assert module["options"]["stages"]["choices"] == list(STAGES)


# --- the wiring: boilerplate.yml's check through ansible-playbook, on an inventory of local hosts

def run_boilerplate(tmp_path: Path, settings: dict, stages=None, *args: str) -> tuple[int, dict, str]:
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                  **settings},
                         "children": {"gpu_nodes": {"hosts": {"node1": {}, "node2": {}}},
                                      "bench": {"hosts": {"bench1": {}}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [{"name": "Boilerplate", "ansible.builtin.import_playbook": str(REPO / "playbooks/boilerplate.yml"),
             **({"vars": {"validate_inventory_stages": stages}} if stages else {})},
            {"name": "Later", "hosts": "gpu_nodes", "gather_facts": False,
             "tasks": [{"name": "Would probe", "ansible.builtin.debug": {"msg": "probing"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                           str(tmp_path / "play.yml"), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, json.loads(proc.stdout), proc.stdout + proc.stderr


def task_names(report: dict) -> list:
    return [task["task"]["name"] for play in report["plays"] for task in play["tasks"]]


def check_result(report: dict) -> dict:
    for play in report["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].endswith("Refuse every mistake in the inventory's site-wide settings"):
                return next(iter(task["hosts"].values()))
    raise AssertionError("the check did not run")


def test_boilerplate_lets_a_valid_inventory_through_and_a_limit_limits_the_check(tmp_path):
    # The preflight alone needs no API key.
    settings = {name: value for name, value in LAB.items() if name != "revive_api_key"}
    rc, report, _ = run_boilerplate(tmp_path, settings, ["preflight"], "--limit", "node2")
    result = check_result(report)
    assert rc == 0, result
    assert result["msg"] == "the site-wide settings of 1 host(s) are complete and valid"
    assert result["checked"] == ["node2"] and result["changed"] is False
    assert "Would probe" in task_names(report)


def test_boilerplate_refuses_the_mistakes_before_anything_runs_and_never_shows_the_key(tmp_path):
    settings = dict(LAB, revive_model_source_type="mounted", revive_expected_gpu_name="{{ vault_gpu_name }}",
                    revive_api_key="s3cret-api-key-4711", revive_modle_name="x")
    rc, report, output = run_boilerplate(tmp_path, settings, ["preflight", "provision"], "-e",
                                         "revive_concurrency=many")
    result = check_result(report)
    assert rc == 2
    assert [m["variable"] for m in result["mistakes"]] == [
        "revive_model_source_type", "revive_concurrency", "revive_expected_gpu_name", "revive_modle_name"]
    assert result["mistakes"][0]["message"].startswith(
        "revive_model_source_type 'mounted' was renamed to 'node_path' - on every host of the run (bench1, node1, "
        "node2; group_vars/all/ sets it for all of them). Fix: set revive_model_source_type: node_path")
    assert result["mistakes"][2]["what"].startswith("does not resolve: its value names an undefined variable")
    assert "s3cret-api-key-4711" not in output
    assert "Would probe" not in task_names(report)  # the run ended on the check
