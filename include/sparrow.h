/*
 * sparrow.h -- the public C API of Sparrow, an LLM inference engine for devices
 * whose memory is smaller than the model.  This is the only installed header.
 *
 * Conventions (see docs/API.md for a walk-through):
 *  - Every call that can fail returns sp_status: SP_OK (0) or a negative code.
 *    On failure, sp_last_error() returns a message that says what was wrong and
 *    where (file, offset, tensor or key name).  The library never exits or aborts
 *    on bad input.
 *  - Objects come in init/free or load/free pairs; sp_*_free(NULL) is a no-op.
 *  - Whoever creates an object frees it.  Pointers returned by the library say
 *    who owns them and how long they stay valid.
 *  - Parameters come as structs obtained from sp_*_default_params(), so that new
 *    fields can be added without breaking callers.
 */
#ifndef SPARROW_H
#define SPARROW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPARROW_VERSION "0.1.0"

/* ---------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------- */
typedef enum sp_status {
    SP_OK = 0,
    SP_E_INVALID = -1,     /* a bad argument from the caller (NULL, out of range) */
    SP_E_IO = -2,          /* a file could not be opened, read, written or mapped */
    SP_E_FORMAT = -3,      /* a file is malformed, truncated or inconsistent */
    SP_E_UNSUPPORTED = -4, /* a valid file uses a type/architecture Sparrow lacks */
    SP_E_NOMEM = -5,       /* an allocation failed; the object is left unchanged */
    SP_E_CONTEXT_FULL = -6,/* the tokens would not fit in the session's context */
    SP_E_BUFFER = -7,      /* an output buffer is too small; the needed size is
                              written through the size out-parameter */
    SP_E_STATE = -8,       /* the call is not valid in the object's current state
                              (e.g. sampling before any token was decoded) */
    SP_STATUS_COUNT = 9
} sp_status;

/* A constant English name for a status, e.g. "format error".  Never NULL. */
const char *sp_status_str(sp_status st);

/* The message of the last failure in the calling thread (like errno/dlerror).
 * Owned by the library; valid until the next failing call in this thread.
 * Returns "" if nothing has failed yet. */
const char *sp_last_error(void);

/* ---------------------------------------------------------------------------
 * Library-wide hooks: log callback and allocator
 * ------------------------------------------------------------------------- */
enum sp_log_level { SP_LOG_ERROR = 0, SP_LOG_WARN = 1, SP_LOG_INFO = 2, SP_LOG_DEBUG = 3, SP_LOG_LEVEL_COUNT };

/* Receives every diagnostic.  msg has no trailing newline and is valid only
 * during the call.  The default callback prints errors and warnings to stderr. */
typedef void (*sp_log_fn)(enum sp_log_level level, const char *msg, void *user);

/* Replace the log callback; NULL silences the library.  Set it before loading
 * models or starting threads: it is read without locking. */
void sp_log_set(sp_log_fn fn, void *user);

/* An allocator the embedder supplies (like lua_Alloc).  All heap memory the
 * library uses goes through it.  realloc(NULL, n) must behave as malloc(n).
 * Returning NULL is a recoverable out-of-memory (SP_E_NOMEM). */
struct sp_allocator {
    void *(*malloc_fn)(size_t size, void *user);
    void *(*realloc_fn)(void *ptr, size_t size, void *user);
    void (*free_fn)(void *ptr, void *user);
    void *user;
};

/* Install an allocator; NULL restores the C library's.  Call only while no
 * Sparrow object exists (memory must be freed by the allocator that made it). */
void sp_set_allocator(const struct sp_allocator *a);

/* Initialise CPU feature detection and the kernel dispatch table.  Idempotent;
 * sp_model_load calls it.  Call it once before starting threads if you use the
 * library from several threads at once. */
void sp_init(void);

/* ---------------------------------------------------------------------------
 * Model
 * ------------------------------------------------------------------------- */
struct sp_model;

/* How resident weights are held when the model fits.
 *  SP_WEIGHTS_AUTO: Sparrow's choice (currently LOAD).
 *  SP_WEIGHTS_MMAP: pointers into a read-only mapping of the file; pages
 *                   come from the page cache on first touch.
 *  SP_WEIGHTS_LOAD: read once into anonymous memory backed by huge pages
 *                   where the OS allows: fewer TLB misses when streaming
 *                   weights every token, at the cost of load time. */
enum sp_weight_mode { SP_WEIGHTS_AUTO = 0, SP_WEIGHTS_MMAP = 1, SP_WEIGHTS_LOAD = 2, SP_WEIGHTS_MODE_COUNT };

struct sp_model_params {
    const char *tokenizer_path; /* llama2.c checkpoints: tokenizer.bin; NULL = the
                                   file "tokenizer.bin" beside the model */
    bool vocab_only;            /* load the tokenizer only (no tensors needed) */
    enum sp_weight_mode weights;/* default SP_WEIGHTS_AUTO */
};
struct sp_model_params sp_model_default_params(void);

/* Load a model: GGUF (v2/v3) or a llama2.c checkpoint (.bin).  Tensor data is
 * not read here: weights are reached through the weight pager when needed.
 * Returns SP_OK and *out, or SP_E_IO / SP_E_FORMAT / SP_E_UNSUPPORTED /
 * SP_E_NOMEM / SP_E_INVALID with *out = NULL. */
sp_status sp_model_load(const char *path, const struct sp_model_params *params, struct sp_model **out);
void sp_model_free(struct sp_model *model);

/* Hyper-parameters and tokenizer facts.  String fields are owned by the model. */
struct sp_model_info {
    const char *arch;       /* "llama", "qwen2", "qwen3" */
    const char *name;       /* general.name or "" */
    const char *file_format;/* "gguf v3", "llama2.c" ... */
    const char *tokenizer;  /* "spm" or "bpe" */
    const char *tokenizer_pre; /* BPE pre-tokenizer name, "" for spm */
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim_k;     /* key_length */
    int32_t head_dim_v;     /* value_length */
    int32_t n_ff;
    int32_t n_experts;      /* 0 for dense models */
    int32_t n_experts_used;
    float rope_theta;
    int32_t rope_dims;
    bool rope_neox;         /* rotate (i, i+d/2) instead of adjacent pairs */
    float rms_eps;
    bool tied_output;       /* output head shares token_embd */
    int32_t bos;            /* -1 if none */
    int32_t eos;            /* -1 if none */
    bool add_bos;
    uint64_t n_params;      /* elements over all tensors */
    uint64_t tensor_bytes;  /* bytes of tensor data over all tensors */
    uint64_t bytes_per_token; /* bytes a decoded token reads: every tensor it
                                 touches, one row of the embedding table */
    uint64_t file_size;
};
sp_status sp_model_get_info(const struct sp_model *model, struct sp_model_info *out);

struct sp_tensor_info {
    const char *name;     /* owned by the model */
    const char *type;     /* "F32", "Q4_K", ... */
    int32_t n_dims;
    int64_t ne[4];        /* ne[0] is the row length (ggml order) */
    uint64_t offset;      /* absolute offset in the file */
    uint64_t size;        /* bytes */
};
int32_t sp_model_n_tensors(const struct sp_model *model);
sp_status sp_model_get_tensor(const struct sp_model *model, int32_t i, struct sp_tensor_info *out);

/* Metadata as text, for display ("inspect").  Writes key i's name and a short
 * rendering of its value (arrays abbreviated) into the caller's buffers,
 * truncating to fit.  Returns SP_E_INVALID when i is out of range. */
int32_t sp_model_n_meta(const struct sp_model *model);
sp_status sp_model_get_meta(const struct sp_model *model, int32_t i, char *key, size_t key_cap, char *val,
                            size_t val_cap);

/* ---------------------------------------------------------------------------
 * Tokenizer
 * ------------------------------------------------------------------------- */
enum sp_tokenize_flags {
    SP_TOKENIZE_ADD_BOS = 1u << 0, /* prepend BOS when the vocabulary asks for it */
};

/* Tokenize len bytes of text (need not be NUL-terminated).  Special-token text
 * is not parsed as special.  Writes up to cap ids into tokens and the count to
 * *n_out; if cap is too small returns SP_E_BUFFER with *n_out = the count needed. */
sp_status sp_tokenize(const struct sp_model *model, const char *text, size_t len, unsigned flags, int32_t *tokens,
                      int32_t cap, int32_t *n_out);

/* The bytes one token stands for (byte tokens become their byte, "\xe2\x96\x81"
 * becomes a space).  Control tokens (BOS/EOS) render as "".  Writes up to cap
 * bytes (no NUL) and the length to *n_out; SP_E_BUFFER + needed size if small. */
sp_status sp_token_to_piece(const struct sp_model *model, int32_t token, char *buf, size_t cap, size_t *n_out);

/* Inverse of sp_tokenize: concatenated pieces, with the leading space that SPM
 * vocabularies add at the start removed.  Same buffer contract. */
sp_status sp_detokenize(const struct sp_model *model, const int32_t *tokens, int32_t n, char *buf, size_t cap,
                        size_t *n_out);

/* True for end-of-generation tokens (EOS, EOT). */
bool sp_token_is_eog(const struct sp_model *model, int32_t token);

/* ---------------------------------------------------------------------------
 * Session: context (KV cache), scratch, sampler.  All memory a session needs
 * per token is allocated in sp_session_init; sp_decode never allocates.
 * ------------------------------------------------------------------------- */
struct sp_session;

enum sp_kv_type { SP_KV_F32 = 0, SP_KV_F16 = 1, SP_KV_TYPE_COUNT };

struct sp_sampling_params {
    float temp;           /* 0 = greedy (argmax, lowest id on ties) */
    int32_t top_k;        /* <= 0: disabled */
    float top_p;          /* in (0, 1]; 1: disabled */
    float min_p;          /* in [0, 1]; 0: disabled */
    float repeat_penalty; /* 1: disabled */
    int32_t repeat_last_n;/* how many recent tokens the penalty looks at */
};

struct sp_session_params {
    int32_t n_ctx;        /* 0 = the model's context length, capped at 4096 */
    int32_t n_threads;    /* 0 = one */
    int32_t n_batch;      /* tokens per forward pass when feeding a prompt;
                             0 = 128 (capped at n_ctx).  Memory grows with it. */
    uint64_t seed;        /* sampler seed; the same seed gives the same output */
    enum sp_kv_type kv_type;
    struct sp_sampling_params sampling;
};
struct sp_session_params sp_session_default_params(void);

/* Create a session over a loaded model.  The model must outlive the session.
 * Returns SP_E_INVALID for bad params (message says which), SP_E_NOMEM,
 * SP_E_STATE for a vocab-only model. */
sp_status sp_session_init(struct sp_model *model, const struct sp_session_params *params, struct sp_session **out);
void sp_session_free(struct sp_session *s);

/* Forget all tokens (empty KV cache, empty penalty history); keeps the memory. */
void sp_session_reset(struct sp_session *s);

/* Feed n tokens (a prompt as one batch, or one sampled token) at the current
 * position and compute the logits of the last one.  Returns SP_E_CONTEXT_FULL
 * (nothing consumed) if n_past + n would exceed n_ctx, SP_E_INVALID for an id
 * outside the vocabulary or n <= 0.  Never allocates. */
sp_status sp_decode(struct sp_session *s, const int32_t *tokens, int32_t n);

/* Logits of the last decoded token: n_vocab floats, owned by the session,
 * valid until the next sp_decode / sp_session_reset / sp_session_free.
 * NULL before the first decode. */
const float *sp_get_logits(const struct sp_session *s);

/* Sample the next token from the current logits with the session's sampling
 * parameters, seeded RNG and history (for the repetition penalty).  Does not
 * feed it: call sp_decode with it to continue.  SP_E_STATE before any decode. */
sp_status sp_sample(struct sp_session *s, int32_t *out_token);

int32_t sp_session_n_past(const struct sp_session *s);
int32_t sp_session_n_ctx(const struct sp_session *s);

/* Bytes allocated by the session (KV cache + scratch + logits). */
uint64_t sp_session_memory_bytes(const struct sp_session *s);

/* ---------------------------------------------------------------------------
 * Synthetic models (src/model/synth.c): GGUF files with seeded random weights
 * in the exact shapes of real models, for speed and memory measurements.
 * Their vocabulary is SentencePiece-style and their text is gibberish; the
 * files load in llama.cpp as well.
 * ------------------------------------------------------------------------- */

/* Progress of a long call: done of total units (bytes for sp_synth).  Called
 * on the calling thread.  Return true to go on, false to cancel. */
typedef bool (*sp_progress_fn)(uint64_t done, uint64_t total, void *user);

struct sp_synth_params {
    const char *shape;        /* a shape name, e.g. "llama-7b" (sp_synth_get_shape) */
    const char *type;         /* a file type: "f16", "bf16", "q8_0", "q4_0", "q4_k_m"
                                 (sp_synth_type_name); norms and the MoE router stay F32 */
    const char *path;         /* output file, created or replaced only when complete */
    uint64_t seed;            /* the same shape, type and seed give the same bytes */
    int32_t n_threads;        /* 0 = one; the output does not depend on it */
    sp_progress_fn progress;  /* NULL = no reports */
    void *progress_user;
};
struct sp_synth_params sp_synth_default_params(void);

/* Write the synthetic model.  Output goes to "<path>.tmp.<pid>" and is renamed
 * over path when complete; on any failure (or a cancel) the temporary file is
 * removed and an existing file at path is left as it was.
 * Returns SP_OK, SP_E_INVALID (unknown shape or type, no path), SP_E_IO
 * (message names the file), SP_E_NOMEM, SP_E_STATE (cancelled by progress). */
sp_status sp_synth(const struct sp_synth_params *params);

/* The shapes sp_synth knows, for listing.  Strings are static. */
struct sp_synth_shape_info {
    const char *name;         /* "llama-7b" */
    const char *arch;         /* general.architecture: "llama", "qwen3moe" */
    const char *about;        /* one line: which real model it copies */
    int32_t n_vocab, n_ctx, n_embd, n_layers, n_heads, n_kv_heads, head_dim, n_ff;
    int32_t n_experts, n_experts_used, n_ff_exp; /* 0 for dense shapes */
    float rope_theta;
};
int32_t sp_synth_n_shapes(void);
sp_status sp_synth_get_shape(int32_t i, struct sp_synth_shape_info *out); /* SP_E_INVALID out of range */
int32_t sp_synth_n_types(void);
const char *sp_synth_type_name(int32_t i); /* NULL out of range */

/* Parameters and tensor-data bytes a shape/type gives (the file adds a few
 * MB of metadata and padding).  Either out-pointer may be NULL.  SP_E_INVALID
 * for unknown names. */
sp_status sp_synth_size(const char *shape, const char *type, uint64_t *n_params, uint64_t *tensor_bytes);

/* ---------------------------------------------------------------------------
 * Quantizer (src/quantize/): a model file in, a GGUF with Sparrow's mixed-
 * precision block types out, optionally calibrated on a text and pruned.
 * docs/QUANT.md describes the policies and the file they write.
 * ------------------------------------------------------------------------- */

/* What sp_quantize reports after each tensor it wrote.  Strings are valid
 * during the call only. */
struct sp_quantize_tensor_report {
    int32_t index, count;     /* this tensor's place in the output, of count */
    const char *name;
    const char *type;         /* the type it was stored as: "i4_b64", "F32" */
    int32_t n_dims;
    int64_t ne[4];            /* output shape (after pruning) */
    uint64_t bytes;           /* its data bytes in the output */
    double rel_rmse;          /* sqrt(sum (w - q)^2 / sum w^2) over the tensor */
    double rel_rmse_imp;      /* the same weighted by the calibrated importance
                                 of each input channel; -1 without calibration */
    const char *note;         /* "" or why the type differs from the policy's */
};
/* Return true to go on, false to cancel (nothing is written then). */
typedef bool (*sp_quantize_tensor_fn)(const struct sp_quantize_tensor_report *r, void *user);

/* What calibration does beyond weighting each channel's error by its mean
 * squared activation (always on with a calibration text). */
enum sp_calib_method {
    SP_CALIB_SCALE = 1u << 0, /* activation-aware channel scaling, folded into the
                                 producing operation (the model's function is kept) */
    SP_CALIB_GPTQ = 1u << 1,  /* rounding with error feedback over the input
                                 covariance (small models: the covariances must fit
                                 256 MiB) */
};

struct sp_quantize_params {
    const char *input;        /* GGUF (F32/F16/BF16/Q8_0 tensors) or llama2.c .bin */
    const char *tokenizer_path; /* llama2.c input: its tokenizer.bin (NULL = beside it) */
    const char *output;       /* GGUF written; created or replaced only when complete */
    const char *policy;       /* a named policy (sp_quantize_policy_info); NULL = "mem4" */
    const char *policy_file;  /* or a file of "PATTERN TYPE" lines (overrides policy) */
    const char *calib_path;   /* a text to calibrate on; NULL = none */
    int32_t calib_chunks;     /* at most this many chunks of the text (0 = 16) */
    int32_t calib_ctx;        /* tokens per chunk (0 = 128, capped at the model's context) */
    unsigned calib_skip;      /* SP_CALIB_* methods not to use (0 = use all) */
    float prune_ffn;          /* fraction of FFN neurons dropped per layer, [0, 1) */
    int32_t prune_heads;      /* attention heads dropped per layer, >= 0; with
                                 grouped-query attention a multiple of the group
                                 size (whole KV groups go) */
    int32_t n_threads;        /* 0 = one */
    sp_quantize_tensor_fn on_tensor; /* NULL = no reports */
    void *user;
};
struct sp_quantize_params sp_quantize_default_params(void);

struct sp_quantize_result {
    char policy[32];          /* the policy's name ("file" for a policy file) */
    uint64_t n_params;        /* elements over all tensors of the output */
    uint64_t tensor_bytes;    /* tensor data bytes of the output, as stored */
    double bpw;               /* tensor_bytes * 8 / n_params, measured on the output */
    uint64_t file_size;
    bool native;              /* uses Sparrow's own types (sparrow.requires is set) */
    int32_t calib_tokens;     /* tokens the calibration ran (0 = none) */
    int32_t n_scaled;         /* inputs whose channels calibration rescaled */
    int32_t n_gptq;           /* tensors rounded with error feedback */
    int32_t n_ff, n_heads, n_kv_heads; /* of the output, after pruning */
    double seconds;           /* wall time of the whole call */
};

/* Quantize params->input into params->output.  The output goes to a
 * temporary file renamed into place when complete: on any failure or a
 * cancel nothing is left and an existing file at output is untouched.
 * out (may be NULL) receives the summary.  Returns SP_OK, SP_E_INVALID (bad
 * parameters, unknown policy, pruning the format cannot express),
 * SP_E_FORMAT (a malformed policy file: the message names the line),
 * SP_E_UNSUPPORTED (an input tensor type the quantizer does not read),
 * SP_E_IO, SP_E_NOMEM, SP_E_STATE (cancelled by on_tensor). */
sp_status sp_quantize(const struct sp_quantize_params *params, struct sp_quantize_result *out);

/* The named policies, for listing.  Strings are static; SP_E_INVALID out of
 * range. */
int32_t sp_quantize_n_policies(void);
sp_status sp_quantize_policy_info(int32_t i, const char **name, const char **about);

#ifdef __cplusplus
}
#endif
#endif /* SPARROW_H */
