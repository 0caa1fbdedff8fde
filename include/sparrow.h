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
    SP_E_ABORTED = -9,     /* the caller's abort callback stopped the call */
    SP_STATUS_COUNT = 10
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
 *  SP_WEIGHTS_AUTO: Sparrow's choice: MMAP for a file `sparrow convert` wrote
 *                   (its matrices stored in the layouts the kernels read;
 *                   sp_convert), LOAD for any other.
 *  SP_WEIGHTS_MMAP: pointers into a read-only mapping of the file; pages
 *                   come from the page cache on first touch.
 *  SP_WEIGHTS_LOAD: read once into anonymous memory backed by huge pages
 *                   where the OS allows: fewer TLB misses when streaming
 *                   weights every token, at the cost of load time. */
enum sp_weight_mode { SP_WEIGHTS_AUTO = 0, SP_WEIGHTS_MMAP = 1, SP_WEIGHTS_LOAD = 2, SP_WEIGHTS_MODE_COUNT };

/* KV cache element types, for keys and values separately.  f32, f16, q8_0
 * and q4_0 store rows as llama.cpp does; q4h is Sparrow's 4.5-bit type
 * (blocks of 32 rotated by a Walsh-Hadamard transform, non-uniform 4-bit
 * levels), for q4_0's size at a fraction of its error.  The quantized types
 * need head sizes that are multiples of 32. */
/* How a memory budget's expert cache (MoE models whose experts stream)
 * chooses what to give up.  NEXT_USE (the default) evicts the expert slice
 * whose next use is expected furthest away, from where its layer is in the
 * forward pass's cycle and from the routing seen so far (popular experts,
 * experts reused from one token to the next); LRU evicts the least recently
 * used, as before (docs/MEMORY.md, "The expert cache"). */
enum sp_expert_cache { SP_EXPERT_CACHE_AUTO = 0, SP_EXPERT_CACHE_NEXT_USE = 1, SP_EXPERT_CACHE_LRU = 2,
                       SP_EXPERT_CACHE_COUNT };

enum sp_kv_type { SP_KV_F32 = 0, SP_KV_F16 = 1, SP_KV_Q8_0 = 2, SP_KV_Q4_0 = 3, SP_KV_Q4H = 4, SP_KV_TYPE_COUNT };

struct sp_model_params {
    const char *tokenizer_path; /* llama2.c checkpoints: tokenizer.bin; NULL = the
                                   file "tokenizer.bin" beside the model.  A GGUF
                                   file has its own: set, SP_E_INVALID */
    bool vocab_only;            /* load the tokenizer only (no tensors needed) */
    enum sp_weight_mode weights;/* default SP_WEIGHTS_AUTO */
    uint64_t mem_budget;        /* bytes Sparrow may keep resident -- weights, KV
                                   cache, scratch, the process itself; 0 = no
                                   budget.  One account holds them all
                                   (sp_model_get_mem_stats).  With a budget the
                                   weights are planned for the envelope below and
                                   read when the first session is created
                                   (sp_session_init): what fits stays resident,
                                   the rest streams from storage.  A budget too
                                   small to run at all is refused there (message
                                   states the minimum); sp_model_plan tells
                                   before. */
    /* The envelope: the sessions the budget keeps room for (their KV caches,
     * scratch and logits, as sp_session_init would allocate them), so that
     * the plan does not depend on which session comes first.  A session that
     * does not fit what the plan left is refused with the numbers. */
    int32_t n_ctx;              /* per session; 0 = the trained context */
    int32_t n_seq;              /* sessions at once; 0 = 1 */
    int32_t n_batch;            /* 0 = 128 */
    int32_t n_threads;          /* 0 = one (scratch grows a little with threads) */
    enum sp_kv_type kv_type_k;  /* default F16 */
    enum sp_kv_type kv_type_v;  /* default F16 */
    int32_t batch_tokens;       /* and a batch of the n_seq sessions with this many
                                   tokens a step (sp_batch_init's n_tokens, at
                                   least n_seq), on n_threads; 0 = no batch */
    enum sp_expert_cache expert_cache; /* with a budget that streams experts: the cache's
                                   policy; default (AUTO) NEXT_USE */
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
    const char *arch;       /* "llama", "qwen2", "qwen3", "qwen3moe" */
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
    int32_t n_experts_used; /* experts each token is routed to */
    int32_t n_ff_exp;       /* an expert's FFN width; 0 for dense models */
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
                                 touches, one row of the embedding table; for
                                 MoE, n_experts_used/n_experts of the expert
                                 tensors (routers, shared experts: all) */
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
    SP_TOKENIZE_ADD_BOS = 1u << 0,       /* prepend BOS when the vocabulary asks for it */
    SP_TOKENIZE_PARSE_SPECIAL = 1u << 1, /* text of control tokens ("<|im_start|>",
                                            "</s>") becomes those tokens, as a
                                            rendered chat template needs */
};

/* Tokenize len bytes of text (need not be NUL-terminated).  Without
 * SP_TOKENIZE_PARSE_SPECIAL special-token text is plain text (user input
 * cannot forge a turn); user-defined tokens are matched whole either way.
 * Writes up to cap ids into tokens and the count to *n_out; if cap is too
 * small returns SP_E_BUFFER with *n_out = the count needed. */
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
 * Chat templates (src/chat/): a conversation -> the prompt text the model
 * was trained on.  Two engines, as llama.cpp's --jinja / --no-jinja:
 *  SP_CHAT_JINJA  the template's own program (tokenizer.chat_template is a
 *                 Jinja program) run by a sandboxed interpreter of the subset
 *                 chat templates use: no file or environment access, bounded
 *                 output, memory, loop iterations and nesting;
 *  SP_CHAT_NAMED  hand-written formatters for the families llama.cpp's
 *                 built-in formatter knows, recognised by substrings of the
 *                 template (or chosen by name: sp_chat_builtin_templates).
 * A template that is exactly a family name ("chatml", "llama3", ...) uses
 * that formatter with either engine.  The rendered text is meant to be
 * tokenized with SP_TOKENIZE_ADD_BOS | SP_TOKENIZE_PARSE_SPECIAL, so that
 * "<|im_start|>" and the like become their special tokens.  docs/CHAT.md
 * lists the families, the Jinja subset and the limits.
 * All calls here may run concurrently (they only read the model).
 * ------------------------------------------------------------------------- */

/* A metadata value as text, in full: strings as stored, integers in
 * decimal, floats with %g, booleans as true/false.  Writes the text and a
 * NUL into buf and its length (without the NUL) to *len.  SP_E_BUFFER when
 * cap < *len + 1 (*len is then the length needed, less the NUL);
 * SP_E_INVALID when the key is absent or holds an array. */
sp_status sp_model_meta_str(const struct sp_model *model, const char *key, char *buf, size_t cap, size_t *len);

struct sp_chat_message {
    const char *role;    /* "system", "user", "assistant", "tool", ... */
    const char *content; /* NUL-terminated; NULL is "" */
};

enum sp_chat_engine { SP_CHAT_JINJA = 0, SP_CHAT_NAMED = 1, SP_CHAT_ENGINE_COUNT };

struct sp_chat_params {
    const char *tmpl;          /* Jinja source or a family name; NULL = the model's
                                  tokenizer.chat_template */
    enum sp_chat_engine engine;/* default SP_CHAT_JINJA */
    bool add_assistant;        /* end with the opening of an assistant turn
                                  (add_generation_prompt); default true */
    const char *bos_token;     /* the text bos_token stands for; NULL = the
                                  model's BOS token text ("" without a model) */
    const char *eos_token;     /* the same for eos_token */
    const char *vars_json;     /* NULL, or a JSON object whose members become
                                  template variables (or replace the defaults):
                                  {"tools": [...], "enable_thinking": false} */
    const char *messages_json; /* NULL, or a JSON array of message objects used
                                  instead of the msgs array: fields beyond role
                                  and content (tool_calls, name, ...) reach the
                                  template.  Content given as a list of
                                  {"type": "text", "text": ...} parts is joined
                                  with newlines. */
    bool keep_bos;             /* with a model whose tokenizer adds BOS itself:
                                  false (default) drops a leading BOS text from
                                  the result, as llama.cpp does, so the prompt
                                  does not start with two BOS tokens */
    size_t max_output;         /* bytes of rendered text; 0 = 64 MiB */
    uint64_t max_iterations;   /* loop iterations and macro calls; 0 = 1,000,000 */
};
struct sp_chat_params sp_chat_default_params(void);

/* Render n messages into buf with the template and engine of params (NULL
 * = defaults).  model may be NULL when params->tmpl is set; with a model,
 * bos_token / eos_token default to its tokens' text.  Writes the prompt and
 * a NUL; *len = its length without the NUL.  Returns:
 *  SP_OK;
 *  SP_E_BUFFER      cap < *len + 1 (*len is the length needed, less the NUL);
 *  SP_E_FORMAT      the template failed: a syntax error, a runtime error, its
 *                   raise_exception, or a limit; the message gives the line and
 *                   column ("chat template: line 3, column 12: ..."); also bad
 *                   messages_json / vars_json;
 *  SP_E_UNSUPPORTED a construct, filter or test the interpreter lacks; with
 *                   SP_CHAT_NAMED, a template no formatter recognises; no
 *                   template given and the model has none;
 *  SP_E_INVALID, SP_E_NOMEM. */
sp_status sp_chat_apply(const struct sp_model *model, const struct sp_chat_params *params,
                        const struct sp_chat_message *msgs, size_t n, char *buf, size_t cap, size_t *len);

/* sp_chat_apply with default params but for tmpl (NULL = the model's) and
 * add_assistant. */
sp_status sp_chat_apply_template(const struct sp_model *model, const char *tmpl, const struct sp_chat_message *msgs,
                                 size_t n, bool add_assistant, char *buf, size_t cap, size_t *len);

/* The named formatters' family names, sorted (static strings): writes up to
 * cap of them into names (NULL when cap is 0) and returns how many exist. */
int32_t sp_chat_builtin_templates(const char **names, size_t cap);

/* The family name SP_CHAT_NAMED would format tmpl with, or NULL if none
 * recognises it.  Static string. */
const char *sp_chat_detect_template(const char *tmpl);

/* ---------------------------------------------------------------------------
 * Generation (src/gen/): the loop that turns a prompt into an answer --
 * decode the prompt, then sample, stream and feed back one token at a time
 * until a stop condition -- shared by `sparrow run`, `sparrow chat` and any
 * embedder.  The streamed text is always valid UTF-8: a character split
 * across tokens is delivered with its last byte, invalid bytes become
 * U+FFFD, and text that could still become a stop string is held back until
 * it cannot (it is never delivered when it does).  A server that batches
 * several sequences runs its own loop over the same filters (src/gen/stream.h).
 * Calls on one session must not overlap (as for sp_decode).
 * ------------------------------------------------------------------------- */
struct sp_session;

enum sp_stop_reason {
    SP_STOP_LIMIT = 0,    /* n_predict tokens were generated */
    SP_STOP_EOG = 1,      /* the model sampled an end-of-generation token
                             (<|im_end|>, <|eot_id|>, </s>, ...): not delivered,
                             not decoded */
    SP_STOP_STRING = 2,   /* the text reached a stop string (stop_index says
                             which): the text before it was delivered, it was not */
    SP_STOP_CONTEXT = 3,  /* the context is full and ctx_shift is off */
    SP_STOP_CALLBACK = 4, /* on_token returned false */
    SP_STOP_ABORTED = 5,  /* the session's abort callback stopped a decode
                             (sp_session_set_abort): what was decoded stays */
    SP_STOP_REASON_COUNT
};

/* A constant name: "limit", "eog", "stop string", "context full", "callback",
 * "aborted"; "?" out of range. */
const char *sp_stop_reason_name(enum sp_stop_reason r);

struct sp_generate_params {
    int32_t n_predict;          /* tokens to generate; -1 = until another stop
                                   condition; 0 = decode the prompt only */
    const char *const *stops;   /* n_stops stop strings, non-empty valid UTF-8
                                   (copied; NULL when n_stops is 0) */
    int32_t n_stops;
    bool decode_last;           /* feed the last generated token too, so the
                                   session holds the whole answer (a chat's next
                                   turn goes on after it); false saves that
                                   decode when nothing follows.  Tokens stopped
                                   at by EOG are never fed.  Default true. */
};
struct sp_generate_params sp_generate_default_params(void);

struct sp_generate_result {
    enum sp_stop_reason stop;
    int32_t stop_index;     /* the stop string matched (SP_STOP_STRING), else -1 */
    int32_t n_prompt;       /* prompt tokens decoded by this call */
    int32_t n_generated;    /* tokens sampled and delivered (an EOG token is not) */
    int32_t n_decoded;      /* generated tokens fed back (n_generated, or one
                               less without decode_last or at a full context) */
    double t_prompt_s;      /* seconds decoding the prompt */
    double ttft_s;          /* seconds from the call to the first token sampled
                               (the prompt's decode included); 0 if none */
    double t_decode_s;      /* seconds in sp_decode for the generated tokens */
    double decode_tps;      /* n_decoded / t_decode_s (0 when nothing was fed) */
    double t_total_s;       /* seconds in the call */
};

/* Called once per generated token (token >= 0), and once more with token -1
 * if text was still held at the end.  text[0..len) is the valid UTF-8 the
 * token completes (often len 0: a character or a possible stop string not
 * yet complete); not NUL-terminated, valid only during the call.  Return
 * false to stop (SP_STOP_CALLBACK; the call with token -1 cannot stop). */
typedef bool (*sp_token_fn)(const char *text, size_t len, int32_t token, void *user);

/* Decode n prompt tokens (n may be 0: go on from the logits the session
 * holds), then generate per params (NULL = defaults) with the session's
 * sampling parameters, calling on_token (may be NULL) for each token.  out
 * receives why it stopped and the counts and timings (also on SP_E_* after
 * the prompt, as far as it got).  Returns:
 *  SP_OK            a stop condition was reached (out->stop says which);
 *  SP_E_CONTEXT_FULL the prompt does not fit (nothing consumed; ctx_shift off);
 *  SP_E_STATE       n is 0 and the session holds no logits;
 *  SP_E_INVALID     bad params or stop strings (message says which), or a
 *                   prompt id outside the vocabulary;
 *  SP_E_IO, SP_E_NOMEM as sp_decode / sp_sample return them.
 * It allocates at the start (the stop strings, a token's buffers) and on
 * the way only for a token longer than 256 bytes; sp_decode never does. */
sp_status sp_generate(struct sp_session *s, const int32_t *prompt, int32_t n, const struct sp_generate_params *params,
                      sp_token_fn on_token, void *user, struct sp_generate_result *out);

/* ---------------------------------------------------------------------------
 * Session: one conversation -- its tokens, their KV cache, scratch, sampler.
 * All memory a session needs per token is allocated in sp_session_init;
 * sp_decode never allocates.  The KV cache is paged: blocks of 32 tokens
 * from a pool the model keeps for all its sessions of the same cache types
 * (docs/MEMORY.md), so a long context needs no contiguous allocation and its
 * pages are touched only as tokens arrive.
 *
 * Threads: calls on one session must not overlap; different sessions of one
 * model may be used from different threads at once.  The calling thread
 * does part of the work itself: give it at least 512 KB of stack (the
 * kernels keep up to ~160 KB there; the library's own worker threads get
 * 1 MiB where the C library's default is less, e.g. musl's 128 KB).
 * ------------------------------------------------------------------------- */
struct sp_session;


/* "f16", "q4h", ... (as -ctk / -ctv spell them); NULL out of range. */
const char *sp_kv_type_name(enum sp_kv_type t);
/* Nominal bits per value as stored (q4_0: 4.5); 0 out of range. */
double sp_kv_type_bits(enum sp_kv_type t);
/* The type a name spells; SP_E_INVALID (message lists the names). */
sp_status sp_kv_type_from_name(const char *name, enum sp_kv_type *out);

struct sp_sampling_params {
    float temp;           /* 0 = greedy (argmax, lowest id on ties) */
    int32_t top_k;        /* <= 0: disabled */
    float top_p;          /* in (0, 1]; 1: disabled */
    float min_p;          /* in [0, 1]; 0: disabled */
    float repeat_penalty; /* 1: disabled */
    int32_t repeat_last_n;/* how many recent tokens the penalties look at */
    /* OpenAI's penalties over the same recent tokens, after the repetition
     * penalty: logit -= count * frequency_penalty + (count > 0) *
     * presence_penalty, count being how often the token occurs among them.
     * Finite; 0: disabled (the default); negative values favour repeats. */
    float presence_penalty;
    float frequency_penalty;
};

struct sp_session_params {
    int32_t n_ctx;        /* tokens the session holds; 0 = the model's trained
                             context (n_ctx_train).  More than that is
                             accepted with a warning (the model was not
                             trained for it). */
    int32_t n_threads;    /* 0 = one */
    int32_t n_batch;      /* tokens per forward pass when feeding a prompt;
                             0 = 128 (capped at n_ctx).  Memory grows with it. */
    uint64_t seed;        /* sampler seed; the same seed gives the same output */
    enum sp_kv_type kv_type_k; /* key cache type; default F16 (as llama.cpp) */
    enum sp_kv_type kv_type_v; /* value cache type; default F16 */
    struct sp_sampling_params sampling;
    bool logits_all;      /* keep the logits of every token of the last
                             sp_decode call (sp_get_logits_ith), not only the
                             last one's: n_batch x n_vocab floats, and each
                             sp_decode call then takes at most n_batch tokens.
                             For perplexity and KL divergence.  Default false. */
    bool ctx_shift;       /* when tokens would not fit, drop the oldest ones
                             after the first n_keep (and move the rest back)
                             instead of returning SP_E_CONTEXT_FULL, so a
                             conversation never runs out of context
                             (StreamingLLM's sinks + window).  Default false. */
    int32_t n_keep;       /* tokens at the start a shift never drops (the
                             attention sinks, e.g. 4); default 0 */
    int32_t n_discard;    /* tokens one shift drops; 0 = half of those after
                             n_keep (llama.cpp's choice); 1 = a sliding window */
};
struct sp_session_params sp_session_default_params(void);

/* Create a session over a loaded model.  The model must outlive the session.
 * Returns SP_E_INVALID for bad params (message says which, e.g. a cache
 * type the model's head size cannot take), SP_E_NOMEM (with a memory
 * budget: the message states what the session needs and what is left),
 * SP_E_STATE for a vocab-only model. */
sp_status sp_session_init(struct sp_model *model, const struct sp_session_params *params, struct sp_session **out);
void sp_session_free(struct sp_session *s);

/* Forget all tokens (empty KV cache, empty penalty history, sampler
 * reseeded with the session's seed); keeps the memory. */
void sp_session_reset(struct sp_session *s);

/* Feed n tokens (a prompt as one batch, or one sampled token) at the current
 * position and compute the logits of the last one (of all n with logits_all).
 * Returns SP_E_CONTEXT_FULL (nothing consumed) if n_past + n would exceed
 * n_ctx and ctx_shift is off (or n > n_ctx - n_keep), SP_E_INVALID for an id
 * outside the vocabulary, n <= 0, or (with logits_all) n > n_batch,
 * SP_E_ABORTED when the abort callback stopped it (the batches before stay
 * decoded: sp_session_n_past says how far it got; no logits), SP_E_IO when a
 * streamed weight could not be read under a memory budget, after the bounded
 * retries of transient errors docs/RELIABILITY.md describes (the message
 * names the file and the offset; as for SP_E_ABORTED the batches before stay
 * decoded and no logits are left, so sp_sample says SP_E_STATE): once
 * storage reads again, feeding the tokens not consumed continues the same
 * session.  Never allocates. */
sp_status sp_decode(struct sp_session *s, const int32_t *tokens, int32_t n);

/* Logits of the last decoded token: n_vocab floats, owned by the session,
 * valid until the next sp_decode / sp_session_reset / sp_session_truncate /
 * sp_session_free.  NULL before the first decode. */
const float *sp_get_logits(const struct sp_session *s);

/* Logits of the i-th token (0-based) of the last sp_decode call; i < 0 counts
 * from the end (-1 = the last token, the same as sp_get_logits).  Without
 * logits_all only the last token has logits.  n_vocab floats, owned and valid
 * as for sp_get_logits; NULL when i is out of range or nothing was decoded. */
const float *sp_get_logits_ith(const struct sp_session *s, int32_t i);

/* Sample the next token from the current logits with the session's sampling
 * parameters, seeded RNG and history (for the repetition penalty).  Does not
 * feed it: call sp_decode with it to continue.  SP_E_STATE when there are no
 * logits (before any decode, after a truncation). */
sp_status sp_sample(struct sp_session *s, int32_t *out_token);

/* Tokens the session holds (its KV cache positions in use). */
int32_t sp_session_n_past(const struct sp_session *s);
int32_t sp_session_n_ctx(const struct sp_session *s);

/* The ids of the tokens held, oldest first (context shifts drop some):
 * sp_session_n_past of them, owned by the session, valid until the next call
 * that changes the session.  NULL for a NULL session. */
const int32_t *sp_session_tokens(const struct sp_session *s);

/* Keep the first n tokens and drop the rest (KV cells and the sampler's
 * penalty history alike), so the next sp_decode continues after token n-1.
 * The logits are gone until then.  SP_E_INVALID for n < 0 or n > n_past. */
sp_status sp_session_truncate(struct sp_session *s, int32_t n);

/* Change the sampling parameters between calls (the RNG state and history
 * stay).  SP_E_INVALID for nonsense values (message says which). */
sp_status sp_session_set_sampling(struct sp_session *s, const struct sp_sampling_params *p);

/* Reseed the sampler's RNG (the penalty history stays): what follows is
 * what a fresh session with this seed would draw from the same logits. */
void sp_session_set_seed(struct sp_session *s, uint64_t seed);

/* Called before each batch of a long sp_decode; returning true stops it with
 * SP_E_ABORTED.  NULL removes it.  It runs on the decoding thread. */
typedef bool (*sp_abort_fn)(void *user);
void sp_session_set_abort(struct sp_session *s, sp_abort_fn fn, void *user);

/* What the KV cache holds. */
struct sp_kv_info {
    enum sp_kv_type type_k, type_v;
    int32_t n_cells;          /* tokens held (= n_past) */
    int32_t n_ctx;
    uint64_t bytes_stored;    /* K and V bytes of the held tokens, as stored */
    uint64_t values_stored;   /* K and V values they stand for */
    double bits_per_value;    /* bytes_stored * 8 / values_stored (0 when empty) */
    uint64_t bytes_reserved;  /* the session's share of the model's block pool */
    uint64_t pool_bytes;      /* the whole pool of its types (all sessions) */
    int64_t n_discarded;      /* tokens context shifts have dropped */
    int32_t n_shifts;
    int32_t next_pos;         /* position the next token gets */
    bool swapped;             /* in a swap file (sp_session_swap_out): n_cells and n_ctx only */
};
sp_status sp_session_kv_info(const struct sp_session *s, struct sp_kv_info *out);

/* Bytes allocated by the session (KV cache quota + scratch + logits). */
uint64_t sp_session_memory_bytes(const struct sp_session *s);

/* Save the session -- its tokens, their KV cache rows as stored, the last
 * logits and the sampler's state (RNG and penalty history) -- to path: a
 * versioned file with a SHA-256 checksum, written to a temporary file in
 * path's folder and renamed into place (docs/FORMAT.md).  SP_E_IO (message
 * names the file), SP_E_NOMEM. */
sp_status sp_session_save(struct sp_session *s, const char *path);

/* Replace the session's content with a saved one, so that decoding goes on
 * exactly (bit for bit) as it would have in the session that was saved.
 * The file must come from the same model (a fingerprint of its tensors and
 * hyper-parameters) and cache types, and hold at most n_ctx tokens; it is
 * refused otherwise (SP_E_INVALID, the message says what differs), and when
 * it is truncated or corrupt (SP_E_FORMAT, the message names the field or
 * "checksum"); a refused file leaves the session as it was (the whole file
 * is checked before it is used).  SP_E_IO, and then the session is empty. */
sp_status sp_session_load(struct sp_session *s, const char *path);

/* Swap an idle session out: its tokens and KV rows go to a file in folder
 * dir (a saved session, "sparrow-swap.<pid>.<n>.session"), and its KV memory
 * comes back -- its blocks to the model's pool, their pages to the OS, its
 * share of the memory account -- so that another session can use it.  The
 * logits, the sampler and the scratch stay.  Any later call that needs the
 * cache (sp_decode, sp_sample, truncate, save, load, reset, set_sampling,
 * set_seed) swaps it in first, or sp_session_swap_in does it now: it goes on
 * bit for bit as if it had never left, and the file is removed.  While out,
 * sp_session_tokens is NULL and sp_session_n_past the tokens it held.
 * Swapping in can fail with SP_E_NOMEM when the account has no room (it
 * stays out; the message has the numbers), or SP_E_IO / SP_E_FORMAT when the
 * file cannot be read back (the session is then empty).  A session with
 * logits_all cannot swap (SP_E_STATE).  The file goes when the session is
 * freed. */
sp_status sp_session_swap_out(struct sp_session *s, const char *dir);
sp_status sp_session_swap_in(struct sp_session *s);
bool sp_session_swapped(const struct sp_session *s);

/* ---------------------------------------------------------------------------
 * Batches: several sessions of one model decoded together.  One step feeds
 * each session its own tokens (one sampled token, or a chunk of a prompt)
 * and runs them all through the model in one forward pass, so every weight
 * is read once per step for all of them: decoding is bound by memory
 * bandwidth, and N conversations then cost little more than one.  Each
 * session's tokens attend only to its own KV cells.  What a step leaves in a
 * session is what sp_decode of the same tokens leaves (logits of its last
 * token, penalty history, position), to float rounding: the matrix products
 * run over more rows at once (docs/SERVER.md says when that is bit for bit).
 *
 * Threads: a batch runs on its own pool of n_threads; calls on one batch,
 * and on the sessions it is decoding, must not overlap.
 * ------------------------------------------------------------------------- */
struct sp_batch;

/* A batch for up to n_seq_max sessions per step and n_tokens tokens per step
 * in all (0 = max(128, n_seq_max); at least n_seq_max), its scratch (the
 * forward pass's for n_tokens rows, the logits of n_seq_max rows) taken from
 * the model's memory account.  SP_E_INVALID (bad counts), SP_E_STATE (a
 * vocab-only model), SP_E_NOMEM (the message says what is left). */
sp_status sp_batch_init(struct sp_model *model, int32_t n_seq_max, int32_t n_tokens, int32_t n_threads,
                        struct sp_batch **out);
void sp_batch_free(struct sp_batch *b);
/* Tokens one step takes in all. */
int32_t sp_batch_n_tokens(const struct sp_batch *b);

/* One step: session sessions[i] is fed tokens[i][0 .. n_tokens[i]) for each
 * i < n_seq (distinct sessions of the batch's model; sum of n_tokens <=
 * sp_batch_n_tokens).  Afterwards sp_get_logits(sessions[i]) is the logits
 * of its last token and sp_sample works as after sp_decode.  Returns
 * SP_E_INVALID (bad arguments, an id outside the vocabulary; nothing
 * decoded), SP_E_CONTEXT_FULL (a session cannot take its tokens and has
 * ctx_shift off: nothing decoded for any of them, though sessions before it
 * with ctx_shift on may have shifted), SP_E_IO (a streamed weight could not
 * be read: no session keeps the step's tokens; none has logits).  The abort
 * callbacks are not called: a step is one pass.  Never allocates. */
sp_status sp_batch_decode(struct sp_batch *b, struct sp_session *const *sessions, const int32_t *const *tokens,
                          const int32_t *n_tokens, int32_t n_seq);

/* ---------------------------------------------------------------------------
 * Governor: holds a latency target through heat, low battery and a busy
 * device by turning a session's knobs between tokens (docs/GOVERNOR.md).
 * It reads its sensors (the hottest thermal zone or a file, the battery or
 * a file, memory pressure, competing CPU load; each optional) at most a few
 * times a second, and re-plans every replan_tokens tokens from them and
 * from the measured ms per token: a thermal state (normal / warm / hot /
 * critical, thresholds with hysteresis) and, apart from it, battery saver
 * each give an action from the state table (threads, duty cycle, MoE
 * experts per token, prefill chunk); with a target the pacing between
 * tokens and the thread count follow the measured latency.  No state stops
 * work without limit: the strongest action is a duty cycle, so a generation
 * always finishes.  Off unless a governor is attached.
 *
 * Threads: one governor serves one session (or batch) at a time, driven
 * from its decoding thread; sp_governor_set_signal and
 * sp_governor_get_stats may be called from any thread.
 * ------------------------------------------------------------------------- */
struct sp_governor;

enum sp_gov_state { SP_GOV_NORMAL = 0, SP_GOV_WARM, SP_GOV_HOT, SP_GOV_CRITICAL, SP_GOV_STATE_COUNT };
/* "normal", "warm", "hot", "critical"; "?" out of range. */
const char *sp_gov_state_name(enum sp_gov_state s);

/* What a state (or battery saver) does; the stronger of the thermal state's
 * and the saver's applies, knob by knob. */
struct sp_gov_action {
    double threads;  /* fraction of the session's threads, (0, 1]; at least one */
    double duty;     /* fraction of wall time spent working, [0.05, 1]: after a
                        token of work w the governor sleeps w * (1/duty - 1) */
    double experts;  /* fraction of the model's experts per token, (0, 1]; at
                        least one (router weights renormalised); dense: ignored */
    int32_t chunk;   /* prefill tokens per forward pass at most; 0 = n_batch */
};

struct sp_gov_policy {
    /* entering state s (1..3) at a temperature >= enter_c[s] (degrees C) or
     * a pushed thermal headroom >= enter_headroom[s]; leaving it below
     * enter_c[s] - hysteresis_c (enter_headroom[s] - hysteresis_headroom).
     * Index 0 (normal) is unused.  Increasing in s. */
    double enter_c[SP_GOV_STATE_COUNT];
    double enter_headroom[SP_GOV_STATE_COUNT];
    double hysteresis_c, hysteresis_headroom;
    struct sp_gov_action action[SP_GOV_STATE_COUNT];
    /* battery saver: below saver_below_pct percent and not charging; lifted
     * when charging (or full) or at saver_below_pct + saver_hysteresis_pct */
    double saver_below_pct, saver_hysteresis_pct;
    struct sp_gov_action saver;
    int32_t replan_tokens; /* re-plan every this many tokens, >= 1 */
};
/* The defaults docs/GOVERNOR.md tabulates (45 / 55 / 70 C, saver below 20%). */
struct sp_gov_policy sp_gov_default_policy(void);

struct sp_governor_params {
    double target_ms;          /* per-token latency to hold (ms); 0 = none */
    double target_ttft_s;      /* time to first token to hold (s); 0 = none */
    const char *thermal_file;  /* millidegrees C in a file instead of the thermal zones */
    const char *battery_file;  /* line 1 percent, optional line 2 status as sysfs spells it */
    const char *trace_path;    /* one JSON object per decision (written to a
                                  temporary file, renamed into place by
                                  sp_governor_free); NULL = none */
    const char *policy_file;   /* state-table overrides ("key = value" lines,
                                  docs/GOVERNOR.md); NULL = the defaults */
    double sensor_interval_s;  /* the files are read at most this often; 0 = 0.25 */
    const char *sensor_root;   /* prefix of /sys and /proc (tests); NULL = "/" */
};
struct sp_governor_params sp_governor_default_params(void);

/* SP_E_INVALID (bad numbers; a policy file's bad line, with its number),
 * SP_E_IO (the policy file or the trace cannot be opened), SP_E_NOMEM. */
sp_status sp_governor_init(const struct sp_governor_params *params, struct sp_governor **out);
/* Finishes the trace file (fsync, rename).  Detach it from its session first. */
void sp_governor_free(struct sp_governor *g);

/* Replace / read the state table.  SP_E_INVALID with the field named. */
sp_status sp_governor_set_policy(struct sp_governor *g, const struct sp_gov_policy *p);
sp_status sp_governor_get_policy(const struct sp_governor *g, struct sp_gov_policy *out);
/* Apply a policy file's overrides on top of the current table. */
sp_status sp_governor_load_policy(struct sp_governor *g, const char *path);

/* Signals an app pushes instead of (or on top of) the sensors. */
enum sp_gov_signal {
    SP_GOV_SIGNAL_THERMAL_HEADROOM = 0, /* Android's AThermal_getThermalHeadroom: 0 cool,
                                           1.0 = severe throttling; < 0 clears */
    SP_GOV_SIGNAL_TARGET_WORK_MS,       /* an ADPF-style target work duration per token
                                           (ms), replacing target_ms; <= 0 clears */
    SP_GOV_SIGNAL_TEMP_C,               /* a temperature instead of the sensor; NaN clears */
    SP_GOV_SIGNAL_BATTERY_PCT,          /* a battery level instead of the sensor; < 0 clears */
    SP_GOV_SIGNAL_CHARGING,             /* 1 charging, 0 not; < 0 clears */
    SP_GOV_SIGNAL_COUNT
};
/* Takes effect at the next plan (the next replan_tokens boundary, or the
 * next prompt).  SP_E_INVALID for an unknown signal or a value out of range. */
sp_status sp_governor_set_signal(struct sp_governor *g, enum sp_gov_signal sig, double value);

struct sp_governor_stats {
    int64_t n_tokens;          /* one-token decodes governed */
    int64_t n_prefill_tokens;  /* prompt tokens governed */
    int64_t n_plans;           /* decisions (each is a trace line) */
    int64_t n_state_changes;   /* thermal state changes */
    int64_t n_saver_changes;   /* battery saver on / off */
    int64_t n_thread_changes, n_expert_changes, n_chunk_changes;
    double paced_s;            /* seconds slept between tokens and chunks */
    double state_s[SP_GOV_STATE_COUNT]; /* wall seconds governed in each state */
    double saver_s;            /* of which with battery saver on */
    double max_temp_c;         /* hottest reading (NaN: no sensor) */
    /* now */
    enum sp_gov_state state;
    bool saver;
    int32_t threads, n_expert_used, chunk;
    double pacing_ms, ms_per_token, work_ms;
};
sp_status sp_governor_get_stats(const struct sp_governor *g, struct sp_governor_stats *out);

/* Govern this session from its next call on (NULL: stop, and give it back
 * all its threads and experts).  The governor must outlive the attachment;
 * a governor serves one session or batch at a time (SP_E_STATE otherwise).
 * Pacing sleeps on the decoding thread, inside sp_decode, after a token or
 * a prompt chunk. */
sp_status sp_session_set_governor(struct sp_session *s, struct sp_governor *g);
/* The same for a batch (sparrow serve): each step counts as a token. */
sp_status sp_batch_set_governor(struct sp_batch *b, struct sp_governor *g);

/* ---------------------------------------------------------------------------
 * Cooperative slices: decode in steps of bounded work, so an app can
 * interleave inference with its UI thread.
 *
 *   sp_decode_begin(s, tokens, n);      // as sp_decode would, not yet run
 *   bool done = false;
 *   while (!done && !rc) rc = sp_decode_step(s, 10, &done);  // ~10 ms each
 *
 * A step resumes the forward pass where the last one stopped -- at a
 * layer's stage, or inside a weight product at a block of rows sized to the
 * time left -- and works until about budget_ms have gone (at least one unit
 * of work), then returns; the pool's threads sleep between steps instead of
 * spinning.  A prompt goes in passes of n_batch tokens (fewer for MoE
 * models, whose expert blocks run whole; streamed weights and attention run
 * whole too).  The result -- KV cache, logits, sampler history -- is what
 * sp_decode of the same tokens leaves, bit for bit for dense models (MoE:
 * when the passes match sp_decode's batches).  The tokens must stay valid
 * until done.  Between begin and done the only calls allowed on the session
 * are sp_decode_step and sp_decode_cancel (SP_E_STATE otherwise; reset
 * cancels); the abort callback is asked before each pass.  The governor's
 * knobs apply; its pacing does not (the caller owns the time between
 * steps).  docs/GOVERNOR.md.
 * ------------------------------------------------------------------------- */
/* SP_E_INVALID / SP_E_CONTEXT_FULL as sp_decode (nothing is done then),
 * SP_E_STATE when a step decode is already under way. */
sp_status sp_decode_begin(struct sp_session *s, const int32_t *tokens, int32_t n);
/* budget_ms <= 0: 10 ms.  *done true once every token is decoded (and the
 * logits are there).  On an error the step decode is over: what sp_decode
 * leaves on that error (the passes before stay decoded). */
sp_status sp_decode_step(struct sp_session *s, double budget_ms, bool *done);
/* Abandon a step decode: the passes finished stay decoded, a pass under way
 * is undone (its cells dropped); no logits.  No-op when none is under way. */
void sp_decode_cancel(struct sp_session *s);

/* ---------------------------------------------------------------------------
 * Memory budget: the placement plan and the pager's counters.
 * ------------------------------------------------------------------------- */

/* Weight classes of a plan. */
enum sp_weight_class {
    SP_WCLASS_SMALL = 0, /* norms, biases, routers: always resident */
    SP_WCLASS_DENSE,     /* read in full every token: attention, FFN, output head */
    SP_WCLASS_EXPERT,    /* routed experts: a few slices per token, LRU cache */
    SP_WCLASS_EMBED,     /* input embedding (untied): one row per token, read on demand */
    SP_WCLASS_COUNT
};

struct sp_plan_info {
    uint64_t budget;              /* the model's mem_budget */
    bool resident;                /* everything fits: loaded once, nothing streams */
    uint64_t base_bytes;          /* the process before weights (code, heap, tokenizer) */
    uint64_t session_bytes;       /* KV cache + scratch of the session planned for */
    uint64_t pinned_bytes;        /* weights kept resident */
    uint64_t ring_bytes;          /* dense streaming buffers (read ahead in forward order) */
    uint64_t expert_cache_bytes;  /* expert cache */
    uint64_t row_bytes;           /* embedding row buffers */
    uint64_t overhead_bytes;      /* bookkeeping and safety margin */
    uint64_t total_bytes;         /* the sum: <= budget */
    uint64_t min_budget;          /* smallest budget that runs this model and session */
    uint32_t ring_slots, expert_slots;
    uint64_t expert_units;        /* expert slices in the model (units) */
    uint64_t class_bytes[SP_WCLASS_COUNT], class_pinned[SP_WCLASS_COUNT];
    double read_bps, mem_bps;     /* measured storage and memory read speed (bytes/s; 0 = not measured) */
    double touched_bytes_per_token, read_bytes_per_token;
    double expert_hit_rate;       /* expected, under uniform routing */
    double predicted_tps;         /* predicted decode tokens/s */
};

/* The plan for a model loaded with a mem_budget and a session with params
 * (NULL = defaults), without applying it.  Measures storage and memory speed
 * (~0.2 s) when something must stream.  SP_E_STATE without a budget;
 * SP_E_NOMEM (message states the minimum) when the budget cannot run it. */
sp_status sp_model_plan(struct sp_model *model, const struct sp_session_params *params, struct sp_plan_info *out);

struct sp_mem_stats {
    bool budgeted;                /* a plan is applied and something streams */
    uint64_t resident_weight_bytes; /* pinned weights + pools, or the resident copy/mapping */
    uint64_t bytes_read;          /* bytes the pager read from storage since the plan was applied */
    uint64_t pins, hits, misses, waits; /* streamed-unit pins: found resident / read on demand / found loading */
    uint64_t expert_pins, expert_hits;  /* expert slices needed (once per use), and of those found resident or
                                           already being read when first needed (the expert hit rate) */
    uint64_t prefetch_issued, prefetch_used; /* prefetched units; of those, used before eviction */
    double wait_s;                /* time spent waiting for reads */
    /* the memory account (with or without a budget) */
    uint64_t account_limit;       /* the budget, 0 = none */
    uint64_t account_used, account_peak;
    uint64_t account_weights;     /* pinned weights, pools, bookkeeping (budgeted only) */
    uint64_t account_kv;          /* KV cache quotas of the live sessions */
    uint64_t account_scratch;     /* their scratch and logits */
    uint64_t account_base;        /* the process before weights (budgeted only) */
};
sp_status sp_model_get_mem_stats(const struct sp_model *model, struct sp_mem_stats *out);

/* ---------------------------------------------------------------------------
 * Evaluation (src/eval/eval.c): perplexity of a model on a token sequence,
 * computed the way llama.cpp's llama-perplexity does, and with a reference
 * model, how far the model's next-token distributions are from the
 * reference's (KL divergence, top-1 agreement).  Used by `sparrow eval`.
 *
 * Method: the tokens (normally a text tokenized once with BOS) are cut into
 * n_chunks = n_tokens / n_ctx chunks of n_ctx tokens; the remainder is
 * dropped.  Each chunk is evaluated from an empty cache with its first token
 * replaced by BOS (when the vocabulary adds BOS).  Only the second half of a
 * chunk is scored: the logits at positions j = n_ctx/2 .. n_ctx-2 predict the
 * token at j+1, NLL = -log softmax(logits_j)[token_{j+1}], in double.
 * ppl = exp(mean NLL over all scored positions), ppl_err = ppl * the standard
 * error of the mean NLL (llama-perplexity's +/- estimate).  With a reference,
 * at the same positions: KL(ref || model) = sum_v p_ref(v) (log p_ref(v) -
 * log p_model(v)) in nats from double log-softmaxes, its mean and 99th
 * percentile (linear interpolation between order statistics), and the
 * fraction of positions where both argmaxes (lowest id on ties) agree.
 * ------------------------------------------------------------------------- */
struct sp_eval_result {
    int32_t n_tokens;     /* tokens given */
    int32_t n_ctx;        /* chunk length */
    int32_t n_chunks;     /* chunks in the text (n_tokens / n_ctx) */
    int32_t n_done;       /* chunks evaluated so far (= n_chunks at the end) */
    int64_t n_scored;     /* positions scored so far */
    double ppl, ppl_err;  /* the model's perplexity and its +/- */
    double ref_ppl, ref_ppl_err; /* the reference's; NaN without one */
    double kl_mean, kl_mean_err; /* mean KL(ref || model) in nats and its
                                    standard error; NaN without a reference */
    double kl_p99;        /* 99th percentile of KL; NaN without a reference and
                             in progress reports (computed at the end) */
    double kl_max;        /* NaN without a reference */
    double top1_agree;    /* in [0, 1]; NaN without a reference */
    double kv_bits_per_value; /* the model's KV cache: bytes stored x 8 / values
                                 stored, with the cache full (n_ctx tokens) */
};

/* Called after each chunk with the running results (kl_p99 NaN).  Return
 * true to go on, false to cancel (sp_eval then returns SP_E_STATE). */
typedef bool (*sp_eval_progress_fn)(const struct sp_eval_result *so_far, void *user);

struct sp_eval_params {
    int32_t n_ctx;        /* chunk length, >= 4; 0 = the model's context
                             length capped at 512 */
    int32_t n_batch;      /* tokens per forward pass; 0 = n_ctx capped at 512 */
    int32_t n_threads;    /* 0 = one */
    enum sp_kv_type kv_type_k, kv_type_v;         /* the model's cache (default f32) */
    enum sp_kv_type ref_kv_type_k, ref_kv_type_v; /* the reference's (default f32) */
    /* Streaming instead of chunks: all n_tokens tokens go through one
     * session of n_ctx tokens with context shift, one token per decode, so
     * each prediction sees the last tokens that fit the window (plus the
     * first n_keep, the attention sinks).  Scored: every position from
     * n_ctx/2 on (as many as chunks would give each its context), n_chunks
     * = 1.  Tests StreamingLLM-style eviction against chunked evaluation. */
    bool stream;
    int32_t n_keep;       /* stream: tokens kept at the start (sinks) */
    int32_t n_discard;    /* stream: tokens one shift drops; 0 = 1, a sliding window */
    sp_eval_progress_fn progress; /* NULL = no reports */
    void *progress_user;
};
struct sp_eval_params sp_eval_default_params(void);

/* SP_OK when ref's distributions can be compared with model's: the same
 * vocabulary -- the same number of tokens, the same BOS and every token the
 * same text -- else SP_E_INVALID naming the first difference. */
sp_status sp_eval_check_ref(const struct sp_model *model, const struct sp_model *ref);

/* Evaluate model (and ref, which may be NULL) on n_tokens tokens, writing the
 * figures to *out.  Both models must share the vocabulary
 * (sp_eval_check_ref), else SP_E_INVALID.  Fewer than 2 * n_ctx tokens is
 * SP_E_INVALID (the message states the size needed).  Sessions and scratch
 * are allocated once here.  Also SP_E_NOMEM, SP_E_STATE (cancelled), and
 * whatever loading a weight returns. */
sp_status sp_eval(struct sp_model *model, struct sp_model *ref, const int32_t *tokens, int32_t n_tokens,
                  const struct sp_eval_params *params, struct sp_eval_result *out);

/* A text for sp_eval drawn from a model itself, so that a quality figure needs
 * no dataset: n_tokens tokens in segments of seg_len (the last one may be
 * shorter), each segment BOS followed by tokens sampled at temperature 1 from
 * the full distribution (no top-k/top-p/min-p, no penalty) starting from an
 * empty cache, with one RNG seeded with seed running through all segments.
 * Segments of n_ctx line up with sp_eval's chunks.  The same model, sizes
 * and seed give the same tokens.  SP_E_UNSUPPORTED if the vocabulary has no
 * BOS, SP_E_INVALID for seg_len < 2 or n_tokens < 1. */
sp_status sp_eval_generate(struct sp_model *model, int32_t n_tokens, int32_t seg_len, uint64_t seed,
                           int32_t n_threads, int32_t *tokens);

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
    const char *policy;       /* instead of type: a quantize policy by name ("q4", "moe3",
                                 sp_quantize_policy_info) -- Sparrow's native types, each
                                 tensor quantized as sp_quantize would; norms stay F32 */
    const char *policy_file;  /* instead of type: a policy file (docs/QUANT.md) */
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

/* The same for params (shape and exactly one of type, policy, policy_file;
 * path and the rest are ignored).  SP_E_INVALID for unknown names or not
 * exactly one of the three, SP_E_IO / SP_E_FORMAT for a policy file. */
sp_status sp_synth_params_size(const struct sp_synth_params *params, uint64_t *n_params, uint64_t *tensor_bytes);

/* ---------------------------------------------------------------------------
 * Quantizer (src/quantize/): a model file in, a GGUF with Sparrow's mixed-
 * precision block types out, optionally calibrated on a text, pruned, and
 * with its KV heads folded into fewer.
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
/* Progress of the steps before the first tensor is written, which take
 * seconds on a calibration text: stage "calibrating" (done of total chunks of
 * the text run through the model) and "scaling" (done of total layers whose
 * channel scales were searched).  Called after each unit; the same return
 * rule as sp_quantize_tensor_fn. */
typedef bool (*sp_quantize_progress_fn)(const char *stage, int32_t done, int32_t total, void *user);

/* What calibration does beyond weighting each channel's error by its mean
 * squared activation (always on with a calibration text). */
enum sp_calib_method {
    SP_CALIB_SCALE = 1u << 0, /* activation-aware channel scaling, folded into the
                                 producing operation (the model's function is kept) */
    SP_CALIB_GPTQ = 1u << 1,  /* rounding with error feedback over the input
                                 covariance (small models: the covariances must fit
                                 256 MiB) */
};

/* How a writer stores the matrices whose type has a resident layout -- the
 * regrouped bytes the x86 kernels read (Q4_0_g8, Q4_K_g8, the native g4
 * layouts; docs/FORMAT.md, "Resident layouts").  A file with them is used in
 * place by a resident load: mapped, not copied or repacked. */
enum sp_layout {
    SP_LAYOUT_NONE = 0,  /* the file types (a stored layout is un-repacked) */
    SP_LAYOUT_AUTO,      /* the layouts this CPU's kernels read (none where they read
                            the file types: AArch64, or AMX taking the type's prefill) */
    SP_LAYOUT_RESIDENT,  /* every layout a matrix has, whatever this CPU reads (a file
                            for another machine; where its kernels lack one, a load
                            un-repacks it) */
    SP_LAYOUT_COUNT
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
    int32_t merge_kv_heads;   /* fold the KV heads (after pruning) into this many
                                 by mean-pooling the K and V projections of
                                 contiguous groups of heads; it must divide
                                 their count; 0 = off */
    int32_t n_threads;        /* 0 = one */
    enum sp_layout layout;    /* NONE (default); AUTO / RESIDENT: matrices stored in
                                 resident layouts, as sp_convert does */
    sp_quantize_tensor_fn on_tensor; /* NULL = no reports */
    sp_quantize_progress_fn on_progress; /* NULL = none */
    void *user;               /* passed to on_tensor and on_progress */
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
    int32_t n_ff, n_heads, n_kv_heads; /* of the output, after pruning and folding */
    double seconds;           /* wall time of the whole call */
};

/* Quantize params->input into params->output.  The output goes to a
 * temporary file renamed into place when complete: on any failure or a
 * cancel nothing is left and an existing file at output is untouched.
 * out (may be NULL) receives the summary.  Returns SP_OK, SP_E_INVALID (bad
 * parameters, unknown policy, pruning the format cannot express, a
 * merge_kv_heads that does not divide the KV heads, an output that is one
 * of the files read -- by inode -- refused before any work),
 * SP_E_FORMAT (a malformed policy file: the message names the line),
 * SP_E_UNSUPPORTED (an input tensor type the quantizer does not read),
 * SP_E_IO, SP_E_NOMEM, SP_E_STATE (cancelled by on_tensor). */
sp_status sp_quantize(const struct sp_quantize_params *params, struct sp_quantize_result *out);

/* The named policies, for listing.  Strings are static; SP_E_INVALID out of
 * range. */
int32_t sp_quantize_n_policies(void);
sp_status sp_quantize_policy_info(int32_t i, const char **name, const char **about);

/* ---------------------------------------------------------------------------
 * Conversion (src/quantize/convert.c): any model file Sparrow reads in, a
 * GGUF out with the same tensors (types, values, metadata) whose matrices
 * are stored in the layouts the kernels read and whose tensors start on 4 KiB
 * pages, so that a resident load maps the file and uses it where it lies
 * (SP_WEIGHTS_AUTO): no copy, no repack, its pages shared by every process
 * that maps it.  SP_LAYOUT_NONE writes the file types back.
 * ------------------------------------------------------------------------- */

struct sp_convert_params {
    const char *input;        /* GGUF (native or not), model package or llama2.c .bin */
    const char *tokenizer_path; /* llama2.c input: its tokenizer.bin (NULL = beside it) */
    const char *output;       /* created or replaced only when complete */
    enum sp_layout layout;    /* default SP_LAYOUT_AUTO */
    sp_progress_fn progress;  /* bytes of tensor data written of the total; NULL = none */
    void *progress_user;
};
struct sp_convert_params sp_convert_default_params(void);

struct sp_convert_result {
    int32_t n_tensors;
    int32_t n_layout;         /* tensors stored in a resident layout */
    uint64_t layout_bytes;    /* their bytes */
    uint64_t tensor_bytes;    /* all tensor data */
    uint64_t file_size;
    double seconds;
};

/* Convert params->input into params->output: metadata copied (the layout
 * keys set anew: general.alignment 4096, sparrow.requires, sparrow.layout =
 * "resident" unless NONE), every tensor in order with its values, matrices
 * stored as sp_layout says -- never the input embedding, which is read by
 * rows.  Written to a temporary file beside output, fsynced and renamed:
 * on failure or cancel nothing is left and an existing output is untouched.
 * out may be NULL.  SP_E_INVALID (bad parameters, output is the input),
 * SP_E_FORMAT / SP_E_UNSUPPORTED (an input Sparrow does not read), SP_E_IO,
 * SP_E_NOMEM, SP_E_STATE (cancelled by progress). */
sp_status sp_convert(const struct sp_convert_params *params, struct sp_convert_result *out);

/* "none", "auto", "resident"; NULL out of range. */
const char *sp_layout_name(enum sp_layout l);

/* ---------------------------------------------------------------------------
 * Model packages (src/package/; the layouts in src/format/pack.h, the design
 * in docs/PACKAGES.md).  A package (.spk) is a GGUF file -- standard or
 * Sparrow-native -- as zstd-compressed shards cut at tensor boundaries plus
 * a manifest holding the GGUF's header (metadata, tensor directory) and the
 * SHA-256 of every shard, compressed and raw.  Installing gives back the
 * packed file byte for byte.  A patch (.spkd) turns one model into another:
 * unchanged shards are referenced, changed ones travel whole or as a zstd
 * delta against the old shard.  sp_model_load reads packages directly.
 *
 * Every writer here writes "<out>.sparrow-tmp.<pid>" in the output's folder
 * (one a killed writer left is removed by the next writer of out), fsyncs
 * it, renames it over out and fsyncs the folder: out is at every instant
 * the old file or the new one, whole.  On failure the temporary file is
 * removed.  Every shard's hash is checked before its bytes are used.
 *
 * A model's content id is the SHA-256 of its manifest's content section
 * (the GGUF header, shard offsets, sizes and raw hashes): it depends only on
 * the model's bytes and the shard size, so a GGUF and its package share it,
 * and patches name the models they join by it.
 * ------------------------------------------------------------------------- */

struct sp_package_params {
    int32_t level;            /* zstd level 1..19; 0 = 3 */
    uint64_t shard_size;      /* bytes a shard holds at most (a row or an expert
                                 larger than it stays whole); 0 = 16 MiB.  For
                                 sp_package_diff of two GGUF files; a package
                                 keeps its own */
    int32_t n_threads;        /* 0 = one; the output does not depend on it */
    sp_progress_fn progress;  /* bytes of the model done of total; NULL = none;
                                 returning false cancels (SP_E_STATE) */
    void *progress_user;
};
struct sp_package_params sp_package_default_params(void);

struct sp_package_stats {
    uint64_t model_bytes;     /* the model file's size */
    uint64_t package_bytes;   /* the package's (pack, install, apply to a package) */
    uint64_t patch_bytes;     /* diff: the patch written; apply: the patch read */
    uint32_t n_shards;
    uint32_t n_ref, n_whole, n_delta; /* diff/apply: new shards by how they travel */
    uint64_t changed_comp_bytes; /* diff: the changed shards compressed whole */
    char content_id[65];      /* hex; apply: the new model's */
    double seconds;
};

/* Pack the GGUF at in into the package out.  The same file and parameters
 * give the same bytes (whatever n_threads).  st may be NULL.  Returns SP_OK,
 * SP_E_INVALID (in is not a GGUF file, bad parameters), SP_E_FORMAT,
 * SP_E_IO (message names the file), SP_E_NOMEM, SP_E_STATE (cancelled). */
sp_status sp_package_pack(const char *in, const char *out, const struct sp_package_params *params,
                          struct sp_package_stats *st);

/* Install the package pkg as the GGUF file out (the bytes that were packed).
 * SP_E_FORMAT names the damaged shard or field; otherwise as sp_package_pack. */
sp_status sp_package_install(const char *pkg, const char *out, const struct sp_package_params *params,
                             struct sp_package_stats *st);

/* Write the patch that turns old into new (each a GGUF file or a package;
 * shards are matched by content, so a metadata edit that moves every data
 * offset costs a new manifest only).  For each changed shard the patch
 * carries the smaller of the shard compressed whole and a zstd delta
 * against the old shard holding the same tensor bytes.  As sp_package_pack. */
sp_status sp_package_diff(const char *old_path, const char *new_path, const char *out,
                          const struct sp_package_params *params, struct sp_package_stats *st);

/* Apply patch to model (a GGUF file or a package), writing the new model --
 * of model's kind -- to out, or over model when out is NULL (an update).
 * The patch's old content id must be model's (SP_E_INVALID "for another
 * model"), every new shard's hash is checked before the file is renamed
 * into place; an interrupted update leaves model as it was and can be run
 * again.  level (for deltas re-compressed into a package) is the package's.
 * SP_E_FORMAT names the damaged shard or field; otherwise as sp_package_pack. */
sp_status sp_package_apply(const char *model, const char *patch, const char *out,
                           const struct sp_package_params *params, struct sp_package_stats *st);

/* What a package or patch holds, for display.  Strings are copied into the
 * struct. */
struct sp_package_info {
    bool patch;               /* a .spkd patch, else a .spk package */
    uint64_t file_bytes;      /* this file's size */
    uint64_t model_bytes;     /* package: the GGUF it holds; patch: the new model's */
    uint64_t header_bytes, shard_size;
    uint32_t n_shards, n_tensors;
    int32_t level;            /* package: its zstd level */
    uint32_t n_ref, n_whole, n_delta; /* patch: records by kind */
    char content_id[65];      /* package: its model's; patch: the new model's */
    char old_content_id[65];  /* patch: the model it applies to */
};
/* SP_E_FORMAT naming the field when path is damaged or neither kind. */
sp_status sp_package_info(const char *path, struct sp_package_info *out);

/* Edit a GGUF file's metadata in place, atomically like every writer: each
 * of the n assignments "KEY=VALUE" adds or replaces a string key (the value
 * is everything after the first '='), "KEY:TYPE=VALUE" a typed one (TYPE:
 * str, bool, u8, i8, u16, i16, u32, i32, u64, i64, f32, f64).  Tensor data
 * is copied unchanged.  SP_E_INVALID names the malformed assignment;
 * SP_E_FORMAT, SP_E_IO, SP_E_NOMEM. */
sp_status sp_model_edit(const char *path, const char *const *assignments, int32_t n);

#ifdef __cplusplus
}
#endif
#endif /* SPARROW_H */
