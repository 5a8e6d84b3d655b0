#!/usr/bin/env bash
# The N-GPU options of k3 run moe and k3 bench block (--tp N / --ep N with NCCL), the parts that need no GPU: their
# --help, the usage errors (bad N, --tp with --ep, --device auto), and more ranks than GPUs refused with both
# counts named (64 ranks: more than any one machine here has). A GPU run itself is checked by test_run_moe_tp.
# usage: bash tests/cli_parallel.sh path/to/k3
set -u
NAME=cli_parallel
. "$(dirname "$0")/lib_cli.sh"

FILES=(--weights "$T/w.safetensors" --input "$T/x.safetensors" --output "$T/y.safetensors")

# ---- help ----------------------------------------------------------------------------------------------------
expect 0 "run moe --help" -- "$K3" run moe --help
for o in "--tp N" "--ep N" "--device cuda" ncclCommInitAll NCCL_NVLS_ENABLE "rank 0 writes the output" "Needs N GPUs"; do
    contains "$T/out" "$o" "run moe --help documents $o"
done
expect 0 "bench block --help" -- "$K3" bench block --help
for o in "--tp N" "--ep N" NCCL_NVLS_ENABLE ncclCommInitAll "slowest rank" "without a communicator" "ncclAllReduce" \
    "--tp 1 --config tp8" "--config tp8|ep16" "--table FILE"; do
    contains "$T/out" "$o" "bench block --help documents $o"
done

# ---- usage errors (exit 2) -----------------------------------------------------------------------------------
for n in 0 65 -1 x; do
    expect 2 "run moe --tp $n" -- "$K3" run moe "${FILES[@]}" --tp "$n"
    expect 2 "bench block --tp $n" -- "$K3" bench block --tp "$n"
    expect 2 "bench block --ep $n" -- "$K3" bench block --ep "$n"
done
expect 2 "run moe --tp 65: the range" -- "$K3" run moe "${FILES[@]}" --tp 65
contains "$T/err" "1..64" "run moe --tp 65 names the range"
expect 2 "bench block --tp 65: the range" -- "$K3" bench block --tp 65
contains "$T/err" "1..64" "bench block --tp 65 names the range"
expect 2 "run moe --tp with --ep" -- "$K3" run moe "${FILES[@]}" --tp 2 --ep 2 --device cuda
contains "$T/err" "exclusive" "run moe --tp with --ep: says why"
expect 2 "bench block --tp with --ep" -- "$K3" bench block --tp 2 --ep 2
contains "$T/err" "exclusive" "bench block --tp with --ep: says why"
# --table FILE (compare two plan tables in one call; documented in --help above): without its file a usage error
expect 2 "bench block --table without a file" -- "$K3" bench block --table
expect 2 "run moe --tp 2 --device auto" -- "$K3" run moe "${FILES[@]}" --tp 2 --device auto
contains "$T/err" "not auto" "run moe --tp 2 --device auto: says why"
# shapes the K3 block cannot be cut into: I = 3072 into 5, 896 experts into 3
expect 2 "bench block --tp 5" -- "$K3" bench block --tp 5
contains "$T/err" "I = 3072" "bench block --tp 5 names I"
expect 2 "bench block --ep 3" -- "$K3" bench block --ep 3
contains "$T/err" "896" "bench block --ep 3 names the experts"
expect 2 "bench block --tp 2 --m 17" -- "$K3" bench block --tp 2 --m 17

# ---- more ranks than GPUs (exit 1, before any file is read) ---------------------------------------------------
expect 1 "run moe --tp 64 --device cuda" -- "$K3" run moe "${FILES[@]}" --tp 64 --device cuda
contains "$T/err" "needs 64 GPUs; this process sees " "run moe --tp 64: both counts"
expect 1 "run moe --ep 64 --device cuda" -- "$K3" run moe "${FILES[@]}" --ep 64 --device cuda
contains "$T/err" "--ep 64 with --device cuda runs one rank per GPU and needs 64 GPUs" "run moe --ep 64: both counts"
expect 1 "bench block --tp 64" -- "$K3" bench block --tp 64
contains "$T/err" "needs 64 GPUs; this process sees " "bench block --tp 64: both counts"
expect 1 "bench block --ep 64 --json" -- "$K3" bench block --ep 64 --json
contains "$T/err" "needs 64 GPUs; this process sees " "bench block --ep 64: both counts"
if [ -s "$T/out" ]; then bad "bench block --ep 64 --json: nothing on stdout ($(head -c 200 "$T/out"))"; else ok; fi
# the CPU ranks are unchanged: --tp 2 on the CPU still reads its files (a missing one is the error)
expect 1 "run moe --tp 2 --device cpu without files" -- "$K3" run moe "${FILES[@]}" --tp 2 --device cpu
contains "$T/err" "x.safetensors" "run moe --tp 2 on the CPU names the missing input"

finish
