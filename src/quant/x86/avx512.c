/*
 * avx512.c -- the AVX-512 kernels: the shared x86 kernel bodies of
 * kernels.inc with every unsigned x signed byte dot product done by one
 * AVX512-VNNI vpdpbusd (256-bit, AVX512VL).  The float kernels stay 8 lanes
 * wide on purpose: the gemm tiles and the vec_dots must sum in the same
 * order (a batch gives the same bits as single tokens); the Q4_0, Q4_K
 * and Q6_K gemms, whose sums run per row in lanes, take 16 rows per
 * 512-bit vector (SPX_512) without changing a row's order.  Built with the
 * AVX-512 flags in the Makefile; only called after sp_quant_init() saw
 * AVX512F/BW/VL/VNNI.
 */
#define SPX_VNNI 1
#define SPX_512 1
#include "kernels.inc"
#include "native_kernels.inc"

#include "quant/isa.h"

void sp_quant_register_avx512(struct sp_qtraits *table, const struct sp_cpu_features *f) {
    if (!f->avx512f || !f->avx512bw || !f->avx512vl || !f->avx512vnni || !f->fma || !f->f16c) return;
    spx_install(table);
}

void sp_quant_register_native_avx512(struct sp_qtraits *ntable, const struct sp_cpu_features *f) {
    if (!f->avx512f || !f->avx512bw || !f->avx512vl || !f->avx512vnni || !f->fma || !f->f16c) return;
    spxn_install(ntable);
    spx_install_resident(ntable);
}

#define SPX_KV_512 1
#include "kv_kernels.inc"

void sp_attn_register_avx512(struct sp_attn_kernels *k, const struct sp_cpu_features *f) {
    if (!f->avx512f) return;
    k->scores_rows = kv_scores_rows_avx512;
    k->accum_rows = kv_accum_rows_avx512;
    k->scores = kv_scores_avx512;
    k->accum = kv_accum_avx512;
    k->exp = kv_exp_avx512;
    k->scores_t = kv_scores_t_avx512;
    k->softmax_t = kv_softmax_t_avx512;
    k->accum_t = kv_accum_t_avx512;
    k->wide_pad = 64;
}
