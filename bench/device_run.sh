#!/usr/bin/env bash
# One call on the lent H200 (the `device` tool), in stages so a call fits its 10-minute limit:
#   bench/device_run.sh build      configure + build for sm_90a only (the device's part), k3 info
#   bench/device_run.sh test       ctest (GPU tests run), compute-sanitizer memcheck + racecheck on the GPU tests
#   bench/device_run.sh tune       k3 tune over the K3 shape set -> $OUT/sm90.txt, then re-embed it and rerun
#                                  gpu_linear on every row of the new table
#   bench/device_run.sh gemm       k3 bench gemm with tables/sm90.txt
#   bench/device_run.sh kda        k3 bench kda with tables/sm90.txt
#   bench/device_run.sh demo       k3 demo
# Several stages may be given in order. Logs go to $OUT (at most 8 files come back).
. "$(dirname "$0")/device_common.sh"
for stage in "$@"; do
    case "$stage" in
    build)
        log build
        k3_build_dev
        $B/k3 info | tee "$OUT/info.txt"
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >>"$OUT/info.txt"
        ;;
    test)
        log ctest
        (cd $B && ctest --output-on-failure ${CTEST_EXCLUDE:+-E $CTEST_EXCLUDE}) >"$OUT/ctest.log" 2>&1
        grep -E "tests passed|Passed|Failed|Skipped|\*\*\*|passed, " "$OUT/ctest.log" | tail -30
        log sanitizers
        {
            for t in ${SANITIZE_TESTS:-gpu_kda_proj gpu_gemm_kernels}; do
                for tool in memcheck racecheck; do
                    # racecheck of gpu_kda_proj without its cuBLASLt variant: cuBLASLt's own kernels report hazards
                    args=""
                    [ "$tool" = racecheck ] && [ "$t" = gpu_kda_proj ] && args=--no-cublaslt
                    echo "--- $tool $t $args"
                    K3T_GEMM_QUICK=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/$t $args 2>&1 | tail -3
                    echo "exit ${PIPESTATUS[0]}"
                done
            done
            echo "--- synccheck gpu_kda_proj"
            timeout 150 compute-sanitizer --tool synccheck --error-exitcode 9 $B/gpu_kda_proj 2>&1 | tail -3
            echo "exit ${PIPESTATUS[0]}"
        } >"$OUT/sanitize.log" 2>&1
        cat "$OUT/sanitize.log"
        ;;
    tune)
        log tune
        t0=$SECONDS
        $B/k3 tune --out "$OUT/sm90.txt" --note "tuned by bench/device_run.sh" 2>"$OUT/tune.log"
        echo "k3 tune: $((SECONDS - t0)) s wall"
        tail -5 "$OUT/tune.log"
        cp "$OUT/sm90.txt" tables/sm90.txt && cmake --build $B -j16 >/dev/null 2>&1 && $B/k3 plan | head -40
        log gpu_linear on the tuned table
        $B/gpu_linear >"$OUT/gpu_linear.log" 2>&1
        grep -c FAIL "$OUT/gpu_linear.log"; grep FAIL "$OUT/gpu_linear.log" | head -8; tail -3 "$OUT/gpu_linear.log"
        ;;
    gemm)
        log bench gemm
        $B/k3 bench gemm --table tables/sm90.txt >"$OUT/bench_gemm.txt" 2>&1
        tail -30 "$OUT/bench_gemm.txt"
        ;;
    kda)
        log bench kda
        $B/k3 bench kda --table tables/sm90.txt >"$OUT/bench_kda.txt" 2>&1
        cat "$OUT/bench_kda.txt"
        ;;
    demo)
        log demo
        $B/k3 demo 2>&1 | tail -14
        ;;
    *) echo "unknown stage $stage"; exit 2 ;;
    esac
done
