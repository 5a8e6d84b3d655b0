#!/usr/bin/env bash
# k3 quant / dequant / bench / info against hostile or unlucky files and arguments: a write that fails keeps the
# user's file, tens of thousands of tensors take well under a second, shapes whose sizes overflow, NaN scale codes,
# and the usage messages. Fixtures are written here with printf, awk and head (no generator binary).
# usage: bash tests/cli_files.sh path/to/k3
set -u
NAME=cli_files
. "$(dirname "$0")/lib_cli.sh"

u64le() { local v=$1 i; for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((v >> (8 * i)) & 255)))"; done; }
# st_file PATH HEADER DATA_BYTES [DATA_FILE]: a safetensors file with HEADER (padded to 8) and DATA_BYTES zero
# bytes, or the bytes of DATA_FILE
st_file() {
    local hdr=$2
    while [ $(((8 + ${#hdr}) % 8)) -ne 0 ]; do hdr+=' '; done
    {
        u64le ${#hdr}
        printf '%s' "$hdr"
        if [ $# -ge 4 ]; then cat "$4"; else head -c "$3" /dev/zero; fi
    } >"$1"
}
now_ms() { date +%s%3N; }

# ---- a failed write keeps the file it would replace ------------------------------------------------------
# 128 x 128 F32 zeros: 64 KiB in, about 9 KiB out, so a 4 KiB file size limit stops the write midway
st_file "$T/a.st" '{"w":{"dtype":"F32","shape":[128,128],"data_offsets":[0,65536]}}' 65536
cp "$T/a.st" "$T/a.orig"
expect 1 "quant in place past the file size limit" -- bash -c "ulimit -f 4; trap '' XFSZ; '$K3' quant nvfp4 --input '$T/a.st' --output '$T/a.st'"
contains "$T/err" "a.st: write failed" "the failed write is reported"
contains "$T/err" "left unchanged" "the message says the file was kept"
cmp -s "$T/a.st" "$T/a.orig" && ok || bad "a.st changed after a failed in-place quant"
[ -z "$(ls -a "$T" | grep k3tmp)" ] && ok || bad "a temporary file was left: $(ls -a "$T")"
cp "$T/a.st" "$T/b.st"
expect 1 "dequant over an existing output past the limit" -- bash -c "'$K3' quant nvfp4 --input '$T/a.st' --output '$T/q.st' && ulimit -f 4 && trap '' XFSZ && '$K3' dequant --input '$T/q.st' --output '$T/b.st'"
cmp -s "$T/b.st" "$T/a.orig" && ok || bad "an existing --output was damaged by a failed dequant"
expect 0 "quant in place without a limit" -- "$K3" quant nvfp4 --input "$T/a.st" --output "$T/a.st"
expect 0 "the in-place result dequantizes" -- "$K3" dequant --input "$T/a.st" --output "$T/a2.st"

# ---- 40000 tiny tensors: near-linear, not a scan per tensor ----------------------------------------------
# Judged by how the time grows from N / 4 to N tensors (linear: ~4x, a scan per tensor: ~16x), not by a wall-clock
# bound, which a loaded machine or a sanitizer build can exceed without any scan.
many_tensors() { # N FILE
    local hdr
    hdr=$(awk -v n="$1" 'BEGIN { printf "{"; for (i = 0; i < n; i++) printf "%s\"model.layers.%d.mlp.experts.%d.w\":{\"dtype\":\"F32\",\"shape\":[1,16],\"data_offsets\":[%d,%d]}", (i ? "," : ""), int(i / 1000), i % 1000, 64 * i, 64 * (i + 1); printf "}" }')
    st_file "$2" "$hdr" $((64 * $1))
}
N=40000
Q=$((N / 4))
many_tensors $N "$T/many.st"
many_tensors $Q "$T/few.st"
t0=$(now_ms)
expect 0 "quant of $Q tensors" -- "$K3" quant nvfp4 --input "$T/few.st" --output "$T/few_q.st"
t1=$(now_ms)
expect 0 "dequant of $Q tensors" -- "$K3" dequant --input "$T/few_q.st" --output "$T/few_d.st"
t2=$(now_ms)
expect 0 "quant of $N tensors" -- "$K3" quant nvfp4 --input "$T/many.st" --output "$T/many_q.st"
t3=$(now_ms)
expect 0 "dequant of $N tensors" -- "$K3" dequant --input "$T/many_q.st" --output "$T/many_d.st"
t4=$(now_ms)
contains "$T/err" "$N tensors expanded" "dequant expanded every tensor"
qs=$((t1 - t0 + 1)) ds=$((t2 - t1 + 1)) ql=$((t3 - t2)) dl=$((t4 - t3))
echo "quant $Q / $N tensors: $qs / $ql ms, dequant: $ds / $dl ms"
# 10x between linear (4x) and quadratic (16x); 200 ms of slack for the fixed costs of short runs
[ "$ql" -lt $((10 * qs + 200)) ] && ok || bad "quant: $N tensors took $ql ms, $Q took $qs ms (a scan per tensor?)"
[ "$dl" -lt $((10 * ds + 200)) ] && ok || bad "dequant: $N tensors took $dl ms, $Q took $ds ms (a scan per tensor?)"

# ---- dequant: sizes that overflow, zero rows, NaN codes ---------------------------------------------------
st_file "$T/ovf.st" '{"w":{"dtype":"U8","shape":[0,4611686018427387904],"data_offsets":[0,0]},"w_scale":{"dtype":"U8","shape":[0,1],"data_offsets":[0,0]}}' 0
expect 1 "dequant of a zero-size tensor with last dimension 2^62" -- "$K3" dequant --input "$T/ovf.st" --output "$T/o.st"
contains "$T/err" "w: shape [0, 4611686018427387904]" "the overflow names the tensor and shape"
contains "$T/err" "overflows int64" "the overflow is stated"
grep -q -- "-922" "$T/err" && bad "a negative column count is printed: $(cat "$T/err")" || ok
st_file "$T/rows0.st" '{"w":{"dtype":"U8","shape":[0,8],"data_offsets":[0,0]},"w_scale":{"dtype":"U8","shape":[0,1],"data_offsets":[0,0]}}' 0
expect 1 "dequant of a zero-row packed tensor" -- "$K3" dequant --input "$T/rows0.st" --output "$T/o.st"
contains "$T/err" "has 0 rows" "a zero-row tensor is blamed on its rows"
grep -q "columns" "$T/err" && bad "the zero-row message blames the columns: $(cat "$T/err")" || ok
# w U8 [1, 8] (16 FP4 codes 0x22 = 1.0 each), w_scale F8_E4M3 [1, 1], w_scale_2 F32 []
nv_file() { # PATH SCALE_BYTE SCALE2_HEX_LE
    printf '\x22\x22\x22\x22\x22\x22\x22\x22'"\\x$2$3" >"$T/nv.data"
    st_file "$1" '{"w":{"dtype":"U8","shape":[1,8],"data_offsets":[0,8]},"w_scale":{"dtype":"F8_E4M3","shape":[1,1],"data_offsets":[8,9]},"w_scale_2":{"dtype":"F32","shape":[],"data_offsets":[9,13]}}' 0 "$T/nv.data"
}
nv_file "$T/nv_ok.st" 38 '\x00\x00\x80\x3f'
expect 0 "dequant of a valid one-block file (control)" -- "$K3" dequant --input "$T/nv_ok.st" --output "$T/o.st"
nv_file "$T/nv_nan.st" 7f '\x00\x00\x80\x3f'
expect 1 "dequant with an E4M3 NaN block scale" -- "$K3" dequant --input "$T/nv_nan.st" --output "$T/o.st"
contains "$T/err" "w_scale: element 0 is 0x7F, a NaN E4M3 code" "the NaN scale is named"
nv_file "$T/nv_nan2.st" ff '\x00\x00\x80\x3f'
expect 1 "dequant with a negative-NaN block scale" -- "$K3" dequant --input "$T/nv_nan2.st" --output "$T/o.st"
contains "$T/err" "0xFF, a NaN E4M3 code" "0xFF is a NaN code too"
nv_file "$T/nv_s2.st" 38 '\x00\x00\xc0\x7f'
expect 1 "dequant with a NaN scale_2" -- "$K3" dequant --input "$T/nv_s2.st" --output "$T/o.st"
contains "$T/err" "w_scale_2: element 0 is nan" "the NaN scale_2 is named"
nv_file "$T/nv_inf.st" 7e '\xff\xff\x7f\x7f'
expect 1 "dequant that overflows fp32" -- "$K3" dequant --input "$T/nv_inf.st" --output "$T/o.st"
contains "$T/err" "overflows fp32" "the overflow to Inf is reported"
printf '\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\x22\xff' >"$T/mx.data"
st_file "$T/mx_nan.st" '{"w":{"dtype":"U8","shape":[1,16],"data_offsets":[0,16]},"w_scale":{"dtype":"U8","shape":[1,1],"data_offsets":[16,17]}}' 0 "$T/mx.data"
expect 1 "dequant with a UE8M0 NaN block scale" -- "$K3" dequant --input "$T/mx_nan.st" --output "$T/o.st"
contains "$T/err" "w_scale: element 0 is 0xFF, a NaN UE8M0 code" "the UE8M0 NaN scale is named"

# ---- reader messages through the CLI ----------------------------------------------------------------------
st_file "$T/dupshape.st" '{"a":{"dtype":"U8","shape":[1,1,1,1,1],"shape":[1,1,1,1,1],"data_offsets":[0,1]}}' 1
expect 1 "a duplicate shape key" -- "$K3" dequant --input "$T/dupshape.st" --output "$T/o.st"
contains "$T/err" "duplicate key 'shape'" "a duplicate shape key is named as such"
st_file "$T/utf8.st" $'{"a\xc0\xaf":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}' 1
expect 1 "an overlong UTF-8 name" -- "$K3" quant nvfp4 --input "$T/utf8.st" --output "$T/o.st"
contains "$T/err" "at byte 11: invalid UTF-8" "the invalid UTF-8 byte offset is given"

# ---- usage messages ---------------------------------------------------------------------------------------
expect 2 "bench with no benchmark" -- "$K3" bench
contains "$T/err" "usage: k3 bench" "bench usage goes to stderr"
contains "$T/err" "moe" "bench usage lists moe"
[ ! -s "$T/out" ] && ok || bad "bench with no benchmark printed on stdout: $(head -c 200 "$T/out")"
expect 2 "info --arch 100.0" -- "$K3" info --arch 100.0
contains "$T/err" "MAJOR 1..99 and MINOR 0..9" "info --arch states the valid range"

finish
