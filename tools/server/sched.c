/*
 * sched.c -- the server's scheduler: one thread that owns the slots (one
 * session each) and the batch, and steps every active slot through one
 * batched forward pass at a time (continuous batching: a request joins or
 * leaves between steps).  HTTP threads only queue requests and read what
 * comes back (server.h).
 *
 * A step: give idle slots to queued requests (the slot whose held tokens
 * share the longest prefix with the prompt, so a conversation's next turn
 * decodes only its new tokens); drop slots whose client went away; then one
 * sp_batch_decode with one token of every generating slot and, in what room
 * the batch has left, a chunk of every prompt still being read -- a long
 * prompt goes in chunks between steps instead of stalling the others --
 * and for every slot whose prompt is complete, sample, filter (UTF-8,
 * stop strings: gen/stream.h) and hand the text over.
 *
 * Invariants:
 *  1. slot->req != NULL exactly while a request runs there; the scheduler
 *     holds a reference to it until then.
 *  2. n_fed <= n_prompt; the slot generates once n_fed == n_prompt, and
 *     slot->last is then the token to feed next (sampled, not yet decoded).
 *  3. A request's finish is set once, by the scheduler, under its mutex;
 *     after that no text is appended.
 */
#include "server.h"

#include "../common/cli.h"
#include "gen/stream.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIN_I32(a, b) ((a) < (b) ? (a) : (b))
#define MAX_I32(a, b) ((a) > (b) ? (a) : (b))

struct filters {
    struct sp_utf8_stream u;
    struct sp_stop_matcher stop;
};

/* ---- requests -------------------------------------------------------------- */

struct srv_request *srv_request_new(void) {
    struct srv_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 2;
    r->slot = -1;
    r->t_queued = now_s();
    return r;
}

void srv_request_release(struct srv_request *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    const int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    free(r->prompt);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->text);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* End a request that never got a slot, dropping the scheduler's reference. */
static void refuse(struct srv_request *r, const char *why) {
    pthread_mutex_lock(&r->mu);
    r->finish = SRV_ERROR;
    snprintf(r->error, sizeof r->error, "%s", why);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    srv_request_release(r);
}

void srv_submit(struct srv *sv, struct srv_request *r) {
    pthread_mutex_lock(&sv->mu);
    if (sv->stop) {
        pthread_mutex_unlock(&sv->mu);
        refuse(r, "the server is shutting down");
        return;
    }
    r->next = NULL;
    if (sv->tail) sv->tail->next = r;
    else sv->head = r;
    sv->tail = r;
    sv->n_queued++;
    pthread_cond_signal(&sv->cv);
    pthread_mutex_unlock(&sv->mu);
}

void srv_cancel(struct srv_request *r) {
    pthread_mutex_lock(&r->mu);
    r->cancelled = true;
    pthread_mutex_unlock(&r->mu);
}

/* Append text for the client (under r->mu). */
static void put_text(struct srv_request *r, const char *s, size_t n) {
    if (!n) return;
    if (r->n_text + n + 1 > r->cap_text) {
        size_t cap = r->cap_text ? r->cap_text : 256;
        while (cap < r->n_text + n + 1) cap *= 2;
        char *p = realloc(r->text, cap);
        if (!p) return; /* the text is lost, the request goes on */
        r->text = p;
        r->cap_text = cap;
    }
    memcpy(r->text + r->n_text, s, n);
    r->n_text += n;
    r->text[r->n_text] = '\0';
}

/* ---- slots ------------------------------------------------------------------- */

/* The request is over: say how, let the slot go (invariant 1). */
static void slot_finish(struct srv *sv, struct srv_slot *sl, enum srv_finish how, const char *err) {
    struct srv_request *r = sl->req;
    struct filters *f = sl->filters;
    pthread_mutex_lock(&r->mu);
    if (how == SRV_STOP || how == SRV_LENGTH) {
        /* what the filters still hold is text too (no stop string completed it) */
        char tail[8];
        const size_t nt = sp_utf8_stream_flush(&f->u, tail);
        const char *out;
        size_t n_out;
        int32_t matched = -1;
        if (nt && sp_stop_push(&f->stop, tail, nt, &out, &n_out, &matched) == SP_OK) put_text(r, out, n_out);
        if (matched < 0) {
            sp_stop_flush(&f->stop, &out, &n_out);
            put_text(r, out, n_out);
        }
    }
    if (r->finish == SRV_RUNNING) r->finish = how;
    if (err) snprintf(r->error, sizeof r->error, "%s", err);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    sp_stop_free(&f->stop);
    const double now = now_s();
    pthread_mutex_lock(&sv->mu);
    struct srv_metrics *m = &sv->m;
    m->prompt_tokens += (uint64_t)(sl->n_fed - r->n_cached);
    m->prompt_cached += (uint64_t)r->n_cached;
    m->predicted += (uint64_t)r->n_gen;
    if (sl->t_begin > 0) m->prompt_s += (r->t_first ? r->t_first : now) - sl->t_begin;
    if (r->t_first) m->predicted_s += now - r->t_first;
    m->finished[r->finish]++;
    sl->req = NULL;
    sl->t_begin = 0;
    sl->n_requests++;
    pthread_mutex_unlock(&sv->mu);
    srv_request_release(r);
}

/* Start r in sl: keep the prefix the slot already holds, set the sampler
 * and the filters.  Returns false (and finishes r) on an error. */
static bool slot_begin(struct srv *sv, struct srv_slot *sl, struct srv_request *r) {
    struct filters *f = sl->filters;
    sl->req = r;
    sp_utf8_stream_init(&f->u);
    memset(&f->stop, 0, sizeof f->stop);
    sp_status st = sp_stop_init(&f->stop, (const char *const *)r->stops, r->n_stops);
    if (st) {
        slot_finish(sv, sl, SRV_ERROR, sp_last_error());
        return false;
    }
    const int32_t held = sp_session_n_past(sl->s);
    const int32_t *tok = sp_session_tokens(sl->s);
    int32_t k = 0;
    while (k < held && k < r->n_prompt && tok[k] == r->prompt[k]) k++;
    if (k == r->n_prompt) k--; /* the last prompt token is decoded again: its logits */
    if ((st = sp_session_truncate(sl->s, k)) || (st = sp_session_set_sampling(sl->s, &r->sampling))) {
        slot_finish(sv, sl, SRV_ERROR, sp_last_error());
        return false;
    }
    sp_session_set_seed(sl->s, r->seed);
    sl->n_fed = k;
    sl->t_begin = now_s();
    pthread_mutex_lock(&r->mu);
    r->n_cached = k;
    pthread_mutex_unlock(&r->mu);
    return true;
}

/* Common prefix of slot sl's tokens with r's prompt. */
static int32_t prefix_len(const struct srv_slot *sl, const struct srv_request *r) {
    const int32_t held = sp_session_n_past(sl->s);
    const int32_t *tok = sp_session_tokens(sl->s);
    int32_t k = 0;
    while (k < held && k < r->n_prompt && tok[k] == r->prompt[k]) k++;
    return k;
}

/* A sampled token: the text it adds, and whether the request is over. */
static void slot_token(struct srv *sv, struct srv_slot *sl, int32_t tok) {
    struct srv_request *r = sl->req;
    struct filters *f = sl->filters;
    pthread_mutex_lock(&r->mu);
    r->n_gen++;
    if (!r->t_first) r->t_first = now_s();
    pthread_mutex_unlock(&r->mu);
    if (!r->ignore_eos && sp_token_is_eog(sv->model, tok)) {
        slot_finish(sv, sl, SRV_STOP, NULL);
        return;
    }
    char piece[256], valid[SP_UTF8_STREAM_OUT_MAX(sizeof piece)];
    size_t n_piece = 0;
    if (sp_token_to_piece(sv->model, tok, piece, sizeof piece, &n_piece) != SP_OK) n_piece = 0;
    const size_t n_valid = sp_utf8_stream_push(&f->u, piece, n_piece, valid);
    const char *out = NULL;
    size_t n_out = 0;
    int32_t matched = -1;
    sp_status st = sp_stop_push(&f->stop, valid, n_valid, &out, &n_out, &matched);
    pthread_mutex_lock(&r->mu);
    if (st == SP_OK) put_text(r, out, n_out);
    pthread_cond_broadcast(&r->cv);
    const int32_t n_gen = r->n_gen;
    pthread_mutex_unlock(&r->mu);
    if (st) {
        slot_finish(sv, sl, SRV_ERROR, sp_last_error());
    } else if (matched >= 0) {
        slot_finish(sv, sl, SRV_STOP, NULL);
    } else if (n_gen >= r->max_tokens || sp_session_n_past(sl->s) >= sp_session_n_ctx(sl->s)) {
        slot_finish(sv, sl, SRV_LENGTH, NULL);
    } else {
        sl->last = tok;
    }
}

/* ---- the scheduler thread ------------------------------------------------------ */

static bool any_active(const struct srv *sv) {
    for (int i = 0; i < sv->cfg.n_slots; i++)
        if (sv->slots[i].req) return true;
    return false;
}

/* ---- slot actions ---------------------------------------------------------------- */

/* Is a slot action waiting for slot i?  (under sv->mu) */
static bool op_pending(const struct srv *sv, int i) {
    for (const struct srv_op *op = sv->ops; op; op = op->next)
        if (op->slot == i) return true;
    return false;
}

static void op_done(struct srv *sv, struct srv_op *op) {
    pthread_mutex_lock(&sv->mu);
    op->done = true;
    if (op->st == SP_OK) sv->m.slot_ops++;
    pthread_cond_broadcast(&sv->op_cv);
    pthread_mutex_unlock(&sv->mu);
}

/* Run op on its (idle) slot: the scheduler thread's, between steps. */
static void op_run(struct srv *sv, struct srv_op *op) {
    struct sp_session *s = sv->slots[op->slot].s;
    const double t0 = now_s();
    op->st = SP_OK;
    switch (op->kind) {
    case SRV_OP_SAVE:
        op->n_tokens = sp_session_n_past(s);
        op->st = sp_session_save(s, op->path);
        break;
    case SRV_OP_RESTORE:
        op->st = sp_session_load(s, op->path);
        op->n_tokens = sp_session_n_past(s);
        break;
    case SRV_OP_ERASE:
        op->n_tokens = sp_session_n_past(s);
        sp_session_reset(s);
        break;
    }
    if (op->st) snprintf(op->error, sizeof op->error, "%s", sp_last_error());
    op->ms = (now_s() - t0) * 1e3;
    op_done(sv, op);
}

/* Take the first action whose slot is idle off the list (under sv->mu). */
static struct srv_op *op_take(struct srv *sv) {
    for (struct srv_op **p = &sv->ops; *p; p = &(*p)->next) {
        struct srv_op *op = *p;
        if (sv->slots[op->slot].req) continue;
        *p = op->next;
        op->next = NULL;
        return op;
    }
    return NULL;
}

void srv_slot_op(struct srv *sv, struct srv_op *op) {
    op->done = false;
    op->next = NULL;
    pthread_mutex_lock(&sv->mu);
    if (sv->stop || !sv->ready) {
        op->st = SP_E_STATE;
        snprintf(op->error, sizeof op->error, "the server is shutting down");
        op->done = true;
    } else {
        struct srv_op **p = &sv->ops;
        while (*p) p = &(*p)->next;
        *p = op;
        pthread_cond_signal(&sv->cv);
    }
    while (!op->done) pthread_cond_wait(&sv->op_cv, &sv->mu);
    pthread_mutex_unlock(&sv->mu);
}

/* Give idle slots to queued requests (under sv->mu).  begun[] receives the
 * slots given. */
static int assign(struct srv *sv, int *begun) {
    int n = 0;
    while (sv->head) {
        struct srv_request *r = sv->head;
        int best = -1, best_k = -1;
        for (int i = 0; i < sv->cfg.n_slots; i++) {
            if (sv->slots[i].req || op_pending(sv, i)) continue;
            const int32_t k = prefix_len(&sv->slots[i], r);
            if (k > best_k) best = i, best_k = k;
        }
        if (best < 0) break;
        sv->head = r->next;
        if (!sv->head) sv->tail = NULL;
        sv->n_queued--;
        sv->slots[best].req = r; /* claimed; slot_begin runs outside the lock */
        pthread_mutex_lock(&r->mu);
        r->slot = best;
        pthread_mutex_unlock(&r->mu);
        begun[n++] = best;
    }
    return n;
}

static void *sched_main(void *arg) {
    struct srv *sv = arg;
    const int ns = sv->cfg.n_slots;
    struct sp_session **ss = calloc((size_t)ns, sizeof *ss);
    const int32_t **tk = calloc((size_t)ns, sizeof *tk);
    int32_t *nt = calloc((size_t)ns, sizeof *nt);
    int *idx = calloc((size_t)ns, sizeof *idx), *begun = calloc((size_t)ns, sizeof *begun);
    if (!ss || !tk || !nt || !idx || !begun) {
        fprintf(stderr, "sparrow serve: scheduler: out of memory\n");
        goto out;
    }
    const int32_t room = sp_batch_n_tokens(sv->batch);
    for (;;) {
        pthread_mutex_lock(&sv->mu);
        for (int i = 0; i < ns; i++) sv->slots[i].n_past = sp_session_n_past(sv->slots[i].s); /* for /metrics */
        while (!sv->stop && !sv->head && !sv->ops && !any_active(sv)) pthread_cond_wait(&sv->cv, &sv->mu);
        if (sv->stop) {
            pthread_mutex_unlock(&sv->mu);
            break;
        }
        /* slot actions first: their slots take no new request meanwhile */
        for (struct srv_op *op; (op = op_take(sv));) {
            pthread_mutex_unlock(&sv->mu);
            op_run(sv, op);
            pthread_mutex_lock(&sv->mu);
        }
        const int n_begun = assign(sv, begun);
        pthread_mutex_unlock(&sv->mu);
        for (int i = 0; i < n_begun; i++) {
            struct srv_slot *sl = &sv->slots[begun[i]];
            slot_begin(sv, sl, sl->req);
        }
        /* drop what the clients left or what ran out of time */
        const double now = now_s();
        for (int i = 0; i < ns; i++) {
            struct srv_slot *sl = &sv->slots[i];
            if (!sl->req) continue;
            pthread_mutex_lock(&sl->req->mu);
            const bool gone = sl->req->cancelled;
            pthread_mutex_unlock(&sl->req->mu);
            if (gone) slot_finish(sv, sl, SRV_CANCELLED, NULL);
            else if (sv->cfg.timeout_s > 0 && now - sl->req->t_queued > sv->cfg.timeout_s)
                slot_finish(sv, sl, SRV_ERROR, "the request timed out");
        }
        /* one token of every generating slot, then prompt chunks in the room left */
        int n = 0;
        int32_t used = 0;
        for (int i = 0; i < ns; i++) {
            struct srv_slot *sl = &sv->slots[i];
            if (!sl->req || sl->n_fed < sl->req->n_prompt) continue;
            ss[n] = sl->s, tk[n] = &sl->last, nt[n] = 1, idx[n++] = i;
            used++;
        }
        for (int i = 0; i < ns && used < room; i++) {
            struct srv_slot *sl = &sv->slots[i];
            if (!sl->req || sl->n_fed >= sl->req->n_prompt) continue;
            const int32_t take = MIN_I32(sl->req->n_prompt - sl->n_fed, room - used);
            ss[n] = sl->s, tk[n] = sl->req->prompt + sl->n_fed, nt[n] = take, idx[n++] = i;
            used += take;
        }
        if (!n) continue;
        const sp_status st = sp_batch_decode(sv->batch, ss, tk, nt, n);
        pthread_mutex_lock(&sv->mu);
        sv->n_steps++;
        if (!st) sv->n_tokens_decoded += (uint64_t)used;
        sv->m.n_decode++;
        sv->m.busy_slots += (uint64_t)n;
        pthread_mutex_unlock(&sv->mu);
        if (st) {
            /* a full context or an I/O error: those requests end with it */
            char msg[256];
            snprintf(msg, sizeof msg, "decode failed: %s", sp_last_error());
            for (int k = 0; k < n; k++) {
                struct srv_slot *sl = &sv->slots[idx[k]];
                sp_session_reset(sl->s);
                slot_finish(sv, sl, st == SP_E_CONTEXT_FULL ? SRV_LENGTH : SRV_ERROR, msg);
            }
            continue;
        }
        for (int k = 0; k < n; k++) {
            struct srv_slot *sl = &sv->slots[idx[k]];
            const bool prompting = sl->n_fed < sl->req->n_prompt;
            if (prompting) sl->n_fed += nt[k];
            if (sl->n_fed < sl->req->n_prompt) continue; /* more of the prompt next step */
            int32_t tok = 0;
            if (sp_sample(sl->s, &tok) != SP_OK) {
                slot_finish(sv, sl, SRV_ERROR, sp_last_error());
                continue;
            }
            slot_token(sv, sl, tok);
        }
    }
out:
    /* shutting down: every request still here ends with an error */
    for (int i = 0; i < ns; i++)
        if (sv->slots[i].req) slot_finish(sv, &sv->slots[i], SRV_ERROR, "the server is shutting down");
    pthread_mutex_lock(&sv->mu);
    while (sv->head) {
        struct srv_request *r = sv->head;
        sv->head = r->next;
        refuse(r, "the server is shutting down");
    }
    sv->tail = NULL;
    /* slot actions asked for before the stop still run (every slot is idle
     * now): a save waiting for its slot's request is done on SIGTERM */
    for (struct srv_op *op; (op = op_take(sv));) {
        pthread_mutex_unlock(&sv->mu);
        op_run(sv, op);
        pthread_mutex_lock(&sv->mu);
    }
    pthread_mutex_unlock(&sv->mu);
    free(ss);
    free(tk);
    free(nt);
    free(idx);
    free(begun);
    return NULL;
}

/* ---- start and stop ------------------------------------------------------------- */

int srv_start(struct srv *sv) {
    const struct srv_config *c = &sv->cfg;
    pthread_mutex_init(&sv->mu, NULL);
    pthread_cond_init(&sv->cv, NULL);
    pthread_cond_init(&sv->op_cv, NULL);
    struct sp_session_params sp = c->sp;
    sp.n_batch = 1; /* sessions never decode on their own: the batch does */
    /* the budget plans room for n_slots sessions like the slots */
    struct sp_model_params mp = sp_model_default_params();
    mp.mem_budget = c->mem_budget;
    envelope_from(&mp, &sp);
    mp.n_seq = c->n_slots;
    const int32_t n_tok = MAX_I32(c->sp.n_batch ? c->sp.n_batch : 128, c->n_slots);
    mp.batch_tokens = n_tok; /* and the batch that decodes them */
    sp_status st = sp_model_load(c->model_path, &mp, &sv->model);
    if (st) return lib_error("loading the model", st), -1;
    if ((st = sp_model_get_info(sv->model, &sv->info))) return lib_error("model info", st), -1;
    size_t tl = 0;
    if (!c->chat_template && sp_model_meta_str(sv->model, "tokenizer.chat_template", NULL, 0, &tl) == SP_E_INVALID) {
        /* as llama-server does: a model without a template gets chatml */
        fprintf(stderr, "sparrow serve: the model has no chat template: using chatml (--chat-template to choose)\n");
        sv->cfg.chat_template = "chatml";
    }
    sv->slots = calloc((size_t)c->n_slots, sizeof *sv->slots);
    if (!sv->slots) return fprintf(stderr, "sparrow serve: out of memory\n"), -1;
    for (int i = 0; i < c->n_slots; i++) {
        if ((st = sp_session_init(sv->model, &sp, &sv->slots[i].s))) return lib_error("a slot's session", st), -1;
        if (!(sv->slots[i].filters = calloc(1, sizeof(struct filters))))
            return fprintf(stderr, "sparrow serve: out of memory\n"), -1;
    }
    if ((st = sp_batch_init(sv->model, c->n_slots, n_tok, c->sp.n_threads, &sv->batch)))
        return lib_error("the batch", st), -1;
    if (gov_create(&c->gov, &sv->gov) != EXIT_OK) return -1;
    if (sv->gov && (st = sp_batch_set_governor(sv->batch, sv->gov))) return lib_error("attaching the governor", st), -1;
    if (pthread_create(&sv->thread, NULL, sched_main, sv)) return fprintf(stderr, "sparrow serve: no thread\n"), -1;
    sv->ready = true;
    return 0;
}

void srv_stop(struct srv *sv) {
    if (sv->ready) {
        pthread_mutex_lock(&sv->mu);
        sv->stop = true;
        pthread_cond_broadcast(&sv->cv);
        pthread_mutex_unlock(&sv->mu);
        pthread_join(sv->thread, NULL);
        sv->ready = false;
    }
}

/* Free what srv_start made (after srv_stop and the HTTP daemon). */
void srv_free(struct srv *sv) {
    if (sv->slots) {
        for (int i = 0; i < sv->cfg.n_slots; i++) {
            sp_session_free(sv->slots[i].s);
            free(sv->slots[i].filters);
        }
    }
    free(sv->slots);
    sp_batch_free(sv->batch);
    if (sv->gov) gov_report(sv->gov);
    sp_governor_free(sv->gov);
    sp_model_free(sv->model);
}

/* ---- /slots ------------------------------------------------------------------------ */

char *srv_slots_json(struct srv *sv) {
    size_t cap = 256 + (size_t)sv->cfg.n_slots * 160;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t n = (size_t)snprintf(out, cap, "[");
    pthread_mutex_lock(&sv->mu);
    for (int i = 0; i < sv->cfg.n_slots; i++) {
        const struct srv_slot *sl = &sv->slots[i];
        int32_t n_gen = 0, n_prompt = 0;
        if (sl->req) {
            pthread_mutex_lock(&sl->req->mu);
            n_gen = sl->req->n_gen;
            n_prompt = sl->req->n_prompt;
            pthread_mutex_unlock(&sl->req->mu);
        }
        n += (size_t)snprintf(out + n, cap - n,
                              "%s{\"id\":%d,\"is_processing\":%s,\"n_ctx\":%d,\"n_prompt_tokens\":%d,"
                              "\"n_decoded\":%d,\"n_requests\":%llu}",
                              i ? "," : "", i, sl->req ? "true" : "false", sp_session_n_ctx(sl->s), n_prompt, n_gen,
                              (unsigned long long)sl->n_requests);
    }
    pthread_mutex_unlock(&sv->mu);
    snprintf(out + n, cap - n, "]");
    return out;
}

/* ---- /metrics ------------------------------------------------------------------------ */

struct mbuf {
    char *p;
    size_t n, cap;
};

static void mput(struct mbuf *b, const char *name, const char *type, const char *help, double v) {
    if (!b->p) return;
    for (;;) {
        /* whole numbers (counts) in full, the others to 9 digits */
        const bool whole = v == floor(v) && fabs(v) < 1e15;
        const int k = snprintf(b->p + b->n, b->cap - b->n, whole ? "# HELP %s %s\n# TYPE %s %s\n%s %.0f\n"
                                                                 : "# HELP %s %s\n# TYPE %s %s\n%s %.9g\n",
                               name, help, name, type, name, v);
        if (k >= 0 && (size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        char *p = realloc(b->p, b->cap * 2);
        if (!p) {
            free(b->p);
            b->p = NULL;
            return;
        }
        b->p = p;
        b->cap *= 2;
    }
}

/* Prometheus' text format, version 0.0.4: llama-server's names (llamacpp:)
 * where it has the figure, sparrow: for the ones it lacks. */
char *srv_metrics_text(struct srv *sv) {
    struct mbuf b = {.cap = 4096};
    if (!(b.p = malloc(b.cap))) return NULL;
    b.p[0] = '\0';
    pthread_mutex_lock(&sv->mu);
    const struct srv_metrics m = sv->m;
    int busy = 0;
    int64_t kv_tokens = 0;
    for (int i = 0; i < sv->cfg.n_slots; i++) {
        busy += sv->slots[i].req != NULL;
        kv_tokens += sv->slots[i].n_past;
    }
    const int queued = sv->n_queued;
    int ops_waiting = 0;
    for (const struct srv_op *op = sv->ops; op; op = op->next) ops_waiting++;
    pthread_mutex_unlock(&sv->mu);
    const double kv_cap = (double)sv->cfg.n_slots * sv->cfg.sp.n_ctx;
    uint64_t n_finished = 0;
    for (int i = 1; i < 5; i++) n_finished += m.finished[i];
    mput(&b, "llamacpp:prompt_tokens_total", "counter", "Prompt tokens decoded (prefixes a slot already held not counted).",
         (double)m.prompt_tokens);
    mput(&b, "llamacpp:prompt_seconds_total", "counter",
         "Seconds from each request getting its slot to its first token, summed.", m.prompt_s);
    mput(&b, "llamacpp:tokens_predicted_total", "counter", "Tokens generated.", (double)m.predicted);
    mput(&b, "llamacpp:tokens_predicted_seconds_total", "counter",
         "Seconds from each request's first token to its end, summed.", m.predicted_s);
    mput(&b, "llamacpp:n_decode_total", "counter", "Batched decode steps.", (double)m.n_decode);
    mput(&b, "llamacpp:n_busy_slots_per_decode", "gauge", "Slots active per decode step, on average.",
         m.n_decode ? (double)m.busy_slots / (double)m.n_decode : 0);
    mput(&b, "llamacpp:prompt_tokens_seconds", "gauge", "Prompt tokens per second, on average.",
         m.prompt_s > 0 ? (double)m.prompt_tokens / m.prompt_s : 0);
    mput(&b, "llamacpp:predicted_tokens_seconds", "gauge", "Generated tokens per second per request, on average.",
         m.predicted_s > 0 ? (double)m.predicted / m.predicted_s : 0);
    mput(&b, "llamacpp:kv_cache_usage_ratio", "gauge", "Share of the slots' KV cache cells in use.",
         kv_cap > 0 ? (double)kv_tokens / kv_cap : 0);
    mput(&b, "llamacpp:kv_cache_tokens", "gauge", "Tokens held in the slots' KV caches.", (double)kv_tokens);
    mput(&b, "llamacpp:requests_processing", "gauge", "Requests being decoded (slots busy).", busy);
    mput(&b, "llamacpp:requests_deferred", "gauge", "Requests waiting for a slot.", queued);
    mput(&b, "sparrow:prompt_tokens_cached_total", "counter", "Prompt tokens a slot already held (not decoded again).",
         (double)m.prompt_cached);
    mput(&b, "sparrow:requests_finished_total", "counter", "Requests that ended, however they ended.",
         (double)n_finished);
    mput(&b, "sparrow:requests_stopped_total", "counter", "Requests ended by an end-of-generation token or a stop string.",
         (double)m.finished[SRV_STOP]);
    mput(&b, "sparrow:requests_length_total", "counter", "Requests ended by max_tokens or a full context.",
         (double)m.finished[SRV_LENGTH]);
    mput(&b, "sparrow:requests_failed_total", "counter", "Requests ended by an error (decode, timeout, shutdown).",
         (double)m.finished[SRV_ERROR]);
    mput(&b, "sparrow:requests_cancelled_total", "counter", "Requests whose client went away.",
         (double)m.finished[SRV_CANCELLED]);
    mput(&b, "sparrow:slot_actions_total", "counter", "Slot saves, restores and erases done.", (double)m.slot_ops);
    mput(&b, "sparrow:slot_actions_waiting", "gauge", "Slot actions waiting for their slot's request to end.",
         ops_waiting);
    mput(&b, "sparrow:slots_total", "gauge", "Slots (-np).", sv->cfg.n_slots);
    /* the process's memory, for watching it over time (test_serve_load.sh) */
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        long size = 0;
        if (fscanf(f, "%ld %ld", &size, &pages) != 2) pages = 0;
        fclose(f);
    }
    mput(&b, "process_resident_memory_bytes", "gauge", "Resident set size in bytes.",
         (double)pages * (double)sysconf(_SC_PAGESIZE));
#ifdef __GLIBC__
    const struct mallinfo2 mi = mallinfo2();
    mput(&b, "sparrow:heap_in_use_bytes", "gauge", "Bytes malloc has handed out and not had back (glibc mallinfo2).",
         (double)(mi.uordblks + mi.hblkhd));
    mput(&b, "sparrow:heap_free_bytes", "gauge",
         "Bytes free inside malloc's heap: kept by the allocator, resident or not (glibc mallinfo2).",
         (double)mi.fordblks);
#endif
    return b.p;
}
