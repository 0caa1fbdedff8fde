/*
 * avx512.c -- the AVX-512 kernels: the shared x86 kernel bodies of
 * kernels.inc with every unsigned x signed byte dot product done by one
 * AVX512-VNNI vpdpbusd (256-bit, AVX512VL), plus 512-bit float dot products
 * for F32/F16/BF16.  Built with the AVX-512 flags in the Makefile; only
 * called after sp_quant_init() saw AVX512F/BW/VL/VNNI.
 */
#define SPX_VNNI 1
#include "kernels.inc"

#include "quant/isa.h"

/* ---- 512-bit float dot products (single-precision FMA accumulation) ---- */

static void spx512_vec_dot_f32(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    const float *a = w, *b = x;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    if (i < n) { /* masked tail: up to 31 elements */
        const int64_t left = n - i;
        const __mmask16 m0 = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);
        const __mmask16 m1 = (__mmask16)(left <= 16 ? 0 : (1u << (left - 16)) - 1);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, a + i), _mm512_maskz_loadu_ps(m0, b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, a + i + 16), _mm512_maskz_loadu_ps(m1, b + i + 16), acc1);
    }
    *s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static inline __m512 spx512_f16(const uint16_t *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

static inline __m512 spx512_bf16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

#define SPX512_DOT16(name, load)                                                                              \
    static void name(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {         \
        const uint16_t *a = w, *b = x;                                                                        \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                                        \
        int64_t i = 0;                                                                                        \
        for (; i + 32 <= n; i += 32) {                                                                        \
            _mm_prefetch((const char *)(a + i) + SPX_PF_DIST, _MM_HINT_T0);                                   \
            acc0 = _mm512_fmadd_ps(load(a + i, 0xffff), load(b + i, 0xffff), acc0);                           \
            acc1 = _mm512_fmadd_ps(load(a + i + 16, 0xffff), load(b + i + 16, 0xffff), acc1);                 \
        }                                                                                                     \
        for (; i < n; i += 16) {                                                                              \
            const int64_t left = n - i;                                                                       \
            const __mmask16 m = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);                          \
            acc0 = _mm512_fmadd_ps(load(a + i, m), load(b + i, m), acc0);                                     \
        }                                                                                                     \
        *s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));                                                 \
    }

SPX512_DOT16(spx512_vec_dot_f16, spx512_f16)
SPX512_DOT16(spx512_vec_dot_bf16, spx512_bf16)

void sp_quant_register_avx512(struct sp_qtraits *table, const struct sp_cpu_features *f) {
    if (!f->avx512f || !f->avx512bw || !f->avx512vl || !f->avx512vnni || !f->fma || !f->f16c) return;
    spx_install(table);
    table[SP_QTYPE_F32].vec_dot = spx512_vec_dot_f32;
    table[SP_QTYPE_F16].vec_dot = spx512_vec_dot_f16;
    table[SP_QTYPE_BF16].vec_dot = spx512_vec_dot_bf16;
}
