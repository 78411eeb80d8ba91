"""What the preflight needs from the lab: the wheelhouse and the lab model (lab/labctl/prepare.py), kept in
step with the lab's site-wide variables and the gpu_preflight role."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))

from labctl import prepare  # noqa: E402
from labctl.errors import LabError  # noqa: E402
from labctl.shape import LabShape, host_address  # noqa: E402
from labctl.state import HostRecord, LabState  # noqa: E402

from ansible.module_utils.revive_model import inspect_model  # noqa: E402

LAB_VARS = yaml.safe_load((REPO / "inventory/lab/group_vars/all/revive.yml").read_text())


def lab_with_store(tmp_path: Path, support=("model-store",)) -> LabState:
    shape = LabShape(1, tuple(support), {"node1": "v100-pcie-8x"})
    lab = LabState(slot=3, bridge="rvlab3", rootfs="/r", shape=shape, inventory=str(tmp_path / "hosts.yml"))
    for h in shape.hosts:
        root = tmp_path / h.name
        root.mkdir()
        lab.hosts.append(HostRecord(h.name, h.group, host_address(3, h), h.gpu_profile, f"rvlab3-{h.name}",
                                    f"rvlab3h{h.octet}", str(root), "/upper", "/work"))
    return lab


def test_the_seeded_model_is_where_the_lab_variables_say():
    assert LAB_VARS["revive_model_name"] == prepare.MODEL_NAME
    assert LAB_VARS["revive_model_revision"] == prepare.MODEL_REVISION
    assert LAB_VARS["revive_model_source_type"] == "model_store"
    assert LAB_VARS["revive_model_source_path"] == f"/srv/models/{prepare.MODEL_NAME}/{prepare.MODEL_REVISION}"


def test_the_lab_wheelhouse_is_the_package_source_and_holds_the_probe_pins():
    assert LAB_VARS["revive_pip_source"] == {"type": "wheelhouse", "wheelhouse": ".lab/wheelhouse"}
    assert REPO / LAB_VARS["revive_pip_source"]["wheelhouse"] == prepare.WHEELHOUSE
    defaults = yaml.safe_load((REPO / "roles/gpu_preflight/defaults/main.yml").read_text())
    assert prepare.probe_pins() == defaults["gpu_preflight_probe_packages"] == ["nvidia-ml-py==13.615.71"]


def test_a_wheel_is_found_by_its_normalised_file_name(tmp_path):
    (tmp_path / "nvidia_ml_py-13.615.71-py3-none-any.whl").write_bytes(b"")
    assert prepare.wheel_present(tmp_path, "nvidia-ml-py==13.615.71")
    assert not prepare.wheel_present(tmp_path, "nvidia-ml-py==12.535.133")


def test_seed_model_writes_a_plannable_model_into_the_store_hosts_root_once(tmp_path):
    lab = lab_with_store(tmp_path)
    said = []
    assert prepare.seed_model(lab, log=said.append) == Path("/srv/models/tiny-chat/rev1")
    model_dir = tmp_path / "model-store/srv/models/tiny-chat/rev1"
    facts = inspect_model(str(model_dir))
    assert (facts["num_attention_heads"], facts["head_dim"], facts["dtypes"]) == (8, 64, ["F16"])
    assert sorted(p.name for p in (tmp_path / "model-store/srv/models/tiny-chat").iterdir()) == ["rev1"]
    config_mtime = (model_dir / "config.json").stat().st_mtime_ns

    prepare.seed_model(lab, log=said.append)
    assert said[-1] == "lab: model-store:/srv/models/tiny-chat/rev1 already holds the lab model"
    assert (model_dir / "config.json").stat().st_mtime_ns == config_mtime


def test_seed_model_replaces_a_model_that_differs(tmp_path):
    lab = lab_with_store(tmp_path)
    prepare.seed_model(lab, log=lambda _: None)
    config = tmp_path / "model-store/srv/models/tiny-chat/rev1/config.json"
    config.write_text(json.dumps({"architectures": ["Broken"]}))
    said = []
    prepare.seed_model(lab, log=said.append)
    assert said == ["lab: seeded model-store:/srv/models/tiny-chat/rev1 (llama-2-7b-chat tiny fixture, FP16)"]
    assert json.loads(config.read_text())["architectures"] == ["LlamaForCausalLM"]


def test_seed_model_needs_a_model_store_host(tmp_path):
    with pytest.raises(LabError, match=r"this lab has no model-store host \(support hosts: none\)"):
        prepare.seed_model(lab_with_store(tmp_path, support=()))


def test_seed_model_sparse_writes_the_full_size_model_without_disk_and_compares_it_by_head(tmp_path):
    """The field notes' 20B deployment in the lab (bench/field_notes_lab_test.py): full size, no disk, and a second
    seed that does not read 40 GB of holes to find it unchanged - but a changed header is still found."""
    lab = lab_with_store(tmp_path)
    said = []
    prepare.seed_model(lab, "chat-20b", "rev1", log=said.append, fixture="internlm2-chat-20b", size="sparse")
    model_dir = tmp_path / "model-store/srv/models/chat-20b/rev1"
    facts = inspect_model(str(model_dir))
    shards = sorted(model_dir.glob("*.safetensors"))
    apparent = sum(p.stat().st_size for p in shards)
    assert facts["weight_bytes"] > 39e9 and apparent > 39e9
    assert sum(p.stat().st_blocks * 512 for p in shards) < 10 * 2 ** 20
    assert said == ["lab: seeded model-store:/srv/models/chat-20b/rev1 (internlm2-chat-20b sparse fixture, FP16)"]

    prepare.seed_model(lab, "chat-20b", "rev1", log=said.append, fixture="internlm2-chat-20b", size="sparse")
    assert said[-1] == "lab: model-store:/srv/models/chat-20b/rev1 already holds the lab model"

    with open(shards[0], "r+b") as shard:
        shard.seek(9)
        shard.write(b"X")
    prepare.seed_model(lab, "chat-20b", "rev1", log=said.append, fixture="internlm2-chat-20b", size="sparse")
    assert said[-1].startswith("lab: seeded ")
    assert inspect_model(str(model_dir))["weight_bytes"] == facts["weight_bytes"]


def test_seed_model_refuses_an_unknown_fixture_before_writing_anything(tmp_path):
    with pytest.raises(LabError, match=r"unknown model fixture 'nope': give one of .*internlm2-chat-20b"):
        prepare.seed_model(lab_with_store(tmp_path), fixture="nope")
    assert not (tmp_path / "model-store/srv/models").exists()
