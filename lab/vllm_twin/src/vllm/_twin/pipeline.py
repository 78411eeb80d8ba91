"""Pipeline stages of one replica (0.5.4, PP > 1): which layers each stage holds and what its weights weigh.

The same split and weights the planner sizes a multi-node plan with (module_utils/revive_plan/pipeline.py
`stage_layers`, `largest_stage_weight_bytes`; the twin's wheel does not carry revive_plan, and
tests/unit/test_twin_ray_pipeline.py holds the two to the same numbers).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List


def stage_layers(num_layers: int, stages: int) -> List[int]:
    """0.5.4's split of the layers (get_pp_indices, v0.5.4 vllm/distributed/utils.py:56-86, without
    VLLM_PP_LAYER_PARTITION): `layers // stages` each, the remainder on the last stage."""
    share = num_layers // stages
    return [share] * (stages - 1) + [share + num_layers % stages]


def stage_weight_bytes(facts: Dict[str, Any], layers: List[int], dtype_bytes: float) -> List[int]:
    """Weight bytes of each stage (all its TP ranks): its layers' share of the parameters outside the embedding and
    the LM head, plus the embedding (first stage) and the LM head (last), as the planner counts the largest stage
    (module_utils/revive_plan/pipeline.py largest_stage_weight_bytes). `dtype_bytes`: bytes per parameter."""
    total_layers = sum(layers)
    vocab_matrix = int(facts.get("vocab_size") or 0) * int(facts["hidden_size"])
    head = vocab_matrix
    outside = int(facts["parameter_count"]) - vocab_matrix - (0 if facts.get("tie_word_embeddings") else head)
    per_layer = max(outside, 0) / total_layers
    if facts.get("quantization"):
        dtype_bytes = int(facts["weight_bytes"]) / max(int(facts["parameter_count"]), 1)
    if len(layers) == 1:
        return [int(facts["weight_bytes"]) if facts.get("quantization")
                else int(int(facts["parameter_count"]) * dtype_bytes)]
    sizes = []
    for index, count in enumerate(layers):
        share = count * per_layer + (vocab_matrix if index == 0 else 0) + (head if index == len(layers) - 1 else 0)
        sizes.append(int(math.ceil(share * dtype_bytes)))
    return sizes
