/*
 * pack.h -- model packages (.spk) and their patches (.spkd): the byte layouts,
 * their parsers and serializers, and the rule that cuts a model file into
 * shards.  Untrusted bytes -> plain structs; every count, size and offset is
 * checked.  Packing, installing and diffing are package/'s; docs/PACKAGES.md
 * explains the design.  All integers are little-endian.
 *
 * Package (.spk):
 *   [0, 64)        header: magic "\x89SPK\r\n\x1a\n" | u32 version (1) | u32 flags (0)
 *                  | u64 manifest offset | u64 manifest bytes (compressed)
 *                  | SHA-256 of the compressed manifest
 *   [64, M)        the shards' zstd frames, one after the other in shard order
 *   [M, end)       the manifest, one zstd frame; the file ends with it
 *
 * Manifest = content section, then package section.
 *   content:  "SPKC" | u32 version (1) | u64 file size | u64 header bytes H
 *             | u64 shard size (the cutting parameter) | u32 n_shards | u32 n_ranges
 *             | SHA-256 of the header | the model file's first H bytes (GGUF header,
 *             metadata, tensor directory, padding) | n_shards x { u64 offset, u64 size,
 *             u32 first range, u32 n ranges, SHA-256 of the raw bytes } (56 bytes)
 *             | n_ranges x { u32 tensor, u32 0, u64 offset in the tensor, u64 length } (24)
 *   package:  "SPKZ" | u32 version (1) | i32 zstd level | u32 zstd version | u32 n_shards
 *             | u32 0 | n_shards x { u64 compressed size, SHA-256 of the frame } (40)
 * Shards cover [H, file size) without gaps, in order.  The SHA-256 of the
 * content section is the model's content id: what a patch names.  It depends
 * on the model's bytes and the shard size only, so a plain GGUF has one too.
 *
 * Patch (.spkd):
 *   [0, 192)       header: magic "\x89SPD\r\n\x1a\n" | u32 version (1) | u32 flags (0)
 *                  | old content id | new content id | SHA-256 of the old header bytes
 *                  | SHA-256 of [192, payloads) | u64 old shard size | u32 old n_shards
 *                  | u32 n_records | u64 content bytes | u64 content frame bytes
 *                  | u64 payload bytes | u64 0
 *   content frame  the new content section, zstd with the old model's header
 *                  bytes as prefix (refPrefix): a metadata edit costs a few bytes
 *   records        n_records (= new n_shards) x { u32 kind, u32 old shard, u64 payload bytes }
 *   payloads       in record order: REF none (the old shard's bytes are the new
 *                  one's), WHOLE a zstd frame of the new shard, DELTA a zstd frame
 *                  with the old shard's raw bytes as prefix
 */
#ifndef SP_PACK_H
#define SP_PACK_H

#include "core/file.h"
#include "core/hash.h"
#include "model_file.h"

#define SP_PACK_MAGIC "\x89SPK\r\n\x1a\n"
#define SP_PATCH_MAGIC "\x89SPD\r\n\x1a\n"
#define SP_PACK_VERSION 1u
#define SP_PACK_HEADER_BYTES 64
#define SP_PATCH_HEADER_BYTES 192
#define SP_PACK_MAX_SHARD ((uint64_t)1 << 30)     /* raw bytes of one shard */
#define SP_PACK_MAX_MANIFEST ((uint64_t)1 << 30)  /* decompressed manifest bytes */
#define SP_PACK_DEFAULT_SHARD ((uint64_t)16 << 20)
#define SP_PACK_MIN_SHARD ((uint64_t)64 << 10)

/* A tensor's bytes inside a shard: [offset, offset + length) of tensor
 * `tensor` (directory index in file order). */
struct sp_pack_range {
    uint32_t tensor;
    uint64_t offset, length;
};

struct sp_pack_shard {
    uint64_t raw_offset, raw_size;   /* absolute in the model file */
    uint32_t first_range, n_ranges;  /* ranges [first_range, first_range + n_ranges) */
    uint8_t raw_sha[SP_SHA256_BYTES];
    uint64_t comp_offset, comp_size; /* its frame in the package (comp_offset derived) */
    uint8_t comp_sha[SP_SHA256_BYTES];
};

struct sp_pack_manifest {
    uint64_t file_size;     /* the model file's bytes */
    uint64_t header_size;   /* H: the model file's first bytes, held here */
    uint64_t shard_size;    /* the cutting parameter */
    uint8_t header_sha[SP_SHA256_BYTES];
    uint8_t *header;        /* (header_size) owned */
    uint32_t n_shards, n_ranges;
    struct sp_pack_shard *shards; /* (n_shards) owned */
    struct sp_pack_range *ranges; /* (n_ranges) owned */
    bool has_package;       /* the package section was read or set (comp fields valid) */
    int32_t level;          /* zstd level the frames were made with */
    uint32_t zstd_version;  /* ZSTD_versionNumber() of the packer */
    uint8_t content_id[SP_SHA256_BYTES]; /* SHA-256 of the content section */
};

void sp_pack_manifest_clear(struct sp_pack_manifest *m);

/* Cut a model file's directory into shards (fills file_size, header_size =
 * mf->data_offset, shard_size, shards' raw offsets/sizes and the ranges;
 * not the hashes or the header bytes).  The rule, deterministic in the
 * tensor directory and shard_size only: tensors in offset order; a tensor
 * larger than shard_size is split into pieces of whole rows (3-D tensors:
 * whole experts) of at most shard_size where one row/expert allows; a piece
 * of a split tensor is a shard by itself; otherwise consecutive tensors of
 * the same layer ("blk.N.") share a shard while it stays within shard_size.
 * A shard runs from its first tensor's start to the next shard's (padding
 * included); the first starts at H, the last ends at the file's end.
 * SP_E_INVALID (shard_size out of range, not GGUF), SP_E_NOMEM. */
sp_status sp_pack_cut(const struct sp_model_file *mf, uint64_t shard_size, struct sp_pack_manifest *m);

/* The content section, or the whole manifest (content + package), as bytes
 * (sp_malloc'd, the caller frees).  SP_E_NOMEM, SP_E_INVALID (no package
 * section for the whole manifest). */
sp_status sp_pack_content_bytes(const struct sp_pack_manifest *m, uint8_t **out, size_t *n);
sp_status sp_pack_manifest_bytes(const struct sp_pack_manifest *m, uint8_t **out, size_t *n);

/* Set m->content_id from its content section. */
sp_status sp_pack_content_id(struct sp_pack_manifest *m);

/* Parse a content section (with_package false) or a whole manifest from n
 * bytes; where names the source in messages ("pkg.spk: manifest").  Checks
 * every field: magic, version, sizes, that shards tile [H, file size) in
 * order within SP_PACK_MAX_SHARD, that ranges tile their shards' tensor
 * bytes in order, the header's SHA-256; sets content_id.  Does not check the
 * ranges against the header's directory (sp_pack_check_layout).  On failure
 * m is cleared.  SP_E_FORMAT naming the field or shard, SP_E_NOMEM. */
sp_status sp_pack_manifest_parse(const uint8_t *b, size_t n, bool with_package, const char *where,
                                 struct sp_pack_manifest *m);

/* The container directory of the model file a manifest describes, parsed
 * from its header bytes (no hyper-parameters or vocabulary), and the check
 * that its data section starts at H and that cutting it with the manifest's
 * shard size gives exactly the manifest's shards and ranges.  *out is owned
 * by the caller (sp_model_file_free).  SP_E_FORMAT naming the shard. */
sp_status sp_pack_check_layout(const struct sp_pack_manifest *m, const char *where, struct sp_model_file **out);

/* ---- packages ------------------------------------------------------------ */

struct sp_pack_file_header {
    uint32_t version, flags;
    uint64_t manifest_offset, manifest_size;
    uint8_t manifest_sha[SP_SHA256_BYTES];
};
void sp_pack_header_write(const struct sp_pack_file_header *h, uint8_t out[SP_PACK_HEADER_BYTES]);

/* True when the first bytes of a file are a package's or a patch's magic. */
bool sp_pack_is_package(const uint8_t *b, size_t n);
bool sp_pack_is_patch(const uint8_t *b, size_t n);

/* Read and check a package's header and manifest from f: the manifest
 * frame's SHA-256, its decompression (bounded by SP_PACK_MAX_MANIFEST), the
 * manifest, that the frames tile [64, manifest offset) in order (sets
 * comp_offset) and the layout (sp_pack_check_layout; *dir receives the
 * directory, may be NULL).  SP_E_FORMAT naming the field, SP_E_IO, SP_E_NOMEM. */
sp_status sp_pack_read_manifest(struct sp_file *f, struct sp_pack_manifest *m, struct sp_model_file **dir);

/* The container directory of a GGUF file (header, metadata, tensors; no
 * hyper-parameters or vocabulary): what packing needs of any GGUF, standard
 * or Sparrow-native.  *out owned by the caller.  SP_E_INVALID when f is not
 * GGUF (a llama2.c checkpoint, a package), else sp_gguf_read's errors. */
sp_status sp_pack_gguf_dir(struct sp_file *f, struct sp_model_file **out);

/* A shard's name for messages: "shard 12 (blk.3.attn_q.weight bytes
 * 0..8388608 and 2 more tensors)".  dir may be NULL. */
void sp_pack_shard_name(const struct sp_pack_manifest *m, const struct sp_model_file *dir, uint32_t i, char *buf,
                        size_t cap);

/* ---- zstd frames -------------------------------------------------------- */

/* Decompress one frame of comp_n bytes into exactly raw_n bytes at dst,
 * with prefix (may be NULL) as zstd's referenced prefix.  dctx: a
 * ZSTD_DCtx* (void* so this header needs no zstd.h).  what names the frame
 * in messages.  SP_E_FORMAT when the frame is corrupt or not raw_n bytes. */
sp_status sp_pack_decompress(void *dctx, const void *comp, size_t comp_n, void *dst, size_t raw_n, const void *prefix,
                             size_t prefix_n, const char *what);

/* ---- patches -------------------------------------------------------------- */

enum sp_patch_kind { SP_PATCH_REF = 0, SP_PATCH_WHOLE = 1, SP_PATCH_DELTA = 2, SP_PATCH_KIND_COUNT };
#define SP_PATCH_NO_SHARD UINT32_MAX

struct sp_patch_record {
    uint32_t kind;       /* enum sp_patch_kind */
    uint32_t old_shard;  /* REF, DELTA: the old shard; WHOLE: SP_PATCH_NO_SHARD */
    uint64_t size;       /* payload bytes (0 for REF) */
    uint64_t offset;     /* payload offset in the patch file (derived) */
};

struct sp_patch_header {
    uint8_t old_id[SP_SHA256_BYTES], new_id[SP_SHA256_BYTES];
    uint8_t old_header_sha[SP_SHA256_BYTES];
    uint8_t table_sha[SP_SHA256_BYTES]; /* of [192, payload_offset) */
    uint64_t old_shard_size;
    uint32_t old_n_shards, n_records;
    uint64_t content_size, content_zsize, payload_total;
    /* derived */
    uint64_t content_offset, table_offset, payload_offset;
};

void sp_patch_header_write(const struct sp_patch_header *h, uint8_t out[SP_PATCH_HEADER_BYTES]);

/* Parse the fixed header against the patch file's size (the sections must
 * end exactly at file_size).  SP_E_FORMAT naming the field. */
sp_status sp_patch_header_parse(const uint8_t *b, size_t n, uint64_t file_size, const char *where,
                                struct sp_patch_header *h);

/* Parse the record table (h->n_records x 16 bytes) into recs (n_records),
 * checking kinds, old shard indices against h->old_n_shards and that the
 * payload sizes add up to h->payload_total; sets offsets.  SP_E_FORMAT
 * naming the record. */
sp_status sp_patch_table_parse(const uint8_t *b, size_t n, const struct sp_patch_header *h, const char *where,
                               struct sp_patch_record *recs);

/* Serialize a record table (n x 16 bytes into out). */
void sp_patch_table_write(const struct sp_patch_record *recs, uint32_t n, uint8_t *out);

/* Read a whole patch's metadata from f: header, the SHA-256 of the content
 * frame and table, the table, and the new content section decompressed
 * with old_header (the old model's first bytes) as prefix and parsed; its
 * content id must be the header's new id and its shard count n_records.
 * recs is sp_malloc'd (n_records).  SP_E_FORMAT naming the field. */
sp_status sp_patch_read(struct sp_file *f, const uint8_t *old_header, size_t old_header_n, struct sp_patch_header *h,
                        struct sp_patch_record **recs, struct sp_pack_manifest *content);

#endif /* SP_PACK_H */
