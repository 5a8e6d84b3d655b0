#!/usr/bin/env python3
"""Writes the seed corpora of fuzz_index and fuzz_ckpt_names (tests/fuzz/corpus/<target>/). Run from the
repository root after changing a target's input format; the seeds are committed."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
PROJ = ("gate_proj", "up_proj", "down_proj")


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- fuzz_index: model.safetensors.index.json texts ------------------------------------------------------------
def index(names, shard=lambda i, n: "model-%05d-of-00002.safetensors" % (1 + i % 2), meta=True):
    wm = {n: shard(i, n) for i, n in enumerate(names)}
    doc = {"metadata": {"total_size": 1234}, "weight_map": wm} if meta else {"weight_map": wm}
    return json.dumps(doc, indent=1)


def experts(prefix, e_count, sfx):
    return [f"{prefix}experts.{e}.{p}.{s}" for e in range(e_count) for p in PROJ for s in sfx]


T = "fuzz_index"
out(T, "valid_small.json", index(["model.embed_tokens.weight", "lm_head.weight"]))
out(T, "valid_empty_map.json", '{"weight_map": {}}')
out(T, "valid_ct_mxfp4.json", index(experts("model.layers.0.mlp.", 2, ("weight_packed", "weight_scale"))))
out(T, "valid_ct_nvfp4.json", index(experts("language_model.model.layers.1.mlp.", 2,
                                             ("weight_packed", "weight_scale", "weight_global_scale",
                                              "input_global_scale"))))
out(T, "valid_modelopt.json", index(experts("", 3, ("weight", "weight_scale", "weight_scale_2", "input_scale"))))
out(T, "valid_stacked.json", index(["model.layers.2.mlp.experts.w13_weight", "model.layers.2.mlp.experts.w2_weight"]))
out(T, "valid_escapes.json", '{"weight_map": {"a\\"b\\\\c\\u00e9\\n": "s.safetensors", "\\ud83d\\ude00": "s.safetensors"}}')
out(T, "bad_absolute_shard.json", '{"weight_map": {"a": "/etc/passwd"}}')
out(T, "bad_dotdot_shard.json", '{"weight_map": {"a": "../outside.safetensors"}}')
out(T, "bad_dup_key.json", '{"weight_map": {"a": "s.safetensors", "a": "t.safetensors"}}')
out(T, "bad_not_object.json", '["weight_map"]')
out(T, "bad_no_weight_map.json", '{"metadata": {"total_size": 1}}')
out(T, "bad_value_number.json", '{"weight_map": {"a": 7}}')
out(T, "bad_truncated.json", index(["x.weight", "y.weight"])[:40])
out(T, "bad_expert_gap.json", index(experts("model.layers.0.mlp.", 1, ("weight_packed", "weight_scale")) +
                                    [f"model.layers.0.mlp.experts.2.{p}.weight_packed" for p in PROJ]))
out(T, "bad_both_formats.json", index(experts("model.layers.0.mlp.", 1, ("weight_packed", "weight"))))
out(T, "bad_leading_zero_expert.json", index(experts("model.layers.0.mlp.", 1, ("weight",)) +
                                             ["model.layers.0.mlp.experts.01.gate_proj.weight"]))

# ---- fuzz_ckpt_names: records (see fuzz_ckpt_names.c) ---------------------------------------------------------
DT = {"U8": 0, "F8_E4M3": 1, "F32": 6, "BF16": 3, "I32": 4, "F16": 5}


def rec(name, dtype, shape, fill=0):
    assert len(shape) <= 3 and all(0 <= d < 128 for d in shape)
    head = DT[dtype] | (len(shape) << 3) | (fill << 5)
    body = bytes([head]) + bytes(d if d != 10 else 0x8A for d in shape) + name.encode()
    assert b"\n" not in body, name
    return body


def records(rs):
    return b"\n".join(rs)


def per_expert(prefix, e_count, i, l, fmt, inputs=False, fills=None):
    """compressed-tensors (ct_mx, ct_nv) or ModelOpt (mo) tensors of e_count experts of [2I, L] / [L, I]."""
    bs = 32 if fmt == "ct_mx" else 16
    wsfx = "weight" if fmt == "mo" else "weight_packed"
    sdt = "U8" if fmt == "ct_mx" else "F8_E4M3"
    rs = []
    for e in range(e_count):
        for p in PROJ:
            n, k = (i, l) if p != "down_proj" else (l, i)
            base = f"{prefix}experts.{e}.{p}."
            f = (fills or {}).get((e, p), {})
            rs.append(rec(base + wsfx, "U8", [n, k // 2], f.get("w", 0)))
            rs.append(rec(base + "weight_scale", sdt, [n, k // bs], f.get("s", 0)))
            if fmt != "ct_mx":
                rs.append(rec(base + ("weight_global_scale" if fmt == "ct_nv" else "weight_scale_2"), "F32", [],
                              f.get("g", 0)))
            if inputs and fmt != "ct_mx":
                rs.append(rec(base + ("input_global_scale" if fmt == "ct_nv" else "input_scale"), "F32", [1]))
    return rs


def stacked(prefix, e_count, i, l, nvfp4, inputs=False, swizzled=False):
    bs = 16 if nvfp4 else 32
    sdt = "F8_E4M3" if nvfp4 else "U8"
    rs = [rec(prefix + "w13_weight", "U8", [e_count, 2 * i, l // 2]),
          rec(prefix + "w13_weight_scale", sdt, [e_count, 2 * i * (l // bs)] if swizzled else [e_count, 2 * i, l // bs]),
          rec(prefix + "w2_weight", "U8", [e_count, l, i // 2]),
          rec(prefix + "w2_weight_scale", sdt, [e_count, l, i // bs])]
    if nvfp4:
        rs += [rec(prefix + "w13_weight_scale_2", "F32", [e_count, 2]), rec(prefix + "w2_weight_scale_2", "F32", [e_count])]
    if inputs:
        rs += [rec(prefix + "w13_input_scale", "F32", [e_count]), rec(prefix + "w2_input_scale", "F32", [e_count])]
    return rs


T = "fuzz_ckpt_names"
out(T, "valid_ct_mxfp4.bin", records(per_expert("model.layers.0.mlp.", 2, 32, 32, "ct_mx")))
out(T, "valid_ct_nvfp4.bin", records(per_expert("language_model.model.layers.1.mlp.", 2, 16, 16, "ct_nv", inputs=True)))
out(T, "valid_modelopt.bin", records(per_expert("", 2, 16, 32, "mo", inputs=True)))
out(T, "valid_stacked_nvfp4.bin", records(stacked("model.layers.0.mlp.experts.", 2, 16, 16, True, inputs=True)))
out(T, "valid_stacked_mxfp4.bin", records(stacked("model.layers.2.mlp.", 1, 32, 32, False)))
out(T, "valid_two_layers.bin", records(per_expert("model.layers.0.mlp.", 1, 16, 16, "mo") +
                                       per_expert("model.layers.1.mlp.", 1, 32, 32, "ct_mx")))
out(T, "bad_nan_scale.bin", records(per_expert("", 1, 16, 16, "mo", fills={(0, "up_proj"): {"s": 2}})))
out(T, "bad_zero_global.bin", records(per_expert("", 1, 16, 16, "ct_nv", fills={(0, "down_proj"): {"g": 1}})))
out(T, "bad_expert_gap.bin", records(per_expert("model.layers.0.mlp.", 1, 16, 16, "mo") +
                                     [rec("model.layers.0.mlp.experts.2.gate_proj.weight", "U8", [16, 8])]))
out(T, "bad_shape_mismatch.bin", records(per_expert("", 1, 16, 16, "mo")[:-3] +
                                         [rec("experts.0.down_proj.weight", "U8", [16, 4]),
                                          rec("experts.0.down_proj.weight_scale", "F8_E4M3", [16, 1]),
                                          rec("experts.0.down_proj.weight_scale_2", "F32", [])]))
out(T, "bad_block_size.bin", records(per_expert("", 1, 16, 16, "ct_mx")))
out(T, "bad_both_formats.bin", records(per_expert("", 1, 16, 16, "mo") + [rec("experts.1.gate_proj.weight_packed", "U8", [16, 8])]))
out(T, "bad_dup_name.bin", records([rec("dup", "U8", [1]), rec("dup", "U8", [1])]))
out(T, "bad_stacked_swizzled.bin", records(stacked("", 1, 16, 16, True, swizzled=True)))
out(T, "bad_stacked_one_input.bin", records(stacked("", 1, 16, 16, True) +
                                            [rec("w13_input_scale", "F32", [1])]))
out(T, "bad_names_escaped.bin", records([rec('q"uote\\back\x01', "U8", [2]), rec("experts.0.\x7f.weight", "U8", [1]),
                                         rec("tab\there", "F32", [2, 2])]))
out(T, "bad_empty.bin", b"")
out(T, "bad_wrong_dtype.bin", records(per_expert("", 1, 16, 16, "mo")[1:] + [rec("experts.0.gate_proj.weight", "BF16", [16, 8])]))


def block(prefix, e_count, l, h, si, stacked_names=False, bias=True):
    """The block's router, shared-expert and latent tensors (published or stacked names)."""
    if stacked_names:
        rs = [rec(prefix + "gate_weight", "BF16", [e_count, h]), rec(prefix + "shared_gate_up_weight", "BF16", [2 * si, h]),
              rec(prefix + "shared_down_weight", "BF16", [h, si]), rec(prefix + "down_proj_weight", "BF16", [l, h]),
              rec(prefix + "norm_weight", "BF16", [l]), rec(prefix + "up_proj_weight", "BF16", [h, l])]
        if bias:
            rs.append(rec(prefix + "e_score_correction_bias", "F32", [e_count]))
        return rs
    rs = [rec(prefix + "gate.weight", "BF16", [e_count, h]),
          rec(prefix + "shared_experts.gate_proj.weight", "BF16", [si, h]),
          rec(prefix + "shared_experts.up_proj.weight", "BF16", [si, h]),
          rec(prefix + "shared_experts.down_proj.weight", "BF16", [h, si]),
          rec(prefix + "routed_expert_down_proj.weight", "BF16", [l, h]),
          rec(prefix + "routed_expert_norm.weight", "BF16", [l]),
          rec(prefix + "routed_expert_up_proj.weight", "BF16", [h, l])]
    if bias:
        rs.append(rec(prefix + "gate.e_score_correction_bias", "F32", [e_count]))
    return rs


out(T, "valid_block_modelopt.bin", records(per_expert("model.layers.0.mlp.", 2, 16, 32, "mo") +
                                           block("model.layers.0.mlp.", 2, 32, 64, 16)))
out(T, "valid_block_stacked.bin", records(stacked("", 2, 16, 32, True) + block("", 2, 32, 64, 16, stacked_names=True)))
out(T, "bad_block_partial.bin", records(per_expert("", 2, 16, 32, "mo") + block("", 2, 32, 64, 16)[:3]))
out(T, "bad_block_shape.bin", records(per_expert("", 2, 16, 32, "mo") + block("", 3, 32, 64, 16)))
