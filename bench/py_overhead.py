"""Host overhead of one eager k3kernels call, against torch.nn.functional.linear on the same tensors, and the
per-call cost split into its parts: the compiled run calls (k3kernels._fastcall) against the ctypes binding.

    python3 bench/py_overhead.py                  # the GPU: linear M 1 on 1536 x 7168, fused_moe at K3 TP8 M 1
    python3 bench/py_overhead.py --device cpu     # small shapes on the CPU backend: checks the script's logic only

Method (CUDA): the time of the Python call itself, with the GPU not the bottleneck: every batch of calls is queued
behind one long kernel (torch.cuda._sleep), each call timed with perf_counter_ns, and the stream must still be busy
when the batch has been queued (checked; otherwise the batch is retried with a longer sleep). The cases take turns
batch by batch (interleaved), median over all calls of each. Bar: the eager k3kernels call <= 1.5x F.linear's host time. On the CPU the kernels run inside the call, so
the CPU numbers include the work and say nothing about the overhead. One JSON object on stdout, the table on
stderr; the run takes well under a minute.
"""
import argparse
import ctypes
import sys
import time

from py_common import CapturedCall, _torch, ctypes_binding, device_facts, k3, median, nvfp4_experts, report, routing, torch

import torch.nn.functional as F  # noqa: E402


def host_us(fns, device, calls, reps):
    """Median host time of one call (us) of each function in fns, each call timed alone, the GPU kept busy behind
    a long kernel. The functions take turns batch by batch (rep 1: a batch of each, rep 2: ...), so that a drift of
    the host's speed during the run (other processes, clocks) shifts all of them alike and their ratios hold."""
    times = [[] for _ in fns]
    cycles = calls * 400_000  # about 200 us of GPU time per queued call at 2 GHz: the queue never drains
    for _ in range(reps):
        for j, fn in enumerate(fns):
            for _ in range(4):  # a batch the GPU drained before it was queued is measured again, longer
                if device == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda._sleep(cycles)
                batch = []
                for _ in range(calls):
                    a = time.perf_counter_ns()
                    fn()
                    batch.append(time.perf_counter_ns() - a)
                busy = device != "cuda" or not torch.cuda.current_stream().query()
                if device == "cuda":
                    torch.cuda.synchronize()
                if busy:
                    times[j] += batch
                    break
                cycles *= 4
    if not all(times):
        raise RuntimeError("the GPU drained every batch before it was queued: no valid measurement")
    return [median(t) / 1000.0 for t in times]


def noop_op():
    """A torch.library custom op that does nothing but allocate its output: the Python custom-op layer's cost
    (registered once a process)."""
    if hasattr(torch.ops.k3bench, "noop"):
        return torch.ops.k3bench.noop

    @torch.library.custom_op("k3bench::noop", mutates_args=())
    def noop(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.new_empty((x.shape[0], w.shape[0]))

    @noop.register_fake
    def _(x, w):
        return x.new_empty((x.shape[0], w.shape[0]))
    return torch.ops.k3bench.noop


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=64, help="calls queued per batch (default 64)")
    ap.add_argument("--reps", type=int, default=30, help="batches (default 30)")
    ap.add_argument("--inference-mode", action="store_true",
                    help="every call (F.linear's too) under torch.inference_mode(), as engines run decode")
    a = ap.parse_args(argv)
    if a.calls < 1 or a.reps < 1:
        ap.error("--calls and --reps must be >= 1")
    threads = torch.get_num_threads()
    if a.device == "cpu":
        torch.set_num_threads(1)  # a shared machine's other threads would otherwise dominate F.linear
    try:
        if a.inference_mode:
            with torch.inference_mode():
                return measure(a)
        return measure(a)
    finally:
        torch.set_num_threads(threads)


def measure(a):
    dev = a.device
    gen = torch.Generator().manual_seed(0)
    if dev == "cuda":
        n, kdim, e, l, inter, top_k = 1536, 7168, 896, 3584, 384, 16
    else:
        n, kdim, e, l, inter, top_k = 96, 256, 16, 128, 64, 4
    print("py_overhead: %s, linear %d x %d, fused_moe E %d L %d I %d top-%d NVFP4, M 1" %
          (dev, n, kdim, e, l, inter, top_k), file=sys.stderr)
    x = torch.randn(1, kdim, generator=gen).to(torch.bfloat16).to(dev)
    w = (0.02 * torch.randn(n, kdim, generator=gen)).to(torch.bfloat16).to(dev)
    p13, s13, g13 = nvfp4_experts(e, 2 * inter, l, dev, 1)
    p2, s2, g2 = nvfp4_experts(e, l, inter, dev, 2)
    xm = torch.randn(1, l, generator=gen).to(torch.bfloat16).to(dev)
    ids, wts = routing(1, e, top_k, dev, 3)
    moe_kw = dict(quant="nvfp4", w13_scale=s13, w13_scale_2=g13, w2_scale=s2, w2_scale_2=g2)
    noop = noop_op()
    key = _torch._device_key(x)
    ctx = _torch._ctx(key)
    lin_c = CapturedCall("k3_linear_run", lambda: k3.linear(x, w), outs=[(5, 0)], ws_index=6)
    moe_c = CapturedCall("k3_moe_run", lambda: k3.fused_moe(xm, p13, p2, wts, ids, **moe_kw), outs=[(6, 0)],
                         ws_index=8)
    lib = _torch._lib

    def ctypes_only(fn):
        def call():
            with ctypes_binding():
                return fn()
        return call

    cases = [
        ("F.linear", lambda: F.linear(x, w), "the bar's baseline: aten dispatch + cuBLAS launch"),
        ("k3.linear (eager, the public call)", lambda: k3.linear(x, w), "eager: wrapper, checks, ctypes (no torch.ops)"),
        ("torch.ops.k3kernels.linear", lambda: torch.ops.k3kernels.linear(x, w, None), "the registered op (compile)"),
        ("linear_impl (no torch.ops dispatch)", lambda: _torch.linear_impl(x, w, None), "checks + allocs + ctypes"),
        ("k3_linear_run through ctypes alone", lin_c, "the C call with the binding's arguments"),
        ("k3.fused_moe (eager, the public call)", lambda: k3.fused_moe(xm, p13, p2, wts, ids, **moe_kw),
         "K3 TP8 experts, M 1"),
        ("torch.ops.k3kernels.fused_moe", lambda: torch.ops.k3kernels.fused_moe(
            xm, p13, p2, wts, ids, "nvfp4", s13, g13, s2, g2, "linear", "situ", 4.0, 25.0, "w4a16", None, None), ""),
        ("fused_moe_impl (no torch.ops dispatch)", lambda: _torch.fused_moe_impl(
            xm, p13, p2, wts, ids, "nvfp4", s13, g13, s2, g2, "linear", "situ", 4.0, 25.0, "w4a16", None, None), ""),
        ("k3_moe_run through ctypes alone", moe_c, ""),
        ("k3.linear, ctypes binding", ctypes_only(lambda: k3.linear(x, w)), "without k3kernels._fastcall"),
        ("k3.fused_moe, ctypes binding", ctypes_only(lambda: k3.fused_moe(xm, p13, p2, wts, ids, **moe_kw)),
         "without k3kernels._fastcall"),
        ("custom op doing nothing (k3bench::noop)", lambda: noop(x, w), "the Python custom-op layer"),
        ("its body called directly", lambda: x.new_empty((1, n)), "one output allocation"),
        ("ctypes call of k3_ctx_backend", lambda: lib.k3_ctx_backend(ctx), "the bare ctypes cost, 1 argument"),
        ("argument checks of linear (_t x2)", lambda: (_torch._t("x", x, torch.bfloat16, 2, key),
                                                       _torch._t("weight", w, torch.bfloat16, 2, key)),
         "Python checks"),
        ("ctypes.byref + struct build (MoeWeights)", lambda: ctypes.byref(_torch.C.MoeWeights(1, 2, 3, 4, 5, 6, 7, 8)),
         "the struct a fused_moe call builds"),
    ]
    if _torch._fc is not None:
        cases += [("k3_linear_run through _fastcall alone", lin_c.fast(), "the compiled call"),
                  ("k3_moe_run through _fastcall alone", moe_c.fast(), "the compiled call")]
    for _, fn, _ in cases:  # warm: plans, contexts, allocator pools
        fn()
    t = dict(zip([label for label, _, _ in cases], host_us([fn for _, fn, _ in cases], dev, a.calls, a.reps)))
    lin, moe, base = t["k3.linear (eager, the public call)"], t["k3.fused_moe (eager, the public call)"], t["F.linear"]
    parts = {
        "public_wrapper_us": lin - t["linear_impl (no torch.ops dispatch)"],
        "custom_op_layer_us": t["torch.ops.k3kernels.linear"] - t["linear_impl (no torch.ops dispatch)"],
        "checks_allocs_us": t["linear_impl (no torch.ops dispatch)"] - t["k3_linear_run through ctypes alone"],
        "ctypes_call_us": t["k3_linear_run through ctypes alone"],
        "bare_ctypes_us": t["ctypes call of k3_ctx_backend"],
    }
    result = dict(device_facts(dev), inference_mode=a.inference_mode,
                  method="host time per call, GPU busy behind torch.cuda._sleep" if dev == "cuda"
                  else "CPU backend: includes the work (logic check only)", calls=a.calls, reps=a.reps,
                  times_us={k: round(v, 3) for k, v in t.items()}, linear_parts_us={k: round(v, 3) for k, v in
                                                                                    parts.items()},
                  ratio_linear_to_F_linear=round(lin / base, 3), ratio_fused_moe_to_F_linear=round(moe / base, 3),
                  bar=1.5, linear_within_bar=lin <= 1.5 * base, fused_moe_within_bar=moe <= 1.5 * base,
                  binding=k3.info()["binding"],
                  fastcall_saving_us={"linear": round(t["k3.linear, ctypes binding"] - lin, 3),
                                      "fused_moe": round(t["k3.fused_moe, ctypes binding"] - moe, 3)},
                  ratio_fused_moe_ctypes_to_F_linear=round(t["k3.fused_moe, ctypes binding"] / base, 3))
    rows = [(label, t[label], note) for label, _, note in cases]
    rows += [("k3.linear / F.linear", lin / base, "bar <= 1.5: %s" % ("PASS" if lin <= 1.5 * base else "FAIL")),
             ("k3.fused_moe / F.linear", moe / base, "bar <= 1.5: %s" % ("PASS" if moe <= 1.5 * base else "FAIL")),
             ("k3.fused_moe ctypes binding / F.linear", t["k3.fused_moe, ctypes binding"] / base,
              "the compiled calls save %.2f us" % (t["k3.fused_moe, ctypes binding"] - moe))]
    report(result, rows, "host us per call (median of %d x %d)%s" % (a.reps, a.calls, "" if dev == "cuda" else
                                                                     "  [CPU: includes the work]"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
