#!/usr/bin/env bash
# Guards what tables/sm90.txt was measured under: the blocks per SM of every kernel instance its rows choose.
# Why: one-wave grids under PDL are sensitive to that cap. An unrelated epilogue edit once took w2_t1_u4_c2_l_h2
# from 130 to 128 registers, i.e. from 7 to 8 blocks per SM, and made 6144x7168 at M 1-8 markedly slower on the
# H200 with no change to that kernel's code (bench/NOTES-gemm.md). So a change of any instance's occupancy must
# be seen, and the table re-tuned (or the change undone), before it ships.
# The expected list, tests/data/sm90_gemm_occupancy.txt, holds the blocks per SM of the build the table was tuned
# with (the tuner run recorded in bench/RESULTS.md, nvcc 13.0). It is compared only under the nvcc release it
# names; under another release this test reports skipped, since the table's measurements then say nothing about
# the compiled kernels.
# Needs nvcc only (no GPU); skipped (77) without it or in a build without the CUDA backend. Usage: bash tests/cli_gemm_occupancy.sh path/to/k3 (unused).
set -u
NAME=cli_gemm_occupancy
src="${K3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"
. "$src/tests/lib_cli.sh"
if [ "${K3_HAVE_CUDA:-ON}" = "OFF" ]; then echo "SKIPPED: a build without the CUDA backend (its CUDA build runs this)"; exit 77; fi
nvcc_bin="$(nvcc_path)"
if [ -z "$nvcc_bin" ]; then echo "SKIPPED: no nvcc"; exit 77; fi
expected="$src/tests/data/sm90_gemm_occupancy.txt"
have_ver=$("$nvcc_bin" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
want_ver=$(awk '$1 == "nvcc" { print $2 }' "$expected")
if [ "$have_ver" != "$want_ver" ]; then
    echo "SKIPPED: tables/sm90.txt was tuned with kernels from nvcc $want_ver; this is nvcc $have_ver"
    exit 77
fi

# ptxas's resource report of the kernel families for sm_90a, as the library builds them
for f in mma mma_wt mma_bulk skinny; do
    if "$nvcc_bin" -c -DK3_HAVE_CUDA=1 -I"$src/include" -I"$src/src" -O3 -DNDEBUG --expt-relaxed-constexpr -std=c++17 -lineinfo \
        -gencode arch=compute_90a,code=sm_90a -Xptxas -v "$src/src/cuda/gemm/$f.cu" -o "$T/$f.o" >"$T/$f.log" 2>&1; then
        ok
    else
        bad "nvcc $f.cu: $(grep -m3 error "$T/$f.log")"
    fi
done
[ "$fail" -eq 0 ] || { finish; exit 1; }

# "mma W,T,U,C,PF,MINB,L2B,PIPE,NT regs smem" / "mmawt W,T,U,MINB,NT regs smem" / "mmabulk W,BK,SMEM_KB,C,NT regs
# smem" / "skinny THR,ROWS,UNROLL,SK,M regs smem" for every entry function (smem: static shared memory)
cat "$T/mma.log" "$T/mma_wt.log" "$T/mma_bulk.log" "$T/skinny.log" | awk '
    /Compiling entry function/ {
        name = $0; sub(/.*entry function .*k3_/, "", name)
        kind = name ~ /^mma_wt_kernel/ ? "mmawt" : name ~ /^mma_bulk_kernel/ ? "mmabulk" : name ~ /^mma_kernel/ ? "mma" : "skinny"
        args = ""; s = name
        while (match(s, /L[ib][0-9]+E/)) {
            a = substr(s, RSTART + 2, RLENGTH - 3); args = args (args == "" ? "" : ",") a
            s = substr(s, RSTART + RLENGTH)
        }
        next
    }
    /Used [0-9]+ registers/ {
        regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
        smem = 0; if ($0 ~ /bytes smem/) { smem = $0; sub(/ bytes smem.*/, "", smem); sub(/.*, /, "", smem) }
        print kind, args, regs, smem
    }' >"$T/res.txt"

# the configurations' template arguments (src/plan/gemm_configs.def; K3_PF_HEAD 100, K3_PF_ALL 99)
awk -F'[(),]' '
    function num(x,   n, p, i, v) { gsub(/K3_PF_HEAD/, "100", x); gsub(/K3_PF_ALL/, "99", x); gsub(/ /, "", x)
                                    n = split(x, p, "+"); v = 0; for (i = 1; i <= n; i++) v += p[i]; return v }
    /^K3_GEMM_MMA\(/    { gsub(/ /, "", $2); print "mma", $2, "mma", num($3) "," num($4) "," num($5) "," num($6) "," num($7) "," num($8) "," num($9) "," num($10) }
    /^K3_GEMM_MMA_WT\(/ { gsub(/ /, "", $2); print "mma", $2, "mmawt", num($3) "," num($4) "," num($5) "," num($6) }
    /^K3_GEMM_MMA_BULK\(/ { gsub(/ /, "", $2); print "mma", $2, "mmabulk", num($3) "," num($4) "," num($5) "," num($6) }
    /^K3_GEMM_SKINNY\(/ { gsub(/ /, "", $2); print "skinny", $2, "skinny", num($3) "," num($4) "," num($5) "," num($6) }
' "$src/src/plan/gemm_configs.def" >"$T/cfg.txt"

# every (configuration, token tiles or M) a row of the table chooses, its blocks per SM on an SM90 SM (65,536
# registers allocated per warp in 256s, 2,048 threads, 32 blocks, 228 KB of shared memory with 1 KB reserved
# per block)
awk -v cfgf="$T/cfg.txt" -v resf="$T/res.txt" '
    BEGIN {
        while ((getline l < cfgf) > 0) { split(l, f, " "); rkind[f[1] " " f[2]] = f[3]; cfg[f[1] " " f[2]] = f[4] }
        while ((getline l < resf) > 0) { split(l, f, " "); regs[f[1] " " f[2]] = f[3]; smem[f[1] " " f[2]] = f[4] }
    }
    $1 ~ /^[0-9]+$/ && ($4 == "mma" || $4 == "skinny") {
        n = split($3, r, "-"); lo = r[1]; hi = n > 1 ? r[2] : r[1]
        for (m = lo; m <= hi; m++) {
            key = $4 " " $5
            if (!(key in cfg)) { print "UNKNOWN", key; continue }
            dyn = 0
            if (rkind[key] == "mmabulk") {
                # threads: the consumer warps + the producer warp; dynamic shared memory: the ring, as
                # src/cuda/gemm/mma_bulk.cu sizes it (whole stages of 16 rows x (2 bk + 64) bytes, at least 2)
                split(cfg[key], a, ","); arg = cfg[key] "," (m <= 8 ? 1 : 2); thr = 32 * (a[1] + 1); unit = "nt" (m <= 8 ? 1 : 2)
                sb = 16 * (2 * a[2] + 64); st = int(a[3] * 1024 / sb); if (st < 2) st = 2; dyn = st * sb
            } else if ($4 == "mma") { split(cfg[key], a, ","); arg = cfg[key] "," (m <= 8 ? 1 : 2); thr = 32 * a[1]; unit = "nt" (m <= 8 ? 1 : 2) }
            else { split(cfg[key], a, ","); arg = cfg[key] "," m; thr = a[1]; unit = "m" m }
            rk = rkind[key] " " arg
            if (!(rk in regs)) { print "NOINSTANCE", key, unit; continue }
            wregs = int((regs[rk] * 32 + 255) / 256) * 256
            b = int(int(65536 / wregs) / (thr / 32))
            t = int(2048 / thr); if (t < b) b = t
            s = int(233472 / (smem[rk] + dyn + 1024)); if (s < b) b = s
            if (b > 32) b = 32
            print $4, $5, unit, b
        }
    }' "$src/tables/sm90.txt" | sort -u >"$T/have.txt"

grep -E '^(mma|skinny) ' "$expected" | sort -u >"$T/want.txt"
if grep -qE '^(UNKNOWN|NOINSTANCE)' "$T/have.txt"; then
    bad "table rows without a compiled instance: $(grep -E '^(UNKNOWN|NOINSTANCE)' "$T/have.txt" | tr '\n' ';')"
fi
n_have=$(grep -cE '^(mma|skinny) ' "$T/have.txt")
if diff "$T/want.txt" <(grep -E '^(mma|skinny) ' "$T/have.txt") >"$T/diff.txt"; then
    ok
    echo "sm90 table: $n_have kernel instances, blocks per SM as tuned"
else
    bad "blocks per SM differ from those tables/sm90.txt was tuned with (< tuned, > now):"
    cat "$T/diff.txt" >&2
fi
finish
