#!/usr/bin/python
"""Ansible module prometheus_config: thin wiring over module_utils/revive_monitoring.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: prometheus_config
short_description: Write the fleet's prometheus.yml - every replica, exporter and the front door as scrape targets
description:
  - Builds Prometheus' configuration from the GPU nodes to monitor, their addresses, each node's release record
    (the C(current) release that M(vllm_release_info) returns) and the front door hosts, and writes it to O(dest).
  - Jobs C(vllm) (every replica's C(/metrics)) and C(vllm_health) (blackbox's probe of every replica's C(/health))
    carry the labels C(node), C(replica), C(release) (the record's release id), C(vllm_version) and
    C(vllm_metrics) - V(absent) for a release that needs C(--disable-frontend-multiprocessing) for its C(vllm:*)
    series (O(releases), vLLM 0.5.4, vllm-project/vllm#7188) and runs without it, with a warning, else V(exported).
  - Jobs C(node) (node exporter) and C(gpu) (the GPU exporter, label C(gpu_exporter)) per GPU node, C(haproxy)
    (HAProxy's built-in Prometheus exporter) per front door, and C(prometheus), C(alertmanager), C(blackbox) on the
    monitor host; C(rule_files) and the Alertmanagers.
  - The same fleet gives byte-identical text (sorted, no timestamp); a replica added, removed or moved to another
    release changes it. C(changed) only when the file's content (or its attributes) changes - reload Prometheus
    then.
  - Refuses, before writing anything, a node without a release record (except in check mode, where a fresh fleet
    has none yet - its exporters only, with a warning), a record of a node not in O(nodes), two replicas or a
    replica and an exporter on one port of a node, two nodes on one address, and a release the data does not hold.
  - With O(validate) the new text is checked first (C(promtool check config %s)); a failed check writes nothing.
version_added: "0.1.0"
author:
  - revive project
options:
  dest:
    description: The configuration file to write.
    type: path
    default: /etc/prometheus/prometheus.yml
  nodes:
    description: The GPU nodes to monitor (inventory names); the playbooks pass C(gpu_nodes) without the quarantined ones.
    type: list
    elements: str
    required: true
  records:
    description: Per node, the C(current) release of its release record (M(vllm_release_info)'s C(current); null when it has none).
    type: dict
    default: {}
  addresses:
    description: Per inventory name (GPU node, front door), the address to scrape (its C(ansible_host)); a name missing here is scraped by its name.
    type: dict
    default: {}
  frontdoors:
    description: Front door hosts whose HAProxy exports Prometheus metrics on O(frontdoor_exporter_port); empty means none.
    type: list
    elements: str
    default: []
  releases:
    description: The parsed C(data/vllm-releases.yml) (C(lookup('file', ...) | from_yaml)); which releases need C(--disable-frontend-multiprocessing) for their C(vllm:*) series.
    type: dict
    required: true
  record_path:
    description: Where the records live on the nodes (named in messages only).
    type: str
    default: /var/lib/revive/releases.json
  gpu_exporter:
    description: The GPU exporter on every node - V(dcgm) (DCGM 4.x + dcgm-exporter) or V(nvitop) (nvitop-exporter).
    type: str
    choices: [dcgm, nvitop]
    required: true
  gpu_exporter_port:
    description: Its port (the role derives it from O(gpu_exporter) - dcgm-exporter 9400, nvitop-exporter 9835).
    type: int
    required: true
  node_exporter_port:
    description: Node exporter's port on every GPU node.
    type: int
    default: 9100
  frontdoor_exporter_port:
    description: The port of the front door's Prometheus exporter (a HAProxy frontend with C(http-request use-service prometheus-exporter)).
    type: int
    default: 8405
  prometheus_address:
    description: Prometheus itself, as it scrapes itself.
    type: str
    default: 127.0.0.1:9090
  alertmanagers:
    description: Alertmanagers (host:port) Prometheus sends alerts to; also scraped.
    type: list
    elements: str
    default: [127.0.0.1:9093]
  blackbox_address:
    description: The blackbox exporter (host:port) that probes the replicas' C(/health).
    type: str
    default: 127.0.0.1:9115
  blackbox_module:
    description: The blackbox module of the C(/health) probe (the role's C(blackbox.yml) defines it).
    type: str
    default: http_health
  rule_files:
    description: C(rule_files) - absolute globs, so that O(validate) finds them from its temporary copy.
    type: list
    elements: str
    default: [/etc/prometheus/rules/*.yml]
  scrape_interval:
    description: C(global.scrape_interval).
    type: str
    default: 15s
  scrape_timeout:
    description: C(global.scrape_timeout).
    type: str
    default: 10s
  evaluation_interval:
    description: C(global.evaluation_interval) of the rules.
    type: str
    default: 15s
  external_labels:
    description: C(global.external_labels) (e.g. C(fleet)).
    type: dict
    default: {}
  validate:
    description: A command (words, C(%s) = the new file) that must succeed before the file is written; empty means none.
    type: str
    default: ""
extends_documentation_fragment:
  - ansible.builtin.files
attributes:
  check_mode:
    support: full
    details: Builds and validates the text (when the validator is installed) and says whether it would change; writes nothing.
  diff_mode:
    support: full
    details: The file's text before and after.
notes:
  - The monitor host's Python needs nothing beyond the standard library (the YAML is written by the module).
seealso:
  - module: vllm_release_info
  - name: Prometheus 2.42 configuration
    description: scrape_config, static_config, relabel_config.
    link: https://prometheus.io/docs/prometheus/2.42/configuration/configuration/
  - name: blackbox_exporter, the multi-target pattern
    description: Probing targets through C(/probe?target=...) with relabelling.
    link: https://github.com/prometheus/blackbox_exporter/blob/v0.23.0/README.md
"""

EXAMPLES = r"""
- name: Read every GPU node's release record
  vllm_release_info:
    report_path: ""
  delegate_to: "{{ item }}"
  loop: "{{ groups['gpu_nodes'] }}"
  register: records

- name: Write prometheus.yml
  prometheus_config:
    nodes: "{{ groups['gpu_nodes'] }}"
    records: "{{ dict(groups['gpu_nodes'] | zip(records.results | map(attribute='current'))) }}"
    addresses: {node1: 10.213.0.11, lb1: 10.213.0.4}
    frontdoors: "{{ groups['lb'] }}"
    releases: "{{ lookup('ansible.builtin.file', 'data/vllm-releases.yml') | from_yaml }}"
    gpu_exporter: nvitop
    gpu_exporter_port: 9835
    validate: promtool check config %s
    owner: root
    group: prometheus
    mode: "0640"
  notify: reload prometheus
"""

RETURN = r"""
targets:
  description: Every scrape target - job, address (host:port, or the URL blackbox probes) and labels - sorted.
  returned: always
  type: list
  elements: dict
  sample:
    - {job: vllm, address: "10.213.0.11:8000", labels: {node: node1, release: 3f9a1c2e0b7d, replica: vllm-0, vllm_metrics: exported, vllm_version: "0.5.4"}}
config:
  description: The configuration's text.
  returned: always
  type: str
notes:
  description: The warnings, also shown as Ansible warnings (a release without its metrics flag, a node without a release in check mode).
  returned: always
  type: list
  elements: str
"""

import os
import shlex
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_monitoring import MonitoringError, Settings, fleet_config_text


def read_text(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def validate(module: AnsibleModule, command: str, text: str, dest: str) -> None:
    """Run the check on a temporary copy; the real file is left alone when it fails."""
    handle, path = tempfile.mkstemp(prefix=".prometheus-config-", suffix=".yml", dir=module.tmpdir)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        argv = [word.replace("%s", path) for word in shlex.split(command)]
        if path not in argv:
            module.fail_json(msg=f"validate {command!r} has no %s where the new file's path goes")
        rc, out, err = module.run_command(argv)
        if rc != 0:
            module.fail_json(msg=f"the new {dest} failed {command!r} (rc {rc}): {(out + err).strip()[-3000:]}; "
                                 "nothing was written", rc=rc, stdout=out, stderr=err)
    finally:
        os.unlink(path)


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "gpu_exporter_port": Bound(int, 1, high=65535, why="a TCP port"),
    "node_exporter_port": Bound(int, 1, high=65535, why="a TCP port"),
    "frontdoor_exporter_port": Bound(int, 1, high=65535, why="a TCP port"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "default": "/etc/prometheus/prometheus.yml"},
            "nodes": {"type": "list", "elements": "str", "required": True},
            "records": {"type": "dict", "default": {}},
            "addresses": {"type": "dict", "default": {}},
            "frontdoors": {"type": "list", "elements": "str", "default": []},
            "releases": {"type": "dict", "required": True},
            "record_path": {"type": "str", "default": "/var/lib/revive/releases.json"},
            "gpu_exporter": {"type": "str", "choices": ["dcgm", "nvitop"], "required": True},
            "gpu_exporter_port": {"type": "int", "required": True},
            "node_exporter_port": {"type": "int", "default": 9100},
            "frontdoor_exporter_port": {"type": "int", "default": 8405},
            "prometheus_address": {"type": "str", "default": "127.0.0.1:9090"},
            "alertmanagers": {"type": "list", "elements": "str", "default": ["127.0.0.1:9093"]},
            "blackbox_address": {"type": "str", "default": "127.0.0.1:9115"},
            "blackbox_module": {"type": "str", "default": "http_health"},
            "rule_files": {"type": "list", "elements": "str", "default": ["/etc/prometheus/rules/*.yml"]},
            "scrape_interval": {"type": "str", "default": "15s"},
            "scrape_timeout": {"type": "str", "default": "10s"},
            "evaluation_interval": {"type": "str", "default": "15s"},
            "external_labels": {"type": "dict", "default": {}},
            "validate": {"type": "str", "default": ""},
        },
        add_file_common_args=True,
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "prometheus_config")
    p = module.params
    settings = Settings(
        gpu_exporter=p["gpu_exporter"], gpu_exporter_port=p["gpu_exporter_port"],
        node_exporter_port=p["node_exporter_port"], frontdoor_exporter_port=p["frontdoor_exporter_port"],
        prometheus_address=p["prometheus_address"], alertmanager_addresses=tuple(p["alertmanagers"]),
        blackbox_address=p["blackbox_address"], blackbox_module=p["blackbox_module"],
        rule_files=tuple(p["rule_files"]), scrape_interval=p["scrape_interval"], scrape_timeout=p["scrape_timeout"],
        evaluation_interval=p["evaluation_interval"], external_labels=p["external_labels"])
    try:
        text, fleet = fleet_config_text(p["nodes"], p["records"], p["addresses"], p["frontdoors"], settings,
                                        p["releases"], allow_missing=module.check_mode, record_path=p["record_path"])
    except MonitoringError as error:
        module.fail_json(msg=str(error))
    for warning in fleet.warnings:
        module.warn(warning)
    dest = p["dest"]
    before = read_text(dest)
    changed = before != text
    notes = list(fleet.warnings)
    if p["validate"] and changed:
        program = (shlex.split(p["validate"]) or [""])[0]
        if module.check_mode and not module.get_bin_path(program):
            # Check mode on a fresh host: the package that brings the validator is not installed yet.
            notes.append(f"check mode: {program} is not installed yet, the new text was not validated")
        else:
            validate(module, p["validate"], text, dest)
    if changed and not module.check_mode:
        if not os.path.isdir(os.path.dirname(dest) or "."):
            module.fail_json(msg=f"{os.path.dirname(dest)} does not exist: install Prometheus first (the role's "
                                 "install phase) or point dest at an existing directory")
        handle, staged = tempfile.mkstemp(prefix=".prometheus-config-", dir=os.path.dirname(dest) or ".")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        module.atomic_move(staged, dest)
    file_args = module.load_file_common_arguments(p, path=dest)
    if os.path.exists(dest):
        changed = module.set_fs_attributes_if_different(file_args, changed)
    result = {"changed": changed, "config": text, "notes": notes,
              "targets": [{"job": t.job, "address": t.address, "labels": dict(t.labels)} for t in fleet.targets]}
    if module._diff:
        result["diff"] = {"before": before or "", "after": text, "before_header": dest, "after_header": dest}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
