/*
 * server.h -- `sparrow serve`, the OpenAI-compatible HTTP server: a thin
 * client of include/sparrow.h (docs/SERVER.md).
 *
 *   HTTP threads (http.c, libmicrohttpd, one thread per connection)
 *     parse and check a request, render and tokenize its prompt, queue it,
 *     then wait for its text (or stream it as server-sent events);
 *   the scheduler thread (sched.c)
 *     owns every slot (a session) and the batch: each step it gives free
 *     slots to queued requests, then decodes one token of every generating
 *     slot and a chunk of every prompt in one sp_batch_decode, samples, and
 *     hands the new text to the requests.
 * A request is shared by the two sides under its own mutex; it is freed by
 * whichever side lets go of it last (refs).
 */
#ifndef SP_TOOLS_SERVER_H
#define SP_TOOLS_SERVER_H

#include "sparrow.h"

#include "../common/cli.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define SRV_MAX_STOPS 8

enum srv_finish { SRV_RUNNING = 0, SRV_STOP, SRV_LENGTH, SRV_ERROR, SRV_CANCELLED };

struct srv_request {
    /* set by the HTTP side before queueing, read-only after */
    int32_t *prompt;          /* (n_prompt) token ids, owned */
    int32_t n_prompt;
    int32_t max_tokens;       /* tokens to generate at most, >= 1 */
    struct sp_sampling_params sampling;
    uint64_t seed;
    char *stops[SRV_MAX_STOPS];
    int32_t n_stops;
    bool ignore_eos;          /* llama-server's field: generate max_tokens whatever comes */
    double t_queued;          /* seconds (now_s) */

    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* signalled when text arrives or it ends */
    char *text;               /* (n_text) text produced and not yet taken */
    size_t n_text, cap_text;
    enum srv_finish finish;   /* != SRV_RUNNING: no more text will come */
    char error[256];          /* with SRV_ERROR */
    bool cancelled;           /* the client went away: the scheduler drops it */
    int32_t n_gen;            /* tokens generated */
    int32_t n_cached;         /* prompt tokens the slot already held (not decoded again) */
    double t_first;           /* when the first token was sampled (0: not yet) */
    int32_t slot;             /* the slot serving it, -1 while queued */
    int refs;                 /* 2 while both sides hold it */
    struct srv_request *next; /* the queue */
};

struct srv_config {
    const char *model_path;
    const char *alias;        /* the model's name in the API */
    const char *host;
    int port;                 /* 0: any free port (printed) */
    int n_slots;
    struct sp_session_params sp; /* per slot: n_ctx, threads, cache types */
    uint64_t mem_budget;
    struct gov_opts gov;      /* --governor and its options */
    const char *chat_template;/* NULL: the model's */
    bool jinja;
    size_t max_body;          /* bytes of a request body */
    int32_t max_tokens_cap;   /* max_tokens accepted at most */
    double timeout_s;         /* a request's whole time, 0 = none */
    const char **api_keys;    /* (n_api_keys) accepted bearer tokens; none: no check */
    int n_api_keys;
    const char *slot_save_path; /* NULL: the slot actions answer 501 */
    bool metrics;             /* GET /metrics served (501 otherwise) */
};

/* A slot action (POST /slots/{id}?action=...): run by the scheduler once the
 * slot is idle, so that no step decodes the session meanwhile; the HTTP
 * thread that queued it waits on sv->op_cv until done. */
enum srv_op_kind { SRV_OP_SAVE, SRV_OP_RESTORE, SRV_OP_ERASE };

struct srv_op {
    enum srv_op_kind kind;
    int slot;
    const char *path;         /* the file (save, restore) */
    /* the outcome, set by the scheduler before done */
    bool done;
    sp_status st;
    char error[512];
    int32_t n_tokens;         /* saved, restored or erased */
    double ms;
    struct srv_op *next;
};

/* What GET /metrics reports (under sv->mu). */
struct srv_metrics {
    uint64_t prompt_tokens;   /* prompt tokens decoded (the slots' cached prefixes not counted) */
    uint64_t prompt_cached;   /* prompt tokens a slot already held */
    double prompt_s;          /* each request's time from its slot to its first token, summed */
    uint64_t predicted;       /* tokens generated */
    double predicted_s;       /* each request's time from its first token to its end, summed */
    uint64_t n_decode;        /* steps (sp_batch_decode calls) */
    uint64_t busy_slots;      /* slots active in those steps, summed */
    uint64_t finished[5];     /* requests ended, by enum srv_finish (0 unused) */
    uint64_t slot_ops;        /* slot actions done */
};

struct srv_slot {
    struct sp_session *s;
    struct srv_request *req;  /* NULL: idle */
    int32_t n_fed;            /* prompt tokens decoded so far for req */
    int32_t last;             /* the token sampled last, fed next */
    uint64_t n_requests;      /* served */
    double t_begin;           /* when req got the slot */
    int32_t n_past;           /* tokens held, as of the scheduler's last look (under sv->mu) */
    /* the text filters of the request it serves (gen/stream.h) */
    void *filters;
};

struct srv {
    struct srv_config cfg;
    struct sp_model *model;
    struct sp_model_info info;
    struct sp_batch *batch;
    struct sp_governor *gov;  /* --governor: steers the batch; NULL = off */
    struct srv_slot *slots;   /* (n_slots) */
    pthread_t thread;
    pthread_mutex_t mu;       /* the queue, stop, the slots' req pointers for /slots */
    pthread_cond_t cv;        /* work queued, or stop */
    struct srv_request *head, *tail;
    int n_queued;
    bool stop;
    bool ready;               /* /health: the model is loaded */
    uint64_t n_steps, n_tokens_decoded;
    struct srv_op *ops;       /* slot actions waiting for their slot (under mu) */
    pthread_cond_t op_cv;     /* an action done (under mu) */
    struct srv_metrics m;     /* under mu */
};

/* ---- sched.c -------------------------------------------------------------- */

/* Load the model, make the slots and the batch, start the scheduler.
 * Returns 0, or -1 with a message on stderr. */
int srv_start(struct srv *sv);
/* Stop the scheduler: requests still running or queued end with an error. */
void srv_stop(struct srv *sv);
/* Free what srv_start made (after srv_stop, once no HTTP thread runs). */
void srv_free(struct srv *sv);

/* A new request with refs = 2 (the caller's and the queue's), or NULL. */
struct srv_request *srv_request_new(void);
/* Drop one reference (either side); the last frees it. */
void srv_request_release(struct srv_request *r);
/* Queue r for a slot (the scheduler holds its second reference). */
void srv_submit(struct srv *sv, struct srv_request *r);
/* The client is gone: the scheduler frees the slot at its next step. */
void srv_cancel(struct srv_request *r);

/* Run a slot action on the scheduler thread, waiting until it is done
 * (op->done, op->st; SP_E_STATE with op->error when the server stops). */
void srv_slot_op(struct srv *sv, struct srv_op *op);

/* /slots as JSON (malloc'd). */
char *srv_slots_json(struct srv *sv);
/* /metrics in Prometheus' text format (malloc'd). */
char *srv_metrics_text(struct srv *sv);

/* ---- http.c ------------------------------------------------------------------ */

/* Serve until SIGINT / SIGTERM.  Returns an exit status. */
int srv_http_run(struct srv *sv);

#endif /* SP_TOOLS_SERVER_H */
