/*
 * simde_avx512.h -- forced include for building src/quant/x86/avx512.c on a
 * CPU without AVX-512 (tests/test_avx512_emu.sh): SIMDe's portable versions
 * stand in for the AVX-512 intrinsics, so the AVX-512 kernels' logic runs
 * through tests/test_kernels.c anywhere.  Not for speed; test builds only.
 */
#ifndef SP_TEST_SIMDE_AVX512_H
#define SP_TEST_SIMDE_AVX512_H

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <math.h>

/* Gaps in SIMDe 0.7.4. */
static inline simde__m512 sp_emu_mm512_maskz_loadu_ps(simde__mmask16 k, const float *p) {
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = (k >> i) & 1 ? p[i] : 0.0f;
    return simde_mm512_loadu_ps(t);
}
#define _mm512_maskz_loadu_ps sp_emu_mm512_maskz_loadu_ps

static inline float sp_emu_mm512_reduce_add_ps(simde__m512 v) {
    float t[16];
    simde_mm512_storeu_ps(t, v);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) t[i] += t[i + w];
    return t[0];
}
#define _mm512_reduce_add_ps sp_emu_mm512_reduce_add_ps

static inline simde__m256i sp_emu_mm256_maskz_loadu_epi16(simde__mmask16 k, const void *p) {
    uint16_t t[16];
    for (int i = 0; i < 16; i++) t[i] = (k >> i) & 1 ? ((const uint16_t *)p)[i] : 0;
    return simde_mm256_loadu_si256(t);
}
#define _mm256_maskz_loadu_epi16 sp_emu_mm256_maskz_loadu_epi16

static inline simde__m512 sp_emu_mm512_cvtph_ps(simde__m256i h) {
    uint16_t t[16];
    float f[16];
    simde_mm256_storeu_si256(t, h);
    for (int i = 0; i < 16; i++) f[i] = _cvtsh_ss(t[i]);
    return simde_mm512_loadu_ps(f);
}
#define _mm512_cvtph_ps sp_emu_mm512_cvtph_ps

static inline simde__m512i sp_emu_mm512_cvtepu16_epi32(simde__m256i h) {
    uint16_t t[16];
    uint32_t u[16];
    simde_mm256_storeu_si256(t, h);
    for (int i = 0; i < 16; i++) u[i] = t[i];
    return simde_mm512_loadu_si512(u);
}
#define _mm512_cvtepu16_epi32 sp_emu_mm512_cvtepu16_epi32

static inline simde__m512i sp_emu_mm512_cvtepi8_epi32(simde__m128i b) {
    int8_t t[16];
    int32_t u[16];
    simde_mm_storeu_si128(t, b);
    for (int i = 0; i < 16; i++) u[i] = t[i];
    return simde_mm512_loadu_si512(u);
}
#define _mm512_cvtepi8_epi32 sp_emu_mm512_cvtepi8_epi32

static inline simde__m512 sp_emu_mm512_cvtepi32_ps(simde__m512i v) {
    int32_t u[16];
    float f[16];
    simde_mm512_storeu_si512(u, v);
    for (int i = 0; i < 16; i++) f[i] = (float)u[i];
    return simde_mm512_loadu_ps(f);
}
#define _mm512_cvtepi32_ps sp_emu_mm512_cvtepi32_ps


static inline simde__m512i sp_emu_mm512_cvtps_epi32(simde__m512 v) {
    float f[16];
    int32_t u[16];
    simde_mm512_storeu_ps(f, v);
    for (int i = 0; i < 16; i++) u[i] = (int32_t)nearbyintf(f[i]);
    return simde_mm512_loadu_si512(u);
}
#define _mm512_cvtps_epi32 sp_emu_mm512_cvtps_epi32

#endif /* SP_TEST_SIMDE_AVX512_H */
