#!/usr/bin/env bash
# Proves the fp32-accumulating BF16 FMA is chosen per architecture at compile time (src/cuda/common/fma.cuh), in every
# source that uses it: the skinny GEMM (gemm_skinny.cu) and the KDA run_n / run_k kernels (kda_proj.cu). Their
# sm_90a PTX has no mixed-precision fma.rn.f32.bf16 (it would not compile there) and does have the convert-then-fma
# fma.rn.f32; their sm_100a PTX uses the mixed-precision instruction. Needs nvcc only (no GPU); skipped (77) without it.
# Usage: bash tests/cli_fma_ptx.sh path/to/k3   (the k3 binary is not used)
set -u
NAME=cli_fma_ptx
src="${K3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"
. "$src/tests/lib_cli.sh"
nvcc_bin="$(nvcc_path)"
if [ -z "$nvcc_bin" ]; then echo "SKIPPED: no nvcc"; exit 77; fi

for unit in gemm/skinny kda/proj; do
    for arch in 90a 100a; do
        ptx="$T/${unit//\//_}_${arch}.ptx"
        if ! "$nvcc_bin" -ptx -gencode "arch=compute_${arch},code=compute_${arch}" -I"$src/include" -I"$src/src" \
            --expt-relaxed-constexpr "$src/src/cuda/${unit}.cu" -o "$ptx" 2>"$T/err_${unit//\//_}_${arch}"; then
            bad "nvcc -ptx of ${unit}.cu for compute_${arch} failed: $(head -5 "$T/err_${unit//\//_}_${arch}")"
            continue
        fi
        ok
        n_mixed=$(grep -c 'fma\.rn\.f32\.bf16' "$ptx" || true)
        n_plain=$(grep -cE 'fma\.rn\.f32[[:space:]]' "$ptx" || true)
        if [ "$arch" = 90a ]; then
            [ "$n_mixed" -eq 0 ] && ok || bad "${unit}.cu sm_90a PTX contains $n_mixed mixed-precision fma.rn.f32.bf16"
            [ "$n_plain" -gt 0 ] && ok || bad "${unit}.cu sm_90a PTX has no fma.rn.f32 (convert-then-fma path missing)"
        else
            [ "$n_mixed" -gt 0 ] && ok || bad "${unit}.cu sm_100a PTX does not use fma.rn.f32.bf16"
        fi
        echo "${unit}.cu sm_${arch}: fma.rn.f32.bf16 x$n_mixed, fma.rn.f32 x$n_plain"
    done
done
finish
