#!/usr/bin/env bash
# k3 --help / --version / info: every architecture fact as `k3 info --json --arch` reports it, the plain-text
# form, the real backend of this build, and exit codes (0 ok, 2 usage).
# usage: bash tests/cli_info.sh path/to/k3
set -u
NAME=cli_info
. "$(dirname "$0")/lib_cli.sh"

expect 0 "k3 --help" -- "$K3" --help
for c in info quant dequant run demo plan bench tune; do contains "$T/out" "  $c " "k3 --help lists $c"; done
expect 2 "no command" -- "$K3"
expect 2 "unknown command" -- "$K3" frobnicate
contains "$T/err" "unknown command" "unknown command message"
expect 0 "k3 --version" -- "$K3" --version
contains "$T/out" "k3 0.1.0" "version text"
expect 0 "info --help" -- "$K3" info --help
contains "$T/out" "--arch X.Y" "info help"
expect 2 "info unknown option" -- "$K3" info --frobnicate
expect 2 "info bad arch" -- "$K3" info --arch nine
expect 2 "info arch out of range" -- "$K3" info --arch 9.12

# ARCH MIXED_FMA FP4_MMA TABLE: the shipped architectures, SM107 (SM103's table), and parts without a table
while read -r arch fma fp4 table; do
    expect 0 "info --json --arch $arch" -- "$K3" info --json --arch "$arch"
    contains "$T/out" "\"capability\": \"$arch\"" "$arch capability"
    contains "$T/out" "\"mixed_precision_bf16_fma\": $fma" "$arch mixed FMA"
    contains "$T/out" "\"fp4_mma\": $fp4" "$arch FP4 MMA"
    contains "$T/out" "\"table\": \"$table\"" "$arch table"
    contains "$T/out" "\"simulated\": true" "$arch simulated"
    # no fact about a backend this library does not have (a vendor QKVG GEMM was one)
    if grep -aqi vendor "$T/out"; then bad "$arch: a vendor field in $(cat "$T/out")"; else ok; fi
done <<'ROWS'
9.0 false false sm90
10.0 true true sm100
10.3 true true sm103
10.7 true true sm103
12.0 true true none
8.9 false false none
ROWS

expect 0 "info --arch text" -- "$K3" info --arch 10.7
contains "$T/out" "projection table          sm103" "text table line"
contains "$T/out" "[simulated]" "text simulated mark"

# the real backend: CUDA only where this build has it and a GPU is visible, else the CPU
expect 0 "info --json" -- "$K3" info --json
if grep -aqF '"backend": "cuda"' "$T/out"; then
    contains "$T/out" '"cuda_backend_usable": true' "cuda backend usable"
else
    contains "$T/out" '"backend": "cpu"' "cpu backend"
    contains "$T/out" '"table": "none"' "cpu has no table"
fi
expect 0 "info --device cpu" -- "$K3" info --device cpu --json
contains "$T/out" '"backend": "cpu"' "forced cpu backend"
expect 2 "info bad device" -- "$K3" info --device tpu

finish
