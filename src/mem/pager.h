/*
 * pager.h -- the weight pager: the only way the forward pass reaches tensor
 * data.  Contract as SQLite's page cache: sp_pager_pin() returns a pointer to
 * the resident bytes of a tensor (or a byte range of it) that stays valid
 * until the matching sp_pager_unpin(); "one unpin per successful pin".
 *
 * This version keeps every weight resident (the model fits): either a
 * read-only mapping of the file, or one anonymous region (huge pages where
 * the OS allows) that the weights are read into at open.  The budgeted pager that streams, prefetches and
 * evicts under --mem-budget replaces the inside of these calls, not callers.
 */
#ifndef SP_PAGER_H
#define SP_PAGER_H

#include "format/model_file.h"

struct sp_pager;

struct sp_pager_stats {
    uint64_t pins;        /* successful pins since open */
    uint64_t unpins;
    uint64_t outstanding; /* pins - unpins: must be 0 between tokens */
    uint64_t mapped_bytes;
    enum sp_weight_mode mode; /* MMAP or LOAD (never AUTO) */
};

/* Open mf's file for weight access.  mf must outlive the pager.  Checks the
 * file still has the size the directory was validated against.
 * SP_E_IO (message names the path), SP_E_FORMAT, SP_E_NOMEM. */
sp_status sp_pager_open(const struct sp_model_file *mf, enum sp_weight_mode mode, struct sp_pager **out);
void sp_pager_close(struct sp_pager *pg);

/* Pin nbytes of tensor t starting at byte off within it (off + nbytes <=
 * t->size, checked).  *out points at the bytes; valid until the unpin.
 * t must belong to the pager's model file.  May do I/O in later versions:
 * returns SP_E_IO then, never aborts. */
sp_status sp_pager_pin_range(struct sp_pager *pg, const struct sp_tensor_desc *t, uint64_t off, uint64_t nbytes,
                             const void **out);

/* Pin a whole tensor. */
static inline sp_status sp_pager_pin(struct sp_pager *pg, const struct sp_tensor_desc *t, const void **out) {
    return sp_pager_pin_range(pg, t, 0, t->size, out);
}

/* Release one pin of t (any range).  note: call only after a successful pin. */
void sp_pager_unpin(struct sp_pager *pg, const struct sp_tensor_desc *t);

void sp_pager_get_stats(const struct sp_pager *pg, struct sp_pager_stats *out);

#endif /* SP_PAGER_H */
