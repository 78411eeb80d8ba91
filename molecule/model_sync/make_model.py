#!/usr/bin/env python3
"""Write a model directory for the model_sync scenario: a fixture layout (tests/fixtures/models.py) with
random weights, so rsync cannot match blocks and a transfer cut short leaves a real remainder.

    make_model.py DEST --dtype F16 --vocab 8192 [--overflow]

Llama layout at fixed small dimensions (hidden 128, 2 layers); --vocab scales the embeddings and lm_head
(2 x vocab x 128 values, 512 bytes per vocab entry); --overflow puts one BF16 value beyond FP16's range (70000.0)
into the first tensor of the last shard.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from fixtures.models import model_config, write_model  # noqa: E402


def shard_tensors(path: str):
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    data_start = 8 + length
    return data_start, sorted((entry["data_offsets"], entry["dtype"]) for name, entry in header.items()
                              if name != "__metadata__")


def randomize(path: str, dtype: str, rng: np.random.Generator, overflow: bool) -> None:
    data_start, tensors = shard_tensors(path)
    with open(path, "r+b") as handle:
        for index, ((begin, end), tensor_dtype) in enumerate(tensors):
            count = (end - begin) // 2
            values = rng.uniform(-2.0, 2.0, count).astype(np.float32)
            if overflow and index == 0:
                values[0] = 70000.0
            bits = (values.view(np.uint32) >> 16).astype("<u2") if tensor_dtype == "BF16" else values.astype("<f2")
            handle.seek(data_start + begin)
            handle.write(bits.tobytes())


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest")
    parser.add_argument("--dtype", choices=("F16", "BF16"), default="F16")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--overflow", action="store_true")
    args = parser.parse_args(argv)
    config = dict(model_config("llama-2-7b-chat", size="tiny"), vocab_size=args.vocab, hidden_size=128,
                  intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                  torch_dtype="bfloat16" if args.dtype == "BF16" else "float16")
    write_model(args.dest, "llama-2-7b-chat", config=config, shards=args.shards)
    rng = np.random.default_rng()
    shards = sorted(name for name in os.listdir(args.dest) if name.endswith(".safetensors"))
    for name in shards:
        randomize(os.path.join(args.dest, name), args.dtype, rng, args.overflow and name == shards[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
