/*
 * test_governor.c -- the governor (src/sched/governor.c) and the step API on
 * the tiny models, sensors simulated with files the test writes:
 *  - the thread pool running on fewer of its threads, and back (results
 *    bit for bit what a pool of that many threads gives);
 *  - fewer MoE experts per token: routing keeps the top k with weights
 *    renormalised, all experts again gives the model's logits bit for bit;
 *  - the state table: a heat trace 35 -> 48 -> 58 -> 42 C steps normal ->
 *    warm -> hot -> normal with one change per crossing, a reading sitting
 *    on a threshold does not flap, the knobs of each state are applied;
 *  - battery saver below 20% and discharging (saver true in the trace, fewer
 *    threads and pacing), lifted when charging;
 *  - policy files and signals (headroom, temperature, target);
 *  - the latency loop: pacing converges so that ms per token nears a target;
 *  - sp_decode_begin / sp_decode_step: logits, cache and sampler bit for bit
 *    those of sp_decode, in one slice and in many.
 */
#include "api_internal.h"
#include "core/core.h"
#include "model/model.h"
#include "sched/pool.h"
#include "sched/sensors.h"

#include "test_util.h"

#include <sys/stat.h>

static char dir[4096];

static void write_file(const char *path, const char *text) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    CHECKF(f != NULL, "cannot write %s", tmp);
    if (!f) return;
    fputs(text, f);
    fclose(f);
    CHECK(rename(tmp, path) == 0);
}

static const char *path_in(const char *name) {
    static char buf[4][4200];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

/* ---- pool ---------------------------------------------------------------- */

struct sum_job {
    _Atomic int calls;
    int nth_seen[8];
};

static void sum_task(void *arg, int ith, int nth) {
    struct sum_job *j = arg;
    j->calls++;
    if (ith < 8) j->nth_seen[ith] = nth;
}

static void test_pool_active(void) {
    struct sp_pool *p;
    CHECK(sp_pool_init(4, &p) == SP_OK);
    CHECK(sp_pool_n_threads(p) == 4 && sp_pool_max_threads(p) == 4);
    for (int round = 0; round < 3; round++) {
        const int want[] = {4, 1, 2, 3, 4, 2};
        for (size_t w = 0; w < SP_ARRAY_LEN(want); w++) {
            sp_pool_set_active(p, want[w]);
            CHECK(sp_pool_n_threads(p) == want[w]);
            for (int it = 0; it < 50; it++) {
                struct sum_job j = {0};
                sp_pool_run(p, sum_task, &j);
                CHECKF(j.calls == want[w], "active %d: %d calls", want[w], (int)j.calls);
                for (int t = 0; t < want[w]; t++) CHECK(j.nth_seen[t] == want[w]);
                if (it % 10 == 0) {
                    sp_pool_idle(p);
                    usleep(2000);
                }
            }
        }
    }
    /* a different count before every run, workers racing to park and back */
    for (int it = 0; it < 20000; it++) {
        const int want = 1 + (int)((it * 7u + it / 3u) % 4u);
        sp_pool_set_active(p, want);
        struct sum_job j = {0};
        sp_pool_run(p, sum_task, &j);
        if (j.calls != want) {
            CHECKF(j.calls == want, "run %d, active %d: %d calls", it, want, (int)j.calls);
            break;
        }
        if (it % 1000 == 999) usleep(1500); /* some sleep, some spin */
    }
    sp_pool_set_active(p, 99);
    CHECK(sp_pool_n_threads(p) == 4);
    sp_pool_set_active(p, 0);
    CHECK(sp_pool_n_threads(p) == 1);
    sp_pool_free(p); /* parked workers exit too */
}

/* ---- helpers over the models ---------------------------------------------- */

static struct sp_model *load(const char *rel) {
    const char *p = need_fixture(rel);
    if (!p) return NULL;
    struct sp_model *m = NULL;
    CHECKF(sp_model_load(p, NULL, &m) == SP_OK, "%s: %s", p, sp_last_error());
    return m;
}

static struct sp_session *session(struct sp_model *m, int threads, int n_batch) {
    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = 256;
    sp.n_threads = threads;
    sp.n_batch = n_batch;
    sp.sampling.temp = 0;
    struct sp_session *s = NULL;
    CHECKF(sp_session_init(m, &sp, &s) == SP_OK, "%s", sp_last_error());
    return s;
}

static int n_vocab(const struct sp_model *m) {
    struct sp_model_info mi;
    sp_model_get_info(m, &mi);
    return mi.n_vocab;
}

static int32_t toks_of(struct sp_model *m, const char *text, int32_t *ids, int cap) {
    int32_t n = 0;
    CHECK(sp_tokenize(m, text, strlen(text), SP_TOKENIZE_ADD_BOS, ids, cap, &n) == SP_OK);
    return n;
}

static const char *PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
                            "with her friends and her dog, and one day she found a shiny red ball under a tree.";

/* ---- fewer experts ---------------------------------------------------------- */

static void test_moe_experts(void) {
    struct sp_model *m = load("models/stories260K-moe/stories260K-moe-f32.gguf");
    if (!m) return;
    struct sp_model_info mi;
    sp_model_get_info(m, &mi);
    CHECK(mi.n_experts_used >= 2);
    int32_t ids[256];
    const int32_t n = toks_of(m, PROMPT, ids, 256);
    const int V = n_vocab(m);
    struct sp_session *a = session(m, 1, 64), *b = session(m, 1, 64);
    if (!a || !b) goto out;
    CHECK(sp_decode(a, ids, n) == SP_OK);
    float *la = malloc((size_t)V * sizeof(float));
    memcpy(la, sp_get_logits(a), (size_t)V * sizeof(float));

    struct sp_governor *g;
    struct sp_governor_params gp = sp_governor_default_params();
    CHECK(sp_governor_init(&gp, &g) == SP_OK);
    struct sp_gov_policy pol = sp_gov_default_policy();
    pol.action[SP_GOV_HOT].experts = 0.5;
    pol.action[SP_GOV_HOT].threads = 1;
    pol.action[SP_GOV_HOT].duty = 1;
    pol.action[SP_GOV_HOT].chunk = 0;
    CHECK(sp_governor_set_policy(g, &pol) == SP_OK);
    CHECK(sp_governor_set_signal(g, SP_GOV_SIGNAL_TEMP_C, 60) == SP_OK);
    CHECK(sp_session_set_governor(b, g) == SP_OK);
    CHECK(sp_session_trace_routing(b, true) == SP_OK);
    CHECK(sp_decode(b, ids, n) == SP_OK);
    struct sp_governor_stats st;
    CHECK(sp_governor_get_stats(g, &st) == SP_OK);
    CHECK(st.state == SP_GOV_HOT && st.n_expert_used == mi.n_experts_used / 2);
    /* fewer experts: every routing decision holds k ids, renormalised weights, -1 after */
    const int k = mi.n_experts_used / 2;
    struct sp_moe_route r;
    CHECK(sp_session_routing(b, 0, (uint32_t)n - 1, &r));
    if (sp_session_routing(b, 0, (uint32_t)n - 1, &r)) {
        double sw = 0;
        for (int j = 0; j < k; j++) sw += r.weights[j];
        for (uint32_t j = (uint32_t)k; j < r.n_used; j++) CHECK(r.experts[j] == -1 && r.weights[j] == 0);
        CHECK(r.experts[0] >= 0);
        /* the kept expert is the most probable one */
        int best = 0;
        for (uint32_t e = 1; e < r.n_experts; e++)
            if (r.probs[e] > r.probs[best]) best = (int)e;
        CHECK(r.experts[0] == best);
        CHECKF(sw > 0, "weights sum %g", sw);
    }
    const float *lb = sp_get_logits(b);
    double diff = 0;
    for (int i = 0; i < V; i++) diff += fabs((double)lb[i] - la[i]);
    CHECKF(diff > 0, "half the experts changed nothing");
    /* all experts again: the model's logits bit for bit */
    CHECK(sp_governor_set_signal(g, SP_GOV_SIGNAL_TEMP_C, 30) == SP_OK);
    sp_session_reset(b);
    CHECK(sp_decode(b, ids, n) == SP_OK);
    CHECK(sp_governor_get_stats(g, &st) == SP_OK && st.state == SP_GOV_NORMAL);
    CHECK(memcmp(sp_get_logits(b), la, (size_t)V * sizeof(float)) == 0);
    CHECK(sp_session_set_governor(b, NULL) == SP_OK);
    sp_governor_free(g);
    free(la);
out:
    sp_session_free(a);
    sp_session_free(b);
    sp_model_free(m);
}

/* ---- the trace --------------------------------------------------------------- */

struct trace_row {
    char state[16];
    int saver, threads, n_expert_used;
    double pacing_ms, temp_c;
    long token;
};

/* The rows of a trace file (each must be one JSON object per line with the
 * fields the issue names). */
static int read_trace(const char *path, struct trace_row *rows, int cap) {
    char *text = test_read_file(path, NULL);
    CHECKF(text != NULL, "no trace at %s", path);
    if (!text) return 0;
    int n = 0;
    for (char *l = text; *l && n < cap;) {
        char *nl = strchr(l, '\n');
        if (nl) *nl = '\0';
        CHECKF(l[0] == '{' && l[strlen(l) - 1] == '}', "not an object: %s", l);
        static const char *const keys[] = {"\"t_s\":",     "\"token\":",  "\"state\":",        "\"saver\":",
                                           "\"threads\":", "\"n_expert_used\":", "\"pacing_ms\":", "\"ms_per_token\":",
                                           "\"temp_c\":",  "\"battery_pct\":", "\"load_other\":", "\"psi_some_avg10\":"};
        for (size_t k = 0; k < SP_ARRAY_LEN(keys); k++) CHECKF(strstr(l, keys[k]) != NULL, "%s missing in %s", keys[k], l);
        struct trace_row *r = &rows[n++];
        memset(r, 0, sizeof *r);
        const char *p;
        if ((p = strstr(l, "\"state\":\""))) sscanf(p + 9, "%15[a-z]", r->state);
        r->saver = strstr(l, "\"saver\":true") != NULL;
        if ((p = strstr(l, "\"threads\":"))) r->threads = atoi(p + 10);
        if ((p = strstr(l, "\"n_expert_used\":"))) r->n_expert_used = atoi(p + 16);
        if ((p = strstr(l, "\"pacing_ms\":"))) r->pacing_ms = atof(p + 12);
        if ((p = strstr(l, "\"token\":"))) r->token = atol(p + 8);
        r->temp_c = NAN;
        if ((p = strstr(l, "\"temp_c\":")) && p[9] != 'n') r->temp_c = atof(p + 9);
        if (!nl) break;
        l = nl + 1;
    }
    free(text);
    return n;
}

static int32_t last_np; /* prompt tokens of the last generate() */

/* Generate n tokens one at a time, calling at(i) before token i. */
static void generate(struct sp_session *s, struct sp_model *m, int n, void (*at)(int, void *), void *user) {
    int32_t ids[256];
    const int32_t np = toks_of(m, "Once upon a time", ids, 256);
    last_np = np;
    sp_session_reset(s);
    CHECK(sp_decode(s, ids, np) == SP_OK);
    for (int i = 0; i < n; i++) {
        if (at) at(i, user);
        int32_t t;
        CHECK(sp_sample(s, &t) == SP_OK);
        if (sp_decode(s, &t, 1) != SP_OK) break;
    }
}

static void heat_at(int i, void *user) {
    const char *tf = user;
    /* 35 -> 48 -> 58 -> 42 C, 40 tokens each, with readings that wobble by
     * 0.5 C (a sensor's noise) */
    static const int temps[] = {35000, 48000, 58000, 42000};
    if (i % 10 == 0) {
        char t[32];
        const int wobble = (i / 10) % 2 ? 500 : -500;
        snprintf(t, sizeof t, "%d\n", temps[SP_MIN(i / 40, 3)] + wobble);
        write_file(tf, t);
        usleep(3000); /* past the sensor interval */
    }
}

static void test_heat_trace(void) {
    struct sp_model *m = load("models/stories260K/stories260K-f32.gguf");
    if (!m) return;
    struct sp_session *s = session(m, 2, 64);
    const char *tf = path_in("temp"), *tr = path_in("heat.jsonl");
    write_file(tf, "35000\n");
    struct sp_governor_params gp = sp_governor_default_params();
    gp.thermal_file = tf;
    gp.trace_path = tr;
    gp.sensor_interval_s = 0.001;
    struct sp_governor *g;
    CHECK(sp_governor_init(&gp, &g) == SP_OK);
    CHECK(sp_session_set_governor(s, g) == SP_OK);
    generate(s, m, 160, heat_at, (void *)tf);
    struct sp_governor_stats st;
    CHECK(sp_governor_get_stats(g, &st) == SP_OK);
    CHECK(st.n_tokens == 160);
    CHECKF(st.n_prefill_tokens == last_np, "%lld prompt tokens governed, %d fed", (long long)st.n_prefill_tokens, (int)last_np);
    CHECKF(st.n_state_changes == 3, "%lld state changes (want normal->warm->hot->normal: 3)", (long long)st.n_state_changes);
    CHECK(st.state == SP_GOV_NORMAL);
    CHECK(fabs(st.max_temp_c - 58.5) < 1e-6);
    CHECK(st.state_s[SP_GOV_WARM] > 0 && st.state_s[SP_GOV_HOT] > 0);
    CHECK(st.paced_s > 0); /* warm and hot pace */
    CHECK(sp_session_set_governor(s, NULL) == SP_OK);
    sp_governor_free(g);

    struct trace_row rows[64];
    const int n = read_trace(tr, rows, 64);
    CHECKF(n >= 16, "%d trace rows", n);
    /* the sequence of states, collapsed */
    char seq[256] = "";
    int changes = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || strcmp(rows[i].state, rows[i - 1].state) != 0) {
            if (i) changes++;
            strcat(seq, rows[i].state);
            strcat(seq, " ");
        }
        if (!strcmp(rows[i].state, "hot")) {
            CHECK(rows[i].threads == 1);     /* hot: half the threads */
            CHECK(rows[i].pacing_ms > 0);    /* and a duty cycle */
        }
        if (!strcmp(rows[i].state, "normal") && i > 0) CHECK(rows[i].threads == 2);
    }
    CHECKF(!strcmp(seq, "normal warm hot normal "), "states: %s", seq);
    CHECK(changes == 3);
    sp_session_free(s);
    sp_model_free(m);
}

static void test_battery_saver(void) {
    struct sp_model *m = load("models/stories260K/stories260K-f32.gguf");
    if (!m) return;
    struct sp_session *s = session(m, 2, 64);
    const char *bf = path_in("battery"), *tr = path_in("saver.jsonl"), *tf = path_in("temp-cool");
    write_file(bf, "15\nDischarging\n");
    write_file(tf, "30000\n");
    struct sp_governor_params gp = sp_governor_default_params();
    gp.battery_file = bf;
    gp.thermal_file = tf;
    gp.trace_path = tr;
    gp.sensor_interval_s = 0.001;
    struct sp_governor *g;
    CHECK(sp_governor_init(&gp, &g) == SP_OK);
    CHECK(sp_session_set_governor(s, g) == SP_OK);
    generate(s, m, 30, NULL, NULL);
    struct sp_governor_stats st;
    CHECK(sp_governor_get_stats(g, &st) == SP_OK);
    CHECK(st.saver && st.threads == 1 && st.pacing_ms > 0 && st.state == SP_GOV_NORMAL);
    /* no status line: discharging, still saver */
    write_file(bf, "15\n");
    usleep(3000);
    generate(s, m, 20, NULL, NULL);
    CHECK(sp_governor_get_stats(g, &st) == SP_OK && st.saver);
    /* on the charger: lifted */
    write_file(bf, "15\nCharging\n");
    usleep(3000);
    generate(s, m, 20, NULL, NULL);
    CHECK(sp_governor_get_stats(g, &st) == SP_OK);
    CHECK(!st.saver && st.threads == 2 && st.pacing_ms == 0);
    /* "Not charging" at 21% after being above: hysteresis keeps it off (20 + 3) until below 20 */
    write_file(bf, "19\nNot charging\n");
    usleep(3000);
    generate(s, m, 20, NULL, NULL);
    CHECK(sp_governor_get_stats(g, &st) == SP_OK && st.saver);
    write_file(bf, "21\nDischarging\n");
    usleep(3000);
    generate(s, m, 20, NULL, NULL);
    CHECK(sp_governor_get_stats(g, &st) == SP_OK && st.saver); /* within the hysteresis */
    write_file(bf, "24\nDischarging\n");
    usleep(3000);
    generate(s, m, 20, NULL, NULL);
    CHECK(sp_governor_get_stats(g, &st) == SP_OK && !st.saver);
    CHECK(st.n_saver_changes == 4);
    CHECK(sp_session_set_governor(s, NULL) == SP_OK);
    sp_governor_free(g);

    struct trace_row rows[128];
    const int n = read_trace(tr, rows, 128);
    int saver_rows = 0, saver_paced = 0;
    for (int i = 0; i < n; i++) {
        if (rows[i].saver) {
            saver_rows++;
            saver_paced += rows[i].threads == 1 && rows[i].pacing_ms > 0;
        }
    }
    CHECKF(saver_rows > 0 && saver_paced > 0, "%d saver rows, %d with fewer threads and pacing", saver_rows, saver_paced);
    sp_session_free(s);
    sp_model_free(m);
}

/* ---- policy files, signals ----------------------------------------------------- */

static void test_policy(void) {
    struct sp_governor *g;
    struct sp_governor_params gp = sp_governor_default_params();
    const char *pf = path_in("policy.txt");
    write_file(pf, "# a cooler device\nwarm.enter_c = 40\nhot.enter_c 50\ncritical.duty = 0.2\nsaver.below_pct=30\n"
                   "replan_tokens = 5\nhot.chunk = 16\n");
    gp.policy_file = pf;
    CHECKF(sp_governor_init(&gp, &g) == SP_OK, "%s", sp_last_error());
    struct sp_gov_policy p;
    CHECK(sp_governor_get_policy(g, &p) == SP_OK);
    CHECK(p.enter_c[SP_GOV_WARM] == 40 && p.enter_c[SP_GOV_HOT] == 50 && p.enter_c[SP_GOV_CRITICAL] == 70);
    CHECK(p.action[SP_GOV_CRITICAL].duty == 0.2 && p.saver_below_pct == 30 && p.replan_tokens == 5);
    CHECK(p.action[SP_GOV_HOT].chunk == 16);
    /* bad files: the line is named */
    write_file(pf, "warm.enter_c = 40\nwarm.bogus = 1\n");
    CHECK(sp_governor_load_policy(g, pf) == SP_E_INVALID && strstr(sp_last_error(), ":2:"));
    write_file(pf, "hot.enter_c = 30\n"); /* below warm */
    CHECK(sp_governor_load_policy(g, pf) == SP_E_INVALID);
    write_file(pf, "hot.duty = 0\n");
    CHECK(sp_governor_load_policy(g, pf) == SP_E_INVALID);
    write_file(pf, "hot.duty = abc\n");
    CHECK(sp_governor_load_policy(g, pf) == SP_E_INVALID);
    CHECK(sp_governor_load_policy(g, path_in("no-such")) == SP_E_IO);
    CHECK(sp_governor_get_policy(g, &p) == SP_OK && p.enter_c[SP_GOV_WARM] == 40); /* unchanged by the failures */
    /* the API */
    p = sp_gov_default_policy();
    CHECK(p.enter_c[1] == 45 && p.enter_c[2] == 55 && p.enter_c[3] == 70 && p.saver_below_pct == 20 &&
          p.replan_tokens == 10);
    p.action[SP_GOV_WARM].threads = 0;
    CHECK(sp_governor_set_policy(g, &p) == SP_E_INVALID);
    CHECK(sp_governor_set_signal(g, SP_GOV_SIGNAL_COUNT, 1) == SP_E_INVALID);
    CHECK(sp_governor_set_signal(g, SP_GOV_SIGNAL_CHARGING, 2) == SP_E_INVALID);
    CHECK(sp_governor_set_signal(g, SP_GOV_SIGNAL_BATTERY_PCT, 101) == SP_E_INVALID);
    CHECK(sp_governor_set_signal(g, SP_GOV_SIGNAL_THERMAL_HEADROOM, 0.9) == SP_OK);
    sp_governor_free(g);
    CHECK(strcmp(sp_gov_state_name(SP_GOV_CRITICAL), "critical") == 0);

    /* headroom pushed by the app drives the state; a second session cannot share it */
    struct sp_model *m = load("models/stories260K/stories260K-f32.gguf");
    if (!m) return;
    struct sp_session *s = session(m, 2, 64), *s2 = session(m, 1, 64);
    gp = sp_governor_default_params();
    gp.thermal_file = path_in("no-thermal"); /* absent: unknown */
    CHECK(sp_governor_init(&gp, &g) == SP_OK);
    CHECK(sp_session_set_governor(s, g) == SP_OK);
    CHECK(sp_session_set_governor(s2, g) == SP_E_STATE);
    CHECK(sp_governor_set_signal(g, SP_GOV_SIGNAL_THERMAL_HEADROOM, 1.2) == SP_OK);
    generate(s, m, 12, NULL, NULL);
    struct sp_governor_stats st;
    CHECK(sp_governor_get_stats(g, &st) == SP_OK && st.state == SP_GOV_CRITICAL && isnan(st.max_temp_c));
    CHECK(sp_governor_set_signal(g, SP_GOV_SIGNAL_THERMAL_HEADROOM, -1) == SP_OK);
    CHECK(sp_governor_set_signal(g, SP_GOV_SIGNAL_TEMP_C, 50) == SP_OK);
    generate(s, m, 12, NULL, NULL);
    CHECK(sp_governor_get_stats(g, &st) == SP_OK && st.state == SP_GOV_WARM && st.max_temp_c == 50);
    sp_session_free(s); /* detaches */
    CHECK(sp_session_set_governor(s2, g) == SP_OK);
    CHECK(sp_session_set_governor(s2, NULL) == SP_OK);
    sp_governor_free(g);
    sp_session_free(s2);
    sp_model_free(m);
}

/* ---- the latency loop ----------------------------------------------------------- */

static void test_latency_target(void) {
    struct sp_model *m = load("models/stories260K/stories260K-f32.gguf");
    if (!m) return;
    struct sp_session *s = session(m, 1, 64);
    struct sp_governor_params gp = sp_governor_default_params();
    gp.target_ms = 4.0; /* far above stories260K's work per token: met by pacing */
    gp.thermal_file = path_in("no-thermal");
    struct sp_governor *g;
    CHECK(sp_governor_init(&gp, &g) == SP_OK);
    CHECK(sp_session_set_governor(s, g) == SP_OK);
    int32_t ids[64];
    const int32_t np = toks_of(m, "Once upon a time", ids, 64);
    CHECK(sp_decode(s, ids, np) == SP_OK);
    double t_last = 0, iv[300];
    int n_iv = 0;
    for (int i = 0; i < 250; i++) {
        int32_t t;
        CHECK(sp_sample(s, &t) == SP_OK);
        const double now = sp_mono_s();
        if (i >= 100 && t_last > 0) iv[n_iv++] = (now - t_last) * 1e3;
        t_last = now;
        if (sp_decode(s, &t, 1) != SP_OK) break;
    }
    /* the median of the last 150 intervals near the target (25%: this is a
     * functional check on a shared machine; bench/governor.sh measures) */
    for (int i = 1; i < n_iv; i++)
        for (int j = i; j > 0 && iv[j] < iv[j - 1]; j--) {
            double x = iv[j];
            iv[j] = iv[j - 1];
            iv[j - 1] = x;
        }
    const double med = n_iv ? iv[n_iv / 2] : 0;
    CHECKF(fabs(med - 4.0) < 1.0, "median ms/token %.3f, target 4", med);
    struct sp_governor_stats st;
    CHECK(sp_governor_get_stats(g, &st) == SP_OK && st.pacing_ms > 1.0);
    CHECK(sp_session_set_governor(s, NULL) == SP_OK);
    sp_governor_free(g);
    sp_session_free(s);
    sp_model_free(m);
}

/* ---- the step API --------------------------------------------------------------- */

static void step_vs_decode(const char *rel, int threads, int n_batch, double budget_ms, bool many_slices) {
    struct sp_model *m = load(rel);
    if (!m) return;
    const int V = n_vocab(m);
    int32_t ids[256];
    const int32_t n = toks_of(m, PROMPT, ids, 256);
    struct sp_session *a = session(m, threads, n_batch), *b = session(m, threads, n_batch);
    if (!a || !b) goto out;
    CHECK(sp_decode(a, ids, n) == SP_OK);
    bool done = false;
    int steps = 0;
    CHECK(sp_decode_step(b, budget_ms, &done) == SP_E_STATE); /* nothing begun */
    CHECK(sp_decode_begin(b, ids, n) == SP_OK);
    CHECK(sp_decode_begin(b, ids, n) == SP_E_STATE);
    CHECK(sp_decode(b, ids, 1) == SP_E_STATE);
    while (!done && steps < 100000) {
        CHECK(sp_decode_step(b, budget_ms, &done) == SP_OK);
        steps++;
    }
    CHECKF(many_slices ? steps > 10 : steps >= 1, "%s: %d steps", rel, steps);
    CHECK(sp_session_n_past(b) == n);
    CHECKF(memcmp(sp_get_logits(a), sp_get_logits(b), (size_t)V * sizeof(float)) == 0, "%s: prompt logits differ", rel);
    /* then decode tokens one at a time, each through steps: the same greedy continuation */
    for (int i = 0; i < 20; i++) {
        int32_t ta, tb;
        CHECK(sp_sample(a, &ta) == SP_OK && sp_sample(b, &tb) == SP_OK);
        CHECK(ta == tb);
        CHECK(sp_decode(a, &ta, 1) == SP_OK);
        CHECK(sp_decode_begin(b, &tb, 1) == SP_OK);
        done = false;
        while (!done) CHECK(sp_decode_step(b, budget_ms, &done) == SP_OK);
        CHECK(memcmp(sp_get_logits(a), sp_get_logits(b), (size_t)V * sizeof(float)) == 0);
    }
    /* cancel: a pass under way is dropped, the session goes on */
    const int32_t past = sp_session_n_past(b);
    CHECK(sp_decode_begin(b, ids, 8) == SP_OK);
    CHECK(sp_decode_step(b, 0.000001, &done) == SP_OK);
    sp_decode_cancel(b);
    CHECK(sp_session_n_past(b) <= past + 8);
    CHECK(sp_session_truncate(b, past) == SP_OK);
    int32_t t;
    CHECK(sp_sample(b, &t) == SP_E_STATE); /* no logits after a cancel */
out:
    sp_session_free(a);
    sp_session_free(b);
    sp_model_free(m);
}

static void test_steps(void) {
    /* one slice holds everything */
    step_vs_decode("models/stories260K/stories260K-f32.gguf", 2, 64, 1000, false);
    /* a tiny budget: a stage or a 64-row block per slice, passes of n_batch */
    step_vs_decode("models/stories260K/stories260K-q4_0.gguf", 2, 4, 0.000001, true);
    step_vs_decode("models/stories260K/stories260K-f32.gguf", 2, 64, 0.000001, true);
    step_vs_decode("models/tiny-qwen/tiny-qwen3-f32.gguf", 1, 16, 0.000001, true);
    /* MoE: passes as long as one layer's budget holds (1 token here), and
     * passes of other sizes than sp_decode's batches round differently, so
     * they match sp_decode bit for bit only with n_batch 1 */
    step_vs_decode("models/tiny-qwen/tiny-qwen3moe-f32.gguf", 2, 1, 0.000001, true);
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/sp-governor-%d", scratch_dir(), (int)getpid());
    mkdir(dir, 0755);
    test_pool_active();
    test_moe_experts();
    test_policy();
    test_heat_trace();
    test_battery_saver();
    test_latency_target();
    test_steps();
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return test_report("test_governor");
}
