/*
 * sampler.h -- turns logits into the next token: repetition penalty and
 * OpenAI's frequency / presence penalties over the recent tokens, then
 * greedy (temp 0), or temperature -> top-k -> top-p -> min-p -> a draw from a
 * seeded RNG.  All scratch is allocated at init; sampling never allocates.
 */
#ifndef SP_SAMPLER_H
#define SP_SAMPLER_H

#include "core/core.h"

struct sp_sampler;

/* params is copied.  SP_E_INVALID for nonsense values (negative temp, top_p
 * outside (0,1], ...; the message says which), SP_E_NOMEM. */
sp_status sp_sampler_init(const struct sp_sampling_params *params, uint64_t seed, int32_t n_vocab,
                          struct sp_sampler **out);
void sp_sampler_free(struct sp_sampler *s);

/* Reseed the RNG only. */
void sp_sampler_seed(struct sp_sampler *s, uint64_t seed);

/* Reseed the RNG and clear the history. */
void sp_sampler_reset(struct sp_sampler *s, uint64_t seed);

/* Record a token in the penalties' history (the last repeat_last_n are kept). */
void sp_sampler_accept(struct sp_sampler *s, int32_t token);

/* Replace the penalty history with the last repeat_last_n of tokens[0..n)
 * (a truncated or loaded session); the RNG is kept. */
void sp_sampler_history_set(struct sp_sampler *s, const int32_t *tokens, int32_t n);
/* The history, oldest first, into out (repeat_last_n entries); returns its length. */
int32_t sp_sampler_history(const struct sp_sampler *s, int32_t *out);
/* New parameters between calls (checked as at init); a new repeat_last_n
 * keeps the most recent tokens.  SP_E_INVALID, SP_E_NOMEM. */
sp_status sp_sampler_set_params(struct sp_sampler *s, const struct sp_sampling_params *p);
/* The RNG state, for saving and restoring a session. */
void sp_sampler_rng_get(const struct sp_sampler *s, uint64_t rng[4]);
void sp_sampler_rng_set(struct sp_sampler *s, const uint64_t rng[4]);

/* Choose a token from n_vocab logits (not modified).  Greedy picks the lowest
 * id among equal maxima.  Never allocates. */
int32_t sp_sampler_sample(struct sp_sampler *s, const float *logits);

/* The RNG (xoshiro256** seeded with splitmix64): uniform float in [0, 1). */
float sp_sampler_rand(struct sp_sampler *s);

#endif /* SP_SAMPLER_H */
