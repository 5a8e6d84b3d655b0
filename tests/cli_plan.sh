#!/usr/bin/env bash
# k3 plan / k3 bench gemm / k3 bench moe / k3 tune from the command line: table selection per simulated
# architecture, JSON, table files (good, malformed, key mismatch), exit codes (usage errors 2 in every build);
# bench and tune without a GPU say so and exit 1.
# usage: bash tests/cli_plan.sh path/to/k3
set -u
NAME=cli_plan
. "$(dirname "$0")/lib_cli.sh"

expect 0 "help" -- "$K3" plan --help
contains "$T/out" "--arch X.Y" "plan help"
expect 2 "unknown option" -- "$K3" plan --frobnicate
expect 2 "bad arch" -- "$K3" plan --arch nine
expect 2 "bad max-m" -- "$K3" plan --arch 9.0 --max-m 33

# the table each simulated architecture gets (src/arch): 10.7 shares sm103's, 12.0 has none
for row in "9.0 embedded sm90" "10.0 embedded sm100" "10.3 embedded sm103" "10.7 embedded sm103" "12.0 none"; do
    set -- $row
    expect 0 "plan --arch $1" -- "$K3" plan --arch "$1" --shapes 1536,7168
    contains "$T/out" "table $2${3:+ $3}" "arch $1 table"
    contains "$T/out" "1536 x 7168" "arch $1 shape"
done
expect 0 "json" -- "$K3" plan --arch 10.7 --json --shapes tp8
contains "$T/out" '"table": "embedded sm103"' "json table"
contains "$T/out" '"n": 20480, "k": 7168' "json lists the tp8 shapes"
contains "$T/out" '"kernel": "cublaslt"' "json fallback"
if command -v python3 >/dev/null 2>&1; then
    if python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/out"; then ok; else bad "plan --json is not JSON"; fi
fi
# k3 plan --moe: the routed experts' launches per m (the plan's data, resolved without a GPU on a simulated sm90)
expect 0 "plan --moe help" -- "$K3" plan --moe --help
contains "$T/out" "--force-off LIST" "plan --moe help"
expect 0 "plan --moe tp8" -- "$K3" plan --moe --arch 9.0
contains "$T/out" "1    folded   g1_nvfp4_gated_nt1_async_fold " "tp8 m 1 routes itself (the fold)"
contains "$T/out" "g1_nvfp4_gated_nt1_async_early" "tp8 early routing at m 2-16"
expect 0 "plan --moe no fold" -- "$K3" plan --moe --arch 9.0 --force-off fold,early --max-tokens 2
contains "$T/out" "1    yes      g1_nvfp4_gated_nt1_async " "the forced-off fold keeps the dispatch kernel"
expect 0 "plan --moe ep16 json" -- "$K3" plan --moe --arch 9.0 --config ep16 --max-tokens 4 --json
contains "$T/out" '"gemm2": "g2_nvfp4_nt1_ks8_async_fold_direct"' "ep16 m 1: the wide split, direct output"
if command -v python3 >/dev/null 2>&1; then
    if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["m"]) == 4' "$T/out"; then ok
    else bad "plan --moe --json is not JSON with 4 rows"; fi
fi
expect 0 "plan --moe sm count" -- "$K3" plan --moe --arch 9.0 --sm-count 16 --max-tokens 1
contains "$T/out" "1    yes      g1_nvfp4_gated_nt1_async_early" "16 SMs: the grid is past the fold's waves"
expect 2 "plan --moe bad force" -- "$K3" plan --moe --arch 9.0 --force-off everything
expect 2 "plan --moe sm count without arch" -- "$K3" plan --moe --sm-count 100
expect 2 "plan --moe bad format" -- "$K3" plan --moe --arch 9.0 --format fp8
expect 1 "plan --moe bad shape" -- "$K3" plan --moe --arch 9.0 --top-k 0
contains "$T/err" "top_k" "plan --moe names the bad field"

# k3 plan --latent: the block's per-m schedule and RMSNorm trigger from the architecture's data
expect 0 "plan --latent help" -- "$K3" plan --latent --help
contains "$T/out" "--max-tokens M" "plan --latent help"
expect 0 "plan --latent sm90" -- "$K3" plan --latent --arch 9.0 --max-tokens 32
contains "$T/out" "this CPU context runs SERIAL" "plan --latent says a CPU context runs serially"
rows=$(awk '$1 ~ /^[0-9]+$/' "$T/out" | wc -l)
[ "$rows" -eq 32 ] && ok || bad "plan --latent --max-tokens 32 printed $rows rows"
if awk '$1 ~ /^[0-9]+$/ && !($2 ~ /^(shared-beside|select-beside|logits-first|router-beside|serial)$/ && $3 ~ /^(yes|no)$/) { e = 1 }
        END { exit e }' "$T/out"; then ok; else bad "plan --latent: a row without a schedule and a trigger"; fi
expect 0 "plan --latent sm100 json" -- "$K3" plan --latent --arch 10.0 --max-tokens 4 --json
if command -v python3 >/dev/null 2>&1; then
    if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["m"]; assert d["table"] == "sm100" and \
len(r) == 4 and all(x["schedule"] == "shared-beside" and x["rmsnorm_trigger"] is False for x in r)' "$T/out"; then ok
    else bad "plan --latent --json on sm100: four rows of the defaults"; fi
fi
expect 2 "plan --latent max-tokens 33" -- "$K3" plan --latent --arch 9.0 --max-tokens 33
contains "$T/err" "1..32" "plan --latent names the range"
expect 2 "plan --latent unknown option" -- "$K3" plan --latent --frobnicate 1

expect 0 "configs" -- "$K3" plan --configs
contains "$T/out" "skinny" "configs lists skinny"
contains "$T/out" "mma" "configs lists mma"

# a table file: an explicit row, then the same through --table
cfg=$("$K3" plan --configs | awk '$1 == "skinny" && $9 == 0 { print $2; exit }')
printf 'arch sm90\n1536 7168 1-4 skinny %s\n1536 7168 5 cublaslt h1\n' "$cfg" >"$T/t.txt"
expect 0 "plan --table" -- "$K3" plan --arch 9.0 --table "$T/t.txt" --shapes 1536,7168
contains "$T/out" "1-4     skinny $cfg" "table row resolved"
contains "$T/out" "5       cublaslt h1" "explicit fallback row"
contains "$T/out" "6-16    cublaslt h0 [not in table]" "unlisted M"
printf 'arch sm90\n\n1536 7168 1-4 warp9 x\n' >"$T/bad.txt"
expect 1 "malformed table" -- "$K3" plan --arch 9.0 --table "$T/bad.txt"
contains "$T/err" "bad.txt:3: unknown kernel 'warp9'" "malformed message"
printf 'arch sm90\ngpu NVIDIA H200\nsm_count 132\n' >"$T/keyed.txt"
expect 1 "key mismatch" -- "$K3" plan --arch 9.0 --table "$T/keyed.txt"
contains "$T/err" "table key mismatch" "key mismatch status"
contains "$T/err" "gpu: table 'NVIDIA H200'" "key mismatch names the field"
expect 0 "forced key" -- "$K3" plan --arch 9.0 --table "$T/keyed.txt" --force
expect 1 "missing table" -- "$K3" plan --arch 9.0 --table "$T/none.txt"

# bench / tune usage errors never touch a GPU
expect 2 "bench without a benchmark" -- "$K3" bench
expect 2 "bench unknown" -- "$K3" bench moon
expect 0 "bench gemm help" -- "$K3" bench gemm --help
contains "$T/out" "4.37 TB/s" "bench help explains the ceiling"
expect 2 "bench reps" -- "$K3" bench gemm --reps 3
expect 2 "bench json+csv" -- "$K3" bench gemm --json --csv
expect 2 "bench bad m" -- "$K3" bench gemm --m 0
expect 2 "bench bad shapes" -- "$K3" bench gemm --shapes 1536
expect 0 "bench moe help" -- "$K3" bench moe --help
contains "$T/out" "--hot" "bench moe help: skewed routing"
contains "$T/out" "--ws-offset N" "bench moe help: workspace offset"
expect 2 "bench moe reps" -- "$K3" bench moe --reps 3
contains "$T/err" "--reps must be in 7..1000" "bench moe reps message"
expect 2 "bench moe ws offset" -- "$K3" bench moe --ws-offset 100
contains "$T/err" "multiple of 256" "bench moe ws offset message"
expect 2 "bench moe config" -- "$K3" bench moe --config tp4
expect 2 "bench moe m" -- "$K3" bench moe --m 0
expect 2 "bench moe top-k" -- "$K3" bench moe --top-k 17
expect 2 "bench moe unknown option" -- "$K3" bench moe --frobnicate
expect 0 "tune help" -- "$K3" tune --help
expect 2 "tune bad m" -- "$K3" tune --m 40
expect 2 "tune bad shapes file" -- "$K3" tune --shapes "$T/no_such_file"
if ! "$K3" info --json 2>/dev/null | grep -q '"backend": "cuda"'; then
    expect 1 "bench without a GPU" -- "$K3" bench gemm --shapes 1536,128 --m 1
    contains "$T/err" "needs a CUDA GPU" "bench says why"
    expect 1 "tune without a GPU" -- "$K3" tune --shapes 1536,128 --m 1
    contains "$T/err" "needs a CUDA GPU" "tune says why"
    expect 1 "bench moe without a GPU" -- "$K3" bench moe --config tp8 --m 1 --reps 7
    if grep -aqF "no CUDA backend" "$T/err"; then ok; else contains "$T/err" "cannot create a cuda context" "bench moe says why"; fi
fi

finish
