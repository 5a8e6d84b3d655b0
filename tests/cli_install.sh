#!/usr/bin/env bash
# The install boundary: `cmake --install` of this build folder (installs what was built, rebuilds nothing) into a
# temporary prefix, the files it must hold (header, libk3.so with its SONAME, libk3.a, the CMake package, the
# pkg-config file, the CLI), then one small C program built against the installed tree alone, four ways:
# find_package(k3kernels) with k3kernels::k3 and with k3kernels::k3_static, and cc with pkg-config's flags, shared
# and static (Libs.private). Each program runs on the CPU backend: k3_version() against the header's version
# macros, and one k3_linear_run against values worked out by hand. In a CUDA build the same programs link the CUDA
# runtime and cuBLASLt through the package.
# usage: bash tests/cli_install.sh path/to/k3   (K3_SOURCE_DIR, K3_BINARY_DIR set by ctest)
set -u
NAME=cli_install
. "$(dirname "$0")/lib_cli.sh"
. "${K3_BINARY_DIR:?}/k3_test_env.sh"

P=$T/prefix
LIB=$P/$K3_INSTALL_LIBDIR
expect 0 "cmake --install into a temporary prefix" -- "$K3_CMAKE" --install "$K3_BINARY_DIR" --prefix "$P"
for f in "$K3_INSTALL_INCLUDEDIR/k3.h" "$K3_INSTALL_LIBDIR/libk3.a" "$K3_INSTALL_LIBDIR/libk3.so" \
    "$K3_INSTALL_LIBDIR/cmake/k3kernels/k3kernelsConfig.cmake" \
    "$K3_INSTALL_LIBDIR/cmake/k3kernels/k3kernelsConfigVersion.cmake" \
    "$K3_INSTALL_LIBDIR/pkgconfig/k3kernels.pc" "$K3_INSTALL_BINDIR/k3"; do
    if [ -e "$P/$f" ]; then ok; else bad "not installed: $f"; fi
done
if cmp -s "$K3_SOURCE_DIR/include/k3.h" "$P/$K3_INSTALL_INCLUDEDIR/k3.h"; then ok; else bad "installed k3.h differs"; fi
# libk3.so -> libk3.so.MAJOR.MINOR (the SONAME: before 1.0 a minor version may change the ABI) -> the file
soname=$(objdump -p "$LIB/libk3.so" 2>/dev/null | awk '$1 == "SONAME" { print $2 }')
if [ "$soname" = "libk3.so.${K3_VERSION%.*}" ] && [ -e "$LIB/$soname" ]; then ok; else
    bad "SONAME '$soname', want libk3.so.${K3_VERSION%.*} (installed beside libk3.so)"; fi
expect 0 "the installed CLI runs" -- "$P/$K3_INSTALL_BINDIR/k3" --version
contains "$T/out" "k3 $K3_VERSION" "installed CLI version"

mkdir -p "$T/src"
cat >"$T/src/consumer.c" <<'C'
/* A user of the installed library: the version, then y = x . W^T for one token on the CPU backend. */
#include <k3.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", K3_VERSION_MAJOR, K3_VERSION_MINOR, K3_VERSION_PATCH);
    if (strcmp(k3_version(), want) != 0) {
        fprintf(stderr, "k3_version() is %s, the header says %s\n", k3_version(), want);
        return 1;
    }
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    k3_ctx *ctx = NULL;
    if (k3_ctx_create(&opt, &ctx) != K3_STATUS_SUCCESS) return 1;
    /* x = 1..8; W rows: all ones, +-0.5 alternating, (2, 0, ..., 0, -1): y = 36, -2, 2 - 8 = -6 */
    const float wv[3][8] = {{1, 1, 1, 1, 1, 1, 1, 1}, {0.5f, -0.5f, 0.5f, -0.5f, 0.5f, -0.5f, 0.5f, -0.5f},
                            {2, 0, 0, 0, 0, 0, 0, -1}};
    const float want_y[3] = {36, -2, -6};
    _Alignas(16) uint16_t x[8]; /* the linear run reads 16-byte vectors */
    _Alignas(16) uint16_t w[24];
    _Alignas(16) uint16_t y[3];
    for (int i = 0; i < 8; i++) x[i] = k3_bf16_from_f32((float)(i + 1));
    for (int i = 0; i < 24; i++) w[i] = k3_bf16_from_f32(wv[i / 8][i % 8]);
    k3_linear_desc d;
    k3_linear_desc_init(&d, 3, 8);
    d.max_m = 1;
    k3_linear_plan *plan = NULL;
    size_t ws_bytes = 0;
    int rc = 1;
    if (k3_linear_plan_create(ctx, &d, &plan) == K3_STATUS_SUCCESS &&
        k3_linear_workspace_size(plan, &ws_bytes) == K3_STATUS_SUCCESS && ws_bytes == 0 &&
        k3_linear_run(plan, 1, x, w, NULL, y, NULL, 0, NULL) == K3_STATUS_SUCCESS) {
        rc = 0;
        for (int n = 0; n < 3; n++)
            if (k3_bf16_to_f32(y[n]) != want_y[n]) rc = 1;
        printf("k3kernels %s: y = %g %g %g (want 36 -2 -6)\n", k3_version(), k3_bf16_to_f32(y[0]),
               k3_bf16_to_f32(y[1]), k3_bf16_to_f32(y[2]));
    } else {
        fprintf(stderr, "linear: %s (workspace %zu bytes)\n", k3_ctx_last_error(ctx), ws_bytes);
    }
    k3_linear_plan_destroy(plan);
    k3_ctx_destroy(ctx);
    return rc;
}
C
cat >"$T/src/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.22)
project(k3_consumer LANGUAGES C)
find_package(k3kernels 0.1 REQUIRED)
add_executable(use_shared consumer.c)
target_link_libraries(use_shared PRIVATE k3kernels::k3)
add_executable(use_static consumer.c)
target_link_libraries(use_static PRIVATE k3kernels::k3_static)
CM

needs_libk3() { objdump -p "$1" 2>/dev/null | awk '$1 == "NEEDED" { print $2 }' | grep -q '^libk3\.so'; }
# run_consumer WHAT EXE: it runs, prints the hand-computed values, and links libk3.so exactly when it should
run_consumer() {
    expect 0 "$1 runs" -- "$2"
    contains "$T/out" "k3kernels $K3_VERSION: y = 36 -2 -6" "$1 result"
}

# ---- CMake: find_package(k3kernels) from the prefix ----
cuda_root=()
[ -n "$K3_CUDA_ROOT" ] && cuda_root=(-DCUDAToolkit_ROOT="$K3_CUDA_ROOT")
expect 0 "consumer configures with find_package(k3kernels)" -- "$K3_CMAKE" -S "$T/src" -B "$T/cbuild" \
    -G "$K3_GENERATOR" -DCMAKE_C_COMPILER="$K3_CC" -DCMAKE_BUILD_TYPE="$K3_BUILD_TYPE" -DCMAKE_C_FLAGS="$K3_CFLAGS" \
    -DCMAKE_PREFIX_PATH="$P" "${cuda_root[@]}"
expect 0 "consumer builds against k3kernels::k3 and k3kernels::k3_static" -- "$K3_CMAKE" --build "$T/cbuild"
run_consumer "find_package, k3kernels::k3" "$T/cbuild/use_shared"
if needs_libk3 "$T/cbuild/use_shared"; then ok; else bad "use_shared does not load libk3.so"; fi
run_consumer "find_package, k3kernels::k3_static" "$T/cbuild/use_static"
if needs_libk3 "$T/cbuild/use_static"; then bad "use_static loads libk3.so"; else ok; fi

# ---- pkg-config, with the build's compiler and flags ----
if ! command -v pkg-config >/dev/null 2>&1; then
    echo "pkg-config not found: the pkg-config half of this test did not run (install pkg-config)"
    echo "$pass passed, $fail failed, then skipped"
    [ "$fail" = 0 ] && exit 77
    exit 1
fi
export PKG_CONFIG_PATH=$LIB/pkgconfig
expect 0 "pkg-config --modversion" -- pkg-config --modversion k3kernels
contains "$T/out" "$K3_VERSION" "pkg-config version"
cflags=$(pkg-config --cflags k3kernels)
libs=$(pkg-config --libs k3kernels)
slibs=" $(pkg-config --static --libs k3kernels) "
slibs=${slibs/ -lk3 / -Wl,-Bstatic -lk3 -Wl,-Bdynamic } # libk3.a, though libk3.so lies beside it
# shellcheck disable=SC2086 # flag lists
expect 0 "cc with pkg-config --libs" -- $K3_CC $K3_CFLAGS $cflags "$T/src/consumer.c" -o "$T/pc_shared" $libs
# shellcheck disable=SC2086
expect 0 "cc with pkg-config --static --libs" -- $K3_CC $K3_CFLAGS $cflags "$T/src/consumer.c" -o "$T/pc_static" \
    $slibs
LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} run_consumer "pkg-config, shared" "$T/pc_shared"
if needs_libk3 "$T/pc_shared"; then ok; else bad "pc_shared does not load libk3.so"; fi
run_consumer "pkg-config, static" "$T/pc_static"
if needs_libk3 "$T/pc_static"; then bad "pc_static loads libk3.so"; else ok; fi

finish
