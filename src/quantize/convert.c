/*
 * convert.c -- sp_convert (sparrow.h): a model file in, the same model out
 * with its matrices stored in the layouts the kernels read (docs/FORMAT.md,
 * "Resident layouts in the file") and every tensor on a 4 KiB page, so that
 * a resident load maps the file and uses it where it lies.  In this order:
 *   load the input through the model loader, weights mapped (a package's
 *   decompressed) -> per tensor, the type it is stored as (sp_qtype_stored;
 *   never the input embedding, which is read by rows) -> the GGUF writer:
 *   the input's metadata without its layout keys, the new ones, the
 *   directory, then each tensor's bytes in slabs of rows, repacked or
 *   un-repacked on the way -> fsync and rename (the writer) -> reopen the
 *   output to check that it reads.
 *
 * Invariants:
 *  1. Nothing appears at the output path unless the whole file was written
 *     (the writer's temporary file + rename).
 *  2. Every tensor keeps its name, shape, order and values; only the order
 *     of bytes inside its rows changes (a resident layout is a permutation
 *     of its file type's bytes, row by row).  Memory: one slab.
 */
#include "quantize.h"

#include "core/file.h"
#include "format/gguf.h"
#include "quant/native.h"
#include "quant/quant.h"

#define CONVERT_ALIGNMENT 4096u          /* a page: tensors can be mapped and used in place */
#define CONVERT_SLAB ((uint64_t)16 << 20) /* bytes of rows re-ordered at a time */

struct sp_convert_params sp_convert_default_params(void) {
    return (struct sp_convert_params){.layout = SP_LAYOUT_AUTO};
}

const char *sp_layout_name(enum sp_layout l) {
    static const char *const names[SP_LAYOUT_COUNT] = {"none", "auto", "resident"};
    return (unsigned)l < SP_LAYOUT_COUNT ? names[l] : NULL;
}

struct ctensor {
    const struct sp_tensor_desc *t;
    uint32_t from;    /* the type the pager holds it as (a stored layout the kernels lack: its file type) */
    uint32_t to;      /* the type written */
    uint64_t rows, row_bytes;
};

static sp_status check_params(const struct sp_convert_params *P) {
    if (!P || !P->input || !*P->input || !P->output || !*P->output) {
        return sp_err(SP_E_INVALID, "sp_convert: input and output paths are required");
    }
    if ((unsigned)P->layout >= SP_LAYOUT_COUNT) return sp_err(SP_E_INVALID, "sp_convert: unknown layout %d", (int)P->layout);
    /* by inode, as sp_quantize: writing over the input would replace the
     * file the run maps with what it is computing from it */
    const char *const reads[] = {P->input, P->tokenizer_path};
    const char *const what[] = {"input", "tokenizer"};
    for (size_t k = 0; k < SP_ARRAY_LEN(reads); k++) {
        if (reads[k] && sp_file_same(reads[k], P->output)) {
            return sp_err(SP_E_INVALID, "sp_convert: the output '%s' is the %s file '%s'; choose another output path",
                          P->output, what[k], reads[k]);
        }
    }
    return SP_OK;
}

#define TRY(x)                                                                                                     \
    do {                                                                                                           \
        if ((rc = (x))) goto done;                                                                                 \
    } while (0)

/* Tensor c's bytes, in slabs of whole rows, from the pager to the writer,
 * re-ordered where c->to differs from c->from. */
static sp_status write_tensor(struct sp_model *m, const struct ctensor *c, struct sp_gguf_writer *w, uint8_t *buf,
                              uint64_t *done, uint64_t total, const struct sp_convert_params *P) {
    const struct sp_tensor_desc *t = c->t;
    const uint64_t per = SP_MAX((uint64_t)1, CONVERT_SLAB / c->row_bytes);
    for (uint64_t r0 = 0; r0 < c->rows; r0 += per) {
        const uint64_t nr = SP_MIN(per, c->rows - r0), n = nr * c->row_bytes;
        const void *p, *src;
        sp_status rc = sp_pager_pin_range(m->pager, t, r0 * c->row_bytes, n, &p);
        if (rc) return rc;
        src = p;
        if (c->to != c->from) {
            memcpy(buf, p, (size_t)n);
            if (sp_qtype_resident_from(c->to) == c->from) sp_qtype_repack(c->to, buf, (int64_t)nr, t->ne[0], c->row_bytes);
            else sp_qtype_unrepack(c->from, buf, (int64_t)nr, t->ne[0], c->row_bytes);
            src = buf;
        }
        rc = sp_gguf_writer_write(w, src, (size_t)n);
        sp_pager_unpin(m->pager, t, p);
        if (rc) return rc;
        *done += n;
        if (P->progress && !P->progress(*done, total, P->progress_user)) {
            return sp_err(SP_E_STATE, "sp_convert: '%s': cancelled; nothing was written", P->output);
        }
    }
    return SP_OK;
}

sp_status sp_convert(const struct sp_convert_params *params, struct sp_convert_result *out) {
    const double t0 = sp_quantize_now_s();
    const struct sp_convert_params *P = params;
    sp_status rc = check_params(P);
    if (rc) return rc;
    sp_init();
    struct sp_model *m = NULL;
    struct sp_gguf_writer *w = NULL;
    struct sp_model_file *check = NULL;
    struct ctensor *ct = NULL;
    uint8_t *buf = NULL;
    struct sp_convert_result res = {0};

    struct sp_model_params mp = sp_model_default_params();
    mp.tokenizer_path = P->tokenizer_path;
    mp.weights = SP_WEIGHTS_MMAP; /* read each weight once, straight from the page cache */
    TRY(sp_model_load(P->input, &mp, &m));
    const struct sp_model_file *mf = m->mf;
    if (!(ct = sp_calloc(SP_MAX(mf->n_tensors, 1u), sizeof *ct))) TRY(sp_err(SP_E_NOMEM, "sp_convert: out of memory"));
    int level = 0;
    uint64_t total = 0, slab = 1;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        struct ctensor *c = &ct[i];
        const struct sp_tensor_desc *t = &mf->tensors[i];
        c->t = t;
        c->from = sp_pager_wtype(m->pager, t);
        c->rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
        c->row_bytes = c->rows ? t->size / c->rows : 0;
        const bool matrix = t->n_dims >= 2 && c->rows > 1 && t != m->tok_embd;
        c->to = sp_qtype_stored(c->from, t->ne[0], matrix ? P->layout : SP_LAYOUT_NONE);
        SP_ASSERT(sp_qtype_row_bytes(c->to, t->ne[0]) == sp_qtype_row_bytes(t->type, t->ne[0]));
        level = SP_MAX(level, sp_native_requires_level(c->to));
        if (sp_qtype_resident_from(c->to)) {
            res.n_layout++;
            res.layout_bytes += t->size;
        }
        total += t->size;
        if (c->to != c->from && c->row_bytes) slab = SP_MAX(slab, SP_MIN(t->size, SP_MAX((uint64_t)1, CONVERT_SLAB / c->row_bytes) * c->row_bytes));
    }
    if (!(buf = sp_malloc((size_t)slab))) TRY(sp_err(SP_E_NOMEM, "sp_convert: out of memory for a slab of %llu bytes", (unsigned long long)slab));

    TRY(sp_gguf_writer_open(P->output, CONVERT_ALIGNMENT, &w));
    if (mf->kind == SP_FILE_LLAMA2C) {
        TRY(sp_quantize_meta_llama2c(w, mf));
    } else {
        for (uint64_t i = 0; i < mf->n_meta; i++) {
            if (!sp_model_file_layout_key(mf->meta[i].key)) TRY(sp_gguf_writer_set(w, mf->meta[i].key, &mf->meta[i].value));
        }
    }
    if (level) TRY(sp_gguf_writer_set_str(w, "sparrow.requires", sp_native_requires_name(level)));
    if (P->layout != SP_LAYOUT_NONE) TRY(sp_gguf_writer_set_str(w, "sparrow.layout", "resident"));
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        TRY(sp_gguf_writer_add_tensor(w, ct[i].t->name, ct[i].to, ct[i].t->n_dims, ct[i].t->ne));
    }
    uint64_t done = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        if (ct[i].t->size) TRY(write_tensor(m, &ct[i], w, buf, &done, total, P));
    }
    TRY(sp_gguf_writer_finish(w));
    TRY(sp_model_file_open(P->output, NULL, false, &check)); /* the output reads, as a load will read it */
    res.n_tensors = (int32_t)mf->n_tensors;
    res.tensor_bytes = total;
    res.file_size = check->file_size;
    res.seconds = sp_quantize_now_s() - t0;
    if (out) *out = res;
done:
    sp_gguf_writer_free(w); /* removes the temporary file unless finished */
    sp_model_file_free(check);
    sp_free(buf);
    sp_free(ct);
    sp_model_free(m);
    return rc;
}
