"""k3kernels.load_moe_layer: checkpoints written here (safetensors by hand, ModelOpt and compressed-tensors names,
an index over two shards) read back through the C API and compared with what was written."""
import json
import os
import struct

import numpy as np
import pytest

import k3kernels as k3

E, I, L, H, IS = 3, 32, 32, 48, 16


def write_st(path, tensors):
    """A safetensors file from {name: (dtype string, numpy array)}."""
    header, blobs, off = {}, [], 0
    for name, (dt, a) in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16(a):
    return (np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def make_layer(rng, prefix, ct):
    """Per-expert NVFP4 tensors (ModelOpt or compressed-tensors names) and the block's, with what the reader
    must return: gate and up with their own scale_2 and input scale, compressed-tensors' reciprocals undone."""
    t, want = {}, {"w13": [], "w13_scale": [], "w2": [], "w2_scale": []}
    g13, g2, i13, i2 = np.zeros((E, 2), np.float32), np.zeros(E, np.float32), np.zeros((E, 2), np.float32), \
        np.zeros(E, np.float32)
    for e in range(E):
        for pj, (proj, n, k) in enumerate((("gate_proj", I, L), ("up_proj", I, L), ("down_proj", L, I))):
            w = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
            s = (rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8) & 0x7E)  # no E4M3 NaN codes
            g, a = np.float32(0.5 * (e + 1) + 0.25 * pj), np.float32(2.0 ** (pj - e))  # exact reciprocals
            p = "%sexperts.%d.%s." % (prefix, e, proj)
            t[p + ("weight_packed" if ct else "weight")] = ("U8", w)
            t[p + "weight_scale"] = ("F8_E4M3", s)
            s2name = p + ("weight_global_scale" if ct else "weight_scale_2")
            t[s2name] = ("F32", np.array([1 / g if ct else g], np.float32))
            t[p + ("input_global_scale" if ct else "input_scale")] = ("F32", np.array(1 / a if ct else a, np.float32))
            if pj < 2:
                want["w13"].append(w), want["w13_scale"].append(s)
                g13[e, pj], i13[e, pj] = (np.float32(1) / np.float32(1 / g)) if ct else g, a
            else:
                want["w2"].append(w), want["w2_scale"].append(s)
                g2[e], i2[e] = (np.float32(1) / np.float32(1 / g)) if ct else g, a
    for k in ("w13", "w2"):
        want[k] = np.stack(want[k]).reshape(E, -1, want[k][0].shape[1])
    for k in ("w13_scale", "w2_scale"):  # block scales as fused_moe takes them: [E, rows * cols / block]
        want[k] = np.stack(want[k]).reshape(E, -1)
    want.update(w13_scale_2=g13, w2_scale_2=g2, w13_input_scale=i13, w2_input_scale=i2)
    dense = {"gate.weight": (E, H), "routed_expert_down_proj.weight": (L, H), "routed_expert_norm.weight": (L,),
             "routed_expert_up_proj.weight": (H, L), "shared_experts.gate_proj.weight": (IS, H),
             "shared_experts.up_proj.weight": (IS, H), "shared_experts.down_proj.weight": (H, IS)}
    vals = {}
    for name, shape in dense.items():
        v = k3.round_bf16(rng.standard_normal(shape).astype(np.float32))
        vals[name] = v
        t[prefix + name] = ("BF16", bf16(v))
    bias = rng.standard_normal(E).astype(np.float32)
    t[prefix + "gate.e_score_correction_bias"] = ("F32", bias)
    want.update(gate_weight=vals["gate.weight"], e_score_correction_bias=bias,
                down_proj=vals["routed_expert_down_proj.weight"], norm_weight=vals["routed_expert_norm.weight"], up_proj=vals["routed_expert_up_proj.weight"],
                shared_gate_up=np.concatenate([vals["shared_experts.gate_proj.weight"],
                                               vals["shared_experts.up_proj.weight"]]),
                shared_down=vals["shared_experts.down_proj.weight"])
    return t, want


@pytest.mark.parametrize("ct", [False, True])
def test_load_sharded(tmp_path, ct):
    rng = np.random.default_rng(7 + ct)
    t, want = make_layer(rng, "model.layers.4.mlp.", ct)
    names = sorted(t)
    shards = {n: "part-%d.safetensors" % (i % 2) for i, n in enumerate(names)}
    for k in range(2):
        part = "part-%d.safetensors" % k
        write_st(tmp_path / part, {n: t[n] for n in names if shards[n] == part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    got = k3.load_moe_layer(str(tmp_path), 4)
    assert got["source_format"] == ("compressed-tensors-nvfp4" if ct else "modelopt-nvfp4") and got["fp4"] == "nvfp4"
    assert (got["num_experts"], got["latent"], got["inter"], got["hidden"], got["shared_inter"]) == (E, L, I, H, IS)
    for k, v in want.items():
        assert got[k] is not None and got[k].shape == v.shape and np.array_equal(got[k], v), k
    assert not np.array_equal(got["w13_scale_2"][:, 0], got["w13_scale_2"][:, 1])  # gate and up apart


def test_errors(tmp_path):
    rng = np.random.default_rng(3)
    t, _ = make_layer(rng, "", False)
    del t["routed_expert_norm.weight"]
    write_st(tmp_path / "one.safetensors", t)
    with pytest.raises(k3.K3Error, match="routed_expert_norm.weight' is missing"):
        k3.load_moe_layer(str(tmp_path / "one.safetensors"), 0)
    with pytest.raises(k3.K3Error, match="cannot open"):
        k3.load_moe_layer(str(tmp_path / "absent"), 0)
    with pytest.raises(ValueError, match="layer must be"):
        k3.load_moe_layer(str(tmp_path), -1)
