"""Parameter formulas per architecture against the published parameter counts of real checkpoints."""
from __future__ import annotations

import pytest
from ansible.module_utils.revive_model import model_from_config
from fixtures.models import MODEL_CONFIGS, model_config

# Published counts (model cards / safetensors index totals / 2 bytes).
PUBLISHED = {
    "llama-2-7b-chat": 6_738_415_616,
    "meta-llama-3-8b-instruct": 8_030_261_248,
    "mistral-7b-instruct-v0.2": 7_241_732_096,
    "qwen2-7b-instruct": 7_615_616_512,
    "llama-2-70b-chat": 68_976_648_192,
    "gpt-neoxt-chat-base-20b": 20_554_567_680,
    "gemma-2-9b-it": 9_241_705_984,
    "internlm2-chat-20b": 19_861_149_696,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_formula_matches_published_count(name):
    assert model_from_config(model_config(name))["parameter_count"] == PUBLISHED[name]


def test_every_fixture_config_parses():
    for name in MODEL_CONFIGS:
        facts = model_from_config(model_config(name))
        assert facts["num_attention_heads"] % facts["num_key_value_heads"] == 0, name


def test_tied_embeddings_count_once():
    untied = model_from_config(model_config("llama-2-7b-chat"))["parameter_count"]
    tied = model_from_config(dict(model_config("llama-2-7b-chat"), tie_word_embeddings=True))["parameter_count"]
    assert untied - tied == 32000 * 4096


def test_mixtral_experts():
    mixtral = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
               "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
    assert model_from_config(mixtral)["parameter_count"] == 46_702_792_704  # Mixtral-8x7B


def test_gpt2_learned_positions_and_tied_head():
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_layer": 12,
            "n_head": 12, "vocab_size": 50257, "n_positions": 1024, "n_inner": None}
    assert model_from_config(gpt2)["parameter_count"] == 124_439_808  # GPT-2 small
