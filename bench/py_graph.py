"""The Python-built latent-MoE layer (examples/k3_latent_moe.py's K3LatentMoE) under CUDA-graph replay against the
C API's k3_latent_moe_run for the same block and weights, replayed in a CUDA graph, in the same process.

    python3 bench/py_graph.py                     # K3 TP8 block (H 7168, L 3584, 896 NVFP4 experts, top-16)
    python3 bench/py_graph.py --device cpu        # small block on the CPU backend: checks the logic (no graphs)

The C side is a plan of its own, made through the C API with its defaults for the block (k3_latent_moe_desc_init)
and max_tokens 16, run by a bare ctypes call on torch's capture stream: the C API's time. Both graphs hold `calls`
back-to-back calls on the same weights; they are replayed alternately, each replay timed with CUDA events; median
per call. Bar: the Python layer within 2% of the C API. The outputs of both must be bitwise equal. One JSON object
on stdout, the table on stderr; well under a minute.
"""
import argparse
import ctypes
import statistics
import sys
import time

from py_common import device_facts, k3, nvfp4_experts, report, torch
from k3kernels import _capi as C
from k3kernels import _ops

import k3_latent_moe as example  # noqa: E402


def block_weights(h, l, e, inter, shared, device):
    gen = torch.Generator(device=device).manual_seed(7)
    r = lambda *shape, s: (s * torch.randn(*shape, generator=gen, device=device)).to(torch.bfloat16)  # noqa: E731
    w13, s13, g13 = nvfp4_experts(e, 2 * inter, l, device, 8)
    w2, s2, g2 = nvfp4_experts(e, l, inter, device, 9)
    return {"gate": r(e, h, s=h ** -0.5), "bias": 0.01 * torch.randn(e, generator=gen, device=device),
            "down": r(l, h, s=h ** -0.5), "norm": (1.0 + 0.1 * torch.randn(l, generator=gen, device=device)).to(
                torch.bfloat16), "up": r(h, l, s=l ** -0.5), "sgu": r(2 * shared, h, s=h ** -0.5),
            "sdn": r(h, shared, s=shared ** -0.5), "w13": w13, "s13": s13, "g13": g13, "w2": w2, "s2": s2, "g2": g2}


class CLatentMoE:
    """The block through the C API alone: a context and plan made here, one k3_latent_moe_run per call into
    buffers held here (x is copied into the static input first by the caller)."""

    def __init__(self, w, h, l, e, inter, shared, top_k, m, device):
        lib = _ops._lib
        opt = C.CtxOptions()
        lib.k3_ctx_options_init(ctypes.byref(opt))
        opt.backend = C.BACKEND_CUDA if device == "cuda" else C.BACKEND_CPU
        opt.device = torch.cuda.current_device() if device == "cuda" else 0
        self.ctx = ctypes.c_void_p()
        self._ok(lib.k3_ctx_create(ctypes.byref(opt), ctypes.byref(self.ctx)), "k3_ctx_create")
        d = C.LatentMoeDesc()
        lib.k3_latent_moe_desc_init(ctypes.byref(d))  # the defaults: Kimi-K3 TP8, NVFP4, SiTU, BF16 gate
        d.hidden, d.shared_inter, d.max_tokens = h, shared, 16
        d.router.num_experts, d.router.top_k, d.router.hidden, d.router.max_tokens = e, top_k, h, 16
        d.experts.num_experts, d.experts.top_k, d.experts.hidden, d.experts.inter = e, top_k, l, inter
        d.experts.max_tokens = 16
        self.plan = ctypes.c_void_p()
        self._ok(lib.k3_latent_moe_plan_create(self.ctx, ctypes.byref(d), ctypes.byref(self.plan)), "plan")
        n = ctypes.c_size_t()
        self._ok(lib.k3_latent_moe_workspace_size(self.plan, ctypes.byref(n)), "workspace size")
        p = lambda t: t.data_ptr()  # noqa: E731
        mw = C.MoeWeights(p(w["w13"]), p(w["s13"]), p(w["g13"]), None, p(w["w2"]), p(w["s2"]), p(w["g2"]), None)
        self.lw = C.LatentMoeWeights(p(w["gate"]), p(w["bias"]), p(w["down"]), mw, p(w["norm"]), p(w["up"]),
                                     p(w["sgu"]), p(w["sdn"]))
        self.x = torch.empty((m, h), dtype=torch.bfloat16, device=device)
        self.y = torch.empty((m, h), dtype=torch.bfloat16, device=device)
        self.ids = torch.empty((m, top_k), dtype=torch.int32, device=device)
        self.wts = torch.empty((m, top_k), dtype=torch.float32, device=device)
        self.ws = torch.empty(max(n.value, 1), dtype=torch.uint8, device=device)
        self.ws_bytes, self.m, self.lib, self.device, self.w = n.value, m, lib, device, w

    def _ok(self, st, what):
        if st != C.STATUS_SUCCESS:
            msg = self.lib.k3_ctx_last_error(self.ctx).decode() if getattr(self, "ctx", None) else ""
            raise RuntimeError("%s failed: %s %s" % (what, _ops._lib.k3_status_string(st).decode(), msg))

    def run(self):
        s = torch.cuda.current_stream().cuda_stream if self.device == "cuda" else None
        st = self.lib.k3_latent_moe_run(self.plan, self.m, self.x.data_ptr(), ctypes.byref(self.lw), None,
                                        self.y.data_ptr(), self.ids.data_ptr(), self.wts.data_ptr(),
                                        self.ws.data_ptr(), self.ws_bytes, s)
        self._ok(st, "k3_latent_moe_run")
        return self.y

    def close(self):
        self.lib.k3_latent_moe_plan_destroy(self.plan)
        self.lib.k3_ctx_destroy(self.ctx)


def capture(fn, calls):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            out = fn()
    return g, out


def replay_us(g, calls):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000.0 / calls


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--m", default="1,4,16", help="token counts (default 1,4,16; each <= 16)")
    ap.add_argument("--calls", type=int, default=20, help="calls per graph (default 20)")
    ap.add_argument("--reps", type=int, default=15, help="replays of each graph (default 15)")
    a = ap.parse_args(argv)
    try:
        ms = [int(v) for v in a.m.split(",")]
    except ValueError:
        ap.error("--m must be a comma-separated list of integers (got %r)" % a.m)
    if any(not 1 <= m <= 16 for m in ms) or a.calls < 1 or a.reps < 1:
        ap.error("--m values must be in 1..16, --calls and --reps >= 1")
    dev = a.device
    if dev == "cuda":
        h, l, e, inter, top_k, shared = 7168, 3584, 896, 384, 16, 768
    else:
        h, l, e, inter, top_k, shared = 512, 256, 32, 64, 4, 128
    print("py_graph: %s, latent-MoE block H %d L %d E %d I %d top-%d shared %d" % (dev, h, l, e, inter, top_k,
                                                                                  shared), file=sys.stderr)
    w = block_weights(h, l, e, inter, shared, dev)
    layer = example.K3LatentMoE(w, top_k)
    gen = torch.Generator().manual_seed(11)
    per_m, rows, ok = {}, [], True
    for m in ms:
        cside = CLatentMoE(w, h, l, e, inter, shared, top_k, m, dev)
        x = (0.5 * torch.randn(m, h, generator=gen)).to(torch.bfloat16).to(dev)
        cside.x.copy_(x)
        if dev == "cuda":
            gp, y_py = capture(lambda: layer(x), a.calls)
            gc, y_c = capture(cside.run, a.calls)
            tp, tc = [], []
            for _ in range(a.reps):  # alternated, so drift affects both alike
                tp.append(replay_us(gp, a.calls))
                tc.append(replay_us(gc, a.calls))
            t_py, t_c = statistics.median(tp), statistics.median(tc)
        else:
            y_py, y_c = layer(x), cside.run()
            tp, tc = [], []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                layer(x)
                tp.append((time.perf_counter() - t0) * 1e6)
                t0 = time.perf_counter()
                cside.run()
                tc.append((time.perf_counter() - t0) * 1e6)
            t_py, t_c = statistics.median(tp), statistics.median(tc)
        equal = bool(torch.equal(y_py, y_c))
        ratio = t_py / t_c
        within = abs(ratio - 1.0) <= 0.02
        ok = ok and equal and (within or dev != "cuda")
        per_m[str(m)] = {"python_us": round(t_py, 2), "c_api_us": round(t_c, 2), "ratio": round(ratio, 4),
                         "within_2pct": within, "outputs_bitwise_equal": equal}
        rows.append(("M %d: Python layer / C API (%.1f / %.1f us)" % (m, t_py, t_c), ratio,
                     "%s, outputs %s" % ("within 2%" if within else "OUTSIDE 2%", "equal" if equal else "DIFFER")))
        cside.close()
    result = dict(device_facts(dev), method="CUDA graph replay, %d calls a graph, median of %d replays" %
                  (a.calls, a.reps) if dev == "cuda" else "CPU backend, eager calls (logic check only)",
                  shape={"H": h, "L": l, "E": e, "I": inter, "top_k": top_k, "shared": shared}, per_m=per_m, bar=0.02,
                  passed=ok)
    report(result, rows, "latent-MoE block: the Python layer against the C API%s" %
           ("" if dev == "cuda" else "  [CPU: eager, the bar applies on the GPU]"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
