/*
 * traits.c -- the kernel dispatch table, indexed by enum sp_qtype (ggml's
 * type_traits_cpu in shape).  sp_quant_init() starts from the reference
 * table and overrides entries with ISA variants the CPU supports; after that
 * the table is read-only.
 */
#include "quant.h"

#include "isa.h"
#include "kv.h"
#include "native.h"
#include "ref.h"
#include "types.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The block sizes below are the struct sizes in types.h. */
static_assert(sizeof(struct sp_block_q4_0) == 18 && sizeof(struct sp_block_q4_1) == 20, "block size");
static_assert(sizeof(struct sp_block_q5_0) == 22 && sizeof(struct sp_block_q5_1) == 24, "block size");
static_assert(sizeof(struct sp_block_q8_0) == 34 && sizeof(struct sp_block_q8_1) == 36, "block size");
static_assert(sizeof(struct sp_block_q2_k) == 84 && sizeof(struct sp_block_q3_k) == 110, "block size");
static_assert(sizeof(struct sp_block_q4_k) == 144 && sizeof(struct sp_block_q5_k) == 176, "block size");
static_assert(sizeof(struct sp_block_q6_k) == 210 && sizeof(struct sp_block_q8_k) == 292, "block size");

/* Reference kernels (ref.c) for every type: elements and bytes per block,
 * kernels, and the type activations are converted to for vec_dot. */
static const struct sp_qtraits ref_table[SP_QTYPE_COUNT] = {
    [SP_QTYPE_F32] = {.name = "F32", .block_elems = 1, .block_bytes = 4, .vec_dot_type = SP_QTYPE_F32,
                       .to_float = sp_f32_to_float_ref, .from_float = sp_f32_from_float_ref,
                       .vec_dot = sp_vec_dot_f32_f32_ref},
    [SP_QTYPE_F16] = {.name = "F16", .block_elems = 1, .block_bytes = 2, .vec_dot_type = SP_QTYPE_F16,
                       .to_float = sp_f16_to_float_ref, .from_float = sp_f16_from_float_ref,
                       .vec_dot = sp_vec_dot_f16_f16_ref},
    [SP_QTYPE_BF16] = {.name = "BF16", .block_elems = 1, .block_bytes = 2, .vec_dot_type = SP_QTYPE_BF16,
                       .to_float = sp_bf16_to_float_ref, .from_float = sp_bf16_from_float_ref,
                       .vec_dot = sp_vec_dot_bf16_bf16_ref},
    [SP_QTYPE_Q4_0] = {.name = "Q4_0", .block_elems = 32, .block_bytes = 18, .vec_dot_type = SP_QTYPE_Q8_0,
                       .to_float = sp_q4_0_to_float_ref, .from_float = sp_q4_0_from_float_ref,
                       .vec_dot = sp_vec_dot_q4_0_q8_0_ref},
    [SP_QTYPE_Q4_1] = {.name = "Q4_1", .block_elems = 32, .block_bytes = 20, .vec_dot_type = SP_QTYPE_Q8_1,
                       .to_float = sp_q4_1_to_float_ref, .from_float = sp_q4_1_from_float_ref,
                       .vec_dot = sp_vec_dot_q4_1_q8_1_ref},
    [SP_QTYPE_Q5_0] = {.name = "Q5_0", .block_elems = 32, .block_bytes = 22, .vec_dot_type = SP_QTYPE_Q8_0,
                       .to_float = sp_q5_0_to_float_ref, .from_float = sp_q5_0_from_float_ref,
                       .vec_dot = sp_vec_dot_q5_0_q8_0_ref},
    [SP_QTYPE_Q5_1] = {.name = "Q5_1", .block_elems = 32, .block_bytes = 24, .vec_dot_type = SP_QTYPE_Q8_1,
                       .to_float = sp_q5_1_to_float_ref, .from_float = sp_q5_1_from_float_ref,
                       .vec_dot = sp_vec_dot_q5_1_q8_1_ref},
    [SP_QTYPE_Q8_0] = {.name = "Q8_0", .block_elems = 32, .block_bytes = 34, .vec_dot_type = SP_QTYPE_Q8_0,
                       .to_float = sp_q8_0_to_float_ref, .from_float = sp_q8_0_from_float_ref,
                       .vec_dot = sp_vec_dot_q8_0_q8_0_ref},
    [SP_QTYPE_Q8_1] = {.name = "Q8_1", .block_elems = 32, .block_bytes = 36, .vec_dot_type = SP_QTYPE_Q8_1,
                       .to_float = sp_q8_1_to_float_ref, .from_float = sp_q8_1_from_float_ref},
    [SP_QTYPE_Q2_K] = {.name = "Q2_K", .block_elems = 256, .block_bytes = 84, .vec_dot_type = SP_QTYPE_Q8_K,
                       .to_float = sp_q2_k_to_float_ref, .from_float = sp_q2_k_from_float_ref,
                       .vec_dot = sp_vec_dot_q2_k_q8_k_ref},
    [SP_QTYPE_Q3_K] = {.name = "Q3_K", .block_elems = 256, .block_bytes = 110, .vec_dot_type = SP_QTYPE_Q8_K,
                       .to_float = sp_q3_k_to_float_ref, .from_float = sp_q3_k_from_float_ref,
                       .vec_dot = sp_vec_dot_q3_k_q8_k_ref},
    [SP_QTYPE_Q4_K] = {.name = "Q4_K", .block_elems = 256, .block_bytes = 144, .vec_dot_type = SP_QTYPE_Q8_K,
                       .to_float = sp_q4_k_to_float_ref, .from_float = sp_q4_k_from_float_ref,
                       .vec_dot = sp_vec_dot_q4_k_q8_k_ref},
    [SP_QTYPE_Q5_K] = {.name = "Q5_K", .block_elems = 256, .block_bytes = 176, .vec_dot_type = SP_QTYPE_Q8_K,
                       .to_float = sp_q5_k_to_float_ref, .from_float = sp_q5_k_from_float_ref,
                       .vec_dot = sp_vec_dot_q5_k_q8_k_ref},
    [SP_QTYPE_Q6_K] = {.name = "Q6_K", .block_elems = 256, .block_bytes = 210, .vec_dot_type = SP_QTYPE_Q8_K,
                       .to_float = sp_q6_k_to_float_ref, .from_float = sp_q6_k_from_float_ref,
                       .vec_dot = sp_vec_dot_q6_k_q8_k_ref},
    [SP_QTYPE_Q8_K] = {.name = "Q8_K", .block_elems = 256, .block_bytes = 292, .vec_dot_type = SP_QTYPE_Q8_K,
                       .to_float = sp_q8_k_to_float_ref, .from_float = sp_q8_k_from_float_ref},
};

/* The resident layouts (quant.h; repack.c, repack_k.c): entries of the
 * native table with no name there, so that native names and
 * sp_qtype_is_native() never reach them.  No gemm in the reference: the
 * pager repacks only where a SIMD gemm is registered. */
static const struct {
    uint32_t id;
    uint32_t from; /* the file type it is made from */
    void (*repack)(void *rows, int64_t n_rows, int64_t n, size_t stride);
    void (*unrepack)(void *rows, int64_t n_rows, int64_t n, size_t stride);
    struct sp_qtraits ref;
} resident[] = {
    {SP_QTYPE_Q4_0_G8, SP_QTYPE_Q4_0, sp_q4_0_g8_repack, sp_q4_0_g8_unrepack,
     {.name = "Q4_0_g8", .block_elems = SP_QK_G8, .block_bytes = 144, .vec_dot_type = SP_QTYPE_Q8_0,
      .to_float = sp_q4_0_g8_to_float_ref, .vec_dot = sp_vec_dot_q4_0_g8_q8_0_ref}},
    {SP_QTYPE_Q4_K_G8, SP_QTYPE_Q4_K, sp_q4_k_g8_repack, sp_q4_k_g8_unrepack,
     {.name = "Q4_K_g8", .block_elems = SP_QK_K, .block_bytes = 144, .vec_dot_type = SP_QTYPE_Q8_K,
      .to_float = sp_q4_k_g8_to_float_ref, .vec_dot = sp_vec_dot_q4_k_g8_q8_k_ref}},
#define G4_RESIDENT(b, bytes)                                                                                        \
    {SP_QTYPE_I##b##_B64_G4, SP_NATIVE_ID(SP_NK_I##b, 1, SP_NS_F16), sp_native_g4_repack_i##b,                         \
     sp_native_g4_unrepack_i##b,                                                                                     \
     {.name = "i" #b "_b64_g4", .block_elems = SP_QK_G4, .block_bytes = bytes,                                      \
      .vec_dot_type = (enum sp_qtype)SP_QTYPE_X8, .to_float = sp_native_g4_to_float_i##b,                          \
      .vec_dot = sp_native_g4_vec_dot_i##b}},
    G4_RESIDENT(3, 104) G4_RESIDENT(4, 136) G4_RESIDENT(6, 200)
#undef G4_RESIDENT
};
static_assert(SP_QTYPE_I3_B64_G4 >= SP_QTYPE_NATIVE_FIRST + 64u + 4u * SP_NK_COUNT && SP_QTYPE_I6_B64_G4 < SP_QTYPE_Q4_K_G8,
              "g4 ids past the native types, before the other resident layouts");
static_assert(SP_QTYPE_Q4_0_G8 >= SP_QTYPE_NATIVE_FIRST && SP_QTYPE_Q4_0_G8 < SP_QTYPE_X8 &&
                  SP_QTYPE_Q4_K_G8 >= SP_QTYPE_NATIVE_FIRST && SP_QTYPE_Q4_K_G8 < SP_QTYPE_X8,
              "resident layout ids in the native range");

static struct sp_qtraits table[SP_QTYPE_COUNT];
/* Sparrow's native types (native.h), indexed by id - SP_QTYPE_NATIVE_FIRST. */
static struct sp_qtraits ntable[SP_QTYPE_NATIVE_COUNT];
static atomic_int table_ready;

static bool is_native_id(uint32_t t) {
    return t >= SP_QTYPE_NATIVE_FIRST && t - SP_QTYPE_NATIVE_FIRST < SP_QTYPE_NATIVE_COUNT;
}

void sp_quant_init(void) {
    if (atomic_load(&table_ready)) return;
    sp_attn_kernels_init();
    for (int i = 0; i < SP_QTYPE_COUNT; i++) table[i] = ref_table[i];
    for (uint32_t i = 0; i < SP_QTYPE_NATIVE_COUNT; i++) {
        const struct sp_qtraits *r = sp_native_ref_traits(SP_QTYPE_NATIVE_FIRST + i);
        if (r) ntable[i] = *r;
    }
    for (size_t k = 0; k < SP_ARRAY_LEN(resident); k++) ntable[resident[k].id - SP_QTYPE_NATIVE_FIRST] = resident[k].ref;
    /* ISA hook: x86/ and arm/ variants replace table[t].vec_dot / to_float /
     * from_float here, chosen from sp_cpu_features().  A replaced from_float
     * must produce the same bytes as the reference one (activations are
     * compared bit for bit against llama.cpp). */
#if defined(__x86_64__)
    {
        /* SPARROW_ISA=ref|avx2|avx512 caps the level (tests, benchmarks);
         * unset or unknown: the best the CPU has.  Later hooks win. */
        const char *isa = getenv("SPARROW_ISA");
        const int cap = !isa ? 9 : !strcmp(isa, "ref") ? 0 : !strcmp(isa, "avx2") ? 1 : !strcmp(isa, "avx512") ? 2 : 9;
        const struct sp_cpu_features *f = sp_cpu_features();
        if (cap >= 1) sp_quant_register_avx2(table, f);
        if (cap >= 2) sp_quant_register_avx512(table, f);
        if (cap >= 1) sp_quant_register_native_avx2(ntable, f);
        if (cap >= 2) sp_quant_register_native_avx512(ntable, f);
    }
#endif
#if defined(__x86_64__)
    {
        /* AMX int8 gemm for prefill (x86/amx.c), after the AVX-512 hook: the
         * entries it replaces become its fallback below 16 tokens.  Off when
         * SPARROW_ISA caps the level (ref/avx2/avx512) or SPARROW_AMX=0. */
        const char *isa = getenv("SPARROW_ISA");
        if (!isa || (strcmp(isa, "ref") && strcmp(isa, "avx2") && strcmp(isa, "avx512"))) {
            sp_gemm_fn before[SP_ARRAY_LEN(resident)];
            for (size_t k = 0; k < SP_ARRAY_LEN(resident); k++)
                before[k] = resident[k].from < SP_QTYPE_COUNT ? table[resident[k].from].gemm : NULL;
            sp_quant_register_amx(table, sp_cpu_features());
            /* AMX's prefill reads the file layouts (ggml's types): where it
             * took a type's gemm, that type stays as it is (no resident
             * gemm, so the pager does not repack it) */
            for (size_t k = 0; k < SP_ARRAY_LEN(resident); k++)
                if (resident[k].from < SP_QTYPE_COUNT && table[resident[k].from].gemm != before[k])
                    ntable[resident[k].id - SP_QTYPE_NATIVE_FIRST].gemm = NULL;
        }
    }
#endif
#if defined(__aarch64__)
    {
        /* SPARROW_ISA=ref|neon|dotprod caps the level as above: neon keeps
         * the plain Advanced SIMD kernels even where SDOT exists. */
        const char *isa = getenv("SPARROW_ISA");
        struct sp_cpu_features f = *sp_cpu_features();
        if (isa && !strcmp(isa, "ref")) f.neon = f.dotprod = false;
        if (isa && !strcmp(isa, "neon")) f.dotprod = false;
        sp_quant_register_neon(table, &f);
        sp_quant_register_native_neon(ntable, &f);
    }
#endif
    /* SPARROW_REPACK=0: no resident layout's kernels -- the pager repacks
     * nothing, and a file storing layouts takes the fallback (un-repacked to
     * the file types; tests, and A/B measurements). */
    {
        const char *rp = getenv("SPARROW_REPACK");
        if (rp && !strcmp(rp, "0"))
            for (size_t k = 0; k < SP_ARRAY_LEN(resident); k++) ntable[resident[k].id - SP_QTYPE_NATIVE_FIRST].gemm = NULL;
    }
    atomic_store(&table_ready, 1);
}

const struct sp_qtraits *sp_qtraits_get(uint32_t t) {
    if (!atomic_load(&table_ready)) sp_quant_init();
    if (is_native_id(t)) return ntable[t - SP_QTYPE_NATIVE_FIRST].name ? &ntable[t - SP_QTYPE_NATIVE_FIRST] : NULL;
    if (t >= SP_QTYPE_COUNT || !table[t].name) return NULL;
    return &table[t];
}

const struct sp_qtraits *sp_qtraits_ref(uint32_t t) {
    for (size_t k = 0; k < SP_ARRAY_LEN(resident); k++)
        if (t == resident[k].id) return &resident[k].ref;
    if (is_native_id(t)) return sp_native_ref_traits(t);
    if (t >= SP_QTYPE_COUNT || !ref_table[t].name) return NULL;
    return &ref_table[t];
}

uint32_t sp_qtype_resident(uint32_t t) {
    for (size_t k = 0; k < SP_ARRAY_LEN(resident); k++)
        if (t == resident[k].from) return resident[k].id;
    return 0;
}

uint32_t sp_qtype_resident_from(uint32_t r) {
    for (size_t k = 0; k < SP_ARRAY_LEN(resident); k++)
        if (r == resident[k].id) return resident[k].from;
    return 0;
}

void sp_qtype_repack(uint32_t r, void *rows, int64_t n_rows, int64_t n, size_t stride) {
    for (size_t k = 0; k < SP_ARRAY_LEN(resident); k++)
        if (r == resident[k].id) resident[k].repack(rows, n_rows, n, stride);
}

void sp_qtype_unrepack(uint32_t r, void *rows, int64_t n_rows, int64_t n, size_t stride) {
    for (size_t k = 0; k < SP_ARRAY_LEN(resident); k++)
        if (r == resident[k].id) resident[k].unrepack(rows, n_rows, n, stride);
}

bool sp_qtype_layout_here(uint32_t r) {
    const struct sp_qtraits *tr = sp_qtype_resident_from(r) ? sp_qtraits_get(r) : NULL;
    return tr && tr->gemm;
}

uint32_t sp_qtype_resident_here(uint32_t t, int64_t n) {
    const uint32_t r = sp_qtype_resident(t);
    return r && sp_qtype_layout_here(r) && n > 0 && n % sp_qtraits_ref(r)->block_elems == 0 ? r : 0;
}

uint32_t sp_qtype_stored(uint32_t t, int64_t n, enum sp_layout l) {
    const uint32_t base = sp_qtype_resident_from(t) ? sp_qtype_resident_from(t) : t;
    const uint32_t r = l == SP_LAYOUT_AUTO ? sp_qtype_resident_here(base, n) : l == SP_LAYOUT_RESIDENT ? sp_qtype_resident(base) : 0;
    return r && n > 0 && n % sp_qtraits_ref(r)->block_elems == 0 ? r : base;
}

const char *sp_qtype_name(uint32_t t) {
    const struct sp_qtraits *tr = sp_qtraits_ref(t);
    return tr ? tr->name : NULL;
}

size_t sp_qtype_row_bytes(uint32_t t, int64_t n) {
    const struct sp_qtraits *tr = sp_qtraits_ref(t);
    if (tr && n >= 0 && is_native_id(t)) return (size_t)((n + tr->block_elems - 1) / tr->block_elems) * tr->block_bytes;
    if (!tr || n < 0 || n % tr->block_elems != 0) return 0;
    return (size_t)(n / tr->block_elems) * tr->block_bytes;
}

void sp_gemm_generic(uint32_t t, int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *x,
                     size_t x_stride, int64_t n_tok, float *y, int64_t ldy) {
    const sp_vec_dot_fn dot = sp_qtraits_get(t)->vec_dot;
    /* Row-outer order: each weight row is read once and stays in cache while
     * it meets every token. */
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_stride;
        for (int64_t i = 0; i < n_tok; i++) {
            dot(n, &y[i * ldy + r], wr, (const uint8_t *)x + (size_t)i * x_stride);
        }
    }
}
