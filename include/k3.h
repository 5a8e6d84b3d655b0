/*
 * k3kernels: latency-critical decode kernels for Kimi-K3-class models.
 *
 * One header, plain C11. Every function returns a k3_status (or a value that cannot fail);
 * the library never aborts and never prints unless a logger is installed.
 *
 * Conventions
 * - Describe, plan, run: a descriptor (filled with defaults by its *_desc_init) says what to compute; a plan is
 *   made from it once (shapes, strides, alignment and dtypes are validated there, kernels chosen); run calls
 *   check only what can change per call, and take the caller's workspace (*_workspace_size bytes) and stream.
 * - Every buffer a run call takes lives where the context computes: host memory on a CPU context, device memory
 *   (cudaMalloc) on a CUDA one. Weights are passed to every run call; plans hold none. Give 16-byte aligned
 *   buffers (malloc and cudaMalloc do): the linear and KDA runs read 16-byte vectors and refuse others; every
 *   run refuses a tensor pointer not aligned to its element type, naming it.
 * - Matrices are row-major. Weights are [N, K] with K contiguous; y = x W^T.
 * - BF16 values are passed as uint16_t bit patterns (or void* buffers of them).
 * - `stream` is a cudaStream_t passed as void* (NULL = the legacy default stream); it is ignored by the CPU
 *   backend. Run calls allocate nothing, never synchronize, and make no data-dependent host decisions, so they
 *   may be captured into CUDA graphs.
 * - A failing call returns its status and leaves a message in k3_ctx_last_error(ctx).
 * - Enums are append-only; sized integer types appear in every signature.
 * - Threads: a context may be shared by threads. Plan creation, *_workspace_size and run calls on one context
 *   may run concurrently, and one plan may be run by several threads at once, each run with its own workspace
 *   and outputs: results are those of one thread alone (plans keep no per-call scratch; the context's table is
 *   parsed by k3_ctx_create). k3_ctx_load_table and k3_ctx_destroy must not overlap any other call on that
 *   context, nor k3_*_plan_destroy a call on that plan. On a CUDA context, the plans that own streams, events or
 *   device state (the KDA projection, the latent block) take their runs one at a time, in stream order.
 *   Messages are per context: concurrent failing calls on one context may overwrite each other's
 *   k3_ctx_last_error message (a status never depends on it); where messages matter, use a context per thread.
 *
 * Examples
 * Four complete uses, each the body of a function `int example(void)` that returns 0 on success, with
 * <k3.h>, <math.h>, <stdio.h> and <stdlib.h> included. They run on the CPU backend (host buffers, malloc); the
 * comments say what a CUDA caller does instead. tests/cli_header_examples.sh extracts each one (from its
 * "Example:" line to its "End of example" line), compiles it with the project's warnings as errors, and runs it.
 *
 * Example: linear
 *   // y[M, N] = x[M, K] . W[N, K]^T in BF16 with fp32 accumulation: one plan, run for every decode step.
 *   // On a CUDA context (opt.backend = K3_BACKEND_CUDA) x, w, y and ws are device memory (cudaMalloc, and
 *   // cudaMemcpy the inputs in) and the last argument of k3_linear_run is the cudaStream_t to run on.
 *   enum { M = 4, N = 256, K = 512 };
 *   k3_ctx_options opt;
 *   k3_ctx_options_init(&opt);
 *   opt.backend = K3_BACKEND_CPU;
 *   k3_ctx *ctx = NULL;
 *   k3_status st = k3_ctx_create(&opt, &ctx);
 *   if (st != K3_STATUS_SUCCESS) { // no context, so no message: the status says why
 *       fprintf(stderr, "context: %s\n", k3_status_string(st));
 *       return 1;
 *   }
 *   k3_linear_plan *plan = NULL;
 *   uint16_t *x = malloc(sizeof(uint16_t) * M * K); // BF16 bit patterns
 *   uint16_t *w = malloc(sizeof(uint16_t) * N * K);
 *   uint16_t *y = malloc(sizeof(uint16_t) * M * N);
 *   void *ws = NULL;
 *   size_t ws_bytes = 0;
 *   int rc = 1;
 *   if (!x || !w || !y) goto done;
 *   for (int i = 0; i < M * K; i++) x[i] = k3_bf16_from_f32(1.0f);
 *   for (int i = 0; i < N * K; i++) w[i] = k3_bf16_from_f32(0.125f * (float)(i / K % 8)); // row n: (n % 8) / 8
 *
 *   k3_linear_desc d;
 *   k3_linear_desc_init(&d, N, K); // the weight's shape
 *   d.max_m = M;                   // the most tokens a run will pass
 *   if ((st = k3_linear_plan_create(ctx, &d, &plan)) != K3_STATUS_SUCCESS) goto fail;
 *   if ((st = k3_linear_workspace_size(plan, &ws_bytes)) != K3_STATUS_SUCCESS) goto fail;
 *   if (ws_bytes && !(ws = malloc(ws_bytes))) goto done; // once; every run reuses it
 *   // no residual (a residual is added before the one BF16 rounding, and may alias y); stream NULL
 *   if ((st = k3_linear_run(plan, M, x, w, NULL, y, ws, ws_bytes, NULL)) != K3_STATUS_SUCCESS) goto fail;
 *   rc = 0;
 *   for (int i = 0; i < M * N; i++) // y[t, n] = K * (n % 8) / 8, exact in BF16
 *       if (k3_bf16_to_f32(y[i]) != (float)(K / 8 * (i % N % 8))) rc = 1;
 *   goto done;
 * fail:
 *   fprintf(stderr, "%s: %s\n", k3_status_string(st), k3_ctx_last_error(ctx));
 * done:
 *   free(ws);
 *   free(x);
 *   free(w);
 *   free(y);
 *   k3_linear_plan_destroy(plan);
 *   k3_ctx_destroy(ctx);
 *   return rc;
 * End of example
 *
 * Example: routed experts
 *   // One MoE layer's routed experts, out[t] = sum_j topk_weights[t, j] * expert_e(x[t]) with e = topk_ids[t, j],
 *   // for E 8 experts of width L 64 and intermediate I 32, NVFP4 weights quantized here from fp32 (a checkpoint
 *   // holds them packed already). On a CUDA context x, the ids and weights, out, ws and the packed weights and
 *   // scales are device memory (quantize on the host as below, then cudaMemcpy them in); the k3_moe_weights
 *   // struct that points at them stays on the host.
 *   enum { M = 2, E = 8, TOPK = 2, L = 64, I = 32 };
 *   k3_ctx_options opt;
 *   k3_ctx_options_init(&opt);
 *   opt.backend = K3_BACKEND_CPU;
 *   k3_ctx *ctx = NULL;
 *   k3_status st = k3_ctx_create(&opt, &ctx);
 *   if (st != K3_STATUS_SUCCESS) {
 *       fprintf(stderr, "context: %s\n", k3_status_string(st));
 *       return 1;
 *   }
 *   k3_moe_desc d;
 *   k3_moe_desc_init(&d); // the K3 defaults: NVFP4 with linear block scales, W4A16, the SiTU activation
 *   d.num_experts = E;
 *   d.top_k = TOPK;
 *   d.hidden = L;
 *   d.inter = I;
 *   d.max_tokens = M;
 *   k3_moe_plan *plan = NULL;
 *   size_t s13 = 0, s2 = 0, ws_bytes = 0; // block-scale bytes of one expert's W13 [2I, L] and W2 [L, I]
 *   k3_fp4_scale_bytes(K3_FP4_NVFP4, K3_SCALE_LINEAR, 2 * I, L, &s13);
 *   k3_fp4_scale_bytes(K3_FP4_NVFP4, K3_SCALE_LINEAR, L, I, &s2);
 *   float *f13 = malloc(sizeof(float) * E * 2 * I * L); // fp32 weights: W13 = [gate; up], then W2
 *   float *f2 = malloc(sizeof(float) * E * L * I);
 *   uint8_t *w13 = malloc(E * 2 * I * L / 2), *w2 = malloc(E * L * I / 2); // two E2M1 codes a byte
 *   uint8_t *w13_scale = malloc(E * s13), *w2_scale = malloc(E * s2);        // e4m3 block scales
 *   float *w13_scale_2 = malloc(sizeof(float) * E), *w2_scale_2 = malloc(sizeof(float) * E); // per expert
 *   uint16_t *x = malloc(sizeof(uint16_t) * M * L), *out = malloc(sizeof(uint16_t) * M * L);
 *   int32_t ids[M * TOPK] = {0, 5, 3, 5};              // what a router (k3_router_run) gives: experts ...
 *   float wts[M * TOPK] = {0.75f, 0.25f, 0.5f, 0.5f}; // ... and their weights, per token
 *   void *ws = NULL;
 *   int rc = 1;
 *   if (!f13 || !f2 || !w13 || !w2 || !w13_scale || !w2_scale || !w13_scale_2 || !w2_scale_2 || !x || !out)
 *       goto done;
 *   for (int i = 0; i < E * 2 * I * L; i++) f13[i] = 0.01f * (float)(i * 7 % 23 - 11);
 *   for (int i = 0; i < E * L * I; i++) f2[i] = 0.01f * (float)(i * 5 % 19 - 9);
 *   for (int i = 0; i < M * L; i++) x[i] = k3_bf16_from_f32(0.1f * (float)(i % 9 - 4));
 *   if ((st = k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, E, 2 * I, L, f13, w13, w13_scale, w13_scale_2)) !=
 *           K3_STATUS_SUCCESS ||
 *       (st = k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, E, L, I, f2, w2, w2_scale, w2_scale_2)) !=
 *           K3_STATUS_SUCCESS) {
 *       fprintf(stderr, "quantize: %s\n", k3_status_string(st)); // a host function: no context
 *       goto done;
 *   }
 *   k3_moe_weights w = {0};
 *   w.w13 = w13;
 *   w.w13_scale = w13_scale;
 *   w.w13_scale_2 = w13_scale_2;
 *   w.w2 = w2;
 *   w.w2_scale = w2_scale;
 *   w.w2_scale_2 = w2_scale_2;
 *
 *   if ((st = k3_moe_plan_create(ctx, &d, &plan)) != K3_STATUS_SUCCESS) goto fail;
 *   if ((st = k3_moe_workspace_size(plan, &ws_bytes)) != K3_STATUS_SUCCESS) goto fail;
 *   if (ws_bytes && !(ws = malloc(ws_bytes))) goto done;
 *   // out_f32 NULL: the fp32 sum before its BF16 rounding is not wanted here
 *   if ((st = k3_moe_run(plan, M, x, ids, wts, &w, out, NULL, ws, ws_bytes, NULL)) != K3_STATUS_SUCCESS) goto fail;
 *   rc = 0;
 *   for (int i = 0; i < M * L; i++)
 *       if (!isfinite(k3_bf16_to_f32(out[i]))) rc = 1;
 *   goto done;
 * fail:
 *   fprintf(stderr, "%s: %s\n", k3_status_string(st), k3_ctx_last_error(ctx));
 * done:
 *   free(ws);
 *   free(f13);
 *   free(f2);
 *   free(w13);
 *   free(w2);
 *   free(w13_scale);
 *   free(w2_scale);
 *   free(w13_scale_2);
 *   free(w2_scale_2);
 *   free(x);
 *   free(out);
 *   k3_moe_plan_destroy(plan);
 *   k3_ctx_destroy(ctx);
 *   return rc;
 * End of example
 *
 * Example: latent MoE block
 *   // The whole MoE block of Kimi-K3 (router; down projection to the latent width; routed experts; RMSNorm; up
 *   // projection; shared experts; one sum) at small shapes: H 256, L 128, E 8 top-2 of I 64, shared Is 64.
 *   // k3_latent_moe_desc_init gives the K3 TP8 block, scaled down below. The experts are BF16 to keep this
 *   // example short (NVFP4 experts take the buffers of the routed-experts example). On a CUDA context every
 *   // buffer given to k3_latent_moe_run is device memory (cudaMalloc, cudaMemcpy the weights in).
 *   enum { M = 2, H = 256, L = 128, E = 8, TOPK = 2, I = 64, IS = 64 };
 *   k3_ctx_options opt;
 *   k3_ctx_options_init(&opt);
 *   opt.backend = K3_BACKEND_CPU;
 *   k3_ctx *ctx = NULL;
 *   k3_status st = k3_ctx_create(&opt, &ctx);
 *   if (st != K3_STATUS_SUCCESS) {
 *       fprintf(stderr, "context: %s\n", k3_status_string(st));
 *       return 1;
 *   }
 *   k3_latent_moe_desc d;
 *   k3_latent_moe_desc_init(&d);
 *   d.hidden = d.router.hidden = H;
 *   d.router.num_experts = d.experts.num_experts = E;
 *   d.router.top_k = d.experts.top_k = TOPK;
 *   d.experts.hidden = L;
 *   d.experts.inter = I;
 *   d.experts.format = K3_WEIGHT_BF16;
 *   d.shared_inter = IS;
 *   d.max_tokens = M;
 *   k3_latent_moe_plan *plan = NULL;
 *   uint16_t *gate = malloc(sizeof(uint16_t) * E * H);         // router gate [E, H]
 *   float *bias = malloc(sizeof(float) * E);                    // the router's correction bias (may be NULL)
 *   uint16_t *down = malloc(sizeof(uint16_t) * L * H);         // down_proj [L, H]
 *   uint16_t *w13 = malloc(sizeof(uint16_t) * E * 2 * I * L);  // experts' [gate; up] [E, 2I, L]
 *   uint16_t *w2 = malloc(sizeof(uint16_t) * E * L * I);       // experts' down [E, L, I]
 *   uint16_t *norm = malloc(sizeof(uint16_t) * L);             // RMSNorm weight [L]
 *   uint16_t *up = malloc(sizeof(uint16_t) * H * L);           // up_proj [H, L]
 *   uint16_t *sgu = malloc(sizeof(uint16_t) * 2 * IS * H);     // shared experts' [gate; up] [2 Is, H]
 *   uint16_t *sdown = malloc(sizeof(uint16_t) * H * IS);       // shared experts' down [H, Is]
 *   uint16_t *x = malloc(sizeof(uint16_t) * M * H), *y = malloc(sizeof(uint16_t) * M * H);
 *   int32_t ids[M * TOPK]; // optional outputs: the routing the block chose
 *   float wts[M * TOPK];
 *   void *ws = NULL;
 *   size_t ws_bytes = 0;
 *   int rc = 1;
 *   uint16_t *bf16[] = {gate, down, w13, w2, up, sgu, sdown, x};
 *   const int count[] = {E * H, L * H, E * 2 * I * L, E * L * I, H * L, 2 * IS * H, H * IS, M * H};
 *   for (int b = 0; b < 8; b++) {
 *       if (!bf16[b]) goto done;
 *       for (int i = 0; i < count[b]; i++) bf16[b][i] = k3_bf16_from_f32(0.02f * (float)((i * 7 + b) % 11 - 5));
 *   }
 *   if (!bias || !norm || !y) goto done;
 *   for (int e = 0; e < E; e++) bias[e] = 0.0f;
 *   for (int i = 0; i < L; i++) norm[i] = k3_bf16_from_f32(1.0f);
 *   k3_latent_moe_weights w = {0};
 *   w.gate = gate;
 *   w.bias = bias;
 *   w.down_proj = down;
 *   w.experts.w13 = w13; // BF16 experts need no scales
 *   w.experts.w2 = w2;
 *   w.norm = norm;
 *   w.up_proj = up;
 *   w.shared_gate_up = sgu;
 *   w.shared_down = sdown;
 *
 *   if ((st = k3_latent_moe_plan_create(ctx, &d, &plan)) != K3_STATUS_SUCCESS) goto fail;
 *   if ((st = k3_latent_moe_workspace_size(plan, &ws_bytes)) != K3_STATUS_SUCCESS) goto fail;
 *   if (ws_bytes && !(ws = malloc(ws_bytes))) goto done;
 *   // no residual (it may alias y); stream NULL
 *   st = k3_latent_moe_run(plan, M, x, &w, NULL, y, ids, wts, ws, ws_bytes, NULL);
 *   if (st != K3_STATUS_SUCCESS) goto fail;
 *   rc = 0;
 *   for (int i = 0; i < M * H; i++)
 *       if (!isfinite(k3_bf16_to_f32(y[i]))) rc = 1;
 *   for (int j = 0; j < M * TOPK; j++)
 *       if (ids[j] < 0 || ids[j] >= E) rc = 1;
 *   goto done;
 * fail:
 *   fprintf(stderr, "%s: %s\n", k3_status_string(st), k3_ctx_last_error(ctx));
 * done:
 *   free(ws);
 *   free(gate);
 *   free(bias);
 *   free(down);
 *   free(w13);
 *   free(w2);
 *   free(norm);
 *   free(up);
 *   free(sgu);
 *   free(sdown);
 *   free(x);
 *   free(y);
 *   k3_latent_moe_plan_destroy(plan);
 *   k3_ctx_destroy(ctx);
 *   return rc;
 * End of example
 *
 * Example: checkpoint layer
 *   // One layer's routed experts read from a checkpoint on disk (a folder, an index.json or one safetensors
 *   // file; the compressed-tensors and ModelOpt layouts or the stacked one `k3 quant` writes) and run for one
 *   // token. The path comes from K3_EXAMPLE_CHECKPOINT (tests/cli_header_examples.sh makes one). The layer is
 *   // in host memory: a CUDA caller cudaMemcpy's each buffer (its *_bytes field says how large) to the device.
 *   const char *path = getenv("K3_EXAMPLE_CHECKPOINT");
 *   char err[512];
 *   k3_checkpoint *ck = NULL;
 *   k3_moe_layer *layer = NULL;
 *   if (!path) {
 *       fprintf(stderr, "set K3_EXAMPLE_CHECKPOINT to a checkpoint\n");
 *       return 1;
 *   }
 *   k3_status st = k3_checkpoint_open(path, &ck, err, sizeof err);
 *   if (st == K3_STATUS_SUCCESS) st = k3_checkpoint_load_moe_layer(ck, 0, &layer, err, sizeof err);
 *   k3_checkpoint_close(ck); // the layer owns its buffers
 *   if (st != K3_STATUS_SUCCESS) { // err names the tensor and what was wrong
 *       fprintf(stderr, "%s: %s\n", k3_status_string(st), err);
 *       return 1;
 *   }
 *   k3_moe_desc d;
 *   k3_moe_desc_init(&d);
 *   d.num_experts = layer->num_experts;
 *   d.top_k = 1;
 *   d.hidden = layer->latent;
 *   d.inter = layer->inter;
 *   d.format = layer->fp4 == K3_FP4_NVFP4 ? K3_WEIGHT_NVFP4 : K3_WEIGHT_MXFP4;
 *   d.scale_layout = K3_SCALE_LINEAR;
 *   d.w13_separate_scale_2 = layer->fp4 == K3_FP4_NVFP4; // scale_2 [E, 2]: gate and up apart
 *   d.max_tokens = 1;
 *   k3_moe_weights w = {.w13 = layer->w13, .w13_scale = layer->w13_scale, .w13_scale_2 = layer->w13_scale_2,
 *                       .w2 = layer->w2, .w2_scale = layer->w2_scale, .w2_scale_2 = layer->w2_scale_2};
 *   // (no input scales: W4A16; fields left out are NULL)
 *   k3_ctx_options opt;
 *   k3_ctx_options_init(&opt);
 *   opt.backend = K3_BACKEND_CPU;
 *   k3_ctx *ctx = NULL;
 *   k3_moe_plan *plan = NULL;
 *   uint16_t *x = malloc(sizeof(uint16_t) * (size_t)d.hidden), *y = malloc(sizeof(uint16_t) * (size_t)d.hidden);
 *   const int32_t id = 0; // the token goes to expert 0 with weight 1
 *   const float p = 1.0f;
 *   void *ws = NULL;
 *   size_t ws_bytes = 0;
 *   int rc = 1;
 *   if (!x || !y || (st = k3_ctx_create(&opt, &ctx)) != K3_STATUS_SUCCESS) goto done;
 *   if ((st = k3_moe_plan_create(ctx, &d, &plan)) != K3_STATUS_SUCCESS) goto done;
 *   k3_moe_workspace_size(plan, &ws_bytes);
 *   if (!(ws = malloc(ws_bytes ? ws_bytes : 1))) goto done;
 *   for (int64_t i = 0; i < d.hidden; i++) x[i] = k3_bf16_from_f32(1.0f);
 *   if ((st = k3_moe_run(plan, 1, x, &id, &p, &w, y, NULL, ws, ws_bytes, NULL)) != K3_STATUS_SUCCESS) goto done;
 *   printf("layer %d: %d experts, L %lld, I %lld; y[0] = %g\n", (int)layer->layer, (int)layer->num_experts,
 *          (long long)layer->latent, (long long)layer->inter, (double)k3_bf16_to_f32(y[0]));
 *   rc = isfinite(k3_bf16_to_f32(y[0])) ? 0 : 1;
 * done:
 *   if (rc) fprintf(stderr, "checkpoint example: %s: %s\n", k3_status_string(st), ctx ? k3_ctx_last_error(ctx) : "");
 *   k3_moe_plan_destroy(plan);
 *   k3_ctx_destroy(ctx);
 *   k3_moe_layer_free(layer);
 *   free(ws);
 *   free(x);
 *   free(y);
 *   return rc;
 * End of example
 */
#ifndef K3_H
#define K3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define K3_API __declspec(dllexport)
#else
#define K3_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------ version ---------------- */
#define K3_VERSION_MAJOR 0
#define K3_VERSION_MINOR 1
#define K3_VERSION_PATCH 0
/* "MAJOR.MINOR.PATCH", static storage. */
K3_API const char *k3_version(void);

/* ------------------------------------------------------------------ status ----------------- */
typedef enum k3_status {
    K3_STATUS_SUCCESS = 0,
    K3_STATUS_INVALID_ARGUMENT = 1, /* a NULL pointer, a bad shape, stride, alignment, dtype or option */
    K3_STATUS_UNSUPPORTED = 2,      /* valid, but this build/backend/device does not implement it */
    K3_STATUS_OUT_OF_MEMORY = 3,    /* a host or device allocation at create/plan time failed */
    K3_STATUS_NOT_AVAILABLE = 4,    /* backend not compiled in, or no such device */
    K3_STATUS_CUDA_ERROR = 5,       /* a CUDA runtime call or kernel launch failed */
    K3_STATUS_CUBLAS_ERROR = 6,     /* a cuBLASLt call failed */
    K3_STATUS_IO_ERROR = 7,         /* a file could not be opened, read or written */
    K3_STATUS_FORMAT_ERROR = 8,     /* a malformed file (safetensors, table) */
    K3_STATUS_KEY_MISMATCH = 9,     /* a tuned table whose device key does not match this device */
    K3_STATUS_INTERNAL_ERROR = 10,  /* a bug in the library: please report it */
    K3_STATUS_COMM_ERROR = 11,      /* a collective (NCCL) call failed, or the communicator does not fit the plan */
} k3_status;

/* A short constant description of a status ("invalid argument"). Never NULL. */
K3_API const char *k3_status_string(k3_status status);

/* ------------------------------------------------------------------ context ---------------- */
typedef enum k3_backend {
    K3_BACKEND_CPU = 0,  /* the reference backend: plain C, fp32/fp64 accumulation */
    K3_BACKEND_CUDA = 1, /* NVIDIA GPU kernels (when built with CUDA) */
    K3_BACKEND_AUTO = 2, /* CUDA when a device is present and the build has it, else CPU */
} k3_backend;

typedef enum k3_log_level {
    K3_LOG_ERROR = 0,
    K3_LOG_WARN = 1,
    K3_LOG_INFO = 2,
    K3_LOG_DEBUG = 3,
} k3_log_level;

/* Receives every message at or below the context's log level. `msg` is valid only during the call. */
typedef void (*k3_log_fn)(void *user, k3_log_level level, const char *msg);

typedef struct k3_ctx k3_ctx;

typedef struct k3_ctx_options {
    k3_backend backend;    /* default K3_BACKEND_AUTO */
    int32_t device;        /* CUDA device ordinal, default 0 */
    /* Simulated compute capability (CPU backend only): when sim_major > 0 the context's architecture facts,
     * and so every plan's table choice, are those of that capability. Used by tests and `k3 plan --arch`. */
    int32_t sim_major;
    int32_t sim_minor;
    int32_t sim_sm_count;  /* with sim_major: the simulated multiprocessor count; 0 = the sm_count key of the
                              architecture's table (the device it was tuned on) */
    k3_log_fn log_fn;      /* optional; NULL = silent */
    void *log_user;
    k3_log_level log_level; /* default K3_LOG_WARN */
    /* CUDA contexts: the MoE, router and latent run calls ask the driver whether each pointer they are given is
     * device memory and refuse host memory with INVALID_ARGUMENT (one query per pointer, some microseconds a
     * call). 1 = the caller vouches that every pointer it passes is memory of this context's device (as a binding
     * that has checked its tensors can), and the queries are skipped; host memory then faults asynchronously, as
     * in any kernel launch. Default 0. */
    int32_t skip_pointer_checks;
} k3_ctx_options;

/* Fills defaults. The environment variable K3_LOG_LEVEL (0..3), when set, seeds log_level here (and only here). */
K3_API void k3_ctx_options_init(k3_ctx_options *opt);
/* Creates a context. On failure *out is NULL and nothing leaks. */
K3_API k3_status k3_ctx_create(const k3_ctx_options *opt, k3_ctx **out);
/* NULL is accepted. */
K3_API void k3_ctx_destroy(k3_ctx *ctx);
/* The message of the last failing call on this context ("" when none). Valid until the next call on the
 * context; with several threads on one context, the message of any of their failing calls (see Threads above). */
K3_API const char *k3_ctx_last_error(const k3_ctx *ctx);
K3_API k3_backend k3_ctx_backend(const k3_ctx *ctx);

/* ------------------------------------------------------------------ architecture facts ----- */
typedef enum k3_table_id {
    K3_TABLE_NONE = 0, /* no tuned table: every GEMM uses the fallback */
    K3_TABLE_SM90 = 1,
    K3_TABLE_SM100 = 2,
    K3_TABLE_SM103 = 3,
} k3_table_id;

typedef struct k3_arch_info {
    int32_t cc_major;             /* compute capability, 0.0 on a CPU context without simulation */
    int32_t cc_minor;
    int32_t sm_version;           /* 10 * major + minor: 90, 100, 103, 107, 120 ... */
    int32_t simulated;            /* 1 when the capability was given, not read from a device */
    int32_t has_mixed_bf16_fma;   /* fma.rn.f32.bf16 (bf16 operands, fp32 accumulate): SM100+ */
    int32_t has_fp4_mma;          /* native block-scaled FP4 tensor-core MMA: SM100+ */
    k3_table_id table;            /* which projection table applies */
    int32_t cuda_backend_usable;  /* 1 when this context can run CUDA kernels */
    int32_t sm_count;             /* multiprocessors (real devices, or k3_ctx_options.sim_sm_count; else 0) */
    int64_t l2_bytes;             /* L2 size (real devices only, else 0) */
    int32_t driver_version;       /* cudaDriverGetVersion (real devices only, else 0) */
    int32_t runtime_version;      /* cudaRuntimeGetVersion (real devices only, else 0) */
    char device_name[128];        /* "NVIDIA H200", "cpu", or "simulated sm_107" */
} k3_arch_info;

/* The facts of the context's device (or simulated capability). */
K3_API k3_status k3_ctx_arch(const k3_ctx *ctx, k3_arch_info *out);
/* The facts a device of capability major.minor would have (pure function, no device needed). */
K3_API k3_status k3_arch_from_capability(int32_t major, int32_t minor, k3_arch_info *out);
/* "none", "sm90", "sm100", "sm103". */
K3_API const char *k3_table_name(k3_table_id table);

/* ------------------------------------------------------------------ number formats --------- */
/* Scalar codecs (round-to-nearest-even; NaN stays NaN; e4m3 and e2m1 saturate to their max).
 * e4m3 is OCP E4M3FN (bias 7, subnormals, max 448, 0x7F/0xFF = NaN, infinities saturate to +-448).
 * The sign of zero is kept: -0.0, and negatives that round to zero, encode as 0x80 (e4m3) / 0x8 (e2m1).
 * E2M1 has no NaN: k3_e2m1_from_f32(NaN) gives +-0 (k3_fp4_quantize rejects non-finite input instead). */
K3_API uint16_t k3_bf16_from_f32(float x);
K3_API float k3_bf16_to_f32(uint16_t b);
K3_API uint8_t k3_e4m3_from_f32(float x);
K3_API float k3_e4m3_to_f32(uint8_t c);
K3_API uint8_t k3_e2m1_from_f32(float x); /* a 4-bit code in the low nibble */
K3_API float k3_e2m1_to_f32(uint8_t c);   /* reads the low nibble */
K3_API float k3_ue8m0_to_f32(uint8_t c);  /* 2^(c-127); 0xFF = NaN */

typedef enum k3_fp4_format {
    K3_FP4_NVFP4 = 0, /* blocks of 16, e4m3 block scales, one fp32 global scale per matrix */
    K3_FP4_MXFP4 = 1, /* blocks of 32, ue8m0 block scales, no global scale */
} k3_fp4_format;

typedef enum k3_scale_layout {
    K3_SCALE_LINEAR = 0,      /* scale (r, b) at r * (K / block) + b */
    K3_SCALE_SWIZZLED = 1,    /* CUTLASS/FlashInfer 128x4: rows padded to 128, scale columns to 4 */
} k3_scale_layout;

/* Bytes of one matrix's block scales ([rows, cols] weight) in the given layout (swizzled includes padding;
 * swizzled byte of (r, b) = ((r/128) * (Kp/4) + b/4) * 512 + (r%32) * 16 + ((r%128)/32) * 4 + b%4, Kp = the
 * scale-column count rounded up to 4). */
K3_API k3_status k3_fp4_scale_bytes(k3_fp4_format fmt, k3_scale_layout layout, int64_t rows, int64_t cols,
                                    size_t *out_bytes);
/*
 * Quantizes `batch` matrices of [rows, cols] fp32 (contiguous) to packed E2M1 ([rows, cols/2] bytes each,
 * element 2j in the low nibble) plus block scales (k3_fp4_scale_bytes each).
 * NVFP4: per matrix gs = 448 * 6 / amax; `global_scale_inv` [batch] receives 1 / gs (ModelOpt weight_scale_2);
 * an all-zero matrix gets gs = 1; block scale sf = e4m3((gs * amax_block) / 6), q = e2m1((x * gs) / sf).
 * MXFP4: `global_scale_inv` must be NULL; the OCP MX rule: block scale 2^(floor(log2(amax_block)) - 2), its
 * biased exponent clamped to 0..254, q = e2m1(x / scale) (elements up to 8 * scale saturate to 6).
 * A zero block gets scale byte 0 and all-zero codes; swizzled padding bytes are 0.
 * cols must be a multiple of the block size (16 or 32). NaN or Inf in x -> K3_STATUS_INVALID_ARGUMENT (FP4
 * cannot represent them), checked before anything is written. Runs on the host.
 */
K3_API k3_status k3_fp4_quantize(k3_fp4_format fmt, k3_scale_layout layout, int64_t batch, int64_t rows,
                                 int64_t cols, const float *x, uint8_t *packed, uint8_t *scales,
                                 float *global_scale_inv);
/* The inverse: x ~= q * scale * global_scale_inv (NVFP4) or q * 2^(s-127) (MXFP4). */
K3_API k3_status k3_fp4_dequantize(k3_fp4_format fmt, k3_scale_layout layout, int64_t batch, int64_t rows,
                                   int64_t cols, const uint8_t *packed, const uint8_t *scales,
                                   const float *global_scale_inv, float *x);

/* ------------------------------------------------------------------ activations ------------ */
typedef enum k3_act_kind {
    K3_ACT_SILU = 0,                   /* [gate, up]: silu(min(g, L)) * clamp(u, -L, L); no clamp when limit is 0 */
    K3_ACT_SWIGLUOAI = 1,              /* interleaved g = x[0::2], u = x[1::2]: (u' + beta) * g' * sigmoid(alpha g') */
    K3_ACT_SWIGLUOAI_UNINTERLEAVE = 2, /* [gate, up], same math as SWIGLUOAI; requires a limit */
    K3_ACT_RELU2_NO_MUL = 3,           /* not gated: relu(x)^2 */
    K3_ACT_SITU = 4,                   /* [gate, up]: beta tanh(g/beta) sigmoid(g) * (lb tanh(u/lb) or u) */
} k3_act_kind;

typedef struct k3_act_desc {
    k3_act_kind kind;
    float alpha;            /* SWIGLUOAI sigmoid scale, default 1.702 */
    float beta;             /* SWIGLUOAI offset added to up (the "+1"), default 1.0 */
    float limit;            /* clamp limit, finite and >= 0; 0 means none. SWIGLUOAI default 7.0 */
    float situ_beta;        /* SITU: required, finite, > 0 (K3: 4.0). 0 means unset */
    float situ_linear_beta; /* SITU: optional, finite, > 0 when set (K3: 25.0). 0 means unset */
    /* 0 is the only "unset" value: a negative or non-finite limit, situ_beta or situ_linear_beta is refused
     * (INVALID_ARGUMENT naming the field), so a sign slip never silently drops a clamp. */
} k3_act_desc;

/* Defaults for a kind (SITU gets no betas: set them, or use k3_act_desc_k3). */
K3_API void k3_act_desc_init(k3_act_desc *d, k3_act_kind kind);
/* Kimi-K3's activation: SITU, beta 4.0, linear_beta 25.0. */
K3_API void k3_act_desc_k3(k3_act_desc *d);
/* Checks a descriptor; on failure writes a message such as "SITU activation requires activation_situ_beta"
 * into msg (if non-NULL) and returns K3_STATUS_INVALID_ARGUMENT. Plans call this once. Besides the rules above,
 * situ betas on a non-SITU kind are refused (SiTU is its own kind here, not SiLU plus a beta). */
K3_API k3_status k3_act_desc_validate(const k3_act_desc *d, char *msg, size_t msg_size);
/* "situ", "silu", "swigluoai", "swigluoai_uninterleave", "relu2". */
K3_API const char *k3_act_name(k3_act_kind kind);

/* ------------------------------------------------------------------ BF16 linear (GEMM) ----- */
typedef enum k3_kernel {
    K3_KERNEL_AUTO = 0,     /* the plan's table decides per M */
    K3_KERNEL_FALLBACK = 1, /* cuBLASLt on CUDA, the reference loop on the CPU */
    K3_KERNEL_SKINNY = 2,   /* CUDA-core skinny kernel */
    K3_KERNEL_MMA = 3,      /* tensor-core small-M kernel */
} k3_kernel;

typedef enum k3_accum {
    K3_ACCUM_FP32 = 0,
    K3_ACCUM_FP64 = 1, /* CPU backend only: the test oracle */
} k3_accum;

typedef struct k3_linear_desc {
    int64_t n, k;            /* weight [n, k], k contiguous */
    int64_t max_m;           /* the largest token count run calls will pass: 1..32, default 16 */
    int64_t x_stride;        /* elements between rows of x; 0 = k */
    int64_t y_stride;        /* elements between rows of y (and of the residual); 0 = n */
    k3_accum accum;          /* default FP32 */
    k3_kernel force_kernel;  /* default AUTO; anything else forces that kernel for every M (tests, benchmarks) */
    const char *force_config;/* with SKINNY/MMA: a configuration name as in the tables ("b256_o4_u2"), or NULL
                              * (the table's choice when it is that kernel, else the kernel's first configuration
                              * that can run the shape); with FALLBACK: "hI" = the I-th algorithm of cuBLASLt's
                              * heuristic (default h0). A forced choice that cannot run (n, k, max_m, x_stride)
                              * is refused with INVALID_ARGUMENT saying why. */
} k3_linear_desc;

typedef struct k3_linear_plan k3_linear_plan;

K3_API void k3_linear_desc_init(k3_linear_desc *d, int64_t n, int64_t k);
K3_API k3_status k3_linear_plan_create(k3_ctx *ctx, const k3_linear_desc *d, k3_linear_plan **out);
K3_API void k3_linear_plan_destroy(k3_linear_plan *plan);
/* Bytes of workspace a run call needs (0 is a valid answer; then ws may be NULL). */
K3_API k3_status k3_linear_workspace_size(const k3_linear_plan *plan, size_t *out_bytes);
/* Which kernel and configuration the plan runs for m tokens, e.g. "mma w8_t1_u4_c8" or "cublaslt h0 (algo id 66)";
 * on a CPU context the reference loop plus what the table would pick on a GPU. */
K3_API k3_status k3_linear_plan_kernel(const k3_linear_plan *plan, int64_t m, char *buf, size_t buf_size);
/*
 * y[m, n] = x[m, k] . w[n, k]^T (+ residual[m, n]), BF16 in and out, fp32 accumulation (fp64 when asked on CPU),
 * the residual added in fp32 before the single BF16 rounding. residual may be NULL; it may alias y.
 * 1 <= m <= max_m.
 */
K3_API k3_status k3_linear_run(k3_linear_plan *plan, int64_t m, const void *x, const void *w,
                               const void *residual, void *y, void *ws, size_t ws_bytes, void *stream);
/*
 * Loads a GEMM table file (the format of the tables/ folder, written by `k3 tune`) into the context; plans created
 * afterwards use it instead of the embedded table of the context's architecture. A table whose header names a
 * device is refused with K3_STATUS_KEY_MISMATCH (the message names the differing fields: gpu, sm_count,
 * capability, arch) unless force != 0; driver, runtime and library differences are only logged (WARN). A table
 * without a gpu field is keyed by architecture only. Malformed files give K3_STATUS_FORMAT_ERROR with the line
 * number. path NULL returns to the embedded table. Existing plans are unaffected.
 */
K3_API k3_status k3_ctx_load_table(k3_ctx *ctx, const char *path, int32_t force);

/* ------------------------------------------------------------------ router ----------------- */
typedef enum k3_router_kind {
    K3_ROUTER_SIGMOID_NOAUX_TC = 0, /* Kimi-K3 / DeepSeek-V3: sigmoid, + correction bias for the choice */
    K3_ROUTER_SOFTMAX = 1,          /* softmax over logits, top-k, renormalize */
} k3_router_kind;

typedef enum k3_dtype {
    K3_DTYPE_BF16 = 0,
    K3_DTYPE_F32 = 1,
} k3_dtype;

typedef struct k3_router_desc {
    k3_router_kind kind;
    int32_t num_experts;      /* E, 1..4096 */
    int32_t top_k;            /* 1..min(E, 32) */
    int64_t hidden;           /* H: width of x and of the gate weight rows, 1..2^24 */
    k3_dtype gate_dtype;      /* dtype of the gate weight [E, H] (x is always BF16) */
    int32_t renormalize;      /* default 1 */
    float scaling_factor;     /* routed_scaling_factor, default 1.0 */
    int64_t max_tokens;       /* 1..65536, default 16 */
} k3_router_desc;

typedef struct k3_router_plan k3_router_plan;

/* K3 defaults: sigmoid noaux_tc, E 896, top-k 16, H 7168, BF16 gate, renormalize, scale 1.0. */
K3_API void k3_router_desc_init(k3_router_desc *d);
K3_API k3_status k3_router_plan_create(k3_ctx *ctx, const k3_router_desc *d, k3_router_plan **out);
K3_API void k3_router_plan_destroy(k3_router_plan *plan);
/* Bytes of workspace a run needs: on CPU one token's E fp32 logits (plus alignment slack: ws need not be
 * aligned), on CUDA the [max_tokens, E] fp32 logits. Never 0: a run's ws must not be NULL. */
K3_API k3_status k3_router_workspace_size(const k3_router_plan *plan, size_t *out_bytes);
/*
 * logits = fp32(x) . fp32(gate)^T; returns topk_ids [m, top_k] int32 (descending choice; ties to the lower id)
 * and topk_weights [m, top_k] f32. bias [E] f32 is used only by SIGMOID_NOAUX_TC and may be NULL there (a
 * SOFTMAX plan refuses a non-NULL bias).
 * SIGMOID_NOAUX_TC: s = sigmoid(logit), choice = s + bias, weights = s[ids] / (sum s[ids] + 1e-20) * scaling_factor
 * (s[ids] * scaling_factor without renormalize). SOFTMAX: p = softmax(logits), top-k by p, weights = p[ids] /
 * sum p[ids] * scaling_factor (p[ids] * scaling_factor without renormalize).
 * A NaN logit (or choice) ranks below every other expert (NaN experts come last, lowest id first) with weight 0.
 * The CUDA router sums the logits in the CPU router's fixed order and shares its exp/sigmoid, so ids and weights
 * are bitwise equal on both backends. Every pointer must be aligned to its element (x 2 bytes, gate 2 or 4, bias,
 * topk_ids and topk_weights 4); others are refused with INVALID_ARGUMENT naming the pointer.
 */
K3_API k3_status k3_router_run(k3_router_plan *plan, int64_t m, const void *x, const void *gate, const float *bias,
                               int32_t *topk_ids, float *topk_weights, void *ws, size_t ws_bytes, void *stream);

/* ------------------------------------------------------------------ routed experts (MoE) --- */
typedef enum k3_weight_format {
    K3_WEIGHT_BF16 = 0,
    K3_WEIGHT_NVFP4 = 1,
    K3_WEIGHT_MXFP4 = 2,
} k3_weight_format;

typedef enum k3_moe_mode {
    K3_MOE_W4A16 = 0, /* activations stay BF16 */
    K3_MOE_W4A4 = 1,  /* activations quantized to NVFP4 (emulated) at GEMM1 and GEMM2 inputs; NVFP4 weights only */
} k3_moe_mode;

typedef struct k3_moe_desc {
    int32_t num_experts;   /* E (local experts) */
    int32_t top_k;
    int64_t hidden;        /* L: the expert input/output width (the latent width in K3) */
    int64_t inter;         /* I: per-expert intermediate (W13 is [2I, L], W2 is [L, I]) */
    k3_weight_format format;
    k3_scale_layout scale_layout;   /* layout of the FP4 block scales, default LINEAR */
    int32_t w13_separate_scale_2;   /* NVFP4: 1 = w13_scale_2 is [E, 2] (gate, up), 0 = [E] shared */
    k3_moe_mode mode;
    k3_act_desc act;
    int64_t max_tokens;    /* default 16 */
    int32_t force_shape;   /* K3_MOE_FORCE_* bits: launch-shape choices of the CUDA plan turned off (tests and
                              benchmarks compare them; each gives bitwise the same output); default 0 = the plan's
                              own choice at every m. Ignored by the CPU backend. */
    int32_t global_experts; /* expert parallelism: 0 (default) = topk_ids are this plan's experts, [0, E); > 0 =
                              topk_ids are global ids in [0, global_experts) (the router's), turned into this
                              rank's ids by k3_moe_weights.expert_map; E <= global_experts */
} k3_moe_desc;

/* Launch-shape choices of the CUDA routed experts that k3_moe_desc.force_shape can turn off. */
typedef enum k3_moe_force {
    K3_MOE_FORCE_NONE = 0,
    K3_MOE_FORCE_NO_FOLD = 1,  /* keep the dispatch kernel where the GEMMs would route themselves from topk_ids */
    K3_MOE_FORCE_NO_PAIR = 2,  /* GEMM1 in 16-output blocks where it would put gate and up rows in one tile */
    K3_MOE_FORCE_NO_TILES = 4, /* GEMM2 one 16-row tile per warp where it would take two or four */
    K3_MOE_FORCE_NO_EARLY = 8, /* GEMM1's first wave waits for the dispatch kernel where it would route itself */
    K3_MOE_FORCE_NO_BALANCE = 16, /* the folded GEMM1 takes as many blocks per SM as fit where it would hold them
                                   * to its grid's share (k3_moe_launch_info.gemm1_blocks_per_sm) */
} k3_moe_force;

/* What a CUDA MoE plan launches for m tokens (k3_moe_plan_kernel): the instance names of the registry
 * (src/plan/moe_configs.def), their grids, and the launch-shape choices. */
typedef struct k3_moe_launch_info {
    char gemm1[64];             /* "g1_nvfp4_gated_nt1_async_fold"; "cpu" on the CPU backend */
    char gemm2[64];
    int64_t gemm1_grid[2], gemm2_grid[2]; /* blocks (x: expert slots or units, y: row tiles) */
    int32_t dispatch;           /* 1: the dispatch kernel runs first (0: the GEMMs route themselves) */
    int32_t combine;            /* 1: a combine kernel sums the slots (0: top_k 1, GEMM2 writes out) */
    int32_t token_tiles;        /* 8-token tiles per pass */
    int32_t tokens_per_unit;    /* the dispatch's pairs per unit */
    int32_t fold, pair, early, wide, dense, direct;
    int32_t gemm2_split_k;      /* GEMM2's warps split K */
    int32_t gemm2_tiles;        /* GEMM2 16-row tiles per warp */
    int64_t early_blocks;       /* GEMM1 blocks that route themselves ahead of the dispatch kernel */
    int32_t gemm1_blocks_per_sm; /* the folded GEMM1's one-wave grid held to this many blocks per SM (its grid's
                                    share, rounded up), so that blocks which find SMs busy at launch wait for them
                                    instead of stacking on the free ones; 0 = as many as fit */
} k3_moe_launch_info;

/* The tensors of the routed experts; every pointer is device memory on CUDA, host on CPU. */
typedef struct k3_moe_weights {
    const void *w13;            /* BF16 [E, 2I, L] or packed FP4 [E, 2I, L/2]; rows [gate; up] (SWIGLUOAI:
                                   interleaved); RELU2_NO_MUL: I rows */
    const void *w13_scale;      /* FP4 block scales: e4m3 (NVFP4) or ue8m0 (MXFP4), per expert */
    const float *w13_scale_2;   /* NVFP4 global dequant scale (1/gs): [E] or [E, 2] */
    const float *w13_input_scale; /* W4A4: [E] (activation gs = 1 / input_scale) */
    const void *w2;             /* BF16 [E, L, I] or packed FP4 [E, L, I/2] */
    const void *w2_scale;
    const float *w2_scale_2;    /* [E] */
    const float *w2_input_scale;/* W4A4: [E] */
    const int32_t *expert_map;  /* with global_experts > 0: [global_experts], global id -> this rank's id in [0, E)
                                   or -1 = not on this rank (that slot contributes nothing); where the weights live
                                   (device memory on CUDA); NULL otherwise */
} k3_moe_weights;

typedef struct k3_moe_plan k3_moe_plan;

/* K3 TP8 defaults: E 896, top-k 16, L 3584, I 384, NVFP4 linear scales, shared scale_2, W4A16, SITU 4/25. */
K3_API void k3_moe_desc_init(k3_moe_desc *d);
K3_API k3_status k3_moe_plan_create(k3_ctx *ctx, const k3_moe_desc *d, k3_moe_plan **out);
K3_API void k3_moe_plan_destroy(k3_moe_plan *plan);
K3_API k3_status k3_moe_workspace_size(const k3_moe_plan *plan, size_t *out_bytes);
/* What a run of m tokens (1 <= m <= max_tokens) launches. Plans on CUDA contexts, and on CPU contexts with a
 * simulated capability whose architecture table names an SM count (or sim_sm_count), resolve the CUDA launches
 * once per m at plan time; a plain CPU plan reports "cpu". */
K3_API k3_status k3_moe_plan_kernel(const k3_moe_plan *plan, int64_t m, k3_moe_launch_info *out);
/*
 * out[m, L] = bf16( sum_j topk_weights[t, j] * W2_e(act(bf16(W13_e x_t))) ), e = topk_ids[t, j], fp32 sum.
 * x [m, L] BF16; topk_ids [m, top_k] int32; topk_weights [m, top_k] f32.
 * out_f32 (optional, may be NULL): the same sum before its BF16 rounding, [m, L] f32.
 * The activation output is rounded to BF16 (W4A16) or NVFP4 quantize-dequantized with gs = 1/w2_input_scale
 * (W4A4, where x is too, per row, with gs = 1/w13_input_scale); expert outputs are summed unrounded. A row of
 * out does not depend on the other tokens of the batch. Expert parallelism: id -1 means "not on this rank" and the
 * slot contributes nothing; so does any other id outside [0, E), on both backends (ids are not checked: on CUDA
 * they live in device memory and are not read back, so the call stays capturable). A token whose slots are all
 * dropped gets a zero row. CUDA requires L and I to be multiples of 32, x, w13 and
 * w2 16-byte aligned and (NVFP4) the block-scale pointers 4-byte aligned. CUDA runs refuse host pointers with
 * INVALID_ARGUMENT (outside graph capture).
 */
K3_API k3_status k3_moe_run(k3_moe_plan *plan, int64_t m, const void *x, const int32_t *topk_ids,
                            const float *topk_weights, const k3_moe_weights *w, void *out, float *out_f32,
                            void *ws, size_t ws_bytes, void *stream);

/* ------------------------------------------------------------------ latent MoE block ------- */
/* How a block is split over ranks (GPUs). */
typedef enum k3_parallel_layout {
    K3_PARALLEL_NONE = 0, /* one rank holds the whole block */
    K3_PARALLEL_TP = 1,   /* tensor parallel: every rank holds all E experts with I / size of their intermediate
                           * (w13's gate and up rows sharded alike, w2's columns), Is / size of the shared experts
                           * (shared_gate_up rows, shared_down columns), and the router and latent projections
                           * whole; the descriptor's experts.inter and shared_inter are this rank's slices */
    K3_PARALLEL_EP = 2,   /* expert parallel: a rank holds a subset of whole experts (experts.num_experts of
                           * them; experts.global_experts = the router's count; the weights' expert_map says which),
                           * Is / size of the shared experts as in TP, and the router and latent projections whole;
                           * the tokens are as parallel.tokens says */
} k3_parallel_layout;

/* Which tokens a rank of a TP or EP block passes (parallel.tokens). */
typedef enum k3_parallel_tokens {
    K3_TOKENS_REPLICATED = 0, /* every rank passes the same m tokens (tensor-parallel attention) and gets y of all m */
    K3_TOKENS_PER_RANK = 1,   /* data-parallel attention: every rank passes its own m tokens (the same m on every
                               * rank: engines pad) and gets y of those m; the block runs on the size * m tokens
                               * gathered in rank order (rank r's are rows [r m, (r + 1) m)), and max_tokens counts
                               * them: size * m <= max_tokens (so max_tokens >= size). For a TP or EP layout
                               * (NONE + PER_RANK is refused); with size 1 it is the same block as REPLICATED. */
} k3_parallel_tokens;

typedef struct k3_parallel_desc {
    k3_parallel_layout layout;
    int32_t rank; /* 0 .. size - 1 */
    int32_t size; /* 1 for NONE */
    void *nccl_comm; /* the caller's ncclComm_t (size ranks, this one `rank`, on the context's device), or NULL.
                      * With it (CUDA contexts, TP or EP), k3_latent_moe_run reduces across the ranks itself, on the
                      * caller's stream; the library never creates or destroys a communicator. NULL: the
                      * engine-driven stages (k3_latent_moe_run_stage), no collective inside. A build or process
                      * without NCCL answers NOT_AVAILABLE at plan time. */
    k3_parallel_tokens tokens; /* default REPLICATED; PER_RANK: see k3_latent_moe_run and the stages below */
} k3_parallel_desc;

/* Which stream each part of the CUDA block runs on (k3_latent_moe_desc.schedule). The router and the down
 * projection both read only x, and so do the shared experts: the parts that read HBM slowly (the router's
 * selection) can run beside those that stream weights. */
typedef enum k3_latent_schedule {
    K3_LATENT_SCHEDULE_AUTO = 0,          /* the plan's choice for the architecture */
    K3_LATENT_SCHEDULE_SHARED_BESIDE = 1, /* the shared experts on a second stream beside the routed path */
    K3_LATENT_SCHEDULE_ROUTER_BESIDE = 2, /* the router on a second stream beside the down projection and the
                                           * shared experts; the experts start when both are done */
    K3_LATENT_SCHEDULE_SERIAL = 3,        /* one stream: shared experts, router, down, experts, norm, up */
    K3_LATENT_SCHEDULE_SELECT_BESIDE = 4, /* SHARED_BESIDE, and the router's selection on a third stream beside
                                           * the down projection (the logits stay on the main stream) */
    K3_LATENT_SCHEDULE_LOGITS_FIRST = 5,  /* SELECT_BESIDE with the shared experts started after the router logits,
                                           * which then run alone */
} k3_latent_schedule;

typedef struct k3_latent_moe_desc {
    int64_t hidden;          /* H, 7168 */
    k3_router_desc router;   /* router.hidden must equal hidden */
    k3_moe_desc experts;     /* experts.hidden is the latent width L (3584) */
    int64_t shared_inter;    /* Is: merged shared-expert intermediate (K3 TP8: 768); 0 = no shared experts */
    k3_act_desc shared_act;  /* default SITU 4/25 */
    float rms_eps;           /* 1e-5 */
    int64_t max_tokens;      /* default 16; governs the block (router.max_tokens and experts.max_tokens are ignored) */
    k3_parallel_desc parallel; /* default NONE (rank 0 of 1): how the block is split over the GPUs */
    k3_latent_schedule schedule; /* default AUTO; a forced schedule is for tests and benchmarks (CUDA only: the
                                  * CPU backend runs in one order; every schedule gives the same bits) */
} k3_latent_moe_desc;

typedef struct k3_latent_moe_weights {
    const void *gate;                /* router gate [E, H], router.gate_dtype */
    const float *bias;               /* e_score_correction_bias [E] or NULL */
    const void *down_proj;           /* BF16 [L, H] */
    k3_moe_weights experts;
    const void *norm;                /* BF16 [L] */
    const void *up_proj;             /* BF16 [H, L] */
    const void *shared_gate_up;      /* BF16 [2 Is, H] ([gate; up]) */
    const void *shared_down;         /* BF16 [H, Is] */
} k3_latent_moe_weights;

typedef struct k3_latent_moe_plan k3_latent_moe_plan;

/* K3 TP8 block: H 7168, the K3 router and experts, Is 768, SITU 4/25, eps 1e-5. */
K3_API void k3_latent_moe_desc_init(k3_latent_moe_desc *d);
K3_API k3_status k3_latent_moe_plan_create(k3_ctx *ctx, const k3_latent_moe_desc *d, k3_latent_moe_plan **out);
K3_API void k3_latent_moe_plan_destroy(k3_latent_moe_plan *plan);
K3_API k3_status k3_latent_moe_workspace_size(const k3_latent_moe_plan *plan, size_t *out_bytes);
/*
 * y[m, H] = RMSNorm(u) . up_proj^T + shared(x) (+ residual), u = sum_j p_j E_j(bf16(x . down_proj^T)).
 * topk_ids / topk_weights (optional, may be NULL) receive the routing. u stays fp32; RMSNorm(u) =
 * bf16(bf16(u / sqrt(mean(u^2) + eps)) * norm); shared(x) = bf16(bf16(act(bf16(x . gate_up^T))) . down^T);
 * t = bf16(shared(x) + residual) (shared(x) alone without a residual, the residual alone without shared experts);
 * y = bf16(RMSNorm(u) . up_proj^T + t): the up projection's fp32 sums with t added before their one rounding.
 * residual may be NULL or alias y.
 * A plan of a rank of several (parallel.size > 1) holds only part of the block: with parallel.nccl_comm (tokens
 * REPLICATED), the run is PRE_REDUCE, one ncclAllReduce (sum) of the fp32 partial in the workspace, then
 * POST_REDUCE, all on `stream` (every rank calls it, as with any collective; capturable); without one,
 * k3_latent_moe_run refuses it (INVALID_ARGUMENT), since it would normalize this rank's partial u: run the stages
 * below with the cross-rank sum between them.
 * parallel.tokens PER_RANK with parallel.nccl_comm: x, residual and y are this rank's m tokens [m, H]; the run is
 * ncclAllGather of x into the workspace ([size m, H], rank order), PRE_REDUCE on the size m rows, one NCCL group
 * of two ncclReduceScatter (sum; the u rows, then the shared rows) that leaves this rank's rows of the summed
 * partial in the workspace, and POST_REDUCE on m rows, all on `stream` (capturable, no allocation). size m above
 * max_tokens is INVALID_ARGUMENT ("too many tokens for this plan"). topk_ids / topk_weights, when not NULL,
 * receive the routing of this rank's own tokens [m, k] (rows [rank m, (rank + 1) m) of the gathered routing).
 */
K3_API k3_status k3_latent_moe_run(k3_latent_moe_plan *plan, int64_t m, const void *x,
                                   const k3_latent_moe_weights *w, const void *residual, void *y,
                                   int32_t *topk_ids, float *topk_weights, void *ws, size_t ws_bytes,
                                   void *stream);

/* The schedule a run of m tokens takes (never AUTO; 1 <= m <= max_tokens): the descriptor's at every m, or on AUTO
 * the architecture's measured choice for that m; SERIAL on the CPU backend, and where a second stream would have
 * nothing to run (SHARED_BESIDE without shared experts). */
K3_API k3_status k3_latent_moe_plan_schedule_at(const k3_latent_moe_plan *plan, int64_t m,
                                                k3_latent_schedule *out);
/* k3_latent_moe_plan_schedule_at at m = max_tokens. */
K3_API k3_status k3_latent_moe_plan_schedule(const k3_latent_moe_plan *plan, k3_latent_schedule *out);

/* The block's two halves around the cross-rank reduction. */
typedef enum k3_latent_stage {
    K3_LATENT_PRE_REDUCE = 1,  /* router, down projection, routed experts, shared experts -> partial */
    K3_LATENT_POST_REDUCE = 2, /* RMSNorm of the reduced u, up projection, + shared + residual -> y */
} k3_latent_stage;
/*
 * The block of a rank, in two calls, for engines that own their collectives: PRE_REDUCE writes this rank's fp32
 * partial [count] (k3_latent_moe_partial_count: u [m, L], then, with shared experts, the shared output [m, H]),
 * the caller sums the partials of all ranks elementwise (one all-reduce of `count` floats, in place or not), and
 * POST_REDUCE turns the summed buffer into y. PRE_REDUCE reads x and the weights gate, bias, down_proj, experts,
 * shared_gate_up and shared_down, and writes topk_ids / topk_weights when they are not NULL (every rank computes
 * the same routing from the same x); residual and y are not read and may be NULL. POST_REDUCE reads partial,
 * norm, up_proj and residual (may be NULL or alias y), and writes y; x may be NULL. Both partials are unrounded
 * fp32 sums, and POST_REDUCE rounds where the whole block does (the shared output once, to BF16, after the sum),
 * so the ranks' result differs from the unsharded block only by fp32 summation order (one rank's PRE then POST
 * gives k3_latent_moe_run's bits, on both backends). partial is 16-byte aligned on CUDA (cudaMalloc is). Both
 * stages take the plan's workspace (k3_latent_moe_workspace_size); one capture may hold PRE_REDUCE, the caller's
 * reduction and POST_REDUCE.
 * The stages run on whatever rows they are given (m <= max_tokens each). With parallel.tokens PER_RANK (m tokens
 * per rank, M = size m <= max_tokens), the engine gathers the ranks' x in rank order into xg [M, H] and runs
 * PRE_REDUCE(M, xg) into a partial of k3_latent_moe_partial_count(M) floats (u [M, L], then shared [M, H]); it
 * reduce-scatters: rank r's local partial, k3_latent_moe_partial_count(m) floats, is u [m, L] = the sum over the
 * ranks of u rows [r m, (r + 1) m), then shared [m, H] = the sum of shared rows [r m, (r + 1) m) (two
 * reduce-scatters, of M L and M H floats, each block r of which is rank r's rows); then POST_REDUCE(m) on the local
 * partial with this rank's residual writes its y [m, H]. PRE_REDUCE's topk_ids / topk_weights are then those of
 * the M gathered tokens.
 */
K3_API k3_status k3_latent_moe_partial_count(const k3_latent_moe_plan *plan, int64_t m, size_t *out_count);
K3_API k3_status k3_latent_moe_run_stage(k3_latent_moe_plan *plan, k3_latent_stage stage, int64_t m,
                                         const void *x, const k3_latent_moe_weights *w, const void *residual,
                                         void *y, float *partial, int32_t *topk_ids, float *topk_weights, void *ws,
                                         size_t ws_bytes, void *stream);

/* ------------------------------------------------------------------ KDA projection overlap - */
/*
 * The KDA input projection of Kimi-K3 (the three GEMMs that feed a KDA layer at decode): from x [m, hidden] and
 * the packed in_proj weight [packed_rows, hidden] (rows 0..qkvg_rows-1 = q, k, v, g; then f_a (fa_dim rows), beta
 * (local_heads rows), zero padding) and f_b [qkvg_rows / 4, fa_dim]:
 *   qkvg [m, qkvg_rows]           = x . W[0:qkvg_rows]^T                      (caller's stream)
 *   fab  [m, fab_rows]            = x . W[qkvg_rows:packed_rows]^T            (aux stream)
 *   g1   [m, qkvg_rows / 4]       = fab[:, 0:fa_dim] . f_b^T  (f_a read with row stride fab_rows, aux stream)
 * with qkvg_rows = 4 * local_heads * head_dim and fab_rows = packed_rows - qkvg_rows. For 1 <= m <=
 * overlap_max_tokens the aux branch runs concurrently (fork/join by events made at plan time), or all three inside
 * one launch (K3_KDA_RUN_N_FUSED, the SM90 default); otherwise all three run in order on the caller's stream, with
 * bitwise the same results (after the one launch: qkvg bitwise, fab and g1 up to rounding order). Capturable into
 * CUDA graphs. The per-m choices (overlap range, F_AB block shape, QKVG kernel) are the `kda` rows of the
 * architecture's plan table (tables/<arch>.txt, or a table loaded with k3_ctx_load_table).
 */
/* Block shapes of the F_AB kernel (fab = x . W_fab^T; a block spans all of K, except SLICED). */
typedef enum k3_kda_run_n {
    K3_KDA_RUN_N_TUNED = 0,  /* the table's choice per m (the default) */
    K3_KDA_RUN_N_ROWS1 = 1,  /* hidden / 16 threads, one output row per block */
    K3_KDA_RUN_N_ROWS2 = 2,  /* hidden / 16 threads, two output rows per block */
    K3_KDA_RUN_N_NARROW = 3, /* 128 threads and one row per block (hidden % 1024 == 0, else ROWS1): small
                                enough to sit beside a QKVG kernel that fills every SM in one wave */
    K3_KDA_RUN_N_SLICED = 4, /* 128 threads = 16 rows x one K slice per block, about one block per SM (the
                                plan then owns device counts: its runs must be ordered on the GPU) */
    K3_KDA_RUN_N_FUSED = 5,  /* not a run_n shape: where the plan overlaps (m <= overlap_max_tokens), the whole
                                projection in ONE launch on the caller's stream, no aux stream: QKVG tiles three to a
                                block on qkvg_rows / 48 SMs, F_AB then f_b on the remaining SMs. The sequential path
                                (m > overlap_max_tokens) then runs the QKVG GEMM with the same tile configuration
                                (mma w4_t1_u4_l_h2: qkvg bit for bit the same) and the two-row F_AB kernel; fab and g1
                                differ from the one launch's in rounding only (K summed in another order). CUDA; needs
                                hidden % 32 == 0, qkvg_rows % 48 == 0, <= 144 F_AB rows and, every block resident at
                                once, qkvg_rows / 48 SMs plus enough for the branch (4 at TP8); otherwise the tuned
                                plan takes the table's choice for a device it does not fit, and a forced one is
                                refused. The plan owns device state: its runs must be ordered on the GPU (one stream,
                                or streams ordered by events) */
} k3_kda_run_n;

/* The QKVG GEMM's kernel, the same for the overlapped and the sequential path (so they give the same bits). */
typedef enum k3_kda_qkvg {
    K3_KDA_QKVG_TUNED = 0,    /* the table's choice per m (the default) */
    K3_KDA_QKVG_TABLE = 1,    /* the linear plan's GEMM table (the fastest QKVG alone) at every m */
    K3_KDA_QKVG_CUBLASLT = 2, /* cuBLASLt at every m */
} k3_kda_qkvg;

typedef struct k3_kda_proj_desc {
    int64_t hidden;             /* K of the big GEMM, 7168 */
    int64_t local_heads;        /* KDA heads on this rank, 1..4096: 12 at TP8 (24 at TP4, 6 at TP16) */
    int64_t head_dim;           /* a multiple of 8 in 8..1024: 128 */
    int64_t fa_dim;             /* f_a width, 128 */
    int64_t packed_rows;        /* rows of the packed weight, 1..2^24: 6288 at TP8 (12448 at TP4, 3216 at TP16) */
    int64_t max_tokens;         /* 1..16, default 16 */
    int64_t overlap_max_tokens; /* overlap for m <= this (0 = never); default -1 = the table's value for this
                                   architecture (capped at max_tokens) */
    k3_kda_run_n run_n_shape;   /* the F_AB kernel's blocks: TUNED (default) = the table's choice per m; any other
                                   value forces that shape at every m (benchmarks and tests compare them) */
    k3_kda_qkvg qkvg_kernel;    /* the QKVG GEMM's kernel: TUNED (default) = the table's choice per m; TABLE or
                                   CUBLASLT force it at every m. Not used where the one-launch projection runs
                                   (K3_KDA_RUN_N_FUSED has its own QKVG tiles). The sliced and fused shapes keep
                                   state in the plan's device memory: the runs of one plan must be ordered on the GPU
                                   (one stream, or streams ordered by events). */
} k3_kda_proj_desc;

typedef struct k3_kda_proj_plan k3_kda_proj_plan;

/* Kimi-K3 at TP8: hidden 7168, 12 heads of 128, f_a 128, packed 6288, max 16 tokens, tuned overlap range. */
K3_API void k3_kda_proj_desc_init(k3_kda_proj_desc *d);
K3_API k3_status k3_kda_proj_plan_create(k3_ctx *ctx, const k3_kda_proj_desc *d, k3_kda_proj_plan **out);
K3_API void k3_kda_proj_plan_destroy(k3_kda_proj_plan *plan);
K3_API k3_status k3_kda_proj_workspace_size(const k3_kda_proj_plan *plan, size_t *out_bytes);
/* All pointers 16-byte aligned, rows contiguous (row strides hidden, qkvg_rows, fab_rows, qkvg_rows / 4). */
K3_API k3_status k3_kda_proj_run(k3_kda_proj_plan *plan, int64_t m, const void *x, const void *w_packed,
                                 const void *w_fb, void *qkvg, void *fab, void *g1, void *ws, size_t ws_bytes,
                                 void *stream);

/* ------------------------------------------------------------------ checkpoints ------------ */
/*
 * One layer's MoE block read from a checkpoint on disk into this library's layout, in host memory: what a
 * caller copies to the device (cudaMemcpy) and passes to k3_moe_run / k3_latent_moe_run.
 *
 * A checkpoint is a folder holding model.safetensors.index.json (or else exactly one *.safetensors file), an
 * index file ({"weight_map": {"tensor": "shard file"}}; shards are resolved in the index's folder and may not
 * leave it), or one safetensors file. The layer's tensors are found under the first of the prefixes
 * "model.layers.<n>.mlp.", "language_model.model.layers.<n>.mlp." and none that has them. Expert layouts:
 * compressed-tensors MXFP4 and NVFP4 (experts.<e>.{gate,up,down}_proj.weight_packed, .weight_scale,
 * .weight_global_scale, .input_global_scale), ModelOpt NVFP4 (.weight, .weight_scale, .weight_scale_2,
 * .input_scale) and the stacked names this library writes (w13_weight, w13_weight_scale, ...). The block's other
 * tensors, by the published names or this library's: the router gate.weight [E, H] BF16/F32 and
 * gate.e_score_correction_bias [E] F32 (gate_weight, e_score_correction_bias); the shared experts
 * shared_experts.{gate,up,down}_proj.weight (shared_gate_up_weight, shared_down_weight); the latent projections
 * routed_expert_down_proj.weight [L, H], routed_expert_norm.weight [L], routed_expert_up_proj.weight [H, L]
 * (down_proj_weight, norm_weight, up_proj_weight), all BF16. Each group is all or nothing.
 *
 * Every missing, mis-shaped or mistyped tensor, a gap in the experts, a NaN block scale or a scale that is not
 * positive and finite is K3_STATUS_FORMAT_ERROR with a message naming the tensor; a file that cannot be read is
 * K3_STATUS_IO_ERROR. The message goes to err (err_size bytes, always terminated; err may be NULL). A
 * k3_checkpoint is for one thread at a time.
 */
typedef struct k3_checkpoint k3_checkpoint;

/* Where the experts' tensors came from. */
typedef enum k3_checkpoint_format {
    K3_CHECKPOINT_CT_MXFP4 = 0,       /* compressed-tensors, per expert, MXFP4 */
    K3_CHECKPOINT_CT_NVFP4 = 1,       /* compressed-tensors, per expert, NVFP4 (global scales = 1 / scale_2) */
    K3_CHECKPOINT_MODELOPT_NVFP4 = 2, /* ModelOpt, per expert, NVFP4 */
    K3_CHECKPOINT_STACKED = 3,        /* this library's stacked names (what `k3 quant` writes) */
} k3_checkpoint_format;

/*
 * A layer, allocated by the library (k3_moe_layer_free); fields may be appended in later versions, never
 * reordered. FP4 buffers: w13 [E, 2I, L/2] = [gate; up] per expert, w2 [E, L, I/2], block scales in the
 * K3_SCALE_LINEAR layout ([E, 2I, L/block] and [E, L, I/block]). Use it with k3_moe_desc.format = NVFP4 or
 * MXFP4 as fp4 says, scale_layout LINEAR, and (NVFP4) w13_separate_scale_2 = 1: w13_scale_2 is [E, 2] (gate, up).
 * The block tensors are NULL when the layer has no such group (then hidden = latent and shared_inter = 0).
 */
typedef struct k3_moe_layer {
    int32_t layer;
    k3_checkpoint_format source_format;
    k3_fp4_format fp4;
    int32_t num_experts;   /* E */
    int64_t latent;        /* L: the experts' width */
    int64_t inter;         /* I */
    const uint8_t *w13, *w13_scale, *w2, *w2_scale;
    size_t w13_bytes, w13_scale_bytes, w2_bytes, w2_scale_bytes;
    const float *w13_scale_2;     /* [E, 2] (gate, up); NVFP4 only, else NULL */
    const float *w2_scale_2;      /* [E]; NVFP4 only */
    const float *w13_input_scale; /* [E, 2] (gate, up) or NULL when the checkpoint has none */
    const float *w2_input_scale;  /* [E] or NULL */
    int64_t hidden;               /* H: the router's and latent block's width */
    int64_t shared_inter;         /* Is; 0 without shared experts */
    k3_dtype gate_dtype;
    const void *gate;             /* router [E, H] BF16 or F32, or NULL */
    const float *bias;            /* e_score_correction_bias [E] or NULL (a router may have none) */
    const uint16_t *shared_gate_up; /* BF16 [2 Is, H] = [gate; up], or NULL */
    const uint16_t *shared_down;  /* BF16 [H, Is] */
    const uint16_t *down_proj;    /* BF16 [L, H], or NULL */
    const uint16_t *norm;         /* BF16 [L] */
    const uint16_t *up_proj;      /* BF16 [H, L] */
    size_t gate_bytes, bias_bytes, shared_gate_up_bytes, shared_down_bytes, down_proj_bytes, norm_bytes,
        up_proj_bytes;
} k3_moe_layer;

/* Opens a checkpoint: reads the index (or the single file's header) now, shards when a layer needs them. *out is
   NULL on failure. */
K3_API k3_status k3_checkpoint_open(const char *path, k3_checkpoint **out, char *err, size_t err_size);
K3_API void k3_checkpoint_close(k3_checkpoint *ck); /* NULL is accepted */
/* The layout of a stacked file's 3-D block scales, for a file that does not record it (__metadata__
 * k3.quant.scale_layout, which k3 writes) and whose scale shapes fit both layouts (rows a multiple of 128 and scale
 * columns of 4, as every real K3 shape: engines keep swizzled scales in that shape too). Without it such a layer
 * is refused with FORMAT_ERROR; a file that records its layout is read as recorded. The reader takes linear
 * scales: K3_SCALE_SWIZZLED makes the load UNSUPPORTED instead of wrong. INVALID_ARGUMENT for another value. */
K3_API k3_status k3_checkpoint_set_scale_layout(k3_checkpoint *ck, k3_scale_layout layout);
/* Reads layer `layer` (>= 0): its experts (required) and whatever router, shared-expert and latent tensors it has.
   *out is NULL on failure. Stacked files with 128x4-swizzled scales are K3_STATUS_UNSUPPORTED. */
K3_API k3_status k3_checkpoint_load_moe_layer(k3_checkpoint *ck, int32_t layer, k3_moe_layer **out, char *err,
                                              size_t err_size);
K3_API void k3_moe_layer_free(k3_moe_layer *layer); /* NULL is accepted */

#ifdef __cplusplus
}
#endif
#endif /* K3_H */
