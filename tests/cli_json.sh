#!/usr/bin/env bash
# --json of k3 quant, k3 dequant and k3 demo: stdout holds one JSON object and nothing else, its numbers are those
# of the files (sizes from the file system, tensor names and counts from the files' own headers, read here by
# python), names with quotes, backslashes and control characters come back exactly; progress lines and --quiet.
# Skipped (77) without python3 (the JSON is parsed with its json module).
# usage: bash tests/cli_json.sh path/to/k3
set -u
NAME=cli_json
. "$(dirname "$0")/lib_cli.sh"
PY=$(command -v python3 || true)
if [ -z "$PY" ]; then
    echo "SKIPPED: python3 is needed to parse the JSON"
    exit 77
fi

# jcheck FILE EXPR DESCRIPTION: EXPR (python) on d = the JSON object of FILE, which must hold nothing else;
# h(PATH) is the safetensors header of a file (a dict without __metadata__), size(PATH) its byte count
jcheck() {
    if "$PY" - "$1" "$2" <<'PYEOF'; then ok; else bad "$3: $2 ($(head -c 600 "$1"))"; fi
import json, os, struct, sys
text = open(sys.argv[1], encoding="utf-8").read()
assert text.startswith("{") and text.endswith("}\n") and text.count("\n") == 1, "one object on one line"
d = json.loads(text)  # refuses anything after the object
def h(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hd = json.loads(f.read(n))
    hd.pop("__metadata__", None)
    return hd
def size(path):
    return os.path.getsize(path)
sys.exit(0 if eval(sys.argv[2]) else 1)
PYEOF
}

# ---- fixture: F32 tensors, two of them named with characters JSON must escape ---------------------------
IN="$T/in.safetensors"
"$PY" - "$IN" <<'PYEOF' || { echo "FAIL: fixture"; exit 1; }
import json, struct, sys
names = [("w", [2, 64]), ('q"uote\\back', [1, 32]), ("ctl\x01tab\tnl\n", [3, 16]), ("bias", [4]), ("odd", [2, 8])]
hdr, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
for i, (n, shape) in enumerate(names):
    count = 1
    for s in shape:
        count *= s
    b = struct.pack("<%df" % count, *[((j * 7 + i) % 13 - 6) * 0.5 for j in range(count)])
    hdr[n] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(b)]}
    off += len(b)
    blobs.append(b)
h = json.dumps(hdr).encode()
h += b" " * ((8 - (8 + len(h)) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PYEOF
NAMES_Q='["w", "q\"uote\\back", "ctl\x01tab\tnl\n"]'

# ---- help --------------------------------------------------------------------------------------------------
for c in quant dequant; do
    expect 0 "$c --help" -- "$K3" $c --help
    for o in --json --quiet --progress-after bytes_in tensors_out; do contains "$T/out" "$o" "$c --help documents $o"; done
done
expect 0 "demo --help" -- "$K3" demo --help
for o in --json total_ms rel_l2 correctness block_us percent_of_floor "k3 bench block"; do
    contains "$T/out" "$o" "demo --help documents $o"
done
expect 2 "--progress-after -1" -- "$K3" quant nvfp4 --input "$IN" --output "$T/q" --progress-after -1
expect 2 "--progress-after x" -- "$K3" dequant --input "$IN" --output "$T/q" --progress-after x
expect 2 "--progress-after without a value" -- "$K3" quant nvfp4 --input "$IN" --output "$T/q" --progress-after

# ---- quant nvfp4 --json --------------------------------------------------------------------------------------
Q="$T/q.safetensors"
expect 0 "quant nvfp4 --json" -- "$K3" quant nvfp4 --input "$IN" --output "$Q" --json
cp "$T/out" "$T/qj"
jcheck "$T/qj" "d['command'] == 'quant' and d['input'] == '$IN' and d['output'] == '$Q'" "quant: command and paths"
jcheck "$T/qj" "d['format'] == 'nvfp4' and d['scale_layout'] == 'linear' and 'dtype' not in d" "quant: format"
jcheck "$T/qj" "d['tensors_in'] == 5 and d['tensors_in'] == len(h('$IN'))" "quant: tensors_in"
jcheck "$T/qj" "d['quantized'] == $NAMES_Q and d['quantized_count'] == 3" "quant: names escaped and back exactly"
jcheck "$T/qj" "d['copied'] == ['bias', 'odd'] and d['copied_count'] == 2" "quant: copied"
jcheck "$T/qj" "d['tensors_out'] == len(h('$Q')) == 11" "quant: tensors_out is the output's count (3 x 3 + 2)"
jcheck "$T/qj" "all(n + s in h('$Q') for n in d['quantized'] for s in ('', '_scale', '_scale_2'))" "quant: names real"
jcheck "$T/qj" "d['bytes_in'] == size('$IN') and d['bytes_out'] == size('$Q')" "quant: bytes are the file sizes"
jcheck "$T/qj" "isinstance(d['seconds'], float) and 0 <= d['seconds'] < 60" "quant: seconds"
contains "$T/err" "quantized to nvfp4" "the summary line goes to stderr"
if grep -aq "tensor 1 of" "$T/err"; then bad "a fast quant prints no progress by default"; else ok; fi

# progress lines (from the first tensor) and --quiet
expect 0 "quant --progress-after 0" -- "$K3" quant nvfp4 --input "$IN" --output "$Q" --progress-after 0 --json
[ "$(grep -ac '^k3 quant: tensor [1-5] of 5: ' "$T/err")" = 5 ] && ok || bad "one progress line per tensor: $(cat "$T/err")"
contains "$T/err" "k3 quant: writing the output file" "the writing step is announced"
jcheck "$T/out" "d['quantized_count'] == 3" "progress leaves stdout to the object"
expect 0 "quant --quiet --progress-after 0" -- "$K3" quant nvfp4 --input "$IN" --output "$Q" --quiet --progress-after 0
[ ! -s "$T/out" ] && ok || bad "without --json stdout stays empty: $(head -c 200 "$T/out")"
if grep -aq "tensor 1 of\|quantized to" "$T/err"; then bad "--quiet: no progress, no summary"; else ok; fi
contains "$T/err" "keeping odd unquantized" "--quiet keeps the notes"

# mxfp4 swizzled, only one named tensor, written over its own input (bytes_in is the input's size before)
cp "$IN" "$T/inplace.safetensors"
before=$(wc -c <"$T/inplace.safetensors")
expect 0 "quant mxfp4 in place" -- "$K3" quant mxfp4 --scale-layout swizzled --tensor w --input "$T/inplace.safetensors" \
    --output "$T/inplace.safetensors" --json
jcheck "$T/out" "d['format'] == 'mxfp4' and d['scale_layout'] == 'swizzled' and d['quantized'] == ['w']" "mxfp4 --tensor w"
jcheck "$T/out" "d['copied_count'] == 4 and d['tensors_out'] == 6 == len(h('$T/inplace.safetensors'))" "mxfp4 counts"
jcheck "$T/out" "d['bytes_in'] == $before and d['bytes_out'] == size('$T/inplace.safetensors')" "in place: bytes"

# ---- dequant --json --------------------------------------------------------------------------------------------
D="$T/d.safetensors"
expect 0 "dequant --json" -- "$K3" dequant --input "$Q" --output "$D" --dtype bf16 --json
cp "$T/out" "$T/dj"
jcheck "$T/dj" "d['command'] == 'dequant' and d['input'] == '$Q' and d['output'] == '$D'" "dequant: paths"
jcheck "$T/dj" "d['format'] == 'nvfp4' and d['scale_layout'] == 'linear' and d['dtype'] == 'bf16'" "dequant: format"
jcheck "$T/dj" "d['dequantized'] == $NAMES_Q and d['dequantized_count'] == 3" "dequant: names"
jcheck "$T/dj" "sorted(d['dropped']) == sorted(n + s for n in $NAMES_Q for s in ('_scale', '_scale_2'))" "dequant: dropped"
jcheck "$T/dj" "d['dropped_count'] == 6 and d['copied'] == ['bias', 'odd'] and d['tensors_in'] == 11" "dequant: counts"
jcheck "$T/dj" "d['tensors_out'] == len(h('$D')) == 5 and all(h('$D')[n]['dtype'] == 'BF16' for n in d['dequantized'])" \
    "dequant: tensors_out"
jcheck "$T/dj" "d['bytes_in'] == size('$Q') and d['bytes_out'] == size('$D')" "dequant: bytes"
expect 0 "dequant of the swizzled mxfp4 file" -- "$K3" dequant --input "$T/inplace.safetensors" --output "$D" --json
jcheck "$T/out" "d['format'] == 'mxfp4' and d['scale_layout'] == 'swizzled' and d['dropped'] == ['w_scale']" "mxfp4"
expect 0 "dequant of a file with nothing quantized" -- "$K3" dequant --input "$IN" --output "$D" --json
jcheck "$T/out" "d['format'] is None and d['scale_layout'] is None and d['dequantized'] == [] and d['copied_count'] == 5" \
    "nothing to expand: format null"

# ---- failures: nothing on stdout -------------------------------------------------------------------------------
expect 1 "quant --json of a missing file" -- "$K3" quant nvfp4 --input "$T/missing" --output "$Q" --json
[ ! -s "$T/out" ] && ok || bad "a failed quant --json prints nothing on stdout"
printf 'junk' >"$T/junk"
expect 1 "dequant --json of junk" -- "$K3" dequant --input "$T/junk" --output "$D" --json
[ ! -s "$T/out" ] && ok || bad "a failed dequant --json prints nothing on stdout"

# ---- demo --json (the TP8 block on the CPU: about 2.2 GB of host memory and several seconds) ---------------------
expect 0 "demo --json" -- "$K3" demo --device cpu --m 1 --json
jcheck "$T/out" "d['command'] == 'demo' and d['backend'] == 'cpu' and d['m'] == [1] and d['pass'] is True" "demo: basics"
jcheck "$T/out" "d['shape'] == {'experts': 896, 'top_k': 16, 'hidden': 7168, 'latent': 3584, 'inter': 384, 'shared_inter': 768}" \
    "demo: the TP8 shape"
jcheck "$T/out" "len(d['runs']) == 1 and d['runs'][0]['m'] == 1 and d['runs'][0]['total_ms'] > 0" "demo: the run"
jcheck "$T/out" "all(d['runs'][0][k] >= 0 for k in ('router_ms', 'down_ms', 'experts_ms', 'norm_up_ms', 'shared_ms'))" \
    "demo: per-stage times on the CPU"
jcheck "$T/out" "d['copy_seconds'] is None and d['weights_bytes_fp4'] > 2e9 and d['total_seconds'] >= d['weights_seconds']" \
    "demo: weights"
jcheck "$T/out" "d['correctness']['pass'] is True and d['correctness']['bitwise_identical'] is True and d['correctness']['m'] == 4" \
    "demo: correctness"
contains "$T/err" "correctness (cpu" "demo --json: the human lines go to stderr"
contains "$T/err" "total ms" "demo --json: the table goes to stderr"

# ---- demo --json on a GPU (where this build has CUDA and sees one): `k3 bench block`'s row per M ------------------
if "$K3" info --json 2>/dev/null | grep -q '"backend": "cuda"'; then
    expect 0 "demo --device cuda --json" -- "$K3" demo --device cuda --m 1,4 --json
    jcheck "$T/out" "d['backend'] == 'cuda' and d['cpu_fallback'] is False and d['m'] == [1, 4] and d['pass'] is True" \
        "demo cuda: basics"
    jcheck "$T/out" "d['copies'] >= 2 and d['reps'] >= 7 and d['copy_seconds'] > 0" "demo cuda: the method's numbers"
    ROW="{'m', 'block_us', 'router_us', 'down_us', 'experts_us', 'norm_up_us', 'shared_us', 'stages_sum_us', \
'composition_us', 'main_path_us', 'block_over_main_path', 'experts_touched', 'bytes', 'floor_us', \
'percent_of_floor', 'schedule'}"
    STAGES="('router_us', 'down_us', 'experts_us', 'norm_up_us', 'shared_us')"
    jcheck "$T/out" "[r['m'] for r in d['runs']] == [1, 4] and all(set(r) == $ROW for r in d['runs'])" \
        "demo cuda: the fields of bench block --json"
    jcheck "$T/out" "all(r['block_us'] > 0 and all(r[k] > 0 for k in $STAGES) for r in d['runs'])" "demo cuda: times"
    jcheck "$T/out" "all(r['schedule'] in ('shared-beside', 'router-beside', 'serial', 'select-beside', 'logits-first') for r in d['runs'])" \
        "demo cuda: the schedule each M ran"
    jcheck "$T/out" "all(abs(r['stages_sum_us'] - sum(r[k] for k in $STAGES)) < 0.01 and \
abs(r['composition_us'] - (r['block_us'] - r['stages_sum_us'])) < 0.01 for r in d['runs'])" "demo cuda: sum, composition"
    jcheck "$T/out" "all(abs(r['main_path_us'] - (r['stages_sum_us'] - r['shared_us'])) < 0.01 and \
abs(r['block_over_main_path'] - r['block_us'] / r['main_path_us']) < 1e-3 for r in d['runs'])" "demo cuda: the main path"
    # bytes as docs/benchmarks.md counts them at the TP8 rank (H 7168, L 3584, I 384, Is 768): BF16 router gate
    # [896, H], down and up [L, H], shared [3 Is, H], the norm [L]; x and y [m, H]; per touched expert its FP4 W13
    # [2I, L] and W2 [L, I], one e4m3 scale per 16 values and two fp32 scale_2
    DENSE=$((2 * (896 * 7168 + 2 * 3584 * 7168 + 3 * 768 * 7168 + 3584)))
    PER=$((3 * 384 * 3584 / 2 + 3 * 384 * 3584 / 16 + 8))
    jcheck "$T/out" "d['runs'][0]['experts_touched'] == 16 and 16 <= d['runs'][1]['experts_touched'] <= 64" \
        "demo cuda: experts touched"
    jcheck "$T/out" "all(r['bytes'] == $DENSE + $PER * r['experts_touched'] + 4 * 7168 * r['m'] for r in d['runs'])" \
        "demo cuda: bytes"
    jcheck "$T/out" "abs(d['runs'][0]['bytes'] - 185.8e6) < 0.1e6" "demo cuda: M 1 reads the 185.8 MB of the docs"
    jcheck "$T/out" "all(abs(r['floor_us'] - r['bytes'] / 4.37e6) < 2e-3 and \
abs(r['percent_of_floor'] - 100 * r['floor_us'] / r['block_us']) < 0.02 for r in d['runs'])" "demo cuda: floor"
    jcheck "$T/out" "d['correctness']['against'] == 'cpu reference backend' and d['correctness']['ids_identical'] is True" \
        "demo cuda: correctness against the CPU"
    for o in "block us" "stages sum" "% floor" "CUDA-graph replay" "correctness (cuda)"; do
        contains "$T/err" "$o" "demo cuda --json: the table on stderr has '$o'"
    done
fi

finish
