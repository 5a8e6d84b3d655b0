/* Compile-time facts of the routed-experts kernels: warps per block, ring depths, blocks per SM, the weight
 * formats as template arguments. src/plan/moe_configs.h repeats the ones the plan needs (checked in launch.cu). */
#ifndef K3_CUDA_MOE_CONFIG_CUH
#define K3_CUDA_MOE_CONFIG_CUH

#include <stdint.h>

namespace {

constexpr int G1_WARPS = 4; /* split-K warps of a GEMM1 block */
constexpr int G2_WARPS = 4; /* warps of a GEMM2 block: 4 tiles of 16 rows, or 1 tile split 4 ways along K */
constexpr int G1_DEPTH = 3; /* FP4 chunks in flight per lane (GEMM1: 4 rows per chunk, 64 bytes + scales) */
constexpr int G2_DEPTH = 8; /* GEMM2: 2 rows per chunk, 32 bytes + scales */
/* Occupancy bound of the register-ring and BF16 kernels: 3 blocks (12 warps) per SM, which caps their registers
 * per thread (bench/NOTES-moe.md). The cp.async instances set their own (g1_min_blocks, g2_min_blocks). */
constexpr int G2_MIN_BLOCKS = 3;
constexpr int G1_MIN_BLOCKS = 3;
constexpr int ALIGN = 256; /* alignment of each workspace array (workspace.cuh) */

/* The weight formats as template arguments (the values of k3_weight_format). */
enum { FMT_BF16 = 0, FMT_NVFP4 = 1, FMT_MXFP4 = 2 };

} // namespace

#endif
