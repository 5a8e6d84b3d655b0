# Sourced by the device scripts (device_run.sh, device_verify.sh, moe_device.sh): logs under $OUT, nvcc on the
# PATH, the sm_90a build directory, and one way to configure and build it.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
B=${K3_BIN:-build-dev}  # K3_BIN: a folder of prebuilt (carried) binaries instead
log() { echo "== $* ($(date +%T), ${SECONDS}s)"; }
# k3_build_dev [TARGET...]: configure (Release, sm_90a only) and build the targets (all when none); on failure
# print the end of the build log and exit.
k3_build_dev() {
    local targets=()
    [ $# -gt 0 ] && targets=(--target "$@")
    cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DK3_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" \
        >/tmp/k3-build.log 2>&1 && cmake --build $B -j16 ${targets[@]+"${targets[@]}"} >>/tmp/k3-build.log 2>&1 ||
        { tail -40 /tmp/k3-build.log; exit 1; }
}
