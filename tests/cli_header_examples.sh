#!/usr/bin/env bash
# The examples that open include/k3.h: each block from " * Example: NAME" to " * End of example" is wrapped in a
# main(), compiled with this build's C flags (the project's warnings, -Werror) against the built library, and
# run; it must exit 0. Two altered copies check that this harness notices a failure: one with an unused variable
# added (must not compile) and one that returns 1 first (must fail at run time).
# usage: bash tests/cli_header_examples.sh path/to/k3   (K3_SOURCE_DIR, K3_BINARY_DIR set by ctest)
set -u
NAME=cli_header_examples
. "$(dirname "$0")/lib_cli.sh"
. "${K3_BINARY_DIR:?}/k3_test_env.sh"
HDR=${K3_SOURCE_DIR:?}/include/k3.h

# extract NAME FILE: the body of example NAME, each line with the comment's " *" taken off, after a #line that
# points compiler messages at the header; exit 1 when the example or its end marker is missing
extract() {
    awk -v want=" * Example: $1" -v hdr="$HDR" '
        $0 == want { on = 1; printf "#line %d \"%s\"\n", NR + 1, hdr; next }
        on && $0 == " * End of example" { done = 1; exit }
        on { sub(/^ \*/, ""); print }
        END { exit done ? 0 : 1 }' "$HDR" >"$2"
}
# program BODY OUT.c: the example body wrapped into a whole program
program() {
    {
        printf '#include <math.h>\n#include <stdio.h>\n#include <stdlib.h>\n\n#include "k3.h"\n\n'
        printf 'static int example(void) {\n'
        cat "$1"
        printf '}\n\nint main(void) { return example(); }\n'
    } >"$2"
}
# build SRC EXE: this build's compiler and flags, linked to the built shared library
build() {
    # shellcheck disable=SC2086 # the flags are a list
    $K3_CC $K3_CFLAGS -I"$K3_SOURCE_DIR/include" "$1" -o "$2" -L"$K3_LIB_DIR" -Wl,-rpath,"$K3_LIB_DIR" -lk3 -lm
}

mapfile -t names < <(sed -n 's/^ \* Example: //p' "$HDR")
if [ "${#names[@]}" = 4 ]; then ok; else bad "want 4 examples in k3.h, found ${#names[@]}: ${names[*]}"; fi
for want in "linear" "routed experts" "latent MoE block" "checkpoint layer"; do
    found=0
    for n in "${names[@]}"; do [ "$n" = "$want" ] && found=1; done
    if [ $found = 1 ]; then ok; else bad "no example '$want' in k3.h"; fi
done

# the checkpoint example reads a layer: 2 experts of I 32, L 32 from F32 source values (every byte 0x3c, about
# 0.0115) written here as a safetensors file and quantized by `k3 quant nvfp4`
hdr='{"w13_weight":{"dtype":"F32","shape":[2,64,32],"data_offsets":[0,16384]},'
hdr+='"w2_weight":{"dtype":"F32","shape":[2,32,32],"data_offsets":[16384,24576]}}'
while [ $((${#hdr} % 8)) != 0 ]; do hdr="$hdr "; done
n=${#hdr}
{
    printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8 & 255)) \
        $((n >> 16 & 255)) $((n >> 24 & 255)))"
    printf '%s' "$hdr"
    head -c 24576 /dev/zero | tr '\000' '\074'
} >"$T/ck_src.safetensors"
expect 0 "k3 quant writes the checkpoint example's layer" -- "$K3" quant nvfp4 --tensor w13_weight --tensor w2_weight \
    --input "$T/ck_src.safetensors" --output "$T/ck.safetensors"
export K3_EXAMPLE_CHECKPOINT=$T/ck.safetensors

i=0
for n in "${names[@]}"; do
    i=$((i + 1))
    if ! extract "$n" "$T/body$i.c"; then
        bad "example '$n': no 'End of example' line"
        continue
    fi
    program "$T/body$i.c" "$T/ex$i.c"
    expect 0 "example '$n' compiles" -- build "$T/ex$i.c" "$T/ex$i"
    [ -x "$T/ex$i" ] || continue
    expect 0 "example '$n' runs" -- "$T/ex$i"
done

# the harness itself: a broken example must be reported
if [ -s "$T/body1.c" ]; then
    { head -n 1 "$T/body1.c"; echo "    int k3_unused_probe;"; tail -n +2 "$T/body1.c"; } >"$T/unused.c"
    program "$T/unused.c" "$T/bad_compile.c"
    expect 1 "an example with an unused variable does not compile (-Werror)" -- build "$T/bad_compile.c" "$T/bad1"
    { head -n 1 "$T/body1.c"; echo "    if (k3_version()) return 1;"; tail -n +2 "$T/body1.c"; } >"$T/fails.c"
    program "$T/fails.c" "$T/bad_run.c"
    if build "$T/bad_run.c" "$T/bad2" 2>"$T/err"; then
        expect 1 "an example that returns 1 fails" -- "$T/bad2"
    else
        bad "the failing-at-run-time probe did not compile: $(head -c 300 "$T/err")"
    fi
fi

finish
