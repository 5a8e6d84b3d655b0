#!/usr/bin/env python3
"""The per-call kernel timeline of the block's graph, from bench/cupti_trace.c's TSV.

For each captured graph that holds a whole block (router logits and RMSNorm kernels), the calls in it are told
apart by the router's logits kernel; each kernel of a call gets its start and end relative to that call's first
kernel, as medians over every call but the first of every replay but the first. Usage: cupti_timeline.py trace.tsv
"""
import shutil
import statistics
import subprocess
import sys


def demangle(names):
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return {n: (out[i] if i < len(out) and out[i] else n) for i, n in enumerate(names)}


CLASSES = [  # (substring of the demangled name, short label); first match wins
    ("router_logits", "router logits"), ("logits", "router logits"), ("select", "router select"),
    ("rmsnorm", "rmsnorm"), ("latent_addend", "shared addend"), ("latent_sum", "final sum"),
    ("latent_act", "shared act"),
    ("gemm1", "moe gemm1"), ("gemm2", "moe gemm2"), ("combine", "moe combine"), ("dispatch", "moe dispatch"),
    ("map_ids", "moe map ids"), ("quant_x", "moe quant x"), ("mma_wt", "gemm wt"), ("skinny", "gemm skinny"),
    ("mma", "gemm mma"), ("nvjet", "cublasLt"), ("xmma", "cublasLt"), ("cutlass", "cublasLt"),
    ("nccl", "nccl"),
]


def label(name):
    low = name.lower()
    for sub, lab in CLASSES:
        if sub in low:
            return lab
    return name[:40]


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    rows = []
    for line in open(sys.argv[1]):
        f = line.rstrip("\n").split("\t")
        if len(f) < 8:
            continue
        rows.append((int(f[0]), int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[5]), int(f[6]), f[7]))
    names = demangle(sorted({r[7] for r in rows}))
    graphs = {}
    for r in rows:
        if r[0] > 0:
            graphs.setdefault(r[0], []).append(r)
    order = sorted(graphs, key=lambda g: min(r[3] for r in graphs[g]))
    shown = 0
    for g in order:
        recs = graphs[g]
        labs = {r[1]: label(names[r[7]]) for r in recs}
        if "router logits" not in labs.values() or "rmsnorm" not in labs.values():
            continue
        # replays: the k-th occurrence of a node belongs to replay k
        by_node = {}
        for r in sorted(recs, key=lambda r: r[3]):
            by_node.setdefault(r[1], []).append(r)
        reps = min(len(v) for v in by_node.values())
        nodes = sorted(by_node)
        starts = [n for n in nodes if labs[n] == "router logits"]
        calls = len(starts)
        per = len(nodes) // calls if calls else 0
        if not calls or per * calls != len(nodes) or any(
                [labs[n] for n in nodes[c * per:(c + 1) * per]].count("router logits") != 1 for c in range(calls)):
            print("graph %d: %d nodes do not split into %d calls; skipped" % (g, len(nodes), calls))
            continue
        pos = {}  # position in call -> list of (start, end) offsets
        periods = []
        for k in range(1 if reps > 1 else 0, reps):
            t_prev = None
            for c in range(calls):
                cn = nodes[c * per:(c + 1) * per]
                t0 = min(by_node[n][k][3] for n in cn)
                if t_prev is not None:
                    periods.append((t0 - t_prev) / 1000.0)
                t_prev = t0
                if c == 0 and calls > 2:
                    continue  # the first call follows the previous replay's gap
                for i, n in enumerate(cn):
                    r = by_node[n][k]
                    pos.setdefault(i, []).append(((r[3] - t0) / 1000.0, (r[4] - t0) / 1000.0, r[2], r[5], r[6]))
        cn = nodes[:per]
        print("graph %d: %d calls of %d kernels, %d replays; call period median %.1f us" %
              (g, calls, per, reps, statistics.median(periods) if periods else float("nan")))
        print("   %-16s %6s %8s %8s %7s %7s" % ("kernel", "stream", "start", "end", "dur", "grid"))
        for i, n in enumerate(cn):
            v = pos.get(i, [])
            if not v:
                continue
            s = statistics.median(x[0] for x in v)
            e = statistics.median(x[1] for x in v)
            d = statistics.median(x[1] - x[0] for x in v)
            print("   %-16s %6d %8.2f %8.2f %7.2f %7d  x%d" % (labs[n], v[0][2], s, e, d, v[0][3], v[0][4]))
        shown += 1
    if not shown:
        print("no block graph found (%d graphs, %d kernel records)" % (len(graphs), len(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
