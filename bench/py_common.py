"""Shared pieces of the Python benchmarks (py_overhead.py, py_graph.py): the package import from a source checkout,
synthesized NVFP4 experts at the Kimi-K3 TP8 shapes, the C call a binding makes with its exact arguments (through ctypes or the compiled calls), the
report (one JSON object on stdout, the readable table on stderr)."""
import json
import os
import statistics
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import torch  # noqa: E402

import k3kernels as k3  # noqa: E402
from k3kernels import _ops, _torch  # noqa: E402


def nvfp4_experts(e, rows, cols, device, seed):
    """Random packed E2M1 codes, E4M3 block scales in the normal range (no NaN codes), scale_2 0.25, made on the
    device itself (gigabytes at the K3 shapes): valid weights without quantizing on the host."""
    gen = torch.Generator(device=device).manual_seed(seed)
    packed = torch.randint(0, 256, (e, rows, cols // 2), generator=gen, dtype=torch.uint8, device=device)
    scale = torch.randint(0x20, 0x48, (e, rows * cols // 16), generator=gen, dtype=torch.uint8, device=device)
    return packed, scale, torch.full((e,), 0.25, dtype=torch.float32, device=device)


def routing(m, e, k, device, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(m)]).to(torch.int32).to(device)
    wts = (torch.rand(m, k, generator=gen) + 0.1).to(device)
    return ids, wts


class ctypes_binding:
    """Inside: the torch front end calls the library through ctypes alone, as without k3kernels._fastcall."""

    def __enter__(self):
        self.saved = _torch._fc, _torch._linear_run, _torch._router_run, _torch._moe_run
        _torch._fc, _torch._linear_run, _torch._router_run, _torch._moe_run = (
            None, _torch._linear_run_ctypes, _torch._router_run_ctypes, _torch._moe_run_ctypes)

    def __exit__(self, *exc):
        _torch._fc, _torch._linear_run, _torch._router_run, _torch._moe_run = self.saved


class CapturedCall:
    """The library call a k3kernels function makes, with its exact arguments (plan, pointers, stream), recorded
    once; the output and workspace pointers are swapped for buffers held here, so the call can be repeated (and
    captured) without the binding's Python layer. outs: [(argument index, index of the call's output it is)]."""

    def __init__(self, name, call, outs, ws_index):
        lib = _ops._lib
        real = getattr(lib, name)
        seen = []

        def record(*args):
            seen.append(args)
            return real(*args)

        setattr(lib, name, record)
        try:
            with ctypes_binding():  # recorded from the ctypes call
                ref = call()
        finally:
            setattr(lib, name, real)
        if len(seen) != 1:
            raise RuntimeError("%s was called %d times by the recorded call (expected once)" % (name, len(seen)))
        ref = ref if isinstance(ref, tuple) else (ref,)
        args = list(seen[0])
        self.outs = [torch.empty_like(ref[j]) for _, j in outs]
        for (i, _), t in zip(outs, self.outs):
            args[i] = t.data_ptr()
        self.ws = torch.empty(max(args[ws_index + 1], 1), dtype=torch.uint8, device=ref[0].device)
        args[ws_index] = self.ws.data_ptr()
        self.fn, self.args, self.call, self.ref = real, args, call, ref  # call and ref keep the inputs alive
        self.cuda = ref[0].is_cuda
        self.dev = _torch._device_key(ref[0])

    def fast(self):
        """The same call through k3kernels._fastcall (k3_linear_run and k3_moe_run), or None without the module."""
        if _torch._fc is None:
            return None
        a = list(self.args)
        a[0] = a[0].value if hasattr(a[0], "value") else a[0]
        if self.fn.__name__ == "k3_moe_run":  # the struct's fields in order, then the rest
            w = a[5]._obj
            a = a[:5] + [getattr(w, f) for f, _ in type(w)._fields_] + a[6:]
            fn, run = _torch._MOE_RUN, _torch._fc.moe_run
        elif self.fn.__name__ == "k3_linear_run":
            fn, run = _torch._LINEAR_RUN, _torch._fc.linear_run
        else:
            raise ValueError("no compiled call for %s" % self.fn.__name__)

        def call():
            if self.cuda:
                a[-1] = _torch._stream(self.dev)
            st = run(fn, *a)
            if st != 0:
                raise RuntimeError("the recorded call failed: status %d" % st)
            return self.outs
        return call

    def __call__(self):
        if self.cuda:  # every run call takes the stream last: the current one, looked up as the binding does
            self.args[-1] = _torch._stream(self.dev)
        st = self.fn(*self.args)
        if st != 0:
            raise RuntimeError("the recorded call failed: status %d" % st)
        return self.outs


def median(xs):
    return statistics.median(xs)


def report(result, rows, header):
    """rows: [(label, value, note)]; the table on stderr, the JSON object on stdout."""
    print(header, file=sys.stderr)
    for label, value, note in rows:
        v = "%10.2f" % value if isinstance(value, float) else "%10s" % value
        print("  %-52s %s  %s" % (label, v, note), file=sys.stderr)
    print(json.dumps(result, indent=1, sort_keys=True))


def device_facts(device):
    facts = {"torch": torch.__version__, "device": device, "k3": k3.info()["version"]}
    if device == "cuda":
        facts["gpu"] = torch.cuda.get_device_name()
    return facts
