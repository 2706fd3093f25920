/* gpu_kernels.cu: the CUDA kernels of the gpt model that are not GEMMs:
 * LayerNorm, GELU, residual add, embeddings, causal softmax, cross-entropy,
 * bias add/grad, AdamW/SGD, bf16 copies. Each mirrors its CPU function in
 * gpt_layers.c (same formulas, same order of the per-row sums where a
 * thread owns them) and uses no atomics, so a launch is deterministic.
 *
 * Row kernels give one warp per row; column sums (LayerNorm W, bias grad)
 * take 32 columns x 32 row lanes per block; the embedding's W sorts the
 * rows by token value, then sums each value's rows in row order.
 *
 * bf16 (--dtype bf16): the kernels whose output is only ever a GEMM
 * operand write it as bf16 (T = __nv_bfloat16: LayerNorm F, GELU F and B,
 * cross-entropy B, the residual add of B), rounding the very float the
 * fp32 kernel stores (same template, only the store differs), so a GEMM
 * on it sees the operand the old convert-per-call path made; the bias
 * gradient reads such a bf16 gradient. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "runner/model/cuda/gpu_internal.h"

/* Unrolled loops over small register arrays (the array stays in
 * registers); the CPU emulator's g++ knows no such pragma. */
#ifdef __CUDACC__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

#define THREADS 256
#define WARPS (THREADS / 32)
#define GELU_SCALE 0.7978845608028654f

static unsigned blocks_for(size_t n, unsigned per) { return (unsigned)((n + per - 1) / per); }

static int launched(pp_err *err, const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : gpu_cuda_fail(err, e, what);
}

/* A float stored as T, and read back: the bf16 store rounds to nearest even. */
__device__ static inline void store(float *p, float v) { *p = v; }
__device__ static inline void store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ static inline float load(const float *p) { return *p; }
__device__ static inline float load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }

__device__ static float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ static float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* --- LayerNorm ------------------------------------------------------------- */

template <class T>
__global__ static void k_layernorm_forward(T *out, float *mean, float *rstd, const float *inp, const float *g,
                                           const float *b, int N, int C) {
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return; /* whole warps leave together */
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += x[i];
    float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) v += (x[i] - m) * (x[i] - m);
    v = warp_sum(v) / (float)C;
    float r = 1.0f / sqrtf(v + 1e-5f);
    T *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) store(&o[i], (r * (x[i] - m)) * g[i] + b[i]);
    if (lane == 0) mean[row] = m, rstd[row] = r;
}

__global__ static void k_layernorm_backward_input(float *dinp, const float *dout, const float *inp, const float *mean,
                                                  const float *rstd, const float *g, int N, int C) {
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row], dm = 0.0f, dnm = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float xhat = (x[i] - m) * r, dn = g[i] * d[i];
        dm += dn;
        dnm += dn * xhat;
    }
    dm = warp_sum(dm) / (float)C;
    dnm = warp_sum(dnm) / (float)C;
    float *di = dinp + (size_t)row * C;
    for (int i = lane; i < C; i += 32) {
        float xhat = (x[i] - m) * r, dn = g[i] * d[i];
        di[i] = (dn - dm - xhat * dnm) * r;
    }
}

/* Column sums of [N][C] arrays (the gain and bias gradients of the W ops)
 * run on blocks of 32 columns x 32 row lanes: each warp reads 32 adjacent
 * columns of one row (one 128-byte line), 32 rows are in flight per
 * column, and a column's 32 lane sums are added in lane order, so the
 * result has the same bits on every run. One thread per column summing all
 * N rows left most of the GPU idle: LayerNorm's W took 218 us at 1024 x
 * 256, the largest kernel of a 4-rank job (docs/gpu.md, "Measured"). */
#define COL_TILE 32

/* The column's total in the threads of lane 0 (threadIdx.y == 0). */
__device__ static float column_total(float lane_sum) {
    __shared__ float part[COL_TILE][COL_TILE];
    part[threadIdx.y][threadIdx.x] = lane_sum;
    __syncthreads();
    float s = 0.0f;
    if (threadIdx.y == 0)
        for (int l = 0; l < COL_TILE; l++) s += part[l][threadIdx.x];
    __syncthreads(); /* the next call writes part again */
    return s;
}

__global__ static void k_layernorm_backward_weight(float *dg, float *db, const float *dout, const float *inp,
                                                   const float *mean, const float *rstd, int N, int C) {
    int i = blockIdx.x * COL_TILE + threadIdx.x;
    float sg = 0.0f, sb = 0.0f;
    if (i < C)
        for (int n = threadIdx.y; n < N; n += COL_TILE) {
            float d = dout[(size_t)n * C + i];
            sg += (inp[(size_t)n * C + i] - mean[n]) * rstd[n] * d;
            sb += d;
        }
    sg = column_total(sg), sb = column_total(sb);
    if (threadIdx.y == 0 && i < C) dg[i] = sg, db[i] = sb;
}

extern "C" int gpu_layernorm_forward(gpu_ctx *ctx, float *out, float *mean, float *rstd, const float *inp,
                                     const float *g, const float *b, int N, int C, pp_err *err) {
    k_layernorm_forward<float><<<blocks_for((size_t)N, WARPS), THREADS, 0, ctx->stream>>>(out, mean, rstd, inp, g, b,
                                                                                          N, C);
    return launched(err, "LayerNorm F");
}
extern "C" int gpu_layernorm_forward_bf16(gpu_ctx *ctx, gpu_bf16 *out, float *mean, float *rstd, const float *inp,
                                          const float *g, const float *b, int N, int C, pp_err *err) {
    k_layernorm_forward<__nv_bfloat16><<<blocks_for((size_t)N, WARPS), THREADS, 0, ctx->stream>>>(
        (__nv_bfloat16 *)out, mean, rstd, inp, g, b, N, C);
    return launched(err, "LayerNorm F (bf16 out)");
}
extern "C" int gpu_layernorm_backward_input(gpu_ctx *ctx, float *dinp, const float *dout, const float *inp,
                                            const float *mean, const float *rstd, const float *g, int N, int C,
                                            pp_err *err) {
    k_layernorm_backward_input<<<blocks_for((size_t)N, WARPS), THREADS, 0, ctx->stream>>>(dinp, dout, inp, mean,
                                                                                          rstd, g, N, C);
    return launched(err, "LayerNorm B");
}
extern "C" int gpu_layernorm_backward_weight(gpu_ctx *ctx, float *dg, float *db, const float *dout, const float *inp,
                                             const float *mean, const float *rstd, int N, int C, pp_err *err) {
    dim3 tile(COL_TILE, COL_TILE);
    k_layernorm_backward_weight<<<blocks_for((size_t)C, COL_TILE), tile, 0, ctx->stream>>>(dg, db, dout, inp, mean,
                                                                                           rstd, N, C);
    return launched(err, "LayerNorm W");
}

/* --- GELU and residual ----------------------------------------------------- */

/* tanh through expf, as the CPU does (its fast_tanh). */
__device__ static float tanh_exp(float u) { return 1.0f - 2.0f / (1.0f + expf(2.0f * u)); }

template <class T> __global__ static void k_gelu_forward(T *out, const float *inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    store(&out[i], 0.5f * x * (1.0f + tanh_exp(GELU_SCALE * (x + 0.044715f * x * x * x))));
}

template <class T> __global__ static void k_gelu_backward(T *dinp, const float *inp, const float *dout, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float th = tanh_exp(u), sech2 = 1.0f - th * th;
    float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    store(&dinp[i], local * dout[i]);
}

__global__ static void k_add(float *out, const float *a, const float *b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
/* The sum, and its bf16 copy (B's residual gradient: both an fp32 input of
 * the next add and a GEMM operand of B and W). */
__global__ static void k_add_dual(float *out, __nv_bfloat16 *out16, const float *a, const float *b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = a[i] + b[i];
    out[i] = s;
    out16[i] = __float2bfloat16_rn(s);
}

extern "C" int gpu_gelu_forward(gpu_ctx *ctx, float *out, const float *inp, size_t n, pp_err *err) {
    if (n == 0) return 0;
    k_gelu_forward<float><<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>(out, inp, n);
    return launched(err, "GELU F");
}
extern "C" int gpu_gelu_forward_bf16(gpu_ctx *ctx, gpu_bf16 *out, const float *inp, size_t n, pp_err *err) {
    if (n == 0) return 0;
    k_gelu_forward<__nv_bfloat16><<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>((__nv_bfloat16 *)out, inp, n);
    return launched(err, "GELU F (bf16 out)");
}
extern "C" int gpu_gelu_backward(gpu_ctx *ctx, float *dinp, const float *inp, const float *dout, size_t n,
                                 pp_err *err) {
    if (n == 0) return 0;
    k_gelu_backward<float><<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>(dinp, inp, dout, n);
    return launched(err, "GELU B");
}
extern "C" int gpu_gelu_backward_bf16(gpu_ctx *ctx, gpu_bf16 *dinp, const float *inp, const float *dout, size_t n,
                                      pp_err *err) {
    if (n == 0) return 0;
    k_gelu_backward<__nv_bfloat16><<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>((__nv_bfloat16 *)dinp, inp,
                                                                                        dout, n);
    return launched(err, "GELU B (bf16 out)");
}
extern "C" int gpu_add(gpu_ctx *ctx, float *out, const float *a, const float *b, size_t n, pp_err *err) {
    if (n == 0) return 0;
    k_add<<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>(out, a, b, n);
    return launched(err, "residual add");
}
extern "C" int gpu_add_bf16(gpu_ctx *ctx, float *out, gpu_bf16 *out16, const float *a, const float *b, size_t n,
                            pp_err *err) {
    if (n == 0) return 0;
    k_add_dual<<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>(out, (__nv_bfloat16 *)out16, a, b, n);
    return launched(err, "residual add (and bf16 copy)");
}

/* --- embeddings ------------------------------------------------------------ */

__global__ static void k_embedding_forward(float *out, const uint8_t *tokens, const float *wte, const float *wpe,
                                           int N, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    int n = (int)(idx / C), i = (int)(idx % C), t = n % T;
    out[idx] = wte[(size_t)tokens[n] * C + i] + wpe[(size_t)t * C + i];
}

/* The embedding's W: dwte[v][i] is the sum over the rows n that hold token
 * v of dout[n][i], in row order from 0 (the CPU's order: the result must be
 * its bits). The rows are sorted by token value first, a stable counting
 * sort without atomics:
 *   1. k_token_count: block c counts each value in its chunk of rows;
 *   2. k_token_scatter: block c finds where each value's rows start (the
 *      values below it, over all chunks) plus the chunk's place among the
 *      value's rows, and writes its rows there in row order;
 *   3. k_embedding_wte_segsum: a block per 8 columns and value slot sums
 *      each value's rows, staging 256 rows at a time in shared memory
 *      (loaded by all its threads, the next round's loads in flight while
 *      8 lanes add the current round in order).
 * Every dout row is read once, and a value's chain of adds is as long as
 * its count: the old kernel (a block per column block and value, each
 * scanning every token) took 436 us at 4096 x 768 on an H100. */
#define SORT_CHUNK 256 /* rows per block of the sort; V <= this many threads */
#define SUM_COLS 8     /* columns per block of the sum: one 32-byte sector of a row */
#define SUM_LANES 32   /* row lanes staging a round: SUM_COLS x SUM_LANES threads */
#define SUM_DEPTH 8    /* rows staged per lane and round */
#define SUM_ROWS (SUM_LANES * SUM_DEPTH)
#define SUM_SLOTS 32   /* value slots: block (x, s) takes values s, s + 32, ... */

__global__ static void k_token_count(int *counts, const uint8_t *tokens, int N, int V) {
    __shared__ uint8_t tok[SORT_CHUNK];
    int c = blockIdx.x, base = c * SORT_CHUNK, len = min(SORT_CHUNK, N - base), v = threadIdx.x;
    for (int j = threadIdx.x; j < len; j += blockDim.x) tok[j] = tokens[base + j];
    __syncthreads();
    if (v >= V) return;
    int n = 0;
    for (int j = 0; j < len; j++) n += tok[j] == v;
    counts[(size_t)c * V + v] = n;
}

/* start[v] .. start[v + 1]: value v's rows in order[]; every block writes
 * the same start[], block 0 does. */
__global__ static void k_token_scatter(int *order, int *start, const int *counts, const uint8_t *tokens, int N,
                                       int V, int nchunks) {
    __shared__ uint8_t tok[SORT_CHUNK];
    __shared__ int scan[2][SORT_CHUNK];
    int c = blockIdx.x, base = c * SORT_CHUNK, len = min(SORT_CHUNK, N - base), v = threadIdx.x;
    int total = 0, before = 0;
    if (v < V)
        for (int k = 0; k < nchunks; k++) {
            int n = counts[(size_t)k * V + v];
            total += n;
            before += k < c ? n : 0;
        }
    /* inclusive scan of the totals over values (Hillis-Steele, integers) */
    int in = 0;
    scan[0][v] = total;
    __syncthreads();
    for (int d = 1; d < SORT_CHUNK; d <<= 1) {
        scan[1 - in][v] = scan[in][v] + (v >= d ? scan[in][v - d] : 0);
        in = 1 - in;
        __syncthreads();
    }
    int first = scan[in][v] - total; /* rows of the values below v */
    for (int j = threadIdx.x; j < len; j += blockDim.x) tok[j] = tokens[base + j];
    __syncthreads();
    if (v >= V) return;
    if (c == 0) {
        start[v] = first;
        if (v == V - 1) start[V] = N;
    }
    int pos = first + before;
    for (int j = 0; j < len; j++)
        if (tok[j] == v) order[pos++] = base + j;
}

__global__ static void k_embedding_wte_segsum(float *dwte, const float *dout, const int *order, const int *start,
                                              int C, int V) {
    __shared__ float tile[SUM_ROWS][SUM_COLS];
    int x = threadIdx.x, y = threadIdx.y, col = blockIdx.x * SUM_COLS + x;
    for (int v = blockIdx.y; v < V; v += gridDim.y) { /* the same values for every thread of the block */
        int first = start[v], n = start[v + 1] - first;
        float s = 0.0f, next[SUM_DEPTH];
UNROLL
        for (int k = 0; k < SUM_DEPTH; k++) {
            int r = y + k * SUM_LANES;
            next[k] = r < n && col < C ? dout[(size_t)order[first + r] * C + col] : 0.0f;
        }
        for (int done = 0; done < n; done += SUM_ROWS) {
            __syncthreads(); /* the last round's adds have read the tile */
UNROLL
            for (int k = 0; k < SUM_DEPTH; k++) tile[y + k * SUM_LANES][x] = next[k];
            __syncthreads();
UNROLL
            for (int k = 0; k < SUM_DEPTH; k++) { /* the next round's loads, in flight during the adds */
                int r = done + SUM_ROWS + y + k * SUM_LANES;
                next[k] = r < n && col < C ? dout[(size_t)order[first + r] * C + col] : 0.0f;
            }
            if (y == 0) {
                int len = min(SUM_ROWS, n - done);
                for (int r = 0; r < len; r++) s += tile[r][x];
            }
        }
        if (y == 0 && col < C) dwte[(size_t)v * C + col] = s;
    }
}

/* The kernel the sort replaced: a block per (256 columns, value v) scans
 * every token and adds the rows that hold v, in row order. Kept as the
 * baseline bench_gpu times the new one against, and as a second
 * implementation test_gpu_kernels holds it to bit for bit. */
#define TOKEN_CHUNK 4096
__global__ static void k_embedding_backward_wte_scan(float *dwte, const float *dout, const uint8_t *tokens, int N,
                                                     int C) {
    __shared__ uint8_t tok[TOKEN_CHUNK];
    int v = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = 0.0f;
    for (int base = 0; base < N; base += TOKEN_CHUNK) {
        int len = min(TOKEN_CHUNK, N - base);
        __syncthreads();
        for (int j = threadIdx.x; j < len; j += blockDim.x) tok[j] = tokens[base + j];
        __syncthreads();
        if (i < C)
            for (int j = 0; j < len; j++)
                if (tok[j] == v) s += dout[(size_t)(base + j) * C + i];
    }
    if (i < C) dwte[(size_t)v * C + i] = s;
}

__global__ static void k_embedding_backward_wpe(float *dwpe, const float *dout, int B, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C) return;
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += dout[(size_t)b * T * C + idx];
    dwpe[idx] = s;
}

extern "C" int gpu_embedding_forward(gpu_ctx *ctx, float *out, const uint8_t *tokens, const float *wte,
                                     const float *wpe, int B, int T, int C, pp_err *err) {
    size_t n = (size_t)B * T * C;
    if (n == 0) return 0;
    k_embedding_forward<<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>(out, tokens, wte, wpe, B * T, T, C);
    return launched(err, "embedding F");
}

static int embedding_wpe(gpu_ctx *ctx, float *dwpe, const float *dout, int B, int T, int C, pp_err *err) {
    if ((size_t)T * C == 0) return 0;
    k_embedding_backward_wpe<<<blocks_for((size_t)T * C, THREADS), THREADS, 0, ctx->stream>>>(dwpe, dout, B, T, C);
    return launched(err, "embedding W (wpe)");
}

extern "C" int gpu_embedding_backward_weight(gpu_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                                             const uint8_t *tokens, int B, int T, int C, int V, pp_err *err) {
    int N = B * T, nchunks = (N + SORT_CHUNK - 1) / SORT_CHUNK;
    if (V < 1 || V > SORT_CHUNK)
        return pp_fail(err, "gpu: embedding W: %d token values (1 to %d: tokens are bytes)", V, SORT_CHUNK);
    if (C < 1) return 0;
    /* counts [nchunks][V], start [V + 1], order [N] */
    size_t words = (size_t)nchunks * V + (size_t)V + 1 + (size_t)N;
    int *counts = (int *)gpu_scratch(ctx, GPU_SCRATCH_SORT, sizeof(int) * words, err);
    if (!counts) return pp_wrap(err, "gpu: embedding W");
    int *start = counts + (size_t)nchunks * V, *order = start + V + 1;
    if (nchunks > 0) {
        k_token_count<<<nchunks, SORT_CHUNK, 0, ctx->stream>>>(counts, tokens, N, V);
        if (launched(err, "embedding W (token count)") != 0) return -1;
        k_token_scatter<<<nchunks, SORT_CHUNK, 0, ctx->stream>>>(order, start, counts, tokens, N, V, nchunks);
        if (launched(err, "embedding W (token sort)") != 0) return -1;
    } else {
        cudaError_t e = cudaMemsetAsync(start, 0, sizeof(int) * (size_t)(V + 1), ctx->stream);
        if (e != cudaSuccess) return gpu_cuda_fail(err, e, "gpu: embedding W (no rows)");
    }
    dim3 grid(blocks_for((size_t)C, SUM_COLS), (unsigned)min(V, SUM_SLOTS)), block(SUM_COLS, SUM_LANES);
    k_embedding_wte_segsum<<<grid, block, 0, ctx->stream>>>(dwte, dout, order, start, C, V);
    if (launched(err, "embedding W (wte)") != 0) return -1;
    return embedding_wpe(ctx, dwpe, dout, B, T, C, err);
}

extern "C" int gpu_k_embedding_backward_weight_scan(gpu_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                                                    const uint8_t *tokens, int B, int T, int C, int V, pp_err *err) {
    dim3 grid(blocks_for((size_t)C, THREADS), (unsigned)V);
    k_embedding_backward_wte_scan<<<grid, THREADS, 0, ctx->stream>>>(dwte, dout, tokens, B * T, C);
    if (launched(err, "embedding W (wte, scan)") != 0) return -1;
    return embedding_wpe(ctx, dwpe, dout, B, T, C, err);
}

/* --- linear bias ----------------------------------------------------------- */

__global__ static void k_bias_add(float *out, const float *bias, int N, int OC) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < (size_t)N * OC) out[idx] += bias[idx % OC];
}
template <class T> __global__ static void k_bias_grad(float *dbias, const T *dout, int N, int OC) {
    int o = blockIdx.x * COL_TILE + threadIdx.x;
    float s = 0.0f;
    if (o < OC)
        for (int n = threadIdx.y; n < N; n += COL_TILE) s += load(&dout[(size_t)n * OC + o]);
    s = column_total(s);
    if (threadIdx.y == 0 && o < OC) dbias[o] = s;
}
extern "C" int gpu_k_bias_add(gpu_ctx *ctx, float *out, const float *bias, int N, int OC, pp_err *err) {
    size_t n = (size_t)N * OC;
    if (n == 0) return 0;
    k_bias_add<<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>(out, bias, N, OC);
    return launched(err, "bias add");
}
extern "C" int gpu_k_bias_grad(gpu_ctx *ctx, float *dbias, const float *dout, int N, int OC, pp_err *err) {
    dim3 tile(COL_TILE, COL_TILE);
    k_bias_grad<float><<<blocks_for((size_t)OC, COL_TILE), tile, 0, ctx->stream>>>(dbias, dout, N, OC);
    return launched(err, "bias gradient");
}
extern "C" int gpu_k_bias_grad_bf16(gpu_ctx *ctx, float *dbias, const gpu_bf16 *dout, int N, int OC, pp_err *err) {
    dim3 tile(COL_TILE, COL_TILE);
    k_bias_grad<__nv_bfloat16><<<blocks_for((size_t)OC, COL_TILE), tile, 0, ctx->stream>>>(
        dbias, (const __nv_bfloat16 *)dout, N, OC);
    return launched(err, "bias gradient (bf16 in)");
}

/* --- attention softmax ----------------------------------------------------- */

/* Row r of [rows][T] is query position t = r % T: softmax over u <= t of the
 * scaled scores, zeros above the diagonal. */
__global__ static void k_softmax_causal(float *att, int rows, int T) {
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    float *a = att + (size_t)row * T;
    float m = -INFINITY;
    for (int u = lane; u <= t; u += 32) m = fmaxf(m, a[u]);
    m = warp_max(m);
    float s = 0.0f;
    for (int u = lane; u <= t; u += 32) {
        float e = expf(a[u] - m);
        a[u] = e;
        s += e;
    }
    float inv = 1.0f / warp_sum(s);
    for (int u = lane; u < T; u += 32) a[u] = u <= t ? a[u] * inv : 0.0f;
}

__global__ static void k_softmax_causal_backward(float *datt, const float *att, int rows, int T, float scale) {
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    const float *p = att + (size_t)row * T;
    float *d = datt + (size_t)row * T;
    float dot = 0.0f;
    for (int u = lane; u <= t; u += 32) dot += p[u] * d[u];
    dot = warp_sum(dot);
    for (int u = lane; u < T; u += 32) d[u] = u <= t ? p[u] * (d[u] - dot) * scale : 0.0f;
}

extern "C" int gpu_k_softmax_causal(gpu_ctx *ctx, float *att, int rows, int T, pp_err *err) {
    k_softmax_causal<<<blocks_for((size_t)rows, WARPS), THREADS, 0, ctx->stream>>>(att, rows, T);
    return launched(err, "attention softmax F");
}
extern "C" int gpu_k_softmax_causal_backward(gpu_ctx *ctx, float *datt, const float *att, int rows, int T,
                                             float scale, pp_err *err) {
    k_softmax_causal_backward<<<blocks_for((size_t)rows, WARPS), THREADS, 0, ctx->stream>>>(datt, att, rows, T,
                                                                                          scale);
    return launched(err, "attention softmax B");
}

/* --- cross-entropy --------------------------------------------------------- */

__global__ static void k_softmax_xent(float *probs, double *losses, const uint8_t *targets, int N, int V) {
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    float *p = probs + (size_t)row * V;
    float m = -INFINITY;
    for (int i = lane; i < V; i += 32) m = fmaxf(m, p[i]);
    m = warp_max(m);
    float target_logit = p[targets[row]] - m; /* read before the row is overwritten */
    __syncwarp();
    float s = 0.0f;
    for (int i = lane; i < V; i += 32) {
        float e = expf(p[i] - m);
        p[i] = e;
        s += e;
    }
    s = warp_sum(s);
    float inv = 1.0f / s;
    for (int i = lane; i < V; i += 32) p[i] *= inv;
    if (lane == 0) losses[row] = log((double)s) - (double)target_logit;
}

/* out may be p (fp32, in place). */
template <class T>
__global__ static void k_xent_backward(T *out, const float *p, const uint8_t *targets, float scale, int N, int V) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * V) return;
    int n = (int)(idx / V), i = (int)(idx % V);
    store(&out[idx], (p[idx] - (i == targets[n] ? 1.0f : 0.0f)) * scale);
}

extern "C" int gpu_k_softmax_xent(gpu_ctx *ctx, float *probs, double *losses, const uint8_t *targets, int N, int V,
                                  pp_err *err) {
    k_softmax_xent<<<blocks_for((size_t)N, WARPS), THREADS, 0, ctx->stream>>>(probs, losses, targets, N, V);
    return launched(err, "cross-entropy F");
}
extern "C" int gpu_k_xent_backward(gpu_ctx *ctx, float *probs_to_dlogits, const uint8_t *targets, float scale, int N,
                                   int V, pp_err *err) {
    size_t n = (size_t)N * V;
    if (n == 0) return 0;
    k_xent_backward<float><<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>(probs_to_dlogits, probs_to_dlogits,
                                                                                targets, scale, N, V);
    return launched(err, "cross-entropy B");
}
extern "C" int gpu_k_xent_backward_bf16(gpu_ctx *ctx, gpu_bf16 *dlogits, const float *probs, const uint8_t *targets,
                                        float scale, int N, int V, pp_err *err) {
    size_t n = (size_t)N * V;
    if (n == 0) return 0;
    k_xent_backward<__nv_bfloat16><<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>(
        (__nv_bfloat16 *)dlogits, probs, targets, scale, N, V);
    return launched(err, "cross-entropy B (bf16 out)");
}

/* --- optimizer ------------------------------------------------------------- */

/* w16 (may be NULL): the weights' bf16 copy, refreshed in the same pass
 * from the value stored in w (one read of w saved over a conversion after). */
__global__ static void k_adamw(float *w, __nv_bfloat16 *w16, const float *grad, float *am, float *av, size_t n,
                               float lr, float b1, float b2, float eps, float wd, float c1, float c2) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grad[i];
    float m = b1 * am[i] + (1.0f - b1) * g;
    float v = b2 * av[i] + (1.0f - b2) * g * g;
    am[i] = m, av[i] = v;
    float mhat = m / c1, vhat = v / c2;
    float nw = w[i] - lr * (mhat / (sqrtf(vhat) + eps) + wd * w[i]);
    w[i] = nw;
    if (w16) w16[i] = __float2bfloat16_rn(nw);
}
__global__ static void k_sgd(float *w, __nv_bfloat16 *w16, const float *grad, size_t n, float lr, float wd) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float nw = w[i] - lr * (grad[i] + wd * w[i]);
    w[i] = nw;
    if (w16) w16[i] = __float2bfloat16_rn(nw);
}

extern "C" int gpu_optim_step(gpu_ctx *ctx, float *params, gpu_bf16 *params16, const float *grad, float *adam_m,
                              float *adam_v, size_t n, const model_optim *opt, int step, pp_err *err) {
    if (step < 0) return pp_fail(err, "gpu: optimizer step %d: steps count from 0", step);
    if (n == 0) return 0;
    if (opt->kind == MODEL_ADAMW) {
        /* bias correction in double, as optim.c */
        float c1 = (float)(1.0 - pow((double)opt->beta1, step + 1)), c2 = (float)(1.0 - pow((double)opt->beta2, step + 1));
        k_adamw<<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>(params, (__nv_bfloat16 *)params16, grad, adam_m,
                                                                     adam_v, n, opt->lr,
                                                                     opt->beta1, opt->beta2, opt->eps,
                                                                     opt->weight_decay, c1, c2);
        return launched(err, "AdamW");
    }
    k_sgd<<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>(params, (__nv_bfloat16 *)params16, grad, n, opt->lr,
                                                               opt->weight_decay);
    return launched(err, "SGD");
}

/* --- bf16 operands ----------------------------------------------------------- */

__global__ static void k_to_bf16(__nv_bfloat16 *dst, const float *src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
}
extern "C" int gpu_to_bf16(gpu_ctx *ctx, gpu_bf16 *dst, const float *src, size_t n, pp_err *err) {
    if (n == 0) return 0;
    k_to_bf16<<<blocks_for(n, THREADS), THREADS, 0, ctx->stream>>>((__nv_bfloat16 *)dst, src, n);
    return launched(err, "bf16 conversion");
}
