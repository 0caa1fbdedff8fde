/*
 * governor.c -- sensors -> state -> knobs (docs/GOVERNOR.md).
 *
 * Every replan_tokens tokens (and before each prompt) the governor reads its
 * sensors (rate-limited, sensors.c), merges the signals the app pushed, and
 *  1. moves the thermal state one way or the other with hysteresis: up to
 *     the highest state whose entry threshold the temperature (or pushed
 *     headroom) reaches, down only once it is below a state's threshold by
 *     the hysteresis, so a reading that sits on a threshold cannot make the
 *     state flap;
 *  2. sets battery saver (below saver_below_pct and not on power; lifted on
 *     power or saver_hysteresis_pct above the threshold);
 *  3. combines the two actions knob by knob (the stronger of each): the cap
 *     on threads, the duty cycle, experts per token, the prompt chunk;
 *  4. with a latency target, closes the loop on the measured ms per token
 *     (wall time from one token's start to the next's, pacing included):
 *     the pacing moves by GAIN x the error of the window's median, within
 *     [0, target]; when the target is missed without pacing, the thread
 *     count the measurements say is fastest (a count not measured recently
 *     is tried) is used, and when it is met with room to spare, the fewest
 *     threads that meet it with a margin -- less CPU for the same latency.
 * The duty cycle sets a floor under the pacing (w x (1/duty - 1) after w of
 * work), so heat wins over the latency target; nothing ever stops work.
 * With a TTFT target the pacing between prompt chunks shrinks to what the
 * remaining prompt leaves room for.
 *
 * Invariants:
 *  1. mu guards everything but the owner-only counters of the window; the
 *     decode thread takes it at each call, other threads for signals and
 *     stats.
 *  2. Every plan writes exactly one trace line (when tracing) and counts
 *     in n_plans.
 */
#include "governor.h"

#include "sensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { WINDOW = 64, MAX_TRACK_THREADS = 256 };
#define GAIN 0.8
/* A thread count's measurement is trusted for EST_FRESH_S or EST_FRESH_PLANS
 * plans, whichever is longer: a slow model (300 ms a token, 3 s between plans)
 * would otherwise find every other count stale at each plan and try one every
 * few plans, each try a window of tokens at a worse setting. */
#define EST_FRESH_S 3.0
#define EST_FRESH_PLANS 8

struct thread_est {
    double work_ms; /* EWMA of work per token at this count */
    double t_s;     /* when last measured (0: never) */
    int64_t plan;   /* n_plans then */
};

struct sp_governor {
    pthread_mutex_t mu;
    struct sp_governor_params p;
    char *thermal_file, *battery_file, *trace_path, *trace_tmp, *sensor_root;
    struct sp_gov_policy pol;
    struct sp_sensors *sensors;
    FILE *trace;
    char *trace_buf; /* its stdio buffer, allocated here: no allocation on the token path */
    double t0;
    /* signals (NAN / < 0 = unset) */
    double sig[SP_GOV_SIGNAL_COUNT];
    /* owner */
    const void *owner;
    int max_threads;
    uint32_t model_k, n_batch;
    /* state */
    enum sp_gov_state state;
    bool saver, planned;
    struct sp_gov_knobs k;
    int thread_cap;
    double duty;
    double pacing_lat_ms; /* the latency loop's pacing */
    double pacing_ms;     /* last pacing given */
    struct sp_sensor_reading rd;
    double temp_c, headroom, battery_pct; /* effective (NAN unknown) */
    int charging;                         /* 1, 0, -1 unknown */
    /* measurements */
    double tok_start, last_tok_start;
    double iv[WINDOW], wk[WINDOW]; /* intervals and work (ms) of recent tokens */
    int n_iv, n_wk, since_plan;
    double work_ewma_ms;
    double ms_per_token, work_ms;
    struct thread_est est[MAX_TRACK_THREADS + 1];
    int explore_wait;
    /* prefill */
    uint32_t pf_total, pf_done;
    double pf_t0, pf_ms_per_tok; /* EWMA of work per prompt token */
    /* accounting */
    double acc_t;
    struct sp_governor_stats st;
};

const char *sp_gov_state_name(enum sp_gov_state s) {
    static const char *const n[SP_GOV_STATE_COUNT] = {"normal", "warm", "hot", "critical"};
    return (unsigned)s < SP_GOV_STATE_COUNT ? n[s] : "?";
}

struct sp_gov_policy sp_gov_default_policy(void) {
    struct sp_gov_policy p = {
        .enter_c = {0, 45, 55, 70},
        .enter_headroom = {0, 0.7, 0.85, 1.0},
        .hysteresis_c = 2.0,
        .hysteresis_headroom = 0.05,
        .action =
            {
                [SP_GOV_NORMAL] = {1.0, 1.0, 1.0, 0},
                [SP_GOV_WARM] = {1.0, 0.8, 1.0, 0},
                [SP_GOV_HOT] = {0.5, 0.5, 0.75, 64},
                [SP_GOV_CRITICAL] = {0.5, 0.3, 0.5, 32},
            },
        .saver_below_pct = 20,
        .saver_hysteresis_pct = 3,
        .saver = {0.5, 0.7, 0.75, 0},
        .replan_tokens = 10,
    };
    return p;
}

struct sp_governor_params sp_governor_default_params(void) {
    return (struct sp_governor_params){0};
}

static sp_status check_action(const struct sp_gov_action *a, const char *who) {
    if (!(a->threads > 0 && a->threads <= 1)) return sp_err(SP_E_INVALID, "governor policy: %s.threads %g not in (0, 1]", who, a->threads);
    if (!(a->duty >= 0.05 && a->duty <= 1)) return sp_err(SP_E_INVALID, "governor policy: %s.duty %g not in [0.05, 1]", who, a->duty);
    if (!(a->experts > 0 && a->experts <= 1)) return sp_err(SP_E_INVALID, "governor policy: %s.experts %g not in (0, 1]", who, a->experts);
    if (a->chunk < 0) return sp_err(SP_E_INVALID, "governor policy: %s.chunk %d is negative", who, (int)a->chunk);
    return SP_OK;
}

static sp_status check_policy(const struct sp_gov_policy *p) {
    for (int s = 1; s < SP_GOV_STATE_COUNT; s++) {
        if (!isfinite(p->enter_c[s]) || !isfinite(p->enter_headroom[s]))
            return sp_err(SP_E_INVALID, "governor policy: %s threshold is not a number", sp_gov_state_name(s));
        if (s > 1 && (p->enter_c[s] <= p->enter_c[s - 1] || p->enter_headroom[s] <= p->enter_headroom[s - 1]))
            return sp_err(SP_E_INVALID, "governor policy: %s.enter_c / enter_headroom must exceed %s's",
                          sp_gov_state_name(s), sp_gov_state_name(s - 1));
    }
    if (!(p->hysteresis_c >= 0 && p->hysteresis_c < 50) || !(p->hysteresis_headroom >= 0 && p->hysteresis_headroom < 1))
        return sp_err(SP_E_INVALID, "governor policy: hysteresis out of range (C: [0, 50), headroom: [0, 1))");
    if (!(p->saver_below_pct >= 0 && p->saver_below_pct <= 100) || !(p->saver_hysteresis_pct >= 0 && p->saver_hysteresis_pct <= 100))
        return sp_err(SP_E_INVALID, "governor policy: saver.below_pct / hysteresis_pct not in [0, 100]");
    if (p->replan_tokens < 1 || p->replan_tokens > 100000)
        return sp_err(SP_E_INVALID, "governor policy: replan_tokens %d not in [1, 100000]", (int)p->replan_tokens);
    sp_status rc;
    for (int s = 0; s < SP_GOV_STATE_COUNT; s++)
        if ((rc = check_action(&p->action[s], sp_gov_state_name(s)))) return rc;
    return check_action(&p->saver, "saver");
}

static char *dup_opt(const char *s, bool *fail) {
    if (!s || !*s) return NULL;
    char *d = sp_strdup(s);
    if (!d) *fail = true;
    return d;
}

sp_status sp_governor_init(const struct sp_governor_params *params, struct sp_governor **out) {
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    struct sp_governor_params p = params ? *params : sp_governor_default_params();
    if (!(p.target_ms >= 0 && p.target_ms < 1e7) || !(p.target_ttft_s >= 0 && p.target_ttft_s < 1e5) ||
        !(p.sensor_interval_s >= 0 && p.sensor_interval_s < 3600))
        return sp_err(SP_E_INVALID, "%s: target_ms %g, target_ttft_s %g or sensor_interval_s %g out of range", __func__,
                      p.target_ms, p.target_ttft_s, p.sensor_interval_s);
    struct sp_governor *g = sp_calloc(1, sizeof *g);
    if (!g) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    pthread_mutex_init(&g->mu, NULL);
    bool fail = false;
    g->thermal_file = dup_opt(p.thermal_file, &fail);
    g->battery_file = dup_opt(p.battery_file, &fail);
    g->trace_path = dup_opt(p.trace_path, &fail);
    g->sensor_root = dup_opt(p.sensor_root, &fail);
    g->p = p;
    g->p.thermal_file = g->thermal_file;
    g->p.battery_file = g->battery_file;
    g->p.trace_path = g->trace_path;
    g->p.sensor_root = g->sensor_root;
    g->p.policy_file = NULL;
    g->pol = sp_gov_default_policy();
    for (int i = 0; i < SP_GOV_SIGNAL_COUNT; i++) g->sig[i] = NAN;
    g->t0 = g->acc_t = sp_mono_s();
    g->st.max_temp_c = NAN;
    g->duty = 1.0;
    sp_status rc = SP_OK;
    if (fail) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto fail;
    }
    const struct sp_sensor_cfg sc = {g->sensor_root, g->thermal_file, g->battery_file, p.sensor_interval_s};
    if ((rc = sp_sensors_init(&sc, &g->sensors))) goto fail;
    if (p.policy_file && (rc = sp_governor_load_policy(g, p.policy_file))) goto fail;
    if (g->trace_path) {
        const size_t n = strlen(g->trace_path) + 32;
        if (!(g->trace_tmp = sp_malloc(n))) {
            rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
            goto fail;
        }
        snprintf(g->trace_tmp, n, "%s.tmp.%d", g->trace_path, (int)getpid());
        if (!(g->trace = fopen(g->trace_tmp, "w"))) {
            rc = sp_err(SP_E_IO, "governor trace: cannot create %s: %s", g->trace_tmp, strerror(errno));
            goto fail;
        }
        if ((g->trace_buf = sp_malloc(1 << 16))) setvbuf(g->trace, g->trace_buf, _IOFBF, 1 << 16);
    }
    *out = g;
    return SP_OK;
fail:
    sp_governor_free(g);
    return rc;
}

void sp_governor_free(struct sp_governor *g) {
    if (!g) return;
    if (g->trace) {
        bool ok = fflush(g->trace) == 0 && fsync(fileno(g->trace)) == 0;
        ok &= fclose(g->trace) == 0;
        if (!ok || rename(g->trace_tmp, g->trace_path) != 0) {
            SP_LOG_W("governor trace: cannot write %s: %s", g->trace_path, strerror(errno));
            (void)unlink(g->trace_tmp);
        }
    }
    sp_free(g->trace_buf);
    sp_sensors_free(g->sensors);
    sp_free(g->thermal_file);
    sp_free(g->battery_file);
    sp_free(g->trace_path);
    sp_free(g->trace_tmp);
    sp_free(g->sensor_root);
    pthread_mutex_destroy(&g->mu);
    sp_free(g);
}

sp_status sp_governor_set_policy(struct sp_governor *g, const struct sp_gov_policy *p) {
    if (!g || !p) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    sp_status rc = check_policy(p);
    if (rc) return rc;
    pthread_mutex_lock(&g->mu);
    g->pol = *p;
    pthread_mutex_unlock(&g->mu);
    return SP_OK;
}

sp_status sp_governor_get_policy(const struct sp_governor *g, struct sp_gov_policy *out) {
    if (!g || !out) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    pthread_mutex_lock((pthread_mutex_t *)&g->mu);
    *out = g->pol;
    pthread_mutex_unlock((pthread_mutex_t *)&g->mu);
    return SP_OK;
}

/* The field "key" names in p (NULL if none); *is_int for chunk / replan. */
static double *policy_field(struct sp_gov_policy *p, const char *key, int32_t **ip) {
    *ip = NULL;
    if (!strcmp(key, "hysteresis_c")) return &p->hysteresis_c;
    if (!strcmp(key, "hysteresis_headroom")) return &p->hysteresis_headroom;
    if (!strcmp(key, "saver.below_pct")) return &p->saver_below_pct;
    if (!strcmp(key, "saver.hysteresis_pct")) return &p->saver_hysteresis_pct;
    if (!strcmp(key, "replan_tokens")) {
        *ip = &p->replan_tokens;
        return NULL;
    }
    const char *dot = strchr(key, '.');
    if (!dot) return NULL;
    struct sp_gov_action *a = NULL;
    int s = -1;
    for (int i = 0; i < SP_GOV_STATE_COUNT; i++) {
        const char *n = sp_gov_state_name(i);
        if (strlen(n) == (size_t)(dot - key) && !strncmp(key, n, strlen(n))) s = i;
    }
    if (s >= 0) a = &p->action[s];
    else if (!strncmp(key, "saver.", 6)) a = &p->saver;
    if (!a) return NULL;
    const char *f = dot + 1;
    if (s > 0 && !strcmp(f, "enter_c")) return &p->enter_c[s];
    if (s > 0 && !strcmp(f, "enter_headroom")) return &p->enter_headroom[s];
    if (!strcmp(f, "threads")) return &a->threads;
    if (!strcmp(f, "duty")) return &a->duty;
    if (!strcmp(f, "experts")) return &a->experts;
    if (!strcmp(f, "chunk")) *ip = &a->chunk;
    return NULL;
}

sp_status sp_governor_load_policy(struct sp_governor *g, const char *path) {
    if (!g || !path) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    FILE *f = fopen(path, "r");
    if (!f) return sp_err(SP_E_IO, "governor policy: cannot open %s: %s", path, strerror(errno));
    struct sp_gov_policy p;
    sp_governor_get_policy(g, &p);
    char line[512];
    int ln = 0;
    sp_status rc = SP_OK;
    while (!rc && fgets(line, sizeof line, f)) {
        ln++;
        char *h = strchr(line, '#');
        if (h) *h = '\0';
        char key[128], val[128], extra[8];
        for (char *c = line; *c; c++)
            if (*c == '=') *c = ' ';
        const int n = sscanf(line, "%127s %127s %7s", key, val, extra);
        if (n <= 0) continue;
        if (n != 2) {
            rc = sp_err(SP_E_INVALID, "%s:%d: expected 'key = value'", path, ln);
            break;
        }
        int32_t *ip;
        double *dp = policy_field(&p, key, &ip);
        char *end;
        errno = 0;
        const double v = strtod(val, &end);
        if (!dp && !ip) rc = sp_err(SP_E_INVALID, "%s:%d: unknown key '%s' (docs/GOVERNOR.md lists them)", path, ln, key);
        else if (*end || end == val || errno || !isfinite(v)) rc = sp_err(SP_E_INVALID, "%s:%d: '%s' is not a number", path, ln, val);
        else if (ip && (v != floor(v) || v < 0 || v > 1e6)) rc = sp_err(SP_E_INVALID, "%s:%d: %s takes a whole number", path, ln, key);
        else if (dp) *dp = v;
        else *ip = (int32_t)v;
    }
    fclose(f);
    if (rc) return rc;
    if ((rc = check_policy(&p))) return sp_err(rc, "%s: %s", path, sp_last_error());
    return sp_governor_set_policy(g, &p);
}

sp_status sp_governor_set_signal(struct sp_governor *g, enum sp_gov_signal sig, double v) {
    if (!g || (unsigned)sig >= SP_GOV_SIGNAL_COUNT)
        return sp_err(SP_E_INVALID, "%s: no governor or unknown signal %d", __func__, (int)sig);
    bool clear;
    switch (sig) {
    case SP_GOV_SIGNAL_TEMP_C: clear = isnan(v); if (!clear && !(v > -100 && v < 300)) goto bad; break;
    case SP_GOV_SIGNAL_THERMAL_HEADROOM: clear = v < 0; if (!clear && !(v < 100)) goto bad; break;
    case SP_GOV_SIGNAL_TARGET_WORK_MS: clear = !(v > 0); if (!clear && !(v < 1e7)) goto bad; break;
    case SP_GOV_SIGNAL_BATTERY_PCT: clear = v < 0; if (!clear && !(v <= 100)) goto bad; break;
    default: clear = v < 0; if (!clear && v != 0 && v != 1) goto bad; break;
    }
    pthread_mutex_lock(&g->mu);
    g->sig[sig] = clear ? NAN : v;
    pthread_mutex_unlock(&g->mu);
    return SP_OK;
bad:
    return sp_err(SP_E_INVALID, "%s: value %g out of range for signal %d", __func__, v, (int)sig);
}

sp_status sp_governor_get_stats(const struct sp_governor *g, struct sp_governor_stats *out) {
    if (!g || !out) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    pthread_mutex_lock((pthread_mutex_t *)&g->mu);
    *out = g->st;
    out->state = g->state;
    out->saver = g->saver;
    out->threads = g->k.threads;
    out->n_expert_used = (int32_t)(g->k.n_expert_used ? g->k.n_expert_used : g->model_k);
    out->chunk = (int32_t)g->k.chunk;
    out->pacing_ms = g->pacing_ms;
    out->ms_per_token = g->ms_per_token;
    out->work_ms = g->work_ms;
    pthread_mutex_unlock((pthread_mutex_t *)&g->mu);
    return SP_OK;
}

/* ---- the controller (under mu) -------------------------------------------- */

static void account(struct sp_governor *g, double now) {
    const double dt = now - g->acc_t;
    if (g->owner && dt > 0) {
        g->st.state_s[g->state] += dt;
        if (g->saver) g->st.saver_s += dt;
    }
    g->acc_t = now;
}

static double median(const double *v, int n) {
    double t[WINDOW];
    memcpy(t, v, (size_t)n * sizeof *t);
    for (int i = 1; i < n; i++) { /* insertion sort: n <= 64 */
        const double x = t[i];
        int j = i - 1;
        for (; j >= 0 && t[j] > x; j--) t[j + 1] = t[j];
        t[j + 1] = x;
    }
    return n == 0 ? 0 : n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static double target_ms(const struct sp_governor *g) {
    return !isnan(g->sig[SP_GOV_SIGNAL_TARGET_WORK_MS]) ? g->sig[SP_GOV_SIGNAL_TARGET_WORK_MS] : g->p.target_ms;
}

static void read_inputs(struct sp_governor *g, bool force) {
    sp_sensors_read(g->sensors, force, &g->rd);
    const double *s = g->sig;
    g->temp_c = !isnan(s[SP_GOV_SIGNAL_TEMP_C]) ? s[SP_GOV_SIGNAL_TEMP_C] : g->rd.has_temp ? g->rd.temp_c : NAN;
    g->headroom = s[SP_GOV_SIGNAL_THERMAL_HEADROOM];
    g->battery_pct = !isnan(s[SP_GOV_SIGNAL_BATTERY_PCT]) ? s[SP_GOV_SIGNAL_BATTERY_PCT]
                     : g->rd.has_battery                 ? g->rd.battery_pct
                                                         : NAN;
    if (!isnan(s[SP_GOV_SIGNAL_CHARGING])) g->charging = s[SP_GOV_SIGNAL_CHARGING] > 0;
    else if (g->rd.has_battery && g->rd.battery_status != SP_BAT_UNKNOWN) g->charging = sp_battery_on_power(g->rd.battery_status);
    else g->charging = isnan(g->battery_pct) ? -1 : 0; /* a level without a status: discharging */
    if (!isnan(g->temp_c) && (isnan(g->st.max_temp_c) || g->temp_c > g->st.max_temp_c)) g->st.max_temp_c = g->temp_c;
}

/* Steps 1-3 of the file comment. */
static void plan_state(struct sp_governor *g) {
    const struct sp_gov_policy *P = &g->pol;
    const double t = g->temp_c, h = g->headroom;
    int s = (int)g->state;
    while (s + 1 < SP_GOV_STATE_COUNT && ((!isnan(t) && t >= P->enter_c[s + 1]) || (!isnan(h) && h >= P->enter_headroom[s + 1])))
        s++;
    while (s > 0 && !(!isnan(t) && t >= P->enter_c[s] - P->hysteresis_c) &&
           !(!isnan(h) && h >= P->enter_headroom[s] - P->hysteresis_headroom))
        s--;
    if (s != (int)g->state) g->st.n_state_changes++;
    g->state = (enum sp_gov_state)s;

    bool saver = g->saver;
    if (isnan(g->battery_pct) || g->charging == 1) saver = false;
    else if (g->battery_pct < P->saver_below_pct) saver = true;
    else if (g->battery_pct >= P->saver_below_pct + P->saver_hysteresis_pct) saver = false;
    if (saver != g->saver) g->st.n_saver_changes++;
    g->saver = saver;

    struct sp_gov_action a = P->action[s];
    if (saver) {
        a.threads = SP_MIN(a.threads, P->saver.threads);
        a.duty = SP_MIN(a.duty, P->saver.duty);
        a.experts = SP_MIN(a.experts, P->saver.experts);
        if (P->saver.chunk && (!a.chunk || P->saver.chunk < a.chunk)) a.chunk = P->saver.chunk;
    }
    g->thread_cap = SP_MAX(1, (int)floor(a.threads * g->max_threads + 1e-9));
    g->duty = a.duty;
    uint32_t k = 0;
    if (g->model_k) {
        k = (uint32_t)SP_MAX(1.0, floor(a.experts * g->model_k + 0.5));
        if (k >= g->model_k) k = 0;
    }
    if (k != g->k.n_expert_used) g->st.n_expert_changes++;
    g->k.n_expert_used = k;
    const uint32_t chunk = a.chunk > 0 ? SP_MIN((uint32_t)a.chunk, g->n_batch) : g->n_batch;
    if (chunk != g->k.chunk) g->st.n_chunk_changes++;
    g->k.chunk = chunk;
}

static void set_threads(struct sp_governor *g, int n) {
    n = SP_MAX(1, SP_MIN(n, g->thread_cap));
    if (n != g->k.threads) g->st.n_thread_changes++;
    g->k.threads = n;
}

static bool est_fresh(const struct sp_governor *g, const struct thread_est *e, double now) {
    return e->t_s > 0 && (now - e->t_s < EST_FRESH_S || g->st.n_plans - e->plan < EST_FRESH_PLANS);
}

/* Step 4: the latency loop (decode), from the window since the last plan. */
static void plan_latency(struct sp_governor *g, double now) {
    const double T = target_ms(g);
    const int nt = g->k.threads;
    if (g->n_wk > 0 && nt <= MAX_TRACK_THREADS) {
        const double w = median(g->wk, g->n_wk);
        struct thread_est *e = &g->est[nt];
        e->work_ms = est_fresh(g, e, now) ? 0.5 * e->work_ms + 0.5 * w : w;
        e->t_s = now;
        e->plan = g->st.n_plans;
    }
    if (!(T > 0)) {
        set_threads(g, g->thread_cap);
        g->pacing_lat_ms = 0;
        return;
    }
    if (g->n_iv > 0) {
        const double m = median(g->iv, g->n_iv);
        g->pacing_lat_ms = SP_MAX(0.0, SP_MIN(T, g->pacing_lat_ms + GAIN * (T - m)));
    }
    /* threads: the fewest that meet the target with a margin, else the fastest known */
    int fit = 0, fastest = 0, stale = 0;
    for (int n = 1; n <= g->thread_cap && n <= MAX_TRACK_THREADS; n++) {
        const struct thread_est *e = &g->est[n];
        const bool fresh = est_fresh(g, e, now);
        if (!fresh) {
            if (!stale || abs(n - nt) < abs(stale - nt)) stale = n;
            continue;
        }
        if (!fit && e->work_ms <= 0.8 * T) fit = n;
        if (!fastest || e->work_ms < g->est[fastest].work_ms) fastest = n;
    }
    if (g->explore_wait > 0) g->explore_wait--;
    if (fit) {
        set_threads(g, fit);
    } else if (stale && g->explore_wait == 0) {
        set_threads(g, stale); /* measure a count not seen lately */
        g->explore_wait = 3;
    } else if (fastest) {
        set_threads(g, fastest);
    }
    if (g->k.threads != nt) g->pacing_lat_ms = 0; /* re-converge from the new work */
}

static void jnum(FILE *f, const char *key, double v, const char *fmt) {
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs("null", f);
}

static void trace_line(struct sp_governor *g, const char *event, double now) {
    g->st.n_plans++;
    FILE *f = g->trace;
    if (!f) return;
    fprintf(f, "{\"t_s\":%.4f,\"token\":%lld,\"event\":\"%s\",\"state\":\"%s\",\"saver\":%s,\"threads\":%d",
            now - g->t0, (long long)(g->st.n_tokens), event, sp_gov_state_name(g->state), g->saver ? "true" : "false",
            g->k.threads);
    fprintf(f, ",\"n_expert_used\":%u,\"chunk\":%u", g->k.n_expert_used ? g->k.n_expert_used : g->model_k, g->k.chunk);
    jnum(f, "pacing_ms", g->pacing_ms, "%.3f");
    jnum(f, "duty", g->duty, "%.3f");
    jnum(f, "ms_per_token", g->ms_per_token > 0 ? g->ms_per_token : NAN, "%.3f");
    jnum(f, "work_ms", g->work_ms > 0 ? g->work_ms : NAN, "%.3f");
    jnum(f, "target_ms", target_ms(g) > 0 ? target_ms(g) : NAN, "%.3f");
    jnum(f, "temp_c", g->temp_c, "%.2f");
    jnum(f, "headroom", g->headroom, "%.3f");
    jnum(f, "battery_pct", g->battery_pct, "%.1f");
    fprintf(f, ",\"charging\":%s", g->charging < 0 ? "null" : g->charging ? "true" : "false");
    jnum(f, "psi_some_avg10", g->rd.has_psi ? g->rd.psi_some_avg10 : NAN, "%.2f");
    jnum(f, "psi_full_avg10", g->rd.has_psi ? g->rd.psi_full_avg10 : NAN, "%.2f");
    jnum(f, "load_other", g->rd.has_load ? g->rd.load_other : NAN, "%.3f");
    jnum(f, "load_self", g->rd.has_load ? g->rd.load_self : NAN, "%.3f");
    jnum(f, "cpu_self_s", g->rd.cpu_self_s, "%.3f");
    fputs("}\n", f);
}

/* ---- the owner's calls ------------------------------------------------------ */

sp_status sp_gov_attach(struct sp_governor *g, const void *owner, int max_threads, uint32_t n_experts_used,
                        uint32_t n_batch, struct sp_gov_knobs *k) {
    pthread_mutex_lock(&g->mu);
    if (g->owner && g->owner != owner) {
        pthread_mutex_unlock(&g->mu);
        return sp_err(SP_E_STATE, "governor: already governing another session or batch");
    }
    g->owner = owner;
    g->max_threads = SP_MAX(1, max_threads);
    g->model_k = n_experts_used;
    g->n_batch = SP_MAX(1u, n_batch);
    g->thread_cap = g->max_threads;
    g->k = (struct sp_gov_knobs){g->max_threads, 0, g->n_batch};
    g->acc_t = sp_mono_s();
    g->planned = false;
    *k = g->k;
    pthread_mutex_unlock(&g->mu);
    return SP_OK;
}

void sp_gov_detach(struct sp_governor *g, const void *owner) {
    pthread_mutex_lock(&g->mu);
    if (g->owner == owner) {
        account(g, sp_mono_s());
        g->owner = NULL;
    }
    pthread_mutex_unlock(&g->mu);
}

/* A full plan: inputs, state, latency; one trace line. */
static void plan(struct sp_governor *g, const char *event, bool force, double now) {
    account(g, now);
    read_inputs(g, force || !g->planned);
    plan_state(g);
    if (!strcmp(event, "decode")) plan_latency(g, now);
    else set_threads(g, g->thread_cap); /* a prompt: all the threads the state allows */
    g->planned = true;
    (void)event;
}

void sp_gov_prefill_begin(struct sp_governor *g, uint32_t n, struct sp_gov_knobs *k) {
    pthread_mutex_lock(&g->mu);
    const double now = sp_mono_s();
    g->pf_total = n;
    g->pf_done = 0;
    g->pf_t0 = now;
    g->last_tok_start = 0; /* the gap before this prompt is no token's */
    g->n_iv = g->n_wk = 0;
    plan(g, "prefill", true, now);
    g->pacing_ms = 0;
    trace_line(g, "prefill", now);
    *k = g->k;
    pthread_mutex_unlock(&g->mu);
}

double sp_gov_prefill_pass(struct sp_governor *g, uint32_t n, double work_s, bool last, struct sp_gov_knobs *k) {
    pthread_mutex_lock(&g->mu);
    const double now = sp_mono_s();
    g->pf_done += n;
    g->st.n_prefill_tokens += n;
    const double per = n ? work_s * 1e3 / n : 0;
    g->pf_ms_per_tok = g->pf_ms_per_tok > 0 ? 0.5 * g->pf_ms_per_tok + 0.5 * per : per;
    double pace_ms = 0;
    if (!last) {
        pace_ms = work_s * 1e3 * (1.0 / g->duty - 1.0);
        if (g->p.target_ttft_s > 0) {
            /* what the rest of the prompt leaves room for, spread over its passes */
            const uint32_t left = g->pf_total > g->pf_done ? g->pf_total - g->pf_done : 0;
            const double left_ms = g->p.target_ttft_s * 1e3 - (now - g->pf_t0) * 1e3 - left * g->pf_ms_per_tok;
            const double passes = SP_MAX(1.0, ceil((double)left / SP_MAX(1u, g->k.chunk)));
            pace_ms = SP_MAX(0.0, SP_MIN(pace_ms, left_ms / passes));
        }
    }
    g->pacing_ms = pace_ms;
    if (last) account(g, now);
    *k = g->k;
    pthread_mutex_unlock(&g->mu);
    return pace_ms * 1e-3;
}

void sp_gov_token_begin(struct sp_governor *g) {
    pthread_mutex_lock(&g->mu);
    const double now = sp_mono_s();
    if (g->last_tok_start > 0 && g->n_iv < WINDOW) {
        g->iv[g->n_iv++] = (now - g->last_tok_start) * 1e3;
        g->ms_per_token = (now - g->last_tok_start) * 1e3;
    }
    g->last_tok_start = now;
    g->tok_start = now;
    pthread_mutex_unlock(&g->mu);
}

double sp_gov_token_end(struct sp_governor *g, double work_s, struct sp_gov_knobs *k) {
    pthread_mutex_lock(&g->mu);
    const double now = sp_mono_s();
    g->st.n_tokens++;
    g->work_ms = work_s * 1e3;
    if (g->n_wk < WINDOW) g->wk[g->n_wk++] = g->work_ms;
    bool planned = false;
    if (++g->since_plan >= g->pol.replan_tokens || !g->planned) {
        if (g->n_iv > 0) g->ms_per_token = median(g->iv, g->n_iv);
        plan(g, "decode", false, now);
        g->since_plan = 0;
        g->n_iv = g->n_wk = 0;
        planned = true;
    } else {
        account(g, now);
    }
    const double pace_th = g->work_ms * (1.0 / g->duty - 1.0);
    g->pacing_ms = SP_MAX(pace_th, g->pacing_lat_ms);
    if (planned) trace_line(g, "decode", now);
    *k = g->k;
    pthread_mutex_unlock(&g->mu);
    return g->pacing_ms * 1e-3;
}

void sp_gov_paced(struct sp_governor *g, double s) {
    pthread_mutex_lock(&g->mu);
    g->st.paced_s += s;
    pthread_mutex_unlock(&g->mu);
}

void sp_gov_sleep(double s) {
    if (!(s > 0)) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
