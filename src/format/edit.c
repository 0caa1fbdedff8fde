/*
 * edit.c -- a GGUF file's metadata rewritten in place (model_file.h): the
 * same keys in the same order with some values replaced or added at the
 * end, the same tensors in the same order and layout, their bytes copied.
 * The GGUF writer does the atomic part (temporary file, fsync, rename).
 */
#include "model_file.h"

#include "core/file.h"
#include "gguf.h"

#include <stdio.h>

#define COPY_CHUNK ((size_t)8 << 20)

sp_status sp_model_file_edit(const char *path, const struct sp_meta_kv *set, size_t n_set) {
    struct sp_file *f = NULL;
    struct sp_model_file *mf = NULL;
    struct sp_gguf_writer *w = NULL;
    uint8_t *buf = NULL;
    sp_status rc = sp_file_open(path, &f);
    if (rc) return rc;
    uint8_t magic[4] = {0};
    if ((rc = sp_file_read_at(f, 0, magic, (size_t)SP_MIN((uint64_t)4, sp_file_size(f))))) goto done;
    if (memcmp(magic, "GGUF", 4) != 0) {
        rc = sp_err(SP_E_INVALID, "%s: '%s' is not a GGUF file (edit a package's GGUF and pack it again)", __func__, path);
        goto done;
    }
    if (!(mf = sp_calloc(1, sizeof *mf)) || !(mf->path = sp_strdup(path))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto done;
    }
    if ((rc = sp_gguf_read(f, mf))) goto done;
    /* the writer lays tensors out in declaration order: keep a file whose
     * layout it would not reproduce as it is, rather than move its data */
    uint64_t end = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        const uint64_t want = (end + mf->alignment - 1) / mf->alignment * mf->alignment;
        if (t->offset - mf->data_offset != want) {
            rc = sp_err(SP_E_UNSUPPORTED, "%s: '%s': tensor '%s' is not where a GGUF writer puts it (offset %llu, expected "
                        "%llu): this file's layout cannot be kept", __func__, path, t->name,
                        (unsigned long long)(t->offset - mf->data_offset), (unsigned long long)want);
            goto done;
        }
        end = want + t->size;
    }
    if ((rc = sp_gguf_writer_open(path, mf->alignment, &w))) goto done;
    for (uint64_t i = 0; i < mf->n_meta; i++) {
        const struct sp_meta_value *v = &mf->meta[i].value;
        for (size_t k = 0; k < n_set; k++) {
            if (strcmp(set[k].key, mf->meta[i].key) == 0) v = &set[k].value;
        }
        if ((rc = sp_gguf_writer_set(w, mf->meta[i].key, v))) goto done;
    }
    for (size_t k = 0; k < n_set; k++) { /* new keys go last, in the order given */
        if (!sp_model_file_meta(mf, set[k].key) && (rc = sp_gguf_writer_set(w, set[k].key, &set[k].value))) goto done;
    }
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        if ((rc = sp_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne))) goto done;
    }
    if (!(buf = sp_malloc(COPY_CHUNK))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto done;
    }
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        for (uint64_t off = 0; off < t->size; off += COPY_CHUNK) {
            const size_t n = (size_t)SP_MIN((uint64_t)COPY_CHUNK, t->size - off);
            if ((rc = sp_file_read_at(f, t->offset + off, buf, n)) || (rc = sp_gguf_writer_write(w, buf, n))) goto done;
        }
    }
    rc = sp_gguf_writer_finish(w);
done:
    sp_gguf_writer_free(w);
    sp_free(buf);
    sp_model_file_free(mf);
    sp_file_close(f);
    return rc;
}
