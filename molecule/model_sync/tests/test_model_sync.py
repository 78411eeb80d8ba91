"""The node after converge and the faults: every promoted model is byte-identical to its source (or its
FP16 conversion), read-only for the service group, with `current` pointing at it and no staging left."""
from __future__ import annotations

import functools
import json
import os

import pytest
from lab_testinfra import connect_verified, lab_hosts

testinfra_hosts = lab_hosts("gpu_nodes")
SSH_CONFIG = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "lab", "ssh_config")
FP16_MODELS = ["chat", "big", "corrupt"]
# Models synced from the other two kinds of source, and the store model each one holds.
OTHER_SOURCES = {"from-controller": "chat", "from-share": "corrupt"}


@functools.cache
def source_manifest(name: str) -> dict:
    client = connect_verified("model-store", SSH_CONFIG)
    try:
        _, stdout, _ = client.exec_command(f"cat /srv/models/{name}/rev1/revive-manifest.json")
        return json.loads(stdout.read())
    finally:
        client.close()


def node_sha256(host, directory: str) -> dict:
    lines = host.check_output(f"cd {directory} && sha256sum $(find . -type f ! -name revive-manifest.json | sort)")
    return {path[2:]: digest for digest, path in (line.split() for line in lines.splitlines())}


@pytest.mark.parametrize("name", FP16_MODELS)
def test_promoted_model_is_byte_identical_to_the_source(host, name):
    expected = {entry["path"]: entry["sha256"] for entry in source_manifest(name)["files"]}
    assert node_sha256(host, f"/data/models/{name}/rev1") == expected


@pytest.mark.parametrize("name,original", sorted(OTHER_SOURCES.items()))
def test_models_from_the_controller_and_a_node_path_are_byte_identical(host, name, original):
    expected = {entry["path"]: entry["sha256"] for entry in source_manifest(original)["files"]}
    assert node_sha256(host, f"/data/models/{name}/rev1") == expected


@pytest.mark.parametrize("name", FP16_MODELS + ["qwen-bf16"])
def test_files_are_read_only_for_root_and_the_service_group(host, name):
    directory = host.file(f"/data/models/{name}/rev1")
    assert (directory.user, directory.group, directory.mode) == ("root", "vllm", 0o750)
    for path in host.check_output(f"find /data/models/{name}/rev1 -type f").splitlines():
        model_file = host.file(path)
        assert (model_file.user, model_file.group, model_file.mode) == ("root", "vllm", 0o440), path


@pytest.mark.parametrize("name", FP16_MODELS + ["qwen-bf16"])
def test_current_points_at_the_revision_and_no_staging_is_left(host, name):
    link = host.file(f"/data/models/{name}/current")
    assert link.is_symlink and link.linked_to == f"/data/models/{name}/rev1"
    assert sorted(host.file(f"/data/models/{name}").listdir()) == ["current", "rev1"]


def test_converted_model_is_fp16_with_config_and_manifest_rewritten(host):
    config = json.loads(host.file("/data/models/qwen-bf16/rev1/config.json").content_string)
    assert config["torch_dtype"] == "float16"
    manifest = json.loads(host.file("/data/models/qwen-bf16/rev1/revive-manifest.json").content_string)
    assert manifest["converted_from"]["content_id"] == source_manifest("qwen-bf16")["content_id"]
    assert manifest["converted_from"]["overflow_values"] == 1
    assert {tuple(entry["dtypes"]) for entry in manifest["files"] if "dtypes" in entry} == {("F16",)}
    assert node_sha256(host, "/data/models/qwen-bf16/rev1") == {e["path"]: e["sha256"] for e in manifest["files"]}


def test_node_key_reaches_the_store_only_through_read_only_rsync(host):
    client = connect_verified("model-store", SSH_CONFIG)
    try:
        _, stdout, _ = client.exec_command("grep revive-model-sync@node1 /root/.ssh/authorized_keys")
        line = stdout.read().decode()
    finally:
        client.close()
    assert line.startswith('restrict,command="/usr/bin/rrsync -ro /srv/models" ssh-ed25519 ')
    denied = host.run("ssh -i /root/.ssh/revive_model_sync -o BatchMode=yes "
                      "-o UserKnownHostsFile=/etc/revive/model_sync_known_hosts -o StrictHostKeyChecking=yes "
                      "root@$(awk '{print $1}' /etc/revive/model_sync_known_hosts) id")
    assert denied.rc != 0 and "uid=" not in denied.stdout
