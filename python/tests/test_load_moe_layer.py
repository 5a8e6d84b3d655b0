"""k3kernels.load_moe_layer on a small checkpoint written here (ModelOpt NVFP4 per-expert names and the latent
block's published names under model.layers.3.mlp.): every array holds the bytes and values written, stacked as
fused_moe and latent_moe take them, and the dict runs latent_moe. Bad checkpoints raise K3Error naming the
tensor."""
import os

import numpy as np
import pytest

import k3kernels as k3
import st_io

E, L, I, H, IS = 4, 64, 32, 128, 32
P = "model.layers.3.mlp."


def bf16_bits(rng, *shape, s=0.1):
    """Random BF16 values as their bits (the upper half of float32)."""
    return ((s * rng.standard_normal(shape)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def as_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_checkpoint(folder, drop=None):
    rng = np.random.default_rng(91)
    t, want = {}, {"w": {}, "s": {}, "s2": {}}
    for e in range(E):
        for proj, (n, k) in (("gate_proj", (I, L)), ("up_proj", (I, L)), ("down_proj", (L, I))):
            w = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
            s = rng.integers(0x20, 0x48, (n, k // 16), dtype=np.uint8)
            s2 = np.array(rng.uniform(0.01, 0.1), np.float32)
            base = "%sexperts.%d.%s." % (P, e, proj)
            t[base + "weight"] = ("U8", w.shape, w)
            t[base + "weight_scale"] = ("F8_E4M3", s.shape, s)
            t[base + "weight_scale_2"] = ("F32", (), s2)
            want["w"][e, proj], want["s"][e, proj], want["s2"][e, proj] = w, s, float(s2)
    block = {"gate.weight": bf16_bits(rng, E, H), "shared_experts.gate_proj.weight": bf16_bits(rng, IS, H),
             "shared_experts.up_proj.weight": bf16_bits(rng, IS, H),
             "shared_experts.down_proj.weight": bf16_bits(rng, H, IS),
             "routed_expert_down_proj.weight": bf16_bits(rng, L, H), "routed_expert_norm.weight": bf16_bits(rng, L, s=1),
             "routed_expert_up_proj.weight": bf16_bits(rng, H, L)}
    for name, bits in block.items():
        t[P + name] = ("BF16", bits.shape, bits)
    bias = (0.01 * rng.standard_normal(E)).astype(np.float32)
    t[P + "gate.e_score_correction_bias"] = ("F32", bias.shape, bias)
    if drop:
        del t[P + drop]
    os.makedirs(folder, exist_ok=True)
    st_io.write(os.path.join(folder, "model.safetensors"), t)
    return want, block, bias


def test_load_moe_layer_values(tmp_path):
    want, block, bias = write_checkpoint(str(tmp_path / "ckpt"))
    d = k3.load_moe_layer(str(tmp_path / "ckpt"), 3)
    assert d["w13"].shape == (E, 2 * I, L // 2) and d["w2"].shape == (E, L, I // 2)
    assert d["w13_scale"].shape == (E, 2 * I * L // 16) and d["w2_scale"].shape == (E, L * I // 16)
    for e in range(E):
        assert np.array_equal(d["w13"][e], np.concatenate([want["w"][e, "gate_proj"], want["w"][e, "up_proj"]]))
        assert np.array_equal(d["w13_scale"][e], np.concatenate([want["s"][e, "gate_proj"].ravel(),
                                                                 want["s"][e, "up_proj"].ravel()]))
        assert np.array_equal(d["w2"][e], want["w"][e, "down_proj"])
        assert np.array_equal(d["w2_scale"][e], want["s"][e, "down_proj"].ravel())
        assert tuple(d["w13_scale_2"][e]) == (np.float32(want["s2"][e, "gate_proj"]),
                                              np.float32(want["s2"][e, "up_proj"]))
        assert d["w2_scale_2"][e] == np.float32(want["s2"][e, "down_proj"])
    assert "w13_input_scale" not in d
    assert np.array_equal(d["gate_weight"], as_f32(block["gate.weight"]))
    assert np.array_equal(d["e_score_correction_bias"], bias)
    assert np.array_equal(d["shared_gate_up"], as_f32(np.concatenate([block["shared_experts.gate_proj.weight"],
                                                                      block["shared_experts.up_proj.weight"]])))
    for key, name in (("shared_down", "shared_experts.down_proj.weight"), ("down_proj", "routed_expert_down_proj.weight"),
                      ("norm_weight", "routed_expert_norm.weight"), ("up_proj", "routed_expert_up_proj.weight")):
        assert np.array_equal(d[key], as_f32(block[name])), key
    # the dict plugs into latent_moe as it is (w13_scale_2 [E, 2]: separate gate and up scales)
    x = np.random.default_rng(92).standard_normal((2, H)).astype(np.float32)
    y, wts, ids = k3.latent_moe(x, d["gate_weight"], d["down_proj"], d["w13"], d["w2"], d["norm_weight"], d["up_proj"],
                                e_score_correction_bias=d["e_score_correction_bias"], shared_gate_up=d["shared_gate_up"],
                                shared_down=d["shared_down"], top_k=2, quant="nvfp4", w13_scale=d["w13_scale"],
                                w13_scale_2=d["w13_scale_2"], w2_scale=d["w2_scale"], w2_scale_2=d["w2_scale_2"])
    assert y.shape == (2, H) and np.all(np.isfinite(y)) and ids.shape == (2, 2)


def test_load_moe_layer_errors(tmp_path):
    write_checkpoint(str(tmp_path / "ok"))
    with pytest.raises(k3.K3Error, match="layer 4: no MoE experts found"):
        k3.load_moe_layer(str(tmp_path / "ok"), 4)
    write_checkpoint(str(tmp_path / "gap"), drop="experts.2.up_proj.weight_scale")
    with pytest.raises(k3.K3Error, match="experts.2.up_proj.weight_scale"):
        k3.load_moe_layer(str(tmp_path / "gap"), 3)
    with pytest.raises(k3.K3Error, match="I/O error: .*cannot open"):
        k3.load_moe_layer(str(tmp_path / "missing"), 0)
    with pytest.raises(ValueError, match="layer must be an int"):
        k3.load_moe_layer(str(tmp_path / "ok"), -1)
