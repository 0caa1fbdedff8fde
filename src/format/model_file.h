/*
 * model_file.h -- what format/ hands the rest of the engine: plain structs for
 * the hyper-parameters, the vocabulary and the tensor directory (names, types,
 * shapes, absolute file offsets).  No tensor data is read to build them, and
 * nothing outside format/ includes a file format's own header.
 *
 * Everything in a struct sp_model_file (strings, arrays) is owned by it and
 * freed by sp_model_file_free().
 */
#ifndef SP_MODEL_FILE_H
#define SP_MODEL_FILE_H

/* The longest trained context a file may claim: 16M positions (the longest
 * released models claim 10M).  More is a broken header -- 0xFFFFFFFF, say --
 * refused at load, naming context_length. */
#define SP_MAX_CTX_TRAIN (1u << 24)

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

enum sp_arch {
    SP_ARCH_LLAMA = 0, /* Llama 2/3, Mistral, TinyLlama, SmolLM; Mixtral when n_experts > 0 */
    SP_ARCH_QWEN2,     /* attention q/k/v biases */
    SP_ARCH_QWEN3,     /* per-head q/k RMSNorm */
    SP_ARCH_QWEN3MOE,  /* qwen3 with routed experts */
    SP_ARCH_COUNT
};

const char *sp_arch_name(enum sp_arch a); /* "llama", "qwen2", ... */

struct sp_hparams {
    enum sp_arch arch;
    uint32_t n_vocab;        /* rows of token_embd */
    uint32_t n_ctx_train;    /* context_length, 1..SP_MAX_CTX_TRAIN */
    uint32_t n_embd;         /* embedding_length */
    uint32_t n_layers;       /* block_count */
    uint32_t n_heads;        /* attention.head_count */
    uint32_t n_kv_heads;     /* attention.head_count_kv (defaults to n_heads) */
    uint32_t head_dim_k;     /* attention.key_length (defaults to n_embd / n_heads) */
    uint32_t head_dim_v;     /* attention.value_length (defaults to n_embd / n_heads, as llama.cpp) */
    uint32_t n_ff;           /* feed_forward_length */
    uint32_t n_experts;      /* expert_count, 0 = dense */
    uint32_t n_experts_used; /* expert_used_count */
    uint32_t n_ff_exp;       /* expert FFN width: expert_feed_forward_length (qwen3moe), n_ff (llama MoE) */
    bool expert_weights_norm;/* MoE: renormalize the chosen experts' softmax weights to sum 1 */
    float rope_theta;        /* rope.freq_base (default 10000) */
    float rope_freq_scale;   /* 1 / rope.scaling.factor for linear scaling (default 1) */
    uint32_t rope_dims;      /* rope.dimension_count (defaults to head_dim_k) */
    bool rope_neox;          /* true for qwen*: rotate (i, i + rope_dims/2) */
    float rms_eps;           /* attention.layer_norm_rms_epsilon */
};

enum sp_vocab_kind { SP_VOCAB_NONE = 0, SP_VOCAB_SPM, SP_VOCAB_BPE };

/* Token types, as GGUF tokenizer.ggml.token_type stores them. */
enum sp_token_type {
    SP_TOKEN_UNDEFINED = 0,
    SP_TOKEN_NORMAL = 1,
    SP_TOKEN_UNKNOWN = 2,
    SP_TOKEN_CONTROL = 3,
    SP_TOKEN_USER_DEFINED = 4,
    SP_TOKEN_UNUSED = 5,
    SP_TOKEN_BYTE = 6,
};

struct sp_vocab_data {
    enum sp_vocab_kind kind;
    char *pre;               /* tokenizer.ggml.pre, "" when absent (BPE: "default") */
    uint32_t n_tokens;
    char **tokens;           /* (n_tokens) NUL-terminated; SPM spaces are U+2581 */
    uint32_t *token_len;     /* (n_tokens) byte lengths (tokens may hold NUL? no: GGUF strings are checked) */
    float *scores;           /* (n_tokens) or NULL */
    int32_t *types;          /* (n_tokens) enum sp_token_type, or NULL (all normal) */
    uint32_t n_merges;
    char **merges;           /* (n_merges) "left right", BPE only */
    int32_t bos, eos, unk, pad, eot; /* -1 when absent */
    bool add_bos, add_eos;
    bool add_space_prefix;   /* SPM: prepend a space to the text (default true) */
};

/* One tensor of the directory.  offset is absolute in the file and has been
 * checked: offset + size <= file size, size == row_bytes(type, ne[0]) * rows. */
struct sp_tensor_desc {
    char *name;
    uint32_t type;           /* enum sp_qtype */
    uint32_t n_dims;         /* 1..4 */
    int64_t ne[4];           /* ne[0] = row length (ggml order); unused dims are 1 */
    uint64_t offset;
    uint64_t size;
};

/* A metadata key/value, kept for display (inspect) and for tools that copy
 * metadata (conversion, synth).  Values use GGUF's type ids. */
enum sp_meta_type {
    SP_META_U8 = 0, SP_META_I8 = 1, SP_META_U16 = 2, SP_META_I16 = 3, SP_META_U32 = 4, SP_META_I32 = 5,
    SP_META_F32 = 6, SP_META_BOOL = 7, SP_META_STRING = 8, SP_META_ARRAY = 9, SP_META_U64 = 10,
    SP_META_I64 = 11, SP_META_F64 = 12, SP_META_TYPE_COUNT = 13
};

struct sp_meta_value {
    enum sp_meta_type type;
    union {
        uint64_t u64;  /* U8..U64 and BOOL, zero-extended */
        int64_t i64;   /* I8..I64, sign-extended */
        double f64;    /* F32, F64 */
        struct { char *ptr; uint64_t len; } str;
        struct {
            enum sp_meta_type elem_type;
            uint64_t n;
            struct sp_meta_value *items; /* (n) nested values; NULL when n == 0 */
        } arr;
    } v;
};

struct sp_meta_kv {
    char *key;
    struct sp_meta_value value;
};

/* Free what v owns (string bytes, array items, recursively) and zero it. */
void sp_meta_value_clear(struct sp_meta_value *v);

/* Deep copy of src into *dst (strings are NUL-terminated in the copy).
 * Returns SP_OK, SP_E_INVALID (unknown type, arrays nested deeper than 8) or
 * SP_E_NOMEM; *dst is zeroed on failure. */
sp_status sp_meta_value_copy(struct sp_meta_value *dst, const struct sp_meta_value *src);

enum sp_file_kind { SP_FILE_GGUF = 0, SP_FILE_LLAMA2C = 1 };

struct sp_model_file {
    char *path;
    enum sp_file_kind kind;
    uint32_t version;        /* GGUF version; 0 for llama2.c */
    uint64_t file_size;
    uint32_t alignment;      /* general.alignment (32 default); 1 for llama2.c */
    uint64_t data_offset;    /* start of the tensor data section */
    char *name;              /* general.name or "" */

    bool has_hparams;        /* false for vocab-only files without the arch keys */
    struct sp_hparams hp;
    struct sp_vocab_data vocab;

    uint32_t n_tensors;
    struct sp_tensor_desc *tensors; /* (n_tensors) in file order */

    uint64_t n_meta;
    struct sp_meta_kv *meta; /* (n_meta); empty for llama2.c */

    char *tokenizer_path;    /* llama2.c: the tokenizer.bin that was read */

    bool in_place;           /* sparrow.layout = "resident": the tensor data was
                                written to be used where it lies (page-aligned,
                                matrices in the resident layouts of the writing
                                CPU's kernels: `sparrow convert`), so a resident
                                load maps the file instead of copying it */
    bool packed;             /* path is a model package (pack.h): the directory
                                and offsets are those of the GGUF it holds, whose
                                bytes live compressed in shards; read them through
                                package/, never from path */
};

/* Open a model file and build its directory, hyper-parameters and vocabulary.
 * Detects GGUF and model packages (the GGUF inside, packed = true) by magic, otherwise treats the file as a llama2.c checkpoint
 * (then tokenizer_path, or "tokenizer.bin" beside it, gives the vocabulary).
 * vocab_only: tensors are optional and hyper-parameters may be absent.
 * Validates every length, offset and count against the file size.
 * Errors: SP_E_IO, SP_E_FORMAT, SP_E_UNSUPPORTED (unknown tensor type or
 * architecture; message names the tensor or key), SP_E_NOMEM. */
sp_status sp_model_file_open(const char *path, const char *tokenizer_path, bool vocab_only,
                             struct sp_model_file **out);
void sp_model_file_free(struct sp_model_file *mf);

/* The same from an open byte source (core/file.h), e.g. a memory buffer for
 * tests and fuzzing.  f stays the caller's; nothing keeps it. */
struct sp_file;
sp_status sp_model_file_open_file(struct sp_file *f, const char *tokenizer_path, bool vocab_only,
                                  struct sp_model_file **out);

/* Rewrite the GGUF file at path in place with keys set[0..n_set) replacing
 * existing values (same place) or added after them; tensors and their bytes
 * are kept, and so is the data layout (a file whose tensors are not where a
 * GGUF writer puts them is SP_E_UNSUPPORTED).  Atomic: a temporary file
 * renamed over path.  SP_E_INVALID (not GGUF, a bad value), SP_E_FORMAT,
 * SP_E_IO, SP_E_NOMEM. */
struct sp_meta_kv;
sp_status sp_model_file_edit(const char *path, const struct sp_meta_kv *set, size_t n_set);

/* Tensor lookup by exact name; NULL if absent. */
const struct sp_tensor_desc *sp_model_file_find(const struct sp_model_file *mf, const char *name);

/* Metadata lookup by key; NULL if absent. */
const struct sp_meta_value *sp_model_file_meta(const struct sp_model_file *mf, const char *key);

/* Keys that describe how a file's tensor data is laid out (general.alignment,
 * sparrow.requires, sparrow.layout): a writer of another file sets them
 * itself and never copies them from its input. */
bool sp_model_file_layout_key(const char *key);

#endif /* SP_MODEL_FILE_H */
