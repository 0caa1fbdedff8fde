/*
 * governor.h -- the controller behind sparrow.h's sp_governor_*: what the
 * decode paths (api.c) call around their forward passes.  The governor
 * decides; the caller applies the knobs (pool threads, experts per token,
 * prefill chunk) and sleeps the pacing it is given.  docs/GOVERNOR.md.
 *
 * Protocol for the owner (a session or a batch), on its decoding thread:
 *   attach -> { prefill_begin -> prefill_pass* | token_begin -> token_end }* -> detach
 * Every call returns the knobs to use from now on in *k.  Never allocates
 * after init (the trace is a stdio stream opened at init).
 */
#ifndef SP_SCHED_GOVERNOR_H
#define SP_SCHED_GOVERNOR_H

#include "core/core.h"

struct sp_gov_knobs {
    int threads;             /* pool threads to use, 1..max_threads */
    uint32_t n_expert_used;  /* 0 = the model's (dense, or no cut) */
    uint32_t chunk;          /* prompt tokens per pass, 1..n_batch */
};

/* owner: who drives it (SP_E_STATE when another owner holds it).
 * n_experts_used: the model's experts per token (0 dense). */
sp_status sp_gov_attach(struct sp_governor *g, const void *owner, int max_threads, uint32_t n_experts_used,
                        uint32_t n_batch, struct sp_gov_knobs *k);
void sp_gov_detach(struct sp_governor *g, const void *owner);

/* A prompt of n tokens starts (sensors read now). */
void sp_gov_prefill_begin(struct sp_governor *g, uint32_t n, struct sp_gov_knobs *k);
/* A pass of n prompt tokens took work_s; returns the seconds to sleep
 * before the next pass (0 after the last). */
double sp_gov_prefill_pass(struct sp_governor *g, uint32_t n, double work_s, bool last, struct sp_gov_knobs *k);
/* A one-token decode (or a batch step) starts / ended after work_s of
 * work; token_end returns the seconds to sleep now. */
void sp_gov_token_begin(struct sp_governor *g);
double sp_gov_token_end(struct sp_governor *g, double work_s, struct sp_gov_knobs *k);

/* Seconds slept, counted (the caller sleeps, then reports what it slept). */
void sp_gov_paced(struct sp_governor *g, double s);

/* Sleep s seconds (a helper for the callers). */
void sp_gov_sleep(double s);

#endif /* SP_SCHED_GOVERNOR_H */
