/*
 * api_internal.h -- entry points of api.c that are not part of the public
 * API: hooks for the tests (and tools) that link the static library and may
 * see internal types.  Nothing here is stable; embedders use sparrow.h.
 */
#ifndef SP_API_INTERNAL_H
#define SP_API_INTERNAL_H

#include "sparrow.h"

#include "model/moe.h"

/* Record the MoE routing of every sp_decode call from now on (on), or stop
 * and free the record (off).  Each sp_decode call clears the previous one's.
 * SP_E_INVALID for a dense model or a NULL session, SP_E_NOMEM. */
sp_status sp_session_trace_routing(struct sp_session *s, bool on);

/* What the router of layer il chose for position pos during the last
 * sp_decode call; false if that call did not run (il, pos) or tracing is off.
 * The pointers in *out stay valid until the next sp_decode / reset / free. */
bool sp_session_routing(const struct sp_session *s, uint32_t il, uint32_t pos, struct sp_moe_route *out);

/* sp_session_load on an open source (a file, or memory: the fuzz target),
 * optionally without the checksum check (fuzzing reaches the checks after
 * it that way).  Same contract otherwise. */
struct sp_file;
sp_status sp_session_load_from(struct sp_session *s, struct sp_file *f, bool verify);

/* The model a session decodes with (src/gen/generate.c renders its tokens). */
const struct sp_model *sp_session_model(const struct sp_session *s);

#endif /* SP_API_INTERNAL_H */
