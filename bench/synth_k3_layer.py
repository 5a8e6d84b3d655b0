#!/usr/bin/env python3
"""Writes one full-size Kimi-K3 TP8 MoE layer in the native per-expert compressed-tensors MXFP4 layout, sharded
with a model.safetensors.index.json, for measuring `k3 convert` at full size (not a test; see bench/RESULTS.md).

Per expert e (896 of them), under model.layers.<layer>.mlp.experts.<e>.:
  gate_proj / up_proj  weight_packed U8 [384, 1792], weight_scale U8 [384, 112]
  down_proj            weight_packed U8 [3584, 192], weight_scale U8 [3584, 12]
and the block: gate.weight BF16 [896, 7168], gate.e_score_correction_bias F32 [896], shared_experts
{gate,up}_proj.weight BF16 [768, 7168], shared_experts.down_proj.weight BF16 [7168, 768],
routed_expert_down_proj.weight BF16 [3584, 7168], routed_expert_norm.weight BF16 [3584],
routed_expert_up_proj.weight BF16 [7168, 3584].
Codes are random bytes; UE8M0 scale bytes lie in [base, base + span) (default 116 .. 127, 12 binades), a realistic
narrow range, so MXFP4 -> NVFP4 is lossless. Each shard is written tensor by tensor (memory stays small).

usage: synth_k3_layer.py OUT_DIR [--layer N] [--shards S] [--experts E] [--seed X]
"""
import argparse
import json
import os
import struct

import numpy as np

I, L, H, IS = 384, 3584, 7168, 768


def expert_tensors(prefix, e):
    p = f"{prefix}experts.{e}."
    out = []
    for proj, n, k in (("gate_proj", I, L), ("up_proj", I, L), ("down_proj", L, I)):
        out.append((p + proj + ".weight_packed", "U8", [n, k // 2], "codes"))
        out.append((p + proj + ".weight_scale", "U8", [n, k // 32], "scales"))
    return out


def block_tensors(prefix, experts):
    return [
        (prefix + "gate.weight", "BF16", [experts, H], "bf16"),
        (prefix + "gate.e_score_correction_bias", "F32", [experts], "f32"),
        (prefix + "shared_experts.gate_proj.weight", "BF16", [IS, H], "bf16"),
        (prefix + "shared_experts.up_proj.weight", "BF16", [IS, H], "bf16"),
        (prefix + "shared_experts.down_proj.weight", "BF16", [H, IS], "bf16"),
        (prefix + "routed_expert_down_proj.weight", "BF16", [L, H], "bf16"),
        (prefix + "routed_expert_norm.weight", "BF16", [L], "bf16"),
        (prefix + "routed_expert_up_proj.weight", "BF16", [H, L], "bf16"),
    ]


SIZE = {"U8": 1, "BF16": 2, "F32": 4}


def nbytes(t):
    n = SIZE[t[1]]
    for d in t[2]:
        n *= d
    return n


class Source:
    """Deterministic bytes without generating gigabytes of randomness: slices of one random pool."""

    def __init__(self, seed, base, span):
        rng = np.random.default_rng(seed)
        self.pool = rng.integers(0, 256, size=(64 << 20) + 4096, dtype=np.uint8)
        self.scales = (base + rng.integers(0, span, size=(1 << 20) + 4096)).astype(np.uint8)
        self.bf16 = (rng.standard_normal(1 << 22).astype(np.float32) * 0.02).view(np.uint32) >> 16
        self.bf16 = self.bf16.astype(np.uint16)
        self.k = 0

    def take(self, kind, n):
        self.k = (self.k * 1103515245 + 12345) & 0x7FFFFFFF
        if kind == "codes":
            off = self.k % 4096
            out = bytearray()
            while len(out) < n:
                m = min(n - len(out), len(self.pool) - off)
                out += self.pool[off : off + m].tobytes()
                off = 0
            return bytes(out)
        if kind == "scales":
            off = self.k % 4096
            assert n <= len(self.scales) - off
            return self.scales[off : off + n].tobytes()
        if kind == "bf16":
            reps = -(-n // (2 * len(self.bf16)))
            return np.tile(self.bf16, reps).tobytes()[:n]
        return np.linspace(-0.5, 0.5, n // 4, dtype=np.float32).tobytes()


def write_shard(path, tensors, src):
    header, off = {}, 0
    for name, dt, shape, _ in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nbytes((name, dt, shape))]}
        off += nbytes((name, dt, shape))
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, dt, shape, kind in tensors:
            f.write(src.take(kind, nbytes((name, dt, shape))))
    os.replace(tmp, path)
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--layer", type=int, default=3)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--experts", type=int, default=896)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale-base", type=int, default=116, help="smallest UE8M0 scale byte (127 = 2^0)")
    ap.add_argument("--scale-span", type=int, default=12, help="how many consecutive scale bytes are used")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    prefix = f"model.layers.{a.layer}.mlp."
    src = Source(a.seed, a.scale_base, a.scale_span)
    per = -(-a.experts // a.shards)
    weight_map, total = {}, 0
    for s in range(a.shards):
        tensors = []
        for e in range(s * per, min(a.experts, (s + 1) * per)):
            tensors += expert_tensors(prefix, e)
        if s == a.shards - 1:
            tensors += block_tensors(prefix, a.experts)
        name = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
        total += write_shard(os.path.join(a.out_dir, name), tensors, src)
        for t in tensors:
            weight_map[t[0]] = name
        print(f"synth: {name}: {len(tensors)} tensors", flush=True)
    with open(os.path.join(a.out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    print(f"synth: {total / 1e9:.3f} GB of tensor data in {a.shards} shards under {a.out_dir}")


if __name__ == "__main__":
    main()
