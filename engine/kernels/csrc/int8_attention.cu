/*
 * Cross-attention of decode steps over the int8 cache (engine/kernels/int8_attention.py), for NVIDIA GPUs,
 * compiled at run time with NVRTC. One block per (batch, head, query) row and key split; head_dim 64 (every
 * Whisper size).
 *
 * Why not only Triton: the Triton kernel streams the cache at ~3.4 TB/s on an H200 whatever its block shape,
 * pipelining or scale layout; it converts every int8 byte to float32 with the conversion instruction, which
 * issues at 16 per clock per multiprocessor: one per byte read is ~4.2 TB/s at most on that card. Here the keys
 * are never converted: the query is quantized to 16-bit integers (its float16 values carry 11 bits) and split
 * into a signed high byte and an unsigned low byte, so q . k is two dp4a instructions per four keys' bytes,
 * summed exactly in int32. Only values are converted (V_PRMT: by placing the byte in a float's mantissa and
 * subtracting, which runs on the plain arithmetic pipes).
 *
 * Layout: each row's keys and values are contiguous 64-byte vectors (unit last stride, vector stride a multiple
 * of 16 bytes); scales are bfloat16, one per vector. Scores are kept in log2 units (the query is pre-multiplied
 * by sm_scale * log2(e)), so exp is one exp2 instruction.
 *
 * Work split inside a block: TPK threads share a key (64 / TPK dims each) and THREADS / TPK keys are in flight
 * per step, UNROLL steps loaded before any is used. Each group of TPK threads keeps its own running max, sum and
 * weighted values; groups merge once at the end through shared memory. With NUM_SPLITS > 1 a block writes its
 * partial max (natural log units), sum and unnormalized output, combined by a second kernel.
 *
 * Compile-time settings (-D; engine/kernels/int8_attention.py CUDA_SETTINGS, swept by
 * benchmarks/int8_cross_attention.py --sweep-cuda): THREADS, TPK, UNROLL; MIN_BLOCKS (blocks per multiprocessor
 * the registers are capped for); LOAD_HINT (0 plain read-only loads, 1 skipping L1, 2 also prefetching 256 bytes
 * into L2); OUT_BF16 (query and output in bfloat16, else float16); K_DP4A and V_PRMT (1: the integer forms above;
 * 0: converting instructions).
 */

#define HEAD_DIM 64
#define DPT (HEAD_DIM / TPK)  /* dims per thread */
#define WORDS (DPT / 4)       /* 32-bit words of int8 per thread and vector */
#define GROUPS (THREADS / TPK)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define NEG_INF __int_as_float(0xff800000)

typedef unsigned short u16;

__device__ __forceinline__ float half_to_float(u16 x) {
#if OUT_BF16
    return __uint_as_float(((unsigned)x) << 16);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
#endif
}

__device__ __forceinline__ u16 float_to_half(float f) {
    u16 x;
#if OUT_BF16
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(x) : "f"(f));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));
#endif
    return x;
}

__device__ __forceinline__ float bf16_to_float(u16 x) { return __uint_as_float(((unsigned)x) << 16); }

__device__ __forceinline__ int dp4a_ss(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ int dp4a_us(unsigned a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* WORDS 32-bit words of one vector: a 16- or 8-byte load */
struct Chunk {
    int w[WORDS];
};

#ifndef LOAD_HINT
#define LOAD_HINT 0
#endif
#if LOAD_HINT == 1
#define LD_PREFIX "ld.global.nc.L1::no_allocate"
#elif LOAD_HINT == 2
#define LD_PREFIX "ld.global.nc.L1::no_allocate.L2::256B"
#endif

__device__ __forceinline__ Chunk load_chunk(const signed char *p) {
    Chunk c;
#if LOAD_HINT == 0
#if WORDS == 4
    int4 v = __ldg(reinterpret_cast<const int4 *>(p));
    c.w[0] = v.x, c.w[1] = v.y, c.w[2] = v.z, c.w[3] = v.w;
#elif WORDS == 2
    int2 v = __ldg(reinterpret_cast<const int2 *>(p));
    c.w[0] = v.x, c.w[1] = v.y;
#else
    c.w[0] = __ldg(reinterpret_cast<const int *>(p));
#endif
#else
#if WORDS == 4
    asm volatile(LD_PREFIX ".v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(c.w[0]), "=r"(c.w[1]), "=r"(c.w[2]), "=r"(c.w[3]) : "l"(p));
#elif WORDS == 2
    asm volatile(LD_PREFIX ".v2.s32 {%0, %1}, [%2];" : "=r"(c.w[0]), "=r"(c.w[1]) : "l"(p));
#else
    asm volatile(LD_PREFIX ".s32 %0, [%1];" : "=r"(c.w[0]) : "l"(p));
#endif
#endif
    return c;
}

/* byte i of w as a float: the V_PRMT form puts the biased byte into the mantissa of 2^23 and subtracts */
__device__ __forceinline__ float byte_to_float(int w, int i) {
#if V_PRMT
    unsigned biased = (unsigned)w ^ 0x80808080u;
    return __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7540 | i)) - 8388736.0f;
#else
    return (float)(signed char)(w >> (8 * i));
#endif
}

#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) int8_attention(
    const u16 *__restrict__ Q, const signed char *__restrict__ K, const u16 *__restrict__ KS,
    const signed char *__restrict__ V, const u16 *__restrict__ VS, u16 *__restrict__ O, float *__restrict__ M,
    float *__restrict__ L, float *__restrict__ ACC, int sqb, int sqh, int sqt, int skb, int skh, int skn, int sksb,
    int sksh, int svb, int svh, int svn, int svsb, int svsh, int sob, int soh, int sot, int H, int T, int N,
    int keys_per_split, double sm_scale, int num_splits, const int *__restrict__ SLOT,
    const int *__restrict__ ORDER, int use_slot, int use_order) {
    /* SLOT (use_slot): the cache slot each batch row reads; ORDER (use_order): the batch rows in the order the
       blocks take them, rows reading one slot side by side so that its bytes come from L2 after the first */
    const int split = blockIdx.y;
    int row = blockIdx.x;
    if (use_order) row = (ORDER[row / (T * H)] * H + (row / T) % H) * T + row % T;
    const int t = row % T, h = (row / T) % H, b = row / (T * H);
    const int kb = use_slot ? SLOT[b] : b;
    const int tid = threadIdx.x, group = tid / TPK, part = tid % TPK;
    const int d0 = part * DPT;

    const signed char *k_row = K + (long long)kb * skb + (long long)h * skh + d0;
    const signed char *v_row = V + (long long)kb * svb + (long long)h * svh + d0;
    const u16 *ks_row = KS + (long long)kb * sksb + (long long)h * sksh;
    const u16 *vs_row = VS + (long long)kb * svsb + (long long)h * svsh;

    float q[DPT];
    const u16 *q_row = Q + (long long)b * sqb + (long long)h * sqh + (long long)t * sqt + d0;
#pragma unroll
    for (int i = 0; i < DPT; i++) q[i] = half_to_float(q_row[i]) * (float)(sm_scale * LOG2E);

#if K_DP4A
    /* the query as 16-bit integers against the largest |q| of the vector, split into high and low bytes */
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < DPT; i++) amax = fmaxf(amax, fabsf(q[i]));
#pragma unroll
    for (int o = 1; o < TPK; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float q_step = amax > 0.f ? amax / 32767.f : 1.f;
    int q_hi[WORDS];
    unsigned q_lo[WORDS];
#pragma unroll
    for (int w = 0; w < WORDS; w++) {
        int hi = 0;
        unsigned lo = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int qi = __float2int_rn(q[4 * w + i] / q_step);
            hi |= ((qi >> 8) & 0xff) << (8 * i);
            lo |= (unsigned)(qi & 0xff) << (8 * i);
        }
        q_hi[w] = hi, q_lo[w] = lo;
    }
#endif

    const int start = split * keys_per_split;
    const int end = min(start + keys_per_split, N);
    float m = NEG_INF, l = 0.f, acc[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) acc[i] = 0.f;

    /* The loop bounds are the same for every thread (a warp's shuffles need all its lanes); a group whose key is
       past the end computes on zeros and keeps nothing. */
    for (int n0 = start; n0 < end; n0 += GROUPS * UNROLL) {
        Chunk kc[UNROLL], vc[UNROLL];
        float ks[UNROLL], vs[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int n = n0 + u * GROUPS + group;
            if (n < end) {
                kc[u] = load_chunk(k_row + (long long)n * skn);
                vc[u] = load_chunk(v_row + (long long)n * svn);
                ks[u] = bf16_to_float(__ldg(ks_row + n));
                vs[u] = bf16_to_float(__ldg(vs_row + n));
            } else {
#pragma unroll
                for (int w = 0; w < WORDS; w++) kc[u].w[w] = vc[u].w[w] = 0;
                ks[u] = vs[u] = 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const bool valid = n0 + u * GROUPS + group < end; /* the same for a group's threads */
#if K_DP4A
            int hi = 0, lo = 0;
#pragma unroll
            for (int w = 0; w < WORDS; w++) {
                hi = dp4a_ss(kc[u].w[w], q_hi[w], hi);
                lo = dp4a_us(q_lo[w], kc[u].w[w], lo);
            }
            int dot = hi * 256 + lo;
#pragma unroll
            for (int o = 1; o < TPK; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            const float s = (float)dot * q_step * ks[u];
#else
            float dot = 0.f;
#pragma unroll
            for (int w = 0; w < WORDS; w++)
#pragma unroll
                for (int i = 0; i < 4; i++) dot += q[4 * w + i] * (float)(signed char)(kc[u].w[w] >> (8 * i));
#pragma unroll
            for (int o = 1; o < TPK; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            const float s = dot * ks[u];
#endif
            if (!valid) continue;
            if (s > m) { /* rare after a group's first keys: rescale only then */
                const float alpha = exp2f(m - s);
                l *= alpha;
#pragma unroll
                for (int i = 0; i < DPT; i++) acc[i] *= alpha;
                m = s;
            }
            const float p = exp2f(s - m);
            l += p;
            const float pv = p * vs[u];
#pragma unroll
            for (int w = 0; w < WORDS; w++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[4 * w + i] += pv * byte_to_float(vc[u].w[w], i);
        }
    }

    /* merge the groups: scale each to the block's max, sum through shared memory */
    __shared__ float s_m[GROUPS], s_l[GROUPS], s_acc[GROUPS][HEAD_DIM + 1];
    if (part == 0) s_m[group] = m;
    __syncthreads();
    float m_max = NEG_INF;
    for (int g = 0; g < GROUPS; g++) m_max = fmaxf(m_max, s_m[g]);
    const float weight = m == NEG_INF ? 0.f : exp2f(m - m_max);
    if (part == 0) s_l[group] = l * weight;
#pragma unroll
    for (int i = 0; i < DPT; i++) s_acc[group][d0 + i] = acc[i] * weight;
    __syncthreads();
    if (tid < HEAD_DIM) {
        float out = 0.f, l_sum = 0.f;
        for (int g = 0; g < GROUPS; g++) out += s_acc[g][tid], l_sum += s_l[g];
        if (num_splits == 1) {
            O[(long long)b * sob + (long long)h * soh + (long long)t * sot + tid] = float_to_half(out / l_sum);
        } else {
            const int p = row * num_splits + split;
            if (tid == 0) M[p] = m_max * LN2, L[p] = l_sum;
            ACC[(long long)p * HEAD_DIM + tid] = out;
        }
    }
}
