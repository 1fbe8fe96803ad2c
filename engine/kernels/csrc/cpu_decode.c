/*
 * CPU kernels for a decode step (x86-64, AVX2 + FMA, OpenMP; int8 x int8 products with AVX-512 VNNI where the CPU
 * has it, else in AVX2 with the same outputs):
 * the products and attentions of one sequence, and the products and attentions of several decoding together.
 *
 * Why they exist: a decode step multiplies one row by every weight, so it is bound by memory bandwidth. On the
 * 2-core AMD machine we measure on, MKL's single-row products run on one core (its two-thread and one-thread
 * times are equal) at ~10 GB/s from memory, and torch's SDPA reads the cross-attention cache at ~12 GB/s, while
 * both cores together stream ~23 GB/s. These kernels split every product and every head over the caller's
 * OpenMP threads. Built by engine/kernels/cpu_kernels.py against the OpenMP runtime torch has already loaded, so
 * they share torch's thread team instead of competing with it for the cores.
 *
 * float32 activations; weights float32 (input-major, or blocked as the int8 ones are: `blocked`), or int8 with a
 * scale per output (whisper_gemv_q8); contiguous rows. The
 * Python side checks shapes and falls back to torch otherwise. `threads` is
 * torch's intra-op thread count, passed in because OpenMP's own default counts logical CPUs.
 *
 * Tasks are handed out one at a time (schedule(dynamic)), not split in equal halves up front: where other
 * processes share the cores and the kernel deschedules one of our threads, the other takes over the tasks it has
 * not begun, so a region waits for one task instead of a whole time slice (tiny.en under two busy processes:
 * ~5% less time per request, quiet the same; benchmarks/cpu_int8.py). A task is 32-64 columns of a product or one
 * head's attention, so the atomic that hands it out costs nothing measurable.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define COLS 64 /* output columns per task: 8 AVX registers of accumulators */

/* Where input i's weights for a task's columns j0.. start: input-major (row stride n), or blocked (n / 64, k, 64),
 * each task's columns for every input one contiguous run, as the int8 weights are (see gemv_block_q8: the stride
 * of an input-major row, kilobytes, defeats the hardware prefetcher; blocked float32 weights stream 1.3-2.4x
 * faster at decoder shapes). Either way each output sums the same products in the same order. */
static inline size_t weights_first(int blocked, int k, int j0) {
    return blocked ? (size_t)(j0 / COLS) * k * COLS + j0 % COLS : (size_t)j0;
}

static inline size_t weights_stride(int blocked, int n) { return blocked ? COLS : (size_t)n; }

static void gemv_block(const float *x, const float *w, int blocked, const float *bias, const float *residual,
                       float *y, int k, int n, int j0, int gelu) {
    __m256 acc[8];
    for (int t = 0; t < 8; t++) acc[t] = bias ? _mm256_loadu_ps(bias + j0 + 8 * t) : _mm256_setzero_ps();
    const float *first = w + weights_first(blocked, k, j0);
    size_t stride = weights_stride(blocked, n);
    for (int i = 0; i < k; i++) {
        __m256 xi = _mm256_broadcast_ss(x + i);
        const float *row = first + (size_t)i * stride;
        for (int t = 0; t < 8; t++) acc[t] = _mm256_fmadd_ps(xi, _mm256_loadu_ps(row + 8 * t), acc[t]);
    }
    for (int t = 0; t < 8; t++) {
        if (residual) acc[t] = _mm256_add_ps(acc[t], _mm256_loadu_ps(residual + j0 + 8 * t));
        _mm256_storeu_ps(y + j0 + 8 * t, acc[t]);
    }
    if (gelu) /* exact (erf) GELU, as torch's default and Whisper's */
        for (int j = j0; j < j0 + COLS; j++) y[j] = 0.5f * y[j] * (1.0f + erff(y[j] * 0.70710678118654752f));
}

/* LayerNorm of one row, as torch computes it: mean, then the biased variance of the centred values. */
static void layer_norm(const float *x, const float *weight, const float *bias, float eps, float *out, int k) {
    float mean = 0.0f, var = 0.0f;
    for (int i = 0; i < k; i++) mean += x[i];
    mean /= k;
    for (int i = 0; i < k; i++) var += (x[i] - mean) * (x[i] - mean);
    float inv = 1.0f / sqrtf(var / k + eps);
    for (int i = 0; i < k; i++) out[i] = (x[i] - mean) * inv * weight[i] + bias[i];
}

/* y[n] = act(norm(x)[k] @ w[k][n] + bias[n]) (+ residual[n]). w is input-major (row i holds input i's weight for
 * every output), or with `blocked` laid out (n / 64, k, 64); n % 64 == 0. ln_weight, bias and residual
 * may be NULL (no LayerNorm first, no bias, no residual); gelu 1 applies GELU to the product. A decode step's
 * "x + proj(a)" and "proj(norm(x))" each become one call instead of two or three torch operations. */
void whisper_gemv(const float *x, const float *ln_weight, const float *ln_bias, float eps, const float *w,
                  const float *bias, const float *residual, float *y, int k, int n, int gelu, int blocked,
                  int threads) {
    float normed[ln_weight ? k : 1];
    if (ln_weight) {
        layer_norm(x, ln_weight, ln_bias, eps, normed, k);
        x = normed;
    }
    int tasks = n / COLS;
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int b = 0; b < tasks; b++) gemv_block(x, w, blocked, bias, residual, y, k, n, b * COLS, gelu);
}

/* gemv_block with int8 weights and one float scale per output column: 8 int8 weights widened to floats per FMA,
 * the scale applied once to the sum. A quarter of the bytes of float32 weights, which is what a decode step's
 * time is made of. The int8 weights are blocked: (n / 64, k, 64), each task's 64 columns for every input one
 * contiguous run. Input-major rows of 64 bytes would put each input's bytes for a task a page or more apart (the
 * vocabulary's rows are 52 KB), where the hardware prefetcher does not follow: the vocabulary projection of
 * tiny.en took 2.4x as long that way. */
static void gemv_block_q8(const float *x, const signed char *w8, const float *scale, const float *bias,
                          const float *residual, float *y, int k, int n, int j0, int gelu) {
    __m256 acc[8];
    for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
    const signed char *block = w8 + weights_first(1, k, j0); /* this task's k x 64 bytes, contiguous */
    for (int i = 0; i < k; i++) {
        __m256 xi = _mm256_broadcast_ss(x + i);
        const signed char *row = block + (size_t)i * COLS;
        for (int t = 0; t < 8; t++) {
            __m256 wt = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + 8 * t))));
            acc[t] = _mm256_fmadd_ps(xi, wt, acc[t]);
        }
    }
    for (int t = 0; t < 8; t++) {
        __m256 v = _mm256_mul_ps(acc[t], _mm256_loadu_ps(scale + j0 + 8 * t));
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + j0 + 8 * t));
        if (residual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + j0 + 8 * t));
        _mm256_storeu_ps(y + j0 + 8 * t, v);
    }
    if (gelu)
        for (int j = j0; j < j0 + COLS; j++) y[j] = 0.5f * y[j] * (1.0f + erff(y[j] * 0.70710678118654752f));
}

/* whisper_gemv with int8 weights: w8 blocked (n / 64, k, 64), scale (n,) per output column. */
void whisper_gemv_q8(const float *x, const float *ln_weight, const float *ln_bias, float eps, const signed char *w8,
                     const float *scale, const float *bias, const float *residual, float *y, int k, int n, int gelu,
                     int threads) {
    float normed[ln_weight ? k : 1];
    if (ln_weight) {
        layer_norm(x, ln_weight, ln_bias, eps, normed, k);
        x = normed;
    }
    int tasks = n / COLS;
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int b = 0; b < tasks; b++) gemv_block_q8(x, w8, scale, bias, residual, y, k, n, b * COLS, gelu);
}

/* Several rows at once: the products of a decode step of several sequences. Each task owns 32 output columns and
 * streams their weights once for every row: the rows go in pairs (8 accumulators, 4 weight registers), and the
 * task's slab of weights (k x 32) stays in the core's cache between pairs, so memory is read once per step
 * whatever the number of rows. int8 weights (w8 with scale) or float32 ones (w). */
#define PAIR_COLS 32

static inline __m256 load_w(const float *w, const signed char *w8, size_t at) {
    if (w8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w8 + at))));
    return _mm256_loadu_ps(w + at);
}

static void gemm_pair(const float *x0, const float *x1, const float *w, const signed char *w8, int blocked, int k,
                      int n, int j0, __m256 acc0[4], __m256 acc1[4]) {
    for (int t = 0; t < 4; t++) acc0[t] = acc1[t] = _mm256_setzero_ps();
    /* int8 weights blocked (n / 64, k, 64), as whisper_gemv_q8 reads them; float32 ones input-major (row stride n)
     * or blocked the same way */
    size_t first = weights_first(blocked || w8, k, j0), stride = weights_stride(blocked || w8, n);
    for (int i = 0; i < k; i++) {
        __m256 a = _mm256_broadcast_ss(x0 + i), b = _mm256_broadcast_ss(x1 + i);
        size_t at = first + (size_t)i * stride;
        for (int t = 0; t < 4; t++) {
            __m256 wt = load_w(w, w8, at + 8 * t);
            acc0[t] = _mm256_fmadd_ps(a, wt, acc0[t]);
            acc1[t] = _mm256_fmadd_ps(b, wt, acc1[t]);
        }
    }
}

static void store_row(__m256 acc[4], const float *scale, const float *bias, const float *residual, float *y, int j0,
                      int gelu) {
    for (int t = 0; t < 4; t++) {
        __m256 v = scale ? _mm256_mul_ps(acc[t], _mm256_loadu_ps(scale + j0 + 8 * t)) : acc[t];
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + j0 + 8 * t));
        if (residual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + j0 + 8 * t));
        _mm256_storeu_ps(y + j0 + 8 * t, v);
    }
    if (gelu)
        for (int j = j0; j < j0 + PAIR_COLS; j++) y[j] = 0.5f * y[j] * (1.0f + erff(y[j] * 0.70710678118654752f));
}

/* y[r] = act(norm(x[r]) @ W + bias) (+ residual[r]) for rows r < rows; x, residual, y row-major with k, n, n
 * floats per row; W float32 (w: input-major, n % 32 == 0, or with `blocked` as whisper_gemv's, n % 64 == 0) or
 * int8 with a scale per output (w8 blocked as for whisper_gemv_q8, n % 64 == 0, and scale). scratch: rows * k
 * floats when ln_weight is given. */
void whisper_gemm_rows(const float *x, const float *ln_weight, const float *ln_bias, float eps, const float *w,
                       const signed char *w8, const float *scale, const float *bias, const float *residual, float *y,
                       int rows, int k, int n, int gelu, int blocked, float *scratch, int threads) {
    if (ln_weight) {
        for (int r = 0; r < rows; r++) layer_norm(x + (size_t)r * k, ln_weight, ln_bias, eps, scratch + (size_t)r * k, k);
        x = scratch;
    }
    int tasks = n / PAIR_COLS;
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int b = 0; b < tasks; b++) {
        int j0 = b * PAIR_COLS;
        __m256 acc0[4], acc1[4];
        for (int r = 0; r < rows; r += 2) {
            int pair = r + 1 < rows;
            const float *x0 = x + (size_t)r * k, *x1 = x + (size_t)(pair ? r + 1 : r) * k;
            gemm_pair(x0, x1, w, w8, blocked, k, n, j0, acc0, acc1);
            store_row(acc0, w8 ? scale : NULL, bias, residual ? residual + (size_t)r * n : NULL, y + (size_t)r * n, j0,
                      gelu);
            if (pair)
                store_row(acc1, w8 ? scale : NULL, bias, residual ? residual + (size_t)(r + 1) * n : NULL,
                          y + (size_t)(r + 1) * n, j0, gelu);
        }
    }
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
}

/* One query against n positions of one head (rows of 64 floats): softmax in float32 with the running maximum
 * subtracted, as SDPA does. s: n floats of scratch. */
static void attend_head(const float *q, const float *kh, const float *vh, float *out, int n, float scale, float *s) {
    __m256 qs[8];
    for (int t = 0; t < 8; t++) qs[t] = _mm256_mul_ps(_mm256_loadu_ps(q + 8 * t), _mm256_set1_ps(scale));
    float max = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *kj = kh + (size_t)j * 64;
        __m256 a = _mm256_mul_ps(qs[0], _mm256_loadu_ps(kj));
        for (int t = 1; t < 8; t++) a = _mm256_fmadd_ps(qs[t], _mm256_loadu_ps(kj + 8 * t), a);
        s[j] = hsum(a);
        if (s[j] > max) max = s[j];
    }
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - max);
        sum += s[j];
    }
    __m256 acc[8];
    for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m256 p = _mm256_set1_ps(s[j]);
        const float *vj = vh + (size_t)j * 64;
        for (int t = 0; t < 8; t++) acc[t] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * t), acc[t]);
    }
    __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (int t = 0; t < 8; t++) _mm256_storeu_ps(out + 8 * t, _mm256_mul_ps(acc[t], inv));
}

/* One query per head against n cached positions, head size 64 (every Whisper model's).
 * q: (heads, 64); k, v: (heads, *, 64) with head_stride floats between heads and rows of 64 floats;
 * out: (heads, 64); scratch: heads * n floats for the scores. */
void whisper_attend_one(const float *q, const float *k, const float *v, float *out, int heads, int n,
                        long head_stride, float scale, float *scratch, int threads) {
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int h = 0; h < heads; h++)
        attend_head(q + 64 * h, k + h * head_stride, v + h * head_stride, out + 64 * h, n, scale,
                    scratch + (size_t)h * n);
}

/* Several rows, each in its own cache slot (row r in slot r of k, v), one task per (row, head).
 * Cross-attention (positions == NULL): q (rows, heads, 64) against the first n positions of each slot, or of slot
 * s the first lengths[s] where lengths is given (a window encoded on a short context).
 * Self-attention (positions given): q is the fused (rows, 3, heads, 64) q/k/v projection; each row first writes
 * its new key and value at its own position p, then attends over positions 0..p (n: the slots' capacity, for the
 * scratch). out: (rows, heads, 64); scratch: rows * heads * n floats. */
void whisper_attend_rows(const float *q, float *k, float *v, float *out, int rows, int heads, int n,
                         const long *positions, const long *slots, const long *lengths, long slot_stride,
                         long head_stride, float scale, float *scratch, int threads) {
    int width = heads * 64, q_stride = positions ? 3 * width : width;
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int task = 0; task < rows * heads; task++) {
        int r = task / heads, h = task % heads;
        long slot = slots ? slots[r] : r; /* cross-attention: each row's window's slot */
        float *kh = k + slot * slot_stride + h * head_stride, *vh = v + slot * slot_stride + h * head_stride;
        const float *qh = q + (size_t)r * q_stride + 64 * h;
        int len = lengths ? (int)lengths[slot] : n;
        if (positions) {
            long p = positions[r];
            memcpy(kh + p * 64, qh + width, 64 * sizeof(float));
            memcpy(vh + p * 64, qh + 2 * width, 64 * sizeof(float));
            len = (int)p + 1;
        }
        attend_head(qh, kh, vh, out + (size_t)task * 64, len, scale, scratch + (size_t)task * n);
    }
}

/* Row r of x (k floats) as the integer dot products quantize it: normalized into scratch first where ln_weight is
 * given. */
static const float *input_row(const float *x, const float *ln_weight, const float *ln_bias, float eps, float *scratch,
                              int r, int k) {
    const float *row = x + (size_t)r * k;
    if (!ln_weight) return row;
    layer_norm(row, ln_weight, ln_bias, eps, scratch + (size_t)r * k, k);
    return scratch + (size_t)r * k;
}

/* ---- int8 x int8 products (AVX-512 VNNI) ---------------------------------------------------------------------
 * The int8 kernels above widen each weight to a float before its FMA: three instructions for 8 multiply-adds.
 * With VNNI one instruction (vpdpbusd) multiplies 64 unsigned bytes by 64 signed ones and adds each four into a
 * 32-bit sum, as CTranslate2's int8 products do: the row is quantized too (a scale per row, its largest magnitude
 * over 127, the integers shifted by 128 to unsigned bytes), and the shift is taken back out with each column's
 * sum of weights: sum((xq + 128) * w) - 128 * sum(w) = sum(xq * w). Far fewer instructions per token, which is
 * what counts when other processes take most of the cores' time. Weights interleaved by four inputs:
 * (n / 64, k / 4, 64, 4), each task's 64 columns for every four inputs one 256-byte run. k % 4 == 0. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vnni")

/* row x (k floats) -> unsigned bytes round(x / s) + 128 and its scale s */
static float quantize_row_u8(const float *x, unsigned char *xq, int k) {
    float amax = 0.0f;
    for (int i = 0; i < k; i++) amax = fmaxf(amax, fabsf(x[i]));
    float s = amax > 0.0f ? amax / 127.0f : 1.0f, inv = 1.0f / s;
    for (int i = 0; i < k; i++) xq[i] = (unsigned char)((int)lrintf(x[i] * inv) + 128);
    return s;
}

/* ROWS rows (1-4) against one task's 64 columns: 4 x ROWS accumulators of 16 sums, each 256-byte run of weights
 * loaded once for all the rows. */
static inline __attribute__((always_inline)) void dot_rows_vnni(const unsigned char *const xq[4], int nrows,
                                                                const signed char *slab, int k, __m512i acc[4][4]) {
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 4; t++) acc[r][t] = _mm512_setzero_si512();
    for (int g = 0; g < k / 4; g++) {
        const signed char *p = slab + (size_t)g * 4 * COLS;
        __m512i w0 = _mm512_loadu_si512(p), w1 = _mm512_loadu_si512(p + 64), w2 = _mm512_loadu_si512(p + 128),
                w3 = _mm512_loadu_si512(p + 192);
        for (int r = 0; r < nrows; r++) {
            int four;
            memcpy(&four, xq[r] + 4 * g, 4);
            __m512i a = _mm512_set1_epi32(four);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], a, w0);
            acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], a, w1);
            acc[r][2] = _mm512_dpbusd_epi32(acc[r][2], a, w2);
            acc[r][3] = _mm512_dpbusd_epi32(acc[r][3], a, w3);
        }
    }
}

static inline void store_row_vnni(__m512i acc[4], float sx, const int *colsum, const float *scale, const float *bias,
                                  const float *residual, float *y, int j0, int gelu) {
    for (int t = 0; t < 4; t++) {
        int j = j0 + 16 * t;
        __m512i sums = _mm512_sub_epi32(acc[t], _mm512_slli_epi32(_mm512_loadu_si512(colsum + j), 7));
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(_mm512_set1_ps(sx), _mm512_loadu_ps(scale + j)));
        if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + j));
        if (residual) v = _mm512_add_ps(v, _mm512_loadu_ps(residual + j));
        _mm512_storeu_ps(y + j, v);
    }
    if (gelu)
        for (int j = j0; j < j0 + COLS; j++) y[j] = 0.5f * y[j] * (1.0f + erff(y[j] * 0.70710678118654752f));
}

/* y[r] = act(norm(x[r]) @ W + bias) (+ residual[r]) for rows r < rows, W int8 interleaved (above) with a scale
 * and a weight sum per output column; n % 64 == 0, k % 4 == 0. scratch: rows * k floats when ln_weight is given;
 * xq: rows * k bytes. One row is a decode step of one sequence; several, the vocabulary projection of several. */
void whisper_gemm_q8_vnni(const float *x, const float *ln_weight, const float *ln_bias, float eps,
                          const signed char *w4, const float *scale, const int *colsum, const float *bias,
                          const float *residual, float *y, int rows, int k, int n, int gelu, float *scratch,
                          unsigned char *xq, int threads) {
    float sx[rows];
    for (int r = 0; r < rows; r++)
        sx[r] = quantize_row_u8(input_row(x, ln_weight, ln_bias, eps, scratch, r, k), xq + (size_t)r * k, k);
    int tasks = n / COLS;
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int b = 0; b < tasks; b++) {
        int j0 = b * COLS;
        const signed char *slab = w4 + (size_t)b * k * COLS;
        __m512i acc[4][4];
        for (int r0 = 0; r0 < rows; r0 += 4) {
            int nrows = rows - r0 < 4 ? rows - r0 : 4;
            const unsigned char *xs[4];
            for (int r = 0; r < 4; r++) xs[r] = xq + (size_t)(r0 + (r < nrows ? r : 0)) * k;
            switch (nrows) { /* a constant count: the accumulators stay in registers */
            case 1: dot_rows_vnni(xs, 1, slab, k, acc); break;
            case 2: dot_rows_vnni(xs, 2, slab, k, acc); break;
            case 3: dot_rows_vnni(xs, 3, slab, k, acc); break;
            default: dot_rows_vnni(xs, 4, slab, k, acc);
            }
            for (int r = 0; r < nrows; r++) {
                size_t at = (size_t)(r0 + r) * n;
                store_row_vnni(acc[r], sx[r0 + r], colsum, scale, bias, residual ? residual + at : NULL, y + at, j0,
                               gelu);
            }
        }
    }
}

#pragma GCC pop_options

/* Whether this CPU runs whisper_gemm_q8_vnni. */
int whisper_has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}

/* ---- int8 x int8 products (AVX2) ------------------------------------------------------------------------------
 * whisper_gemm_q8_vnni's products on a CPU without VNNI, from the same interleaved weights, with bit for bit the
 * same outputs: the row quantized the same way but kept signed (quantize_row_u8's integers less 128) as int16, the
 * integer sums exact, equal to vpdpbusd's less 128 * the column's weight sum, and the float operations after them
 * store_row_vnni's in the same order. Per four inputs, 32 weight bytes (8 columns x 4 inputs) become two vectors of
 * 16-bit lanes without widening: shifted left by 8 the even bytes, masked the odd ones, each weight times 256.
 * vpmaddwd multiplies each by the row's integer for that input and adds adjacent pairs into 32 bits (exact, where
 * vpmaddubsw would saturate), so each 32-bit lane of the sum of the two is one column's sum over the four inputs,
 * times 256: 8 columns per accumulator, and per 32 multiply-adds 7 instructions (the weights widened to floats,
 * whisper_gemv_q8: 12). A lane holds at most 64 such four-input sums (256 inputs: 64 * 4 * 256 * 128 * 127 < 2^31),
 * then goes into an exact total shifted back by 8. */

/* row x (k floats) -> its integers round(x / s) as int16, each four inputs' in the order 0, 2, 1, 3 (the pairs
 * vpmaddwd takes with the even and the odd bytes), and its scale s; the integers and s are quantize_row_u8's
 * (less 128): the same max, division and product, and vcvtps2dq rounds to nearest even as lrintf does. */
static float quantize_row_i16(const float *x, short *xq, int k) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    int i = 0;
    /* vmaxps returns its second operand where either is NaN: like fmaxf, a NaN input is passed over */
    for (; i + 8 <= k; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), magnitude), m);
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++) amax = fmaxf(amax, lanes[l]);
    for (; i < k; i++) amax = fmaxf(amax, fabsf(x[i]));
    float s = amax > 0.0f ? amax / 127.0f : 1.0f, inv = 1.0f / s;
    __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= k; i += 8) {
        __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
        /* each 128-bit lane's four in the order 0, 2, 1, 3, packed to 16 bits (|v| <= 127: no saturation), then the
         * two lanes' low halves side by side */
        v = _mm256_packs_epi32(_mm256_shuffle_epi32(v, _MM_SHUFFLE(3, 1, 2, 0)), v);
        v = _mm256_permute4x64_epi64(v, _MM_SHUFFLE(3, 1, 2, 0));
        _mm_storeu_si128((__m128i *)(xq + i), _mm256_castsi256_si128(v));
    }
    for (; i < k; i += 4) /* k % 4 == 0 */
        for (int t = 0; t < 4; t++) xq[i + (t & 1) * 2 + (t >> 1)] = (short)lrintf(x[i + t] * inv);
    return s;
}

/* nrows rows (1-2) against nacc * 8 columns of a task's 64 (its slab from column c0 on, p), over groups g0..g1 of
 * four inputs (at most 64): nrows x nacc accumulators, each 32 bytes of weights loaded once for both rows; the sums
 * go into tot. */
static inline __attribute__((always_inline)) void chunk_avx2(const short *const xs[2], int nrows, int nacc,
                                                             const signed char *p, int g0, int g1,
                                                             int tot[2][COLS]) {
    const __m256i high = _mm256_set1_epi16((short)0xFF00);
    __m256i acc[2][8];
    for (int r = 0; r < nrows; r++)
        for (int t = 0; t < nacc; t++) acc[r][t] = _mm256_setzero_si256();
    for (int g = g0; g < g1; g++, p += 4 * COLS) {
        __m256i even[2], odd[2];
        for (int r = 0; r < nrows; r++) {
            int two;
            memcpy(&two, xs[r] + 4 * g, 4);
            even[r] = _mm256_set1_epi32(two);
            memcpy(&two, xs[r] + 4 * g + 2, 4);
            odd[r] = _mm256_set1_epi32(two);
        }
        for (int t = 0; t < nacc; t++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(p + 32 * t));
            __m256i we = _mm256_slli_epi16(w, 8), wo = _mm256_and_si256(w, high);
            for (int r = 0; r < nrows; r++)
                acc[r][t] = _mm256_add_epi32(
                    acc[r][t], _mm256_add_epi32(_mm256_madd_epi16(even[r], we), _mm256_madd_epi16(odd[r], wo)));
        }
    }
    for (int r = 0; r < nrows; r++)
        for (int t = 0; t < nacc; t++) {
            __m256i *at = (__m256i *)(tot[r] + 8 * t);
            _mm256_storeu_si256(at, _mm256_add_epi32(_mm256_loadu_si256(at), _mm256_srai_epi32(acc[r][t], 8)));
        }
}

/* A value the compiler cannot see into: keeps a product from being fused with the add after it (-ffp-contract
 * would make the two one FMA, rounded once), so the floats are store_row_vnni's, rounded after each operation. */
static inline __m256 opaque(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}

/* nrows rows' outputs for nacc * 8 columns of a task, from its column c0 */
static inline __attribute__((always_inline)) void pass_avx2(const short *const xs[2], const float *sx, int nrows,
                                                            int nacc, const signed char *slab, int k, int c0,
                                                            const float *scale, const float *bias,
                                                            const float *residual, float *y, int n, int j0,
                                                            int gelu) {
    int tot[2][COLS];
    for (int r = 0; r < nrows; r++) memset(tot[r], 0, sizeof(tot[r]));
    for (int g0 = 0; g0 < k / 4; g0 += 64)
        chunk_avx2(xs, nrows, nacc, slab + (size_t)g0 * 4 * COLS + 4 * c0, g0, g0 + 64 < k / 4 ? g0 + 64 : k / 4,
                   tot);
    for (int r = 0; r < nrows; r++) {
        size_t at = (size_t)r * n;
        for (int t = 0; t < nacc; t++) {
            int j = j0 + c0 + 8 * t;
            __m256 sums = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(tot[r] + 8 * t)));
            __m256 v = opaque(_mm256_mul_ps(sums, _mm256_mul_ps(_mm256_set1_ps(sx[r]), _mm256_loadu_ps(scale + j))));
            if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + j));
            if (residual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + at + j));
            _mm256_storeu_ps(y + at + j, v);
        }
        if (gelu)
            for (int j = j0 + c0; j < j0 + c0 + 8 * nacc; j++)
                y[at + j] = 0.5f * y[at + j] * (1.0f + erff(y[at + j] * 0.70710678118654752f));
    }
}

/* whisper_gemm_q8_vnni's product without VNNI: the same arguments and weights; xq: rows * k int16. */
void whisper_gemm_q8_avx2(const float *x, const float *ln_weight, const float *ln_bias, float eps,
                          const signed char *w4, const float *scale, const int *colsum, const float *bias,
                          const float *residual, float *y, int rows, int k, int n, int gelu, float *scratch,
                          short *xq, int threads) {
    (void)colsum; /* the rows' integers are signed here: no shift to take back out */
    float sx[rows];
    for (int r = 0; r < rows; r++)
        sx[r] = quantize_row_i16(input_row(x, ln_weight, ln_bias, eps, scratch, r, k), xq + (size_t)r * k, k);
    int tasks = n / COLS;
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int b = 0; b < tasks; b++) {
        int j0 = b * COLS;
        const signed char *slab = w4 + (size_t)b * k * COLS;
        for (int r0 = 0; r0 < rows; r0 += 2) {
            const short *xs[2] = {xq + (size_t)r0 * k, xq + (size_t)(r0 + 1 < rows ? r0 + 1 : r0) * k};
            const float *res = residual ? residual + (size_t)r0 * n : NULL;
            float *out = y + (size_t)r0 * n;
            if (r0 + 1 < rows) /* a pair: 2 x 4 accumulators, two passes over the task's columns */
                for (int c0 = 0; c0 < COLS; c0 += 32)
                    pass_avx2(xs, sx + r0, 2, 4, slab, k, c0, scale, bias, res, out, n, j0, gelu);
            else
                pass_avx2(xs, sx + r0, 1, 8, slab, k, 0, scale, bias, res, out, n, j0, gelu);
        }
    }
}

/* Whether this CPU runs whisper_gemm_q8_avx2 (the whole library needs AVX2 and FMA). */
int whisper_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
