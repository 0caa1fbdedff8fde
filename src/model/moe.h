/*
 * moe.h -- the Mixture-of-Experts feed-forward block of one layer (router ->
 * softmax over all experts -> top-k -> weighted sum of SwiGLU experts, plus a
 * shared expert where the file has one), its scratch, and the routing trace
 * that tests read back.  The dense FFN stays in llama.c.
 */
#ifndef SP_MOE_H
#define SP_MOE_H

#include "model.h"

/* Allocate / free the MoE fields of f (probs ... yg) for m's expert counts
 * and f->n_batch; a no-op for dense models.  SP_E_NOMEM. */
sp_status sp_moe_fwd_init(const struct sp_model *m, struct sp_fwd *f);
void sp_moe_fwd_free(struct sp_fwd *f);
uint64_t sp_moe_fwd_bytes(const struct sp_model *m, uint32_t n_batch);

/* The FFN of MoE layer il for the n_tok tokens at positions pos0..: reads
 * the normed rows f->xb, writes the block output to f->xb2 (the caller adds
 * it to the residual).  Never allocates.  SP_E_IO if the pager cannot
 * provide a weight. */
sp_status sp_moe_ffn(struct sp_model *m, struct sp_fwd *f, uint32_t il, uint32_t n_tok, uint32_t pos0);

/* ---- routing trace (for tests; off unless enabled) ------------------------
 * Records, per layer and position, what the router chose in the forward
 * calls since the last sp_moe_trace_clear().  Costs nothing when off (one
 * NULL test per layer); when on, n_layers * n_ctx * (2 K + X) * 4 bytes. */

struct sp_moe_route {
    const int32_t *experts; /* (n_used) chosen experts, descending router probability (ties: lower id) */
    const float *weights;   /* (n_used) the weights their outputs were summed with */
    const float *probs;     /* (n_experts) softmax over all router logits */
    uint32_t n_used, n_experts;
};

/* Turn the trace on (allocates for f->n_ctx positions) or off (frees).
 * SP_E_INVALID for a dense model, SP_E_NOMEM. */
sp_status sp_moe_trace_enable(const struct sp_model *m, struct sp_fwd *f, bool on);
/* Forget every record (a new decode call starts). */
void sp_moe_trace_clear(struct sp_fwd *f);
/* The decision of layer il at position pos; false if none was recorded. */
bool sp_moe_trace_get(const struct sp_fwd *f, uint32_t il, uint32_t pos, struct sp_moe_route *out);

#endif /* SP_MOE_H */
