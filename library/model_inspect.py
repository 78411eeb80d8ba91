#!/usr/bin/python
"""Ansible module: read a model directory's config and safetensors headers (no torch, no weight data)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_inspect
short_description: Describe a model directory from its config.json and safetensors headers
description:
  - Reads C(config.json), C(generation_config.json), the names of the tokenizer files, the safetensors
    index and every shard's header (tensor names, dtypes, shapes, byte ranges). Tensor data is never read
    and torch is not needed, so a 40 GB model is described in milliseconds.
  - Fails, naming the file and the fix, on a corrupt header, a shard listed in the index but missing, header
    offsets beyond the file size, a tensor listed in the index but absent from its shard, mixed weight dtypes
    (listing the odd tensors) or an unreadable config.
  - A bare C(config.json) (the path of the file, or a directory without weights) is accepted for what-if
    planning; parameter count and weight bytes are then computed from the architecture.
  - Read-only; check mode runs the same reads.
version_added: "0.1.0"
author: revive planner
options:
  path:
    description:
      - A model directory (Hugging Face layout) or the path of a C(config.json).
    type: path
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - Logic lives in C(module_utils/revive_model.py); the parameter formulas per architecture are documented
    there.
"""

EXAMPLES = r"""
- name: Describe the model synced to local SSD
  model_inspect:
    path: /data/models/chat-20b-fp16
  register: revive_model_facts

- name: Plan from a bare config.json (what-if, no weights on the host)
  model_inspect:
    path: /srv/configs/llama-2-70b-chat/config.json
  register: revive_model_whatif

- name: Refuse to go on with a checkpoint vLLM cannot load in one dtype
  ansible.builtin.assert:
    that: revive_model_facts.model.dtypes | length == 1
    fail_msg: "{{ revive_model_facts.model.path }} mixes {{ revive_model_facts.model.dtypes }}"
"""

RETURN = r"""
model:
  description: Model facts (see docs/architecture.md, glossary).
  returned: success
  type: dict
  contains:
    path: {description: Absolute path inspected (directory or config.json)., type: str, sample: /data/models/chat-20b-fp16}
    config_file: {description: The config.json read., type: str}
    source: {description: C(safetensors) when shard headers were read, C(config-only) otherwise., type: str, sample: safetensors}
    architecture: {description: First entry of C(architectures)., type: str, sample: InternLM2ForCausalLM}
    model_type: {description: C(model_type) of the config., type: str, sample: internlm2}
    architecture_family: {description: Which parameter formula applies (C(llama-like), C(gpt_neox), ...)., type: str}
    num_hidden_layers: {description: Decoder layers., type: int, sample: 48}
    hidden_size: {description: Hidden size., type: int, sample: 6144}
    num_attention_heads: {description: Attention (query) heads., type: int, sample: 48}
    num_key_value_heads: {description: KV heads, looked up in vLLM 0.5.4's order (multi_query, kv_n_heads, n_head_kv, num_kv_heads, num_key_value_heads, multi_query_group_num)., type: int, sample: 8}
    head_dim: {description: C(head_dim) if set, else hidden_size / num_attention_heads., type: int, sample: 128}
    vocab_size: {description: Vocabulary size., type: int, sample: 92544}
    intermediate_size: {description: MLP width., type: int, sample: 16384}
    max_position_embeddings: {description: vLLM's derived maximum model length (smallest length key, scaled by rope_scaling)., type: int, sample: 32768}
    rope_scaling: {description: The config's rope_scaling or null., type: dict}
    sliding_window: {description: Sliding window size when the model uses one, else null., type: int}
    attn_logit_softcapping: {description: Attention logit soft-capping (Gemma-2) or null; xFormers cannot run it., type: float}
    tie_word_embeddings: {description: Whether lm_head shares the embedding matrix., type: bool}
    num_experts: {description: Local experts of an MoE model, 0 for dense., type: int}
    num_experts_per_tok: {description: Experts routed per token, 0 for dense., type: int}
    requires_trust_remote_code: {description: "True when config.json maps its classes to code in the repository (C(auto_map)); vLLM then needs C(--trust-remote-code).", type: bool}
    torch_dtype: {description: The config's torch_dtype., type: str, sample: float16}
    weights_dtype: {description: The dtype of the floating-point weights (safetensors name)., type: str, sample: F16}
    quantization: {description: "null, or {method, bits, group_size, ...} from quantization_config or quantize_config.json.", type: dict, sample: {method: gptq, bits: 4, group_size: 128}}
    parameter_count: {description: Parameters (from the headers; from the architecture for quantized or config-only models)., type: int, sample: 19861149696}
    parameter_count_source: {description: C(safetensors) or C(architecture)., type: str}
    weight_bytes: {description: Bytes of all tensors (exact from the headers, computed for config-only)., type: int, sample: 39722299392}
    dtypes: {description: Distinct tensor dtypes found., type: list, elements: str, sample: [F16]}
    shards: {description: One entry per safetensors file., type: list, elements: dict, sample: [{file: model-00001-of-00002.safetensors, bytes: 19862000000, tensors: 218}]}
    total_tensors: {description: Number of tensors over all shards., type: int}
    index_file: {description: Name of the safetensors index, or null for single-file models., type: str}
    tokenizer_files: {description: Tokenizer files present., type: list, elements: str, sample: [tokenizer.json, tokenizer_config.json]}
    generation_config: {description: Content of generation_config.json or null., type: dict}
    warnings: {description: Things that did not stop the inspection (e.g. .bin weights, no weights)., type: list, elements: str}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_model import ModelInspectError, inspect_model


def main() -> None:
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True}}, supports_check_mode=True)
    try:
        model = inspect_model(module.params["path"])
    except ModelInspectError as exc:
        module.fail_json(msg=str(exc))
    for warning in model["warnings"]:
        module.warn(warning)
    module.exit_json(changed=False, model=model)


if __name__ == "__main__":
    main()
