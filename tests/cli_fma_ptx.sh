#!/usr/bin/env bash
# Proves the fp32-accumulating BF16 FMA is chosen per architecture at compile time (src/cuda/fma.cuh):
# the sm_90a PTX of the skinny GEMM has no mixed-precision fma.rn.f32.bf16 (it would not compile there),
# the sm_100a PTX uses it. Needs nvcc only (no GPU); skipped (77) without it.
# Usage: bash tests/cli_fma_ptx.sh path/to/k3   (the k3 binary is not used)
set -u
NAME=cli_fma_ptx
src="${K3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"
. "$src/tests/lib_cli.sh"
nvcc_bin="$(nvcc_path)"
if [ -z "$nvcc_bin" ]; then echo "SKIPPED: no nvcc"; exit 77; fi

for arch in 90a 100a; do
    if ! "$nvcc_bin" -ptx -gencode "arch=compute_${arch},code=compute_${arch}" -I"$src/include" -I"$src/src" \
        --expt-relaxed-constexpr "$src/src/cuda/gemm_skinny.cu" -o "$T/skinny_${arch}.ptx" 2>"$T/err_${arch}"; then
        bad "nvcc -ptx for compute_${arch} failed: $(head -5 "$T/err_${arch}")"
        continue
    fi
    ok
done
if [ -f "$T/skinny_90a.ptx" ]; then
    n_mixed=$(grep -c 'fma\.rn\.f32\.bf16' "$T/skinny_90a.ptx" || true)
    n_plain=$(grep -cE 'fma\.rn\.f32[[:space:]]' "$T/skinny_90a.ptx" || true)
    [ "$n_mixed" -eq 0 ] && ok || bad "sm_90a PTX contains $n_mixed mixed-precision fma.rn.f32.bf16"
    [ "$n_plain" -gt 0 ] && ok || bad "sm_90a PTX has no fma.rn.f32 (convert-then-fma path missing)"
    echo "sm_90a: fma.rn.f32.bf16 x$n_mixed, fma.rn.f32 x$n_plain"
fi
if [ -f "$T/skinny_100a.ptx" ]; then
    n_mixed=$(grep -c 'fma\.rn\.f32\.bf16' "$T/skinny_100a.ptx" || true)
    [ "$n_mixed" -gt 0 ] && ok || bad "sm_100a PTX does not use fma.rn.f32.bf16"
    echo "sm_100a: fma.rn.f32.bf16 x$n_mixed"
fi
finish
