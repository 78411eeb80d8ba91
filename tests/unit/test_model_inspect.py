"""model_inspect logic: facts from fixture models, every error names its file and the fix."""
from __future__ import annotations

import json
import os
import struct

import pytest
from ansible.module_utils.revive_model import ModelInspectError, inspect_model, model_from_config
from fixtures.models import model_config, write_model


def test_tiny_fp16_20b_fixture_reports_its_model_facts(tmp_path):
    path = write_model(str(tmp_path / "chat-20b"), "internlm2-chat-20b", dtype="F16", shards=2)
    facts = inspect_model(path)
    config = model_config("internlm2-chat-20b", size="tiny")
    assert facts["source"] == "safetensors"
    assert facts["architecture"] == "InternLM2ForCausalLM"
    assert (facts["num_hidden_layers"], facts["hidden_size"], facts["num_attention_heads"],
            facts["num_key_value_heads"], facts["head_dim"]) == (2, 512, 8, 1, 64)
    assert facts["dtypes"] == ["F16"] and facts["weights_dtype"] == "F16"
    assert [s["file"] for s in facts["shards"]] == ["model-00001-of-00002.safetensors",
                                                    "model-00002-of-00002.safetensors"]
    # Weight bytes are exactly the shard data sections: file size minus 8-byte length and header.
    assert facts["weight_bytes"] == facts["parameter_count"] * 2
    assert facts["parameter_count"] == model_from_config(config)["parameter_count"]
    assert facts["tokenizer_files"] == ["tokenizer.json", "tokenizer_config.json"]
    assert facts["generation_config"]["eos_token_id"] == 2
    assert facts["index_file"] == "model.safetensors.index.json"


def test_full_size_sparse_20b_has_the_field_notes_weight_size(tmp_path):
    path = write_model(str(tmp_path / "chat-20b"), "internlm2-chat-20b", size="sparse", dtype="F16", shards=4)
    facts = inspect_model(path)
    assert facts["parameter_count"] == 19_861_149_696
    assert facts["weight_bytes"] == 39_722_299_392  # ~40 GB FP16: the notes' "~41 GB" model
    assert sum(s["bytes"] for s in facts["shards"]) > facts["weight_bytes"]
    assert facts["max_position_embeddings"] == 32768


def test_single_file_model_without_index(tmp_path):
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat", shards=1)
    facts = inspect_model(path)
    assert facts["index_file"] is None
    assert [s["file"] for s in facts["shards"]] == ["model.safetensors"]


def test_bf16_checkpoint_reports_bf16(tmp_path):
    facts = inspect_model(write_model(str(tmp_path / "q"), "qwen2-7b-instruct"))
    assert facts["dtypes"] == ["BF16"] and facts["torch_dtype"] == "bfloat16"
    assert facts["sliding_window"] is None  # use_sliding_window: false


@pytest.mark.parametrize("as_file", [True, False])
def test_bare_config_is_config_only(tmp_path, as_file):
    path = write_model(str(tmp_path / "c"), "llama-2-70b-chat", config_only=True, size="full")
    facts = inspect_model(os.path.join(path, "config.json") if as_file else path)
    assert facts["source"] == "config-only"
    assert facts["parameter_count"] == 68_976_648_192
    assert facts["weight_bytes"] == 68_976_648_192 * 2
    assert facts["shards"] == [] and facts["dtypes"] == ["F16"]


def test_gptq_checkpoint(tmp_path):
    facts = inspect_model(write_model(str(tmp_path / "g"), "qwen2-7b-instruct-gptq-int4"))
    assert facts["quantization"] == {"method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
                                     "sym": True}
    assert facts["dtypes"] == ["F16", "I32"]
    assert facts["parameter_count_source"] == "architecture"


def test_gptq_full_size_weight_bytes_match_the_published_checkpoint(tmp_path):
    facts = inspect_model(write_model(str(tmp_path / "g"), "qwen2-7b-instruct-gptq-int4", size="sparse"))
    assert facts["parameter_count"] == 7_615_616_512
    assert 5.5e9 < facts["weight_bytes"] < 5.7e9  # Qwen2-7B-Instruct-GPTQ-Int4 is 5.58 GB on the Hub
    config_only = model_from_config(model_config("qwen2-7b-instruct-gptq-int4"))
    assert abs(config_only["weight_bytes"] - facts["weight_bytes"]) / facts["weight_bytes"] < 0.01


def test_awq_checkpoint(tmp_path):
    facts = inspect_model(write_model(str(tmp_path / "a"), "llama-2-7b-chat-awq"))
    assert facts["quantization"]["method"] == "awq" and facts["quantization"]["bits"] == 4


def test_quantize_config_json_beside_config(tmp_path):
    config = dict(model_config("llama-2-7b-chat", size="tiny"))
    path = write_model(str(tmp_path / "old-gptq"), "llama-2-7b-chat", config=config, config_only=True)
    with open(os.path.join(path, "quantize_config.json"), "w") as handle:
        json.dump({"bits": 4, "group_size": 128, "desc_act": True}, handle)
    assert inspect_model(path)["quantization"] == {"method": "gptq", "bits": 4, "group_size": 128,
                                                   "desc_act": True}


@pytest.mark.parametrize("qcfg, expected", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, {"method": "bitsandbytes", "bits": 4}),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"},
     {"method": "fp8", "bits": 8, "activation_scheme": "dynamic"}),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"},
     {"method": "marlin", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}),
])
def test_quantization_schemes(qcfg, expected):
    config = dict(model_config("llama-2-7b-chat"), quantization_config=qcfg)
    assert model_from_config(config)["quantization"] == expected


def test_kv_head_lookup_follows_vllm_order():
    falcon = {"model_type": "falcon", "architectures": ["FalconForCausalLM"], "hidden_size": 4544,
              "num_attention_heads": 71, "num_hidden_layers": 32, "vocab_size": 65024, "multi_query": True}
    assert model_from_config(falcon)["num_key_value_heads"] == 1
    chatglm = {"model_type": "chatglm", "hidden_size": 4096, "num_attention_heads": 32, "num_layers": 28,
               "padded_vocab_size": 65024, "multi_query_group_num": 2, "ffn_hidden_size": 13696}
    facts = model_from_config(chatglm)
    assert (facts["num_key_value_heads"], facts["num_hidden_layers"], facts["vocab_size"]) == (2, 28, 65024)
    mpt = {"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "vocab_size": 50432,
           "attn_config": {"kv_n_heads": 8}}
    assert model_from_config(mpt)["num_key_value_heads"] == 8


def test_rope_scaling_extends_the_derived_length():
    config = dict(model_config("llama-2-7b-chat"), rope_scaling={"type": "linear", "factor": 4.0})
    assert model_from_config(config)["max_position_embeddings"] == 16384
    llama3 = dict(model_config("llama-2-7b-chat"), rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert model_from_config(llama3)["max_position_embeddings"] == 4096


# ---------------------------------------------------------------- errors: what, which file, how to fix

def _shard(path):
    return os.path.join(path, "model-00001-of-00002.safetensors")


def test_corrupt_header_json(tmp_path):
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat")
    with open(_shard(path), "r+b") as handle:
        handle.seek(8)
        handle.write(b"{not json")
    with pytest.raises(ModelInspectError) as err:
        inspect_model(path)
    assert str(err.value).startswith(f"{_shard(path)}: corrupt safetensors header: ")
    assert "is not JSON" in str(err.value) and "re-sync model-00001-of-00002.safetensors" in str(err.value)


def test_header_length_beyond_file(tmp_path):
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat")
    size = os.path.getsize(_shard(path))
    with open(_shard(path), "r+b") as handle:
        handle.write(struct.pack("<Q", size * 4))
    with pytest.raises(ModelInspectError, match=r"declares a \d+-byte JSON header but the file has \d+ bytes"):
        inspect_model(path)


def test_file_shorter_than_length_field(tmp_path):
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat")
    with open(_shard(path), "wb") as handle:
        handle.write(b"\x01\x02")
    with pytest.raises(ModelInspectError, match="the file is 2 bytes, shorter than the 8-byte header length"):
        inspect_model(path)


def test_offsets_beyond_file_size_means_truncated(tmp_path):
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat")
    os.truncate(_shard(path), os.path.getsize(_shard(path)) - 100)
    with pytest.raises(ModelInspectError) as err:
        inspect_model(path)
    message = str(err.value)
    assert message.startswith(f"{_shard(path)}: header offsets beyond file size: tensor ")
    assert "(the file is truncated)" in message


def test_missing_shard_listed_in_index(tmp_path):
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat")
    second = os.path.join(path, "model-00002-of-00002.safetensors")
    os.remove(second)
    with pytest.raises(ModelInspectError) as err:
        inspect_model(path)
    assert str(err.value) == (
        f"{second}: missing shard listed in {os.path.join(path, 'model.safetensors.index.json')}. Re-run "
        "the model download or sync; a partial copy must not be served.")


def test_index_names_a_tensor_the_shard_lacks(tmp_path):
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat")
    index = os.path.join(path, "model.safetensors.index.json")
    with open(index) as handle:
        data = json.load(handle)
    data["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    with open(index, "w") as handle:
        json.dump(data, handle)
    with pytest.raises(ModelInspectError, match=r"tensor 'model.layers.9.mlp.up_proj.weight' is listed in "
                                                r"model.safetensors.index.json but absent"):
        inspect_model(path)


def test_mixed_dtypes_name_the_odd_tensors(tmp_path):
    from fixtures.models import checkpoint_tensors, write_safetensors
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat", shards=1)
    config = model_config("llama-2-7b-chat", size="tiny")
    tensors = checkpoint_tensors(config, "F16")
    tensors = [(n, "F32" if n == "model.layers.1.mlp.down_proj.weight" else dt, s) for n, dt, s in tensors]
    write_safetensors(os.path.join(path, "model.safetensors"), tensors)
    with pytest.raises(ModelInspectError) as err:
        inspect_model(path)
    assert str(err.value).startswith(
        f"{path}: mixed dtypes: most tensors are F16 (")
    assert "F32: model.safetensors:model.layers.1.mlp.down_proj.weight (1 tensors)" in str(err.value)


def test_rotary_buffers_do_not_count_as_mixed(tmp_path):
    from fixtures.models import checkpoint_tensors, write_safetensors
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat", shards=1)
    tensors = checkpoint_tensors(model_config("llama-2-7b-chat", size="tiny"), "F16")
    tensors.append(("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", [8]))
    write_safetensors(os.path.join(path, "model.safetensors"), tensors)
    assert inspect_model(path)["dtypes"] == ["F16", "F32"]


def test_unreadable_config(tmp_path):
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat", config_only=True)
    with open(os.path.join(path, "config.json"), "w") as handle:
        handle.write("{'single': quotes}")
    with pytest.raises(ModelInspectError) as err:
        inspect_model(path)
    assert str(err.value).startswith(f"{os.path.join(path, 'config.json')}: unreadable config: not valid JSON")
    assert "Restore the file from the model's source repository." in str(err.value)


def test_config_without_the_needed_fields(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "vocab_size": 32000}))
    with pytest.raises(ModelInspectError, match="it has no num_hidden_layers, hidden_size, num_attention_heads"):
        inspect_model(str(path))


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelInspectError, match=r"config.json: missing\. A model directory needs"):
        inspect_model(str(tmp_path))


def test_nonexistent_path(tmp_path):
    with pytest.raises(ModelInspectError, match="no such file or directory"):
        inspect_model(str(tmp_path / "nope"))


def test_pytorch_bin_weights_are_a_warning(tmp_path):
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat", config_only=True)
    (tmp_path / "m" / "pytorch_model-00001-of-00002.bin").write_bytes(b"\0" * 16)
    facts = inspect_model(path)
    assert facts["source"] == "config-only"
    assert "weights are PyTorch .bin files (1)" in facts["warnings"][0]
