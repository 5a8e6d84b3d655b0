// A diagnostic probe (not part of the library or its build): how fast the MoE GEMM1 weight-access pattern streams
// on its own, with a dependent FFMA chain per chunk standing in for the decode and MMA. Session 20, call s20c
// (bench/NOTES-moe.md session 20, section 2; numbers in bench/RESULTS.md).
// Build and run: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o moe_stream_probe moe_stream_probe.cu
// Session 20 diagnostic (not library code): DRAM throughput of the MoE GEMM1 weight-access pattern alone.
// Each block: 32 rows (16 "gate" rows at r0.., 16 "up" rows at HALF + r0..), 4 warps, a 3-stage cp.async ring per
// warp, optional per-chunk compute (a dependent FFMA chain) to emulate the decode + MMA time.
// pattern 0: as the library (lane g,q: row g / g+8, 16 B at chunk*64 + 16q; warps take chunks w, w+4, ...)
// pattern 1: same rows, but warps take contiguous chunk ranges
// pattern 2: each cp.async instruction reads 512 contiguous bytes (one row's 8 chunks): lane l -> 16 B at 16 l
//            of row (g-set) ; per "chunk" a warp covers 4 rows x 512 B; warps interleave rows
// pattern 3: a block's 16 gate rows (and 16 up rows) as one contiguous span, warps stream it in 2 KB pieces
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)
__device__ __forceinline__ void cp16(void *s, const void *g) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(a), "l"(g) : "memory");
}
__device__ __forceinline__ void cp4(void *s, const void *g) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(a), "l"(g) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void waitg() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
extern __shared__ uint4 dyn[];
struct P { const uint8_t *w; const uint8_t *sc; int64_t eb, sb; int rows, rb, blocks_per_e, pattern, spin, scales; float *out; };
// address of (warp w, chunk k, copy i in 0..3) for this lane
__device__ __forceinline__ const uint8_t *addr(const P &p, const uint8_t *we, int blk, int w, int k, int i, int lane, int nch) {
    const int g = lane >> 2, q = lane & 3, half = p.rows / 2;
    if (p.pattern == 0 || p.pattern == 1) {
        int s = i >> 1, h = i & 1; int64_t row = (s ? half : 0) + blk * 16 + g + 8 * h;
        int c = p.pattern == 0 ? w + 4 * k : w * ((nch + 3) / 4) + k;
        return we + row * p.rb + c * 64 + 16 * q;
    } else if (p.pattern == 2) {
        // chunk index k of warp w: a "super chunk" = 4 rows x 512 B; rows of the block: 32, 512-B pieces per row rb/512
        int per_row = p.rb / 512, total = 32 * per_row; int t = (w + 4 * k) * 4 + i; if (t >= total) t = total - 1;
        int r = t % 32, piece = t / 32; int64_t row = (r < 16 ? 0 : half) + blk * 16 + (r & 15);
        return we + row * p.rb + piece * 512 + 16 * lane;
    } else {
        int64_t span = 16LL * p.rb; int64_t t = (int64_t)(w + 4 * k) * 2048 + i * 512; int set = t >= span; t -= set * span;
        if (t >= span) t = span - 512;
        return we + ((set ? half : 0) + blk * 16) * (int64_t)p.rb + t + 16 * lane;
    }
}
template <int S>
__global__ void __launch_bounds__(128, 4) kern(P p) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int e = blockIdx.x / p.blocks_per_e, blk = blockIdx.x % p.blocks_per_e;
    const uint8_t *we = p.w + e * p.eb;
    const uint8_t *se = p.sc + e * p.sb + (int64_t)blk * 32 * (p.rb / 8);
    const int nch = p.rb / 64, n = (p.pattern == 1) ? (nch + 3) / 4 : (nch - w + 3) / 4;
    uint4 *ring = dyn + w * S * 160;
    float x = lane * 1e-3f, acc = 0.f;
    auto issue = [&](int k) {
        uint4 *st = ring + (k % S) * 160;
        for (int i = 0; i < 4; i++) cp16(st + i * 32 + lane, addr(p, we, blk, w, k, i, lane, nch));
        if (p.scales) for (int i = 0; i < 4; i++) cp4((uint32_t *)(st + 128) + i * 32 + lane, se + (i * 8 + (lane >> 2)) * (p.rb / 8) + (w + 4 * k) * 8 + (lane & 3) * 2 - ((lane & 3) & 1) * 2);
    };
    for (int k = 0; k < S - 1; k++) { if (k < n) issue(k); commit(); }
    for (int k = 0; k < n; k++) {
        if (k + S - 1 < n) issue(k + S - 1);
        commit();
        waitg<S - 1>();
        __syncwarp();
        uint4 v = ring[(k % S) * 160 + lane];
        acc += __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x3f800000u);
        for (int i = 0; i < p.spin; i++) x = fmaf(x, 1.0001f, acc);
        __syncwarp();
    }
    if (x == 12345.f || acc == 12345.f) p.out[0] = x + acc;
}

template <int S>
int runk(const char *name, int rows, int rb, int blocks, int spin, uint8_t *buf, size_t big, float *out,
         int pattern = 0, int scales = 1) {
    if (pattern == 2 && rb % 512) return 0; /* whole 512-byte row pieces only */
    const int smem = 50 * 1024; /* 4 blocks per SM whatever S (S <= 5: 4 x S x 2.5 KB per block) */
    CK(cudaFuncSetAttribute(kern<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int bpe = rows / 32, ex = (blocks + bpe - 1) / bpe;
    int64_t eb = (int64_t)rows * rb, sb = eb / 8, set = (eb + sb) * ex;
    int copies = (int)std::min<int64_t>(8, (int64_t)big / set);
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    std::vector<float> t;
    for (int r = 0; r < 14; r++) {
        const uint8_t *base = buf + (size_t)(r % copies) * set;
        P p{base, base + eb * ex, eb, sb, rows, rb, bpe, pattern, spin, scales, out};
        CK(cudaEventRecord(a)); kern<S><<<blocks, 128, smem>>>(p); CK(cudaGetLastError()); CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b)); float ms; cudaEventElapsedTime(&ms, a, b); if (r >= 2) t.push_back(ms * 1000);
    }
    std::sort(t.begin(), t.end());
    const double us = t[t.size() / 2], bytes = (double)blocks * 32 * rb * (scales ? 1.125 : 1.0);
    printf("%-8s blocks %5d pattern %d scales %d S %d spin %3d: %8.2f us  %6.3f TB/s\n", name, blocks, pattern, scales,
           S, spin, us, bytes / us * 1e-6);
    return 0;
}
int main() {
    uint8_t *buf; size_t big = (size_t)1200 << 20; CK(cudaMalloc(&buf, big)); CK(cudaMemset(buf, 0x11, big));
    float *out; CK(cudaMalloc(&out, 4));
    /* 1. the access patterns (ring depth 3); the "tp8" rows are 3,584 bytes, twice the real TP8 rows (L 3584) */
    for (int scales : {0, 1})
        for (int pattern = 0; pattern < 4; pattern++)
            for (int spin : {0, 300}) {
                runk<3>("ep16", 6144, 1792, 768, spin, buf, big, out, pattern, scales);
                runk<3>("tp8", 768, 3584, 3096, spin, buf, big, out, pattern, scales);
            }
    /* 2. ring depth and grid size, the library's pattern with scales */
    struct C { const char *name; int rows, rb, blocks; } cf[] = {
        {"tp8", 768, 3584, 3096}, {"ep16", 6144, 1792, 768}, {"ep16", 6144, 1792, 528}, {"ep16", 6144, 1792, 1056},
        {"ep16", 6144, 1792, 384}};
    for (auto &c : cf) for (int spin : {0, 300})  {
        runk<2>(c.name, c.rows, c.rb, c.blocks, spin, buf, big, out);
        runk<3>(c.name, c.rows, c.rb, c.blocks, spin, buf, big, out);
        runk<4>(c.name, c.rows, c.rb, c.blocks, spin, buf, big, out);
        runk<5>(c.name, c.rows, c.rb, c.blocks, spin, buf, big, out);
    }
    return 0;
}
