#!/usr/bin/env bash
# The verification call before a stop (one `run` on the lent H200): builds everything for sm_90a, runs every test
# (the GPU tests really run there), repeats gpu_gemm_kernels (its PDL chain check once failed intermittently),
# runs compute-sanitizer on the GPU tests named in SAN (memcheck + racecheck, quick modes), then the benchmarks of
# the three GPU issues and the demo. Logs go to $OUT (at most 8 files come back); a summary goes to stdout.
#   SAN="gpu_moe:0 gpu_kda_proj"   tests to sanitize; "test:G" limits gpu_moe to groups G (K3_MOE_GROUPS)
#   SAN_TOOLS="memcheck racecheck"  compute-sanitizer tools run on each of them (synccheck too for issue 5)
#   STAGES="build test san moe gemm kda demo"
. "$(dirname "$0")/device_common.sh"
for stage in ${STAGES:-build test san moe gemm kda demo}; do
    case "$stage" in
    build)
        log build
        k3_build_dev
        { $B/k3 info; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; } >"$OUT/info.txt"
        ;;
    test)
        log ctest
        (cd $B && timeout 300 ctest --output-on-failure -j 4) >"$OUT/tests.log" 2>&1
        echo "ctest exit $?"
        grep -E "tests passed|Failed|\*\*\*|Skipped" "$OUT/tests.log" | tail -12
        for i in 1 2 3; do
            timeout 60 $B/gpu_gemm_kernels >/tmp/ggk.log 2>&1
            echo "gpu_gemm_kernels repeat $i: exit $? $(tail -1 /tmp/ggk.log)"
            grep -m3 FAIL /tmp/ggk.log
        done >>"$OUT/tests.log"
        tail -6 "$OUT/tests.log"
        ;;
    san)
        log sanitizers
        for spec in ${SAN:-gpu_moe:0 gpu_kda_proj}; do
            t=${spec%%:*}
            g=""
            [ "$spec" != "$t" ] && g=${spec#*:}
            for tool in ${SAN_TOOLS:-memcheck racecheck}; do
                # racecheck of gpu_kda_proj without its cuBLASLt variant: cuBLASLt's own kernels report hazards
                args=""
                [ "$tool" = racecheck ] && [ "$t" = gpu_kda_proj ] && args=--no-cublaslt
                echo "--- $tool $t ${g:+groups $g} $args"
                env K3T_GEMM_QUICK=1 K3_MOE_QUICK=1 K3_MOE_NOFORK=1 ${g:+K3_MOE_GROUPS=$g} timeout 90 \
                    compute-sanitizer --tool $tool --error-exitcode 9 $B/$t $args >/tmp/san.log 2>&1
                echo "exit $?"
                grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed, " /tmp/san.log | tail -2
                grep -oE "(Race reported|Invalid|Error:).{0,60}at [A-Za-z_0-9]+" /tmp/san.log | sort | uniq -c | head -4
            done
        done >"$OUT/sanitize.log" 2>&1
        cat "$OUT/sanitize.log"
        ;;
    moe)
        log bench moe
        timeout 150 $B/k3 bench moe --m 1,4,16 --reps 7 --stages >"$OUT/bench_moe.txt" 2>&1
        echo "exit $?"
        grep -vE "^\s*$" "$OUT/bench_moe.txt" | tail -16
        ;;
    gemm)
        log bench gemm
        timeout 200 $B/k3 bench gemm --table tables/sm90.txt >"$OUT/bench_gemm.txt" 2>&1
        echo "exit $?"
        tail -4 "$OUT/bench_gemm.txt"
        ;;
    kda)
        log bench kda
        timeout 90 $B/k3 bench kda --reps 21 --table tables/sm90.txt >"$OUT/bench_kda.txt" 2>&1
        echo "exit $?"
        tail -20 "$OUT/bench_kda.txt"
        ;;
    demo)
        log demo
        timeout 60 $B/k3 demo >"$OUT/demo.txt" 2>&1
        echo "exit $?"
        tail -8 "$OUT/demo.txt"
        ;;
    *) echo "unknown stage $stage"; exit 2 ;;
    esac
done
log done
