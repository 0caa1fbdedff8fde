/*
 * main.c -- sparrow-server, the OpenAI-compatible HTTP server that `sparrow
 * serve` runs (tools/cli/cmd_serve.c execs it with its arguments): options
 * as llama-server spells them, then the scheduler (sched.c) and the HTTP
 * side (http.c).  docs/SERVER.md.  A binary of its own so that libmicrohttpd
 * and what it links (GnuTLS, p11-kit, ...) are not loaded into every other
 * command, whose memory budgets count the process's resident set.
 */
#include "server.h"

#include "../common/cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define DEF_PORT 8080
#define DEF_SLOTS 1
#define DEF_CTX 4096
#define DEF_MAX_BODY (1u << 20)

static void help(FILE *f) {
    fprintf(f,
            "usage: sparrow serve -m MODEL [options]\n"
            "\n"
            "Serve the model over HTTP with OpenAI's API: POST /v1/chat/completions,\n"
            "POST /v1/completions (streamed or not), GET /v1/models, GET /health,\n"
            "POST /tokenize, /detokenize, /apply-template, GET /props, GET /slots,\n"
            "POST /slots/{id}?action=save|restore|erase, GET /metrics.  N slots share\n"
            "the model and its memory account; every step decodes one token of every\n"
            "active slot in one batched forward pass.\n"
            "\n"
            "options:\n"
            "  -m, --model FILE        the model (GGUF or llama2.c .bin)\n"
            "      --host ADDR         address to listen on (default: 127.0.0.1)\n"
            "      --port N            TCP port; 0 = any free one, printed (default: %d)\n"
            "  -np, --parallel N       slots: requests decoded at once (default: %d)\n"
            "  -c, --ctx-size N        context of each slot (default: %d)\n"
            "  -b, --batch N           tokens one step decodes in all, prompts' chunks\n"
            "                          included (default: 128, at least -np)\n"
            "  -t, --threads N         threads (default: the cores)\n"
            CLI_HELP_CACHE_TYPES
            "      --mem-budget SIZE   bytes Sparrow may keep resident (weights, KV, scratch)\n"
            "      --chat-template T   a family name (chatml, llama3, ...) or Jinja source;\n"
            "                          default: the model's tokenizer.chat_template\n"
            "      --jinja             run templates with the Jinja interpreter (default:\n"
            "                          the named formatters, as llama-server without --jinja)\n"
            "      --alias NAME        the model's name in the API (default: the file name)\n"
            "      --api-key KEY       require \"Authorization: Bearer KEY\" (not on /health);\n"
            "                          may be given more than once\n"
            "      --api-key-file F    the accepted keys, one a line (empty lines skipped)\n"
            "      --slot-save-path DIR  a folder for POST /slots/{id}?action=save|restore\n"
            "      --metrics           serve GET /metrics (Prometheus text format)\n"
            "      --timeout S         a request's time limit in seconds (default: none)\n"
            "      --max-body BYTES    largest request body; more is refused with 413\n"
            "                          (default: %u)\n"
            "  -n, --n-predict N       max_tokens cap and default (default: the context)\n"
            CLI_HELP_GOVERNOR
            "                          (serve: each batched step counts as a token)\n"
            "  -v, --verbose           log more\n",
            DEF_PORT, DEF_SLOTS, DEF_CTX, DEF_MAX_BODY);
}

/* Add a copy of key to the accepted ones. */
static void add_key(struct srv_config *c, const char *key_arg) {
    char *key = strdup(key_arg);
    const char **k = realloc(c->api_keys, (size_t)(c->n_api_keys + 1) * sizeof *k);
    if (!k || !key) usage_error("serve", "out of memory");
    k[c->n_api_keys++] = key;
    c->api_keys = k;
}

/* --api-key-file: one key a line; surrounding blanks and empty lines skipped. */
static void read_key_file(struct srv_config *c, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) usage_error("serve", "--api-key-file %s: %s", path, strerror(errno));
    char line[4096];
    int n = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n' && !feof(f))
            usage_error("serve", "--api-key-file %s: line %d is longer than %zu bytes", path, lineno, sizeof line - 2);
        char *b = line, *e = line + len;
        while (b < e && (*b == ' ' || *b == '\t')) b++;
        while (e > b && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) e--;
        if (e == b) continue;
        *e = '\0';
        add_key(c, b);
        n++;
    }
    const bool err = ferror(f);
    fclose(f);
    if (err) usage_error("serve", "--api-key-file %s: read error", path);
    if (!n) usage_error("serve", "--api-key-file %s: no key in it", path);
}

int main(int argc, char **argv) {
    struct argp a = {.cmd = "serve", .argc = argc, .argv = argv};
    struct srv sv;
    memset(&sv, 0, sizeof sv);
    struct srv_config *c = &sv.cfg;
    c->host = "127.0.0.1";
    c->port = DEF_PORT;
    c->n_slots = DEF_SLOTS;
    c->sp = sp_session_default_params();
    c->sp.n_ctx = DEF_CTX;
    c->sp.n_threads = default_threads();
    c->max_body = DEF_MAX_BODY;
    long long n_predict = -1;
    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, "-h", "--help")) {
            help(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, NULL, "--list-cache-types")) {
            opt_no_value(&a);
            return list_cache_types();
        } else if (opt_is(&a, "-m", "--model")) {
            c->model_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--host")) {
            c->host = opt_value(&a);
        } else if (opt_is(&a, NULL, "--port")) {
            c->port = (int)parse_int(&a, opt_value(&a), 0, 65535);
        } else if (opt_is(&a, "-np", "--parallel")) {
            c->n_slots = (int)parse_int(&a, opt_value(&a), 1, 256);
        } else if (session_opt(&a, &c->sp)) {
            /* -t -c -b -ctk -ctv --kv-type */
        } else if (opt_is(&a, NULL, "--mem-budget")) {
            c->mem_budget = parse_size(&a, opt_value(&a));
        } else if (opt_is(&a, NULL, "--chat-template")) {
            c->chat_template = opt_value(&a);
        } else if (opt_is(&a, NULL, "--jinja")) {
            opt_no_value(&a);
            c->jinja = true;
        } else if (opt_is(&a, NULL, "--alias")) {
            c->alias = opt_value(&a);
        } else if (opt_is(&a, NULL, "--api-key")) {
            const char *k = opt_value(&a);
            if (!*k) usage_error("serve", "--api-key: an empty key");
            add_key(c, k);
        } else if (opt_is(&a, NULL, "--api-key-file")) {
            read_key_file(c, opt_value(&a));
        } else if (opt_is(&a, NULL, "--slot-save-path")) {
            c->slot_save_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--metrics")) {
            opt_no_value(&a);
            c->metrics = true;
        } else if (opt_is(&a, NULL, "--timeout")) {
            c->timeout_s = parse_num(&a, opt_value(&a), 0, 1e9, 0);
        } else if (opt_is(&a, NULL, "--max-body")) {
            c->max_body = (size_t)parse_int(&a, opt_value(&a), 1024, 64ll << 20);
        } else if (opt_is(&a, "-n", "--n-predict")) {
            n_predict = parse_int(&a, opt_value(&a), -1, INT32_MAX);
        } else if (gov_opt(&a, &c->gov)) {
            /* --governor and its options */
        } else {
            last_opt(&a, "options only; the model goes after -m");
        }
    }
    gov_opts_check("serve", &c->gov);
    if (!c->model_path) usage_error("serve", "no model: give one with -m FILE");
    if (c->sp.n_ctx == 0) c->sp.n_ctx = DEF_CTX;
    if (c->sp.n_ctx < 2) usage_error("serve", "-c %d: a slot needs at least 2 tokens", c->sp.n_ctx);
    if (c->sp.n_batch && c->sp.n_batch < c->n_slots)
        usage_error("serve", "-b %d is fewer than -np %d: a step takes one token of every slot", c->sp.n_batch,
                    c->n_slots);
    if (c->slot_save_path) {
        struct stat st;
        if (!*c->slot_save_path) usage_error("serve", "--slot-save-path: an empty path");
        if (stat(c->slot_save_path, &st) != 0 && (errno != ENOENT || mkdir(c->slot_save_path, 0755) != 0))
            usage_error("serve", "--slot-save-path %s: %s", c->slot_save_path, strerror(errno));
        else if (stat(c->slot_save_path, &st) != 0 || !S_ISDIR(st.st_mode))
            usage_error("serve", "--slot-save-path %s: not a folder", c->slot_save_path);
    }
    c->max_tokens_cap = n_predict < 0 || n_predict > c->sp.n_ctx ? c->sp.n_ctx : (int32_t)n_predict;
    if (c->max_tokens_cap < 1) c->max_tokens_cap = 1;
    if (!c->alias) {
        const char *slash = strrchr(c->model_path, '/');
        c->alias = slash ? slash + 1 : c->model_path;
    }
    if (strcmp(c->host, "127.0.0.1") && strcmp(c->host, "localhost") && strcmp(c->host, "::1") && !c->n_api_keys)
        fprintf(stderr, "sparrow serve: warning: listening on %s without --api-key: anyone who can reach it may use it\n",
                c->host);
#ifdef __GLIBC__
    /* One thread per connection: glibc would give each its own malloc arena
     * and keep what they freed, so the resident set would creep up with the
     * connections' peak; the HTTP threads allocate little and the token path
     * nothing, so one shared arena costs no contention worth the name. */
    mallopt(M_ARENA_MAX, 1);
    /* Fixed thresholds: glibc would otherwise raise the mmap threshold to
     * the size of the largest mmap'd block freed (up to 32 MiB), and from
     * then on serve such blocks -- request bodies, tokenized prompts -- from
     * the heap, whose freed pages stay resident.  With the threshold fixed
     * they are mapped and unmapped; the rest of the heap is handed back by
     * malloc_trim as connections end (http.c). */
    mallopt(M_MMAP_THRESHOLD, 128 << 10);
    mallopt(M_TRIM_THRESHOLD, 256 << 10);
#endif
    sp_log_set(cli_log, &log_verbose);
    sp_init();
    int rc = EXIT_RUNTIME;
    if (srv_start(&sv) == 0) rc = srv_http_run(&sv);
    srv_stop(&sv);
    srv_free(&sv);
    for (int i = 0; i < c->n_api_keys; i++) free((void *)c->api_keys[i]);
    free(c->api_keys);
    return rc;
}
