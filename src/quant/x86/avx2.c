/*
 * avx2.c -- the AVX2 + FMA + F16C kernels: the shared x86 kernel bodies of
 * kernels.inc compiled without VNNI (byte dot products through
 * vpmaddubsw + vpmaddwd).  Built with -mavx2 -mfma -mf16c (Makefile); only
 * called after sp_quant_init() saw those features.
 */
#define SPX_VNNI 0
#include "kernels.inc"
#include "native_kernels.inc"

#include "quant/isa.h"

void sp_quant_register_avx2(struct sp_qtraits *table, const struct sp_cpu_features *f) {
    if (!f->avx2 || !f->fma || !f->f16c) return;
    spx_install(table);
}

void sp_quant_register_native_avx2(struct sp_qtraits *ntable, const struct sp_cpu_features *f) {
    if (!f->avx2 || !f->fma || !f->f16c) return;
    spxn_install(ntable);
    spx_install_resident(ntable);
}

#define SPX_KV_512 0
#include "kv_kernels.inc"
#include "kv_tq_avx2.inc"

void sp_attn_register_avx2(struct sp_attn_kernels *k, const struct sp_cpu_features *f) {
    if (!f->avx2 || !f->fma) return;
    k->scores_rows = kv_scores_rows_avx2;
    k->accum_rows = kv_accum_rows_avx2;
    k->scores = kv_scores_avx2;
    k->accum = kv_accum_avx2;
    k->exp = kv_exp_avx2;
    k->scores_t = kv_scores_t_avx2;
    k->softmax_t = kv_softmax_t_avx2;
    k->accum_t = kv_accum_t_avx2;
    k->wide_pad = 16;
    tq_install_avx2(k);
}
