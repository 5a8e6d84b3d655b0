"""Compares two `k3 run moe` output files (CPU vs CUDA): rel-L2 of `output`, equality of the routing.
Usage: python3 bench/check_run_cuda.py CPU.safetensors CUDA.safetensors BAR  (exit 1 when over the bar)."""
import sys

from safetensors.torch import load_file

a, b, bar = load_file(sys.argv[1]), load_file(sys.argv[2]), float(sys.argv[3])
x, y = a["output"].float(), b["output"].float()
rel = float((x - y).norm() / x.norm())
ids = "topk_ids" not in a or bool((a["topk_ids"] == b["topk_ids"]).all())
wts = "topk_weights" not in a or bool((a["topk_weights"] == b["topk_weights"]).all())
ok = rel <= bar and ids and wts
print(f"rel-L2 {rel:.2e} (bar {bar:g}), routing ids equal {ids}, weights bitwise equal {wts}: {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
