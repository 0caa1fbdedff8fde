/*
 * seq.h -- a sequence: the tokens a conversation holds, their KV cells and
 * the forward pass's scratch.  The one object sessions (api.c), evaluation
 * (through sessions) and calibration (src/quantize/calib.c) decode with.
 *
 * A sequence holds at most n_ctx tokens.  Decoding appends cells at the
 * next position and runs the batch through the model; when the tokens
 * would not fit and context shift is on, the oldest n_discard tokens after
 * the first n_keep (attention sinks) leave, the keys after them are rotated
 * back to their new positions, and decoding goes on (StreamingLLM's sinks +
 * window; llama.cpp's --keep / --context-shift).  Positions therefore grow
 * past n_ctx while cell indices stay below it.
 */
#ifndef SP_MODEL_SEQ_H
#define SP_MODEL_SEQ_H

#include "model/model.h"

struct sp_seq_params {
    uint32_t n_ctx;         /* tokens it may hold, >= 1 */
    uint32_t n_batch;       /* tokens per forward pass, 1..n_ctx */
    int n_threads;          /* >= 1 */
    enum sp_kv_type type_k, type_v;
    bool ctx_shift;         /* shift instead of refusing when full */
    uint32_t n_keep;        /* tokens a shift never drops (from the start) */
    uint32_t n_discard;     /* tokens a shift drops; 0 = half of those after n_keep */
};

/* A decode in slices (sp_seq_step_*): where it is. */
struct sp_seq_step {
    const int32_t *tokens;
    uint32_t n, i;           /* tokens asked for / consumed by finished passes */
    float *logits;
    bool all_logits;
    bool active, in_pass;
    uint32_t c0, nb;         /* the pass under way: first cell, tokens */
    struct sp_fwd_cursor cur;/* where in it (model.h) */
    double pass_s;           /* work so far on the pass under way */
    double layer_ms_tok;     /* measured ms per token of one layer (0: none yet) */
    uint32_t n_slices;       /* sp_forward_slice calls of the last sp_seq_step (tests) */
};

/* Return true to stop a long decode between batches. */
typedef bool (*sp_seq_abort_fn)(void *user);

struct sp_seq {
    struct sp_model *m;
    struct sp_seq_params p;
    struct sp_kv_cache *kv;   /* the model's cache for (type_k, type_v); shared */
    struct sp_kv_cells cells; /* this sequence's */
    struct sp_fwd *fwd;
    int32_t next_pos;         /* position of the next token */
    uint64_t n_discarded;     /* tokens context shifts dropped so far */
    uint32_t n_shifts;
    sp_seq_abort_fn abort_fn;
    void *abort_user;
    /* the governor's: tokens per pass when 0 < chunk < n_batch, and a call
     * after each pass of sp_seq_decode (n tokens, work_s seconds) */
    uint32_t chunk;
    void (*pass_done)(void *user, uint32_t n, double work_s, bool last);
    void *pass_user;
    struct sp_seq_step step;
};

/* SP_E_INVALID (a cache type this model's heads do not take; messages say
 * why), SP_E_NOMEM. */
sp_status sp_seq_init(struct sp_model *m, const struct sp_seq_params *p, struct sp_seq **out);
void sp_seq_free(struct sp_seq *s);

/* Hold no tokens (the memory stays). */
void sp_seq_reset(struct sp_seq *s);

/* Decode n tokens in batches of n_batch.  logits (NULL: none) receives the
 * last batch's last row, or with all_logits its every row (n <= n_batch
 * then).  *n_done (may be NULL) = tokens consumed: n, or on an error the
 * batches completed before it (a failed batch leaves no cells).
 * SP_E_CONTEXT_FULL (nothing consumed) when the tokens do not fit and
 * context shift is off, or n > n_ctx - n_keep with it on; SP_E_ABORTED when
 * the abort callback stopped it between batches; SP_E_IO from the pager. */
sp_status sp_seq_decode(struct sp_seq *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits,
                        uint32_t *n_done);

/* Whether n more tokens can be decoded (SP_E_CONTEXT_FULL as sp_seq_decode). */
sp_status sp_seq_fits(const struct sp_seq *s, uint32_t n);

/* sp_seq_decode in slices: begin checks what sp_seq_decode checks first
 * (nothing done on an error); each sp_seq_step runs a pass's work
 * (sp_forward_slice: a layer's stages, its products in row blocks) until
 * about budget_s have gone, in passes of n_batch tokens (the governor's
 * chunk caps them; with experts, as many as one layer's MoE block of the
 * budget holds at the measured cost), and sets *done when every token is
 * in.  The result is sp_seq_decode's, bit for bit when the passes are
 * its batches.  cancel drops a pass under way.  Never allocates. */
sp_status sp_seq_step_begin(struct sp_seq *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits);
sp_status sp_seq_step(struct sp_seq *s, double budget_s, bool *done, uint32_t *n_done);
void sp_seq_step_cancel(struct sp_seq *s);

/* Decode n[i] tokens for each sequence seqs[i] (i < n_seq, all of one
 * model, each at most once) in one forward pass with f's scratch (tokens:
 * seqs[0]'s n[0] first, then seqs[1]'s, ...; sum of n <= f->n_batch), segs
 * being room for n_seq entries.  logits receives each sequence's last row,
 * seqs[i]'s at logits + i*n_vocab.  A sequence that is full shifts first
 * when context shift is on; otherwise SP_E_CONTEXT_FULL and nothing is
 * decoded for any of them; on SP_E_IO no sequence keeps the batch's cells.
 * The abort callbacks are not consulted (one pass is one step).  Never
 * allocates. */
sp_status sp_seq_decode_batch(struct sp_fwd *f, struct sp_fwd_seg *segs, struct sp_seq *const *seqs,
                              const int32_t *tokens, const uint32_t *n, uint32_t n_seq, float *logits);

/* Keep the first n tokens (n <= held). */
void sp_seq_truncate(struct sp_seq *s, uint32_t n);

/* A context shift now: drop n tokens after the first n_keep (n <= held -
 * n_keep) and move the rest back by n positions.  SP_E_INVALID for a bad n,
 * SP_E_IO if a weight (rope frequencies) cannot be read. */
sp_status sp_seq_shift(struct sp_seq *s, uint32_t n);

/* Swap: give the sequence's KV quota back to the cache (its blocks, their
 * pages to the OS) and hold nothing, / take a fresh quota again (empty;
 * SP_E_NOMEM when the storage cannot grow).  Released, it must be regained
 * before anything else is done with it. */
void sp_seq_kv_release(struct sp_seq *s);
sp_status sp_seq_kv_regain(struct sp_seq *s);
static inline bool sp_seq_kv_released(const struct sp_seq *s) {
    return s->cells.blocks == NULL;
}

/* Tokens held / their ids / KV bytes they occupy as stored. */
static inline uint32_t sp_seq_n(const struct sp_seq *s) {
    return s->cells.n;
}
uint64_t sp_seq_kv_bytes(const struct sp_seq *s);

/* Bytes a sequence with these parameters allocates: its KV quota and the
 * scratch (not the logits). */
uint64_t sp_seq_bytes(const struct sp_model *m, const struct sp_seq_params *p);

#endif /* SP_MODEL_SEQ_H */
