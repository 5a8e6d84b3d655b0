// Diagnostic probes (not part of the library or its build) for the MoE GEMMs' weight streams, session 20, call s20c
// (bench/NOTES-moe.md session 20, section 2; numbers in bench/RESULTS.md):
//   stream  the GEMM1 weight-access pattern alone (four lane maps, ring depths 2-5, grid sizes), with a dependent
//           FFMA chain per chunk standing in for the decode and MMA;
//   tile    one tile per block against persistent blocks whose cp.async ring runs on across tiles;
//   ramp    EP16 M 1 as two kernels (GEMM2 under PDL) against one kernel with a device-wide dependency (call s20k).
// Build and run: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o moe_stream_probe moe_stream_probe.cu
//                ./moe_stream_probe [stream|tile|ramp]
//  (Restructured after the s20c run into one file with a shared ring walk; this exact file was not run on a GPU.)
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cstring>
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

/* A warp's walk over its n chunks through an S-stage cp.async ring of `su` uint4 per stage: issue(k) fills stage
 * k % S, use(k, v) gets this lane's first 16 bytes of chunk k once it has landed. */
template <int S, typename Issue, typename Use>
__device__ __forceinline__ void ring_walk(int n, const uint4 *ring, int su, int lane, Issue issue, Use use) {
    for (int k = 0; k < S - 1; k++) {
        if (k < n) issue(k);
        commit();
    }
    for (int k = 0; k < n; k++) {
        if (k + S - 1 < n) issue(k + S - 1);
        commit();
        waitg<S - 1>();
        __syncwarp();
        const uint4 v = ring[(k % S) * su + lane];
        __syncwarp();
        use(k, v);
    }
}
/* The stand-in for a chunk's decode and MMA: a dependent FFMA chain of `spin` steps. */
__device__ __forceinline__ void chunk_work(uint4 v, int spin, float &x, float &acc) {
    acc += __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x3f800000u);
    for (int i = 0; i < spin; i++) x = fmaf(x, 1.0001f, acc);
}
namespace stream {
// The stream probe: the DRAM throughput of the MoE GEMM1 weight-access pattern alone.
// Each block: 32 rows (16 "gate" rows at r0.., 16 "up" rows at HALF + r0..), 4 warps, a 3-stage cp.async ring per
// warp, optional per-chunk compute (a dependent FFMA chain) to emulate the decode + MMA time.
// pattern 0: as the library (lane g,q: row g / g+8, 16 B at chunk*64 + 16q; warps take chunks w, w+4, ...)
// pattern 1: same rows, but warps take contiguous chunk ranges
// pattern 2: each cp.async instruction reads 512 contiguous bytes (one row's 8 chunks): lane l -> 16 B at 16 l
//            of row (g-set) ; per "chunk" a warp covers 4 rows x 512 B; warps interleave rows
// pattern 3: a block's 16 gate rows (and 16 up rows) as one contiguous span, warps stream it in 2 KB pieces
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
    ring_walk<S>(n, ring, 160, lane, issue, [&](int, uint4 v) { chunk_work(v, p.spin, x, acc); });
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
} // namespace stream

namespace tile {
struct P { const uint8_t *w; int tiles, T, spin, epi; float *out; };
// tile t occupies 4 * T * CB contiguous bytes; warp w's chunk j of tile t: t*4*T*CB + (j*4 + w)*CB
template <int CB, int S, int MINB>
__global__ void __launch_bounds__(128, MINB) kern(P p) {
    constexpr int V = CB / 512; /* 16-byte copies per lane per chunk */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint4 *ring = dyn + w * S * (CB / 16);
    const int ntile = (p.tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x; /* this block's tiles */
    const int n = ntile * p.T;                                                          /* its chunks per warp */
    auto addr = [&](int k) {
        const int t = blockIdx.x + (k / p.T) * gridDim.x, j = k % p.T;
        return p.w + ((int64_t)t * 4 * p.T + j * 4 + w) * CB;
    };
    auto issue = [&](int k) {
        uint4 *st = ring + (k % S) * (CB / 16);
        const uint8_t *g = addr(k);
        for (int v = 0; v < V; v++) cp16(st + v * 32 + lane, g + (v * 32 + lane) * 16);
    };
    float x = lane * 1e-3f, acc = 0.f;
    ring_walk<S>(n, ring, CB / 16, lane, issue, [&](int k, uint4 v) {
        chunk_work(v, p.spin, x, acc);
        if (k % p.T == p.T - 1) { /* the tile's epilogue */
            for (int i = 0; i < p.epi; i++) x = fmaf(x, 0.9999f, acc);
            __syncthreads();
            if (x == 12345.f) p.out[blockIdx.x] = x + acc;
        }
    });
    if (x == 12345.f || acc == 12345.f) p.out[0] = x + acc;
}
template <int CB, int S, int MINB>
int runk(const char *name, int tiles, int T, int grid, int spin, int epi, uint8_t *buf, size_t big, float *out) {
    const int smem = 4 * S * CB;
    CK(cudaFuncSetAttribute(kern<CB, S, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int64_t set = (int64_t)tiles * 4 * T * CB;
    const int copies = (int)std::min<int64_t>(8, (int64_t)big / set);
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern<CB, S, MINB>, 128, smem));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    std::vector<float> t;
    for (int r = 0; r < 14; r++) {
        P p{buf + (size_t)(r % copies) * set, tiles, T, spin, epi, out};
        CK(cudaEventRecord(a)); kern<CB, S, MINB><<<grid, 128, smem>>>(p); CK(cudaGetLastError()); CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b)); float ms; cudaEventElapsedTime(&ms, a, b); if (r >= 2) t.push_back(ms * 1000);
    }
    std::sort(t.begin(), t.end()); double us = t[t.size() / 2];
    printf("%-10s CB %4d T %2d S %d occ %d grid %5d spin %3d epi %3d: %8.2f us %6.3f TB/s\n", name, CB, T, S, occ, grid,
           spin, epi, us, set / us * 1e-6);
    return 0;
}
} // namespace tile


namespace ramp {
/* EP16 M 1 shaped: GEMM1 streams 384 blocks x 4 warps x 8 chunks of 1 KB (12.6 MB), GEMM2 5.5 MB. Two kernels as the
 * library runs them (GEMM2 under PDL fills its ring before griddepcontrol.wait) against one kernel whose blocks load
 * their GEMM2 share at the start (registers, or an L2 prefetch read back after the dependency), stream GEMM1, meet at
 * a device-wide counter (every block is resident: the grid is under a wave) and then do the GEMM2 work. */
constexpr int CB = 1024, N1 = 8, N2 = 3, G1B = 384, G2B = 224, W2U4 = 7; /* 7 uint4 per thread: the same 5.5 MB */
struct P {
    const uint8_t *w1, *w2;
    int spin;
    float *out;
    unsigned *counter;
    unsigned target;
    int l2;
};
__device__ __forceinline__ void g1_part(const P &p, float &x, float &acc) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint4 *ring = dyn + w * 3 * (CB / 16);
    const uint8_t *base = p.w1 + ((size_t)blockIdx.x * 4 + w) * N1 * CB;
    auto issue = [&](int k) {
        uint4 *st = ring + (k % 3) * (CB / 16);
        for (int v = 0; v < CB / 512; v++) cp16(st + v * 32 + lane, base + (size_t)k * CB + (v * 32 + lane) * 16);
    };
    ring_walk<3>(N1, ring, CB / 16, lane, issue, [&](int, uint4 v) { chunk_work(v, p.spin, x, acc); });
}
__global__ void __launch_bounds__(128) g1(P p) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    float x = threadIdx.x * 1e-3f, acc = 0.f;
    g1_part(p, x, acc);
    if (x == 12345.f || acc == 12345.f) p.out[0] = x + acc;
}
__global__ void __launch_bounds__(256) g2(P p) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint4 *b = dyn + w * N2 * (CB / 16);
    const uint8_t *base = p.w2 + ((size_t)blockIdx.x * 8 + w) * N2 * CB;
    for (int k = 0; k < N2; k++)
        for (int v = 0; v < CB / 512; v++) cp16(b + k * (CB / 16) + v * 32 + lane, base + (size_t)k * CB + (v * 32 + lane) * 16);
    commit();
    asm volatile("griddepcontrol.wait;" ::: "memory");
    waitg<0>();
    __syncwarp();
    float x = threadIdx.x * 1e-3f, acc = 0.f;
    for (int k = 0; k < N2; k++) chunk_work(b[k * (CB / 16) + lane], p.spin, x, acc);
    __syncthreads(); /* the split-K sum */
    if (x == 12345.f || acc == 12345.f) p.out[0] = x + acc;
}
__global__ void __launch_bounds__(128, 4) fused(P p) {
    const uint4 *w2 = reinterpret_cast<const uint4 *>(p.w2) + ((size_t)blockIdx.x * 128 + threadIdx.x) * W2U4;
    uint4 r[W2U4];
    if (p.l2) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w2));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w2 + W2U4 - 1));
    } else {
        for (int i = 0; i < W2U4; i++) r[i] = __ldcg(w2 + i);
    }
    float x = threadIdx.x * 1e-3f, acc = 0.f;
    g1_part(p, x, acc);
    __syncthreads();
    if (threadIdx.x == 0) { /* the device-wide dependency: every block's GEMM1 part is done */
        __threadfence();
        atomicAdd(p.counter, 1u);
        unsigned c;
        const long long t0 = clock64();
        do asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(c) : "l"(p.counter));
        while (c < p.target && clock64() - t0 < 20000000LL); /* ~10 ms: never hang if a block were not resident */
        if (c < p.target) p.out[1] = 1.0f;
    }
    __syncthreads();
    if (p.l2)
        for (int i = 0; i < W2U4; i++) r[i] = __ldcg(w2 + i);
    const int spin2 = p.spin * N2 * G2B * 8 / (G1B * 4); /* the same GEMM2 work per SM as g2's */
    for (int i = 0; i < W2U4; i++) chunk_work(r[i], spin2 / W2U4, x, acc);
    if (x == 12345.f || acc == 12345.f) p.out[0] = x + acc;
}
int run(uint8_t *buf, size_t big, float *out) {
    const size_t b1 = (size_t)G1B * 4 * N1 * CB, b2 = (size_t)G2B * 8 * N2 * CB, set = b1 + b2;
    if (b2 != (size_t)G1B * 128 * W2U4 * 16) { printf("ramp: GEMM2 bytes differ\n"); return 1; }
    const int copies = (int)std::min<size_t>(8, big / set);
    int occ = 0, sms = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fused, 128, 4 * 3 * CB));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (occ * sms < G1B) { printf("ramp: %d x %d blocks resident < %d\n", occ, sms, G1B); return 1; }
    unsigned *counter;
    CK(cudaMalloc(&counter, 4));
    CK(cudaMemset(counter, 0, 4));
    CK(cudaFuncSetAttribute(g2, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * N2 * CB));
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    unsigned launches = 0;
    for (int spin : {0, 150})
        for (int mode = 0; mode < 3; mode++) { /* 0: two kernels (PDL), 1: one kernel (registers), 2: one kernel (L2) */
            std::vector<float> t;
            for (int r = 0; r < 14; r++) {
                const uint8_t *base = buf + (size_t)(r % copies) * set;
                P p{base, base + b1, spin, out, counter, 0, mode == 2};
                CK(cudaEventRecord(a));
                if (mode == 0) {
                    g1<<<G1B, 128, 4 * 3 * CB>>>(p);
                    CK(cudaGetLastError());
                    cudaLaunchConfig_t cfg = {};
                    cfg.gridDim = dim3(G2B), cfg.blockDim = dim3(256), cfg.dynamicSmemBytes = 8 * N2 * CB;
                    cudaLaunchAttribute at[1];
                    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    at[0].val.programmaticStreamSerializationAllowed = 1;
                    cfg.attrs = at, cfg.numAttrs = 1;
                    CK(cudaLaunchKernelEx(&cfg, g2, p));
                } else {
                    p.target = (++launches) * G1B;
                    fused<<<G1B, 128, 4 * 3 * CB>>>(p);
                    CK(cudaGetLastError());
                }
                CK(cudaEventRecord(b));
                CK(cudaEventSynchronize(b));
                float ms;
                cudaEventElapsedTime(&ms, a, b);
                if (r >= 2) t.push_back(ms * 1000);
            }
            std::sort(t.begin(), t.end());
            const double us = t[t.size() / 2];
            printf("ramp %-22s spin %3d: %7.2f us  %6.3f TB/s (%.1f MB)\n",
                   mode == 0 ? "two kernels (PDL)" : mode == 1 ? "one kernel, W2 in regs" : "one kernel, W2 via L2",
                   spin, us, set / us * 1e-6, set * 1e-6);
        }
    float flag = 0.0f;
    CK(cudaMemcpy(&flag, out + 1, 4, cudaMemcpyDeviceToHost));
    if (flag != 0.0f) printf("ramp: a block gave up waiting for the dependency: the one-kernel times are invalid\n");
    return 0;
}
} // namespace ramp

int main(int argc, char **argv) {
    const bool tile_mode = argc > 1 && strcmp(argv[1], "tile") == 0;
    const bool ramp_mode = argc > 1 && strcmp(argv[1], "ramp") == 0;
    if (argc > 1 && !tile_mode && !ramp_mode && strcmp(argv[1], "stream") != 0) {
        printf("usage: moe_stream_probe [stream|tile|ramp]\n");
        return 2;
    }

    uint8_t *buf; size_t big = (size_t)1200 << 20; CK(cudaMalloc(&buf, big)); CK(cudaMemset(buf, 0x11, big));
    float *out; CK(cudaMalloc(&out, 1 << 20)); CK(cudaMemset(out, 0, 1 << 20));
    if (ramp_mode) return ramp::run(buf, big, out);
    if (!tile_mode) {
        using namespace stream;
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
    } else {
        using namespace tile;
    for (int spin : {0, 150}) {
        /* TP8 GEMM2-like: 7224 tiles of 4 warps x 3 chunks x 1 KB (89 MB) */
        runk<1024, 4, 8>("g2 short", 7224, 3, 7224, spin, 100, buf, big, out);
        runk<1024, 4, 8>("g2 pers8", 7224, 3, 132 * 8, spin, 100, buf, big, out);
        runk<1024, 4, 4>("g2 pers4", 7224, 3, 132 * 4, spin, 100, buf, big, out);
        runk<1024, 8, 4>("g2 pers4", 7224, 3, 132 * 4, spin, 100, buf, big, out);
    }
    for (int spin : {0, 300}) {
        /* TP8 GEMM1-like: 3096 tiles of 4 warps x 14 chunks x 2 KB (355 MB) */
        runk<2048, 3, 4>("g1 short", 3096, 14, 3096, spin, 200, buf, big, out);
        runk<2048, 3, 4>("g1 pers4", 3096, 14, 132 * 4, spin, 200, buf, big, out);
        /* EP16 M4 GEMM1-like: 768 tiles x 7 chunks x 2 KB */
        runk<2048, 3, 4>("e1 short", 768, 7, 768, spin, 200, buf, big, out);
        runk<2048, 3, 4>("e1 pers4", 768, 7, 132 * 4, spin, 200, buf, big, out);
        /* the same bytes as 1536 half tiles */
        runk<2048, 3, 4>("e1 half", 1536, 4, 1536, spin, 200, buf, big, out);
        runk<2048, 3, 4>("e1 halfp", 1536, 4, 132 * 4, spin, 200, buf, big, out);
    }
    }
    return 0;
}
