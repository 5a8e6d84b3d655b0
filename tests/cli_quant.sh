#!/usr/bin/env bash
# k3 quant / k3 dequant through files: exit codes for help, bad usage and bad files, and round trips.
# The input fixture is written here with printf (no generator binary, no python): values on the E2M1 grid,
# so MXFP4 round-trips exactly and NVFP4 within fp32 rounding of its 1/gs factor.
# usage: bash tests/cli_quant.sh path/to/k3
set -u
NAME=cli_quant
. "$(dirname "$0")/lib_cli.sh"

# ---- fixture -------------------------------------------------------------------------------------------
f32le() { printf "\\x${1:6:2}\\x${1:4:2}\\x${1:2:2}\\x${1:0:2}"; }
bf16le() { printf "\\x${1:2:2}\\x${1:0:2}"; }
# fp32 bit patterns of the 16 E2M1 values: codes 0..7 positive, 8..15 negative
GRID=(00000000 3f000000 3f800000 3fc00000 40000000 40400000 40800000 40c00000
      80000000 bf000000 bf800000 bfc00000 c0000000 c0400000 c0800000 c0c00000)
# binary16 patterns of the same 16 values
F16GRID=(0000 3800 3c00 3e00 4000 4200 4400 4600 8000 b800 bc00 be00 c000 c200 c400 c600)
u64le() { local v=$1 i; for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((v >> (8 * i)) & 255)))"; done; }
make_fixture() { # PATH
    local hdr='{"__metadata__":{"format":"pt"},'
    hdr+='"w":{"dtype":"F32","shape":[2,64],"data_offsets":[0,512]},'
    hdr+='"u":{"dtype":"BF16","shape":[1,32],"data_offsets":[512,576]},'
    hdr+='"bias":{"dtype":"F32","shape":[4],"data_offsets":[576,592]},'
    hdr+='"odd":{"dtype":"F32","shape":[2,8],"data_offsets":[592,656]},'
    hdr+='"h":{"dtype":"F16","shape":[1,32],"data_offsets":[656,720]}}'
    while [ $(((8 + ${#hdr}) % 8)) -ne 0 ]; do hdr+=' '; done
    {
        u64le ${#hdr}
        printf '%s' "$hdr"
        local i
        for i in $(seq 0 127); do f32le ${GRID[$(((i * 7 + i / 16) % 16))]}; done # every block holds +-6
        for i in $(seq 0 31); do bf16le ${GRID[$(((i * 5) % 16))]:0:4}; done
        for i in 1 2 3 4; do f32le ${GRID[$i]}; done
        for i in $(seq 0 15); do f32le ${GRID[$((i % 16))]}; done
        for i in $(seq 0 31); do bf16le ${F16GRID[$(((i * 3) % 16))]}; done
    } >"$1"
}
make_fixture "$T/in.safetensors"
[ $(($(wc -c <"$T/in.safetensors") % 8)) -eq 0 ] && ok || bad "fixture size $(wc -c <"$T/in.safetensors")"

# "DTYPE SHAPE BEGIN END" of tensor NAME in FILE (our writer's compact header)
tinfo() {
    local hl
    hl=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    head -c $((8 + hl)) "$1" | tail -c "$hl" |
        sed -n "s/.*\"$2\":{\"dtype\":\"\([A-Z0-9_]*\)\",\"shape\":\[\([0-9,]*\)\],\"data_offsets\":\[\([0-9]*\),\([0-9]*\)\]}.*/\1 \2 \3 \4/p"
}
# od dump (type $3: x4 exact words, f4 floats, x2) of tensor NAME in FILE, one value a line
tdump() {
    local hl info b e
    hl=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    info=$(tinfo "$1" "$2")
    b=$(echo "$info" | cut -d' ' -f3)
    e=$(echo "$info" | cut -d' ' -f4)
    [ -n "$b" ] || { echo "no tensor $2 in $1" >&2; return 1; }
    od -An -v -t"$3" -j $((8 + hl + b)) -N $((e - b)) "$1" | tr -s ' ' '\n' | sed '/^$/d'
}

# ---- help and usage ------------------------------------------------------------------------------------
expect 0 "quant --help" -- "$K3" quant --help
contains "$T/out" "NAME_scale_2" "quant --help documents the names"
contains "$T/out" "swizzled" "quant --help documents the layouts"
expect 0 "dequant --help" -- "$K3" dequant --help
contains "$T/out" "--dtype" "dequant --help documents --dtype"
expect 2 "quant without arguments" -- "$K3" quant
expect 2 "quant fp8" -- "$K3" quant fp8 --input "$T/in.safetensors" --output "$T/o.safetensors"
expect 2 "quant without --output" -- "$K3" quant nvfp4 --input "$T/in.safetensors"
expect 2 "quant --input without value" -- "$K3" quant nvfp4 --input
expect 2 "quant unknown option" -- "$K3" quant nvfp4 --input "$T/in.safetensors" --output "$T/o" --frobnicate
expect 2 "quant bad layout" -- "$K3" quant nvfp4 --input "$T/in.safetensors" --output "$T/o" --scale-layout diag
expect 2 "quant two formats" -- "$K3" quant nvfp4 mxfp4 --input "$T/in.safetensors" --output "$T/o"
expect 2 "dequant bad dtype" -- "$K3" dequant --input "$T/in.safetensors" --output "$T/o" --dtype f16
expect 2 "dequant without --input" -- "$K3" dequant --output "$T/o"

# ---- bad files and tensors -----------------------------------------------------------------------------
expect 1 "missing input" -- "$K3" quant nvfp4 --input "$T/missing.safetensors" --output "$T/o.safetensors"
contains "$T/err" "missing.safetensors" "the missing file is named"
printf 'not a safetensors file at all' >"$T/junk.safetensors"
expect 1 "malformed input" -- "$K3" quant mxfp4 --input "$T/junk.safetensors" --output "$T/o.safetensors"
contains "$T/err" "junk.safetensors" "the malformed file is named"
expect 1 "dequant malformed input" -- "$K3" dequant --input "$T/junk.safetensors" --output "$T/o.safetensors"
expect 1 "--tensor missing" -- "$K3" quant nvfp4 --input "$T/in.safetensors" --output "$T/o" --tensor nope
contains "$T/err" "nope" "the missing tensor is named"
expect 1 "--tensor rank 1" -- "$K3" quant nvfp4 --input "$T/in.safetensors" --output "$T/o" --tensor bias
contains "$T/err" "bias" "the unquantizable tensor is named"
expect 1 "--tensor cols 8" -- "$K3" quant mxfp4 --input "$T/in.safetensors" --output "$T/o" --tensor odd
[ ! -e "$T/o" ] && ok || bad "a failed quant left an output file"
expect 1 "unwritable output" -- "$K3" quant nvfp4 --input "$T/in.safetensors" --output "$T/no/dir/o.safetensors"

# ---- nvfp4, linear --------------------------------------------------------------------------------------
Q="$T/q.safetensors"
expect 0 "quant nvfp4" -- "$K3" quant nvfp4 --input "$T/in.safetensors" --output "$Q"
contains "$T/err" "keeping odd unquantized" "a tensor with cols 8 is kept, with a note"
[ "$(tinfo "$Q" w)" = "U8 2,32 0 64" ] && ok || bad "nvfp4 w: $(tinfo "$Q" w)"
[ "$(tinfo "$Q" w_scale | cut -d' ' -f1,2)" = "F8_E4M3 2,4" ] && ok || bad "nvfp4 w_scale: $(tinfo "$Q" w_scale)"
[ "$(tinfo "$Q" w_scale_2 | cut -d' ' -f1,2)" = "F32 " ] && ok || bad "nvfp4 w_scale_2 scalar: $(tinfo "$Q" w_scale_2)"
[ "$(tinfo "$Q" u | cut -d' ' -f1,2)" = "U8 1,16" ] && ok || bad "nvfp4 u (from BF16): $(tinfo "$Q" u)"
[ "$(tinfo "$Q" bias | cut -d' ' -f1,2)" = "F32 4" ] && ok || bad "bias copied: $(tinfo "$Q" bias)"
[ "$(tinfo "$Q" odd | cut -d' ' -f1,2)" = "F32 2,8" ] && ok || bad "odd copied: $(tinfo "$Q" odd)"
contains "$Q" '"k3.quant.format":"nvfp4"' "format recorded in metadata"
contains "$Q" '"format":"pt"' "input metadata kept"
# every block has amax 6 -> gs = 448, each block scale e4m3(448) = 0x7e
[ "$(tdump "$Q" w_scale x1 | sort -u)" = "7e" ] && ok || bad "nvfp4 block scales: $(tdump "$Q" w_scale x1 | sort -u | tr '\n' ' ')"
[ "$(tdump "$Q" bias x4 | tr '\n' ' ')" = "3f000000 3f800000 3fc00000 40000000 " ] && ok || bad "bias bytes"

D="$T/dq.safetensors"
expect 0 "dequant nvfp4" -- "$K3" dequant --input "$Q" --output "$D"
[ "$(tinfo "$D" w | cut -d' ' -f1,2)" = "F32 2,64" ] && ok || bad "dequant w: $(tinfo "$D" w)"
[ -z "$(tinfo "$D" w_scale)" ] && [ -z "$(tinfo "$D" w_scale_2)" ] && ok || bad "scales dropped"
if grep -aq 'k3.quant' "$D"; then bad "k3.quant metadata removed"; else ok; fi
# q * e4m3 scale * (1/gs) differs from the input by at most fp32 rounding of 1/448
paste <(tdump "$T/in.safetensors" w f4) <(tdump "$D" w f4) >"$T/cmp"
[ "$(wc -l <"$T/cmp")" -eq 128 ] && ok || bad "128 values compared"
awk '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; if (d > 1e-6 * a) n++ } END { exit n > 0 }' "$T/cmp" &&
    ok || bad "nvfp4 round trip of grid values within fp32 rounding"

# ---- mxfp4, swizzled: exact round trip -----------------------------------------------------------------
Q="$T/mq.safetensors"
expect 0 "quant mxfp4 swizzled" -- "$K3" quant mxfp4 --scale-layout swizzled --input "$T/in.safetensors" --output "$Q"
[ "$(tinfo "$Q" w_scale | cut -d' ' -f1,2)" = "U8 512" ] && ok || bad "swizzled scale: flat 128x4 bytes: $(tinfo "$Q" w_scale)"
[ -z "$(tinfo "$Q" w_scale_2)" ] && ok || bad "mxfp4 has no scale_2"
contains "$Q" '"k3.quant.scale_layout":"swizzled"' "layout recorded in metadata"
expect 0 "dequant mxfp4" -- "$K3" dequant --input "$Q" --output "$D"
[ "$(tdump "$D" w x4 | sed 's/^80000000$/00000000/')" = "$(tdump "$T/in.safetensors" w x4 | sed 's/^80000000$/00000000/')" ] &&
    ok || bad "mxfp4 round trip of w is exact"
[ "$(tdump "$D" u x4 | sed 's/0000$//; s/^8000$/0000/')" = "$(tdump "$T/in.safetensors" u x2 | sed 's/^8000$/0000/')" ] &&
    ok || bad "mxfp4 round trip of the BF16 tensor u is exact (as F32)"
want=$(for i in $(seq 0 31); do echo "${GRID[$(((i * 3) % 16))]}"; done | sed 's/^80000000$/00000000/')
[ "$(tdump "$D" h x4 | sed 's/^80000000$/00000000/')" = "$want" ] && ok || bad "mxfp4 round trip of the F16 tensor h is exact"
expect 0 "dequant --dtype bf16" -- "$K3" dequant --input "$Q" --output "$D" --dtype bf16
[ "$(tinfo "$D" w | cut -d' ' -f1,2)" = "BF16 2,64" ] && ok || bad "bf16 output: $(tinfo "$D" w)"

# ---- only the named tensor -----------------------------------------------------------------------------
expect 0 "quant --tensor w" -- "$K3" quant mxfp4 --tensor w --input "$T/in.safetensors" --output "$Q"
[ "$(tinfo "$Q" u | cut -d' ' -f1)" = "BF16" ] && ok || bad "unnamed u left alone"
[ "$(tinfo "$Q" w_scale | cut -d' ' -f1,2)" = "U8 2,2" ] && ok || bad "mxfp4 linear scale shape: $(tinfo "$Q" w_scale)"
expect 1 "re-quantizing a packed tensor" -- "$K3" quant mxfp4 --tensor w --input "$Q" --output "$T/q2.safetensors"
contains "$T/err" "dtype U8" "the reason is given"
# an input that already has a tensor named like a companion: refused, naming it
hdr='{"a":{"dtype":"F32","shape":[1,32],"data_offsets":[0,128]},"a_scale":{"dtype":"U8","shape":[1],"data_offsets":[128,129]}}'
while [ $(((8 + ${#hdr}) % 8)) -ne 0 ]; do hdr+=' '; done
{
    u64le ${#hdr}
    printf '%s' "$hdr"
    for i in $(seq 0 31); do f32le ${GRID[$((i % 16))]}; done
    printf '\x01'
} >"$T/clash.safetensors"
expect 1 "companion name clash" -- "$K3" quant nvfp4 --input "$T/clash.safetensors" --output "$T/q2.safetensors"
contains "$T/err" "a_scale" "the clash is named"

finish
