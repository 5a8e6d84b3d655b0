"""The Kimi-K3 latent-MoE block as a torch.nn.Module on k3kernels, next to a pure-torch module of the same math
(BF16 experts: the NVFP4 weights dequantized), on synthesized weights: checks that their outputs agree, then times
both under CUDA-graph replay and prints the speedup.

    python examples/k3_latent_moe.py                 # K3 TP8 slice on the GPU: H 7168, L 3584, 896 experts, top-16
    python examples/k3_latent_moe.py --small --device cpu   # small shapes, the check only
"""
import argparse
import statistics

import torch

import k3kernels as k3

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def synth_nvfp4(e, rows, cols, gen, device):
    """Random NVFP4 weights [e, rows, cols]: packed codes, E4M3 block scales (normal range), scale_2; and the same
    weights dequantized in BF16 (exact: at most 6 significant bits)."""
    codes = torch.randint(0, 16, (e, rows, cols), generator=gen, dtype=torch.uint8).to(device)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
    exp = torch.randint(1, 5, (e, rows, cols // 16), generator=gen).to(device)  # E4M3 exponent field 1..4
    mant = torch.randint(0, 8, (e, rows, cols // 16), generator=gen).to(device)
    scale = ((exp << 3) | mant).to(torch.uint8).contiguous()
    scale_2 = torch.full((e,), 0.25, dtype=torch.float32, device=device)
    sf = (1.0 + mant.float() / 8.0) * torch.pow(2.0, exp.float() - 7.0)
    table = torch.tensor(E2M1, device=device)
    dense = (table[codes.long()] * sf.repeat_interleave(16, dim=2) * 0.25).to(torch.bfloat16)
    return packed, scale.reshape(e, -1), scale_2, dense


def situ(g, u, beta=4.0, lb=25.0):
    return beta * torch.tanh(g / beta) * torch.sigmoid(g) * (lb * torch.tanh(u / lb))


class K3LatentMoE(torch.nn.Module):
    """The block through k3kernels.latent_moe (one planned call per step)."""

    def __init__(self, w, top_k):
        super().__init__()
        self.w, self.top_k = w, top_k

    def forward(self, x, residual=None):
        w = self.w
        y, _, _ = k3.latent_moe(x, w["gate"], w["down"], w["w13"], w["w2"], w["norm"], w["up"],
                                e_score_correction_bias=w["bias"], shared_gate_up=w["sgu"], shared_down=w["sdn"],
                                residual=residual, top_k=self.top_k, quant="nvfp4", w13_scale=w["s13"],
                                w13_scale_2=w["g13"], w2_scale=w["s2"], w2_scale_2=w["g2"])
        return y


class TorchLatentMoE(torch.nn.Module):
    """The same block in plain torch with BF16 experts (the dequantized NVFP4 weights), the same rounding points."""

    def __init__(self, w, top_k, eps=1e-5):
        super().__init__()
        self.w, self.top_k, self.eps = w, top_k, eps

    def forward(self, x, residual=None):
        w = self.w
        logits = x.float() @ w["gate"].float().t()
        s = torch.sigmoid(logits)
        ids = torch.topk(s + w["bias"], self.top_k, dim=1).indices
        p = torch.gather(s, 1, ids)
        p = p / (p.sum(dim=1, keepdim=True) + 1e-20)
        xl = (x @ w["down"].t())  # bf16 out, fp32 accumulate
        inter = w["w13d"].shape[1] // 2
        w13 = w["w13d"][ids]  # [M, k, 2I, L]
        gu = torch.einsum("mkrl,ml->mkr", w13.float(), xl.float()).to(torch.bfloat16).float()
        a = situ(gu[..., :inter], gu[..., inter:]).to(torch.bfloat16).float()
        o = torch.einsum("mkli,mki->mkl", w["w2d"][ids].float(), a)
        u = (o * p.unsqueeze(-1)).sum(dim=1)
        v = (u * torch.rsqrt(u.pow(2).mean(dim=1, keepdim=True) + self.eps)).to(torch.bfloat16) * w["norm"]
        up = (v @ w["up"].t()).float()
        g = (x @ w["sgu"].t()).float()
        isz = w["sdn"].shape[1]
        sh = (situ(g[:, :isz], g[:, isz:]).to(torch.bfloat16) @ w["sdn"].t()).float()
        y = up + sh
        if residual is not None:
            y = y + residual.float()
        return y.to(torch.bfloat16)


def make_weights(h, l, e, inter, shared, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape, s=1.0: (torch.randn(*shape, generator=gen) * s).to(torch.bfloat16).to(device)  # noqa: E731
    w13, s13, g13, w13d = synth_nvfp4(e, 2 * inter, l, gen, device)
    w2, s2, g2, w2d = synth_nvfp4(e, l, inter, gen, device)
    return {"gate": r(e, h, s=h ** -0.5), "bias": (0.01 * torch.randn(e, generator=gen)).to(device),
            "down": r(l, h, s=h ** -0.5), "norm": (1.0 + 0.1 * torch.randn(l, generator=gen)).to(torch.bfloat16).to(device),
            "up": r(h, l, s=l ** -0.5), "sgu": r(2 * shared, h, s=h ** -0.5), "sdn": r(h, shared, s=shared ** -0.5),
            "w13": w13, "s13": s13, "g13": g13, "w2": w2, "s2": s2, "g2": g2,
            "w13d": w13d, "w2d": w2d}


def graph_time_us(fn, x, reps=7, calls=20):
    """Median per-call time of `calls` back-to-back calls captured in one CUDA graph, over `reps` replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn(x)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / calls)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="small shapes (H 512, L 256, 32 experts, top-4)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--m", default="1,4,16", help="token counts to time (CUDA)")
    a = ap.parse_args(argv)
    if a.small:
        h, l, e, inter, top_k, shared = 512, 256, 32, 64, 4, 128
    else:
        h, l, e, inter, top_k, shared = 7168, 3584, 896, 384, 16, 768
    w = make_weights(h, l, e, inter, shared, a.device)
    k3m, ref = K3LatentMoE(w, top_k), TorchLatentMoE(w, top_k)
    x = (torch.randn(4, h) * 0.5).to(torch.bfloat16).to(a.device)
    y, y_ref = k3m(x).float(), ref(x).float()
    rel = (torch.linalg.norm(y - y_ref) / torch.linalg.norm(y_ref)).item()
    ok = rel <= 1e-2 and bool(torch.isfinite(y).all())
    print("check (M 4, %s): rel-L2 %.2e against the pure-torch module (budget 1e-2): %s" %
          (a.device, rel, "PASS" if ok else "FAIL"))
    if a.device == "cuda":
        print("%4s %12s %12s %8s" % ("M", "k3 us", "torch us", "speedup"))
        for m in [int(v) for v in a.m.split(",")]:
            xm = (torch.randn(m, h) * 0.5).to(torch.bfloat16).cuda()
            t_k3 = graph_time_us(k3m, xm)
            t_ref = graph_time_us(ref, xm, calls=5)
            print("%4d %12.1f %12.1f %7.2fx" % (m, t_k3, t_ref, t_ref / t_k3))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
