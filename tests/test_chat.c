/*
 * test_chat.c -- chat templates: the named formatters and the Jinja
 * interpreter against llama.cpp's renderings of 24 real templates
 * ($SPARROW_SHARED/peer-tests/chat-template/cases.json; the counts are
 * printed and must meet issue 16's thresholds), the interpreter's language
 * features one by one, hostile templates (refused with a line and column,
 * never a crash), the API's buffer contract and the model's template read
 * from a GGUF file, and special tokens in a rendered prompt.
 */
#include "sparrow.h"

#include "chat/chat.h"
#include "format/gguf.h"
#include "format/model_file.h"
#include "test_util.h"

#include <cjson/cJSON.h>

static void quiet(enum sp_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

/* Render into a malloc'd string (NULL on failure; *rc gets the status). */
static char *render(const struct sp_model *m, const struct sp_chat_params *p, const struct sp_chat_message *msgs,
                    size_t n, sp_status *rc) {
    size_t len = 0;
    *rc = sp_chat_apply(m, p, msgs, n, NULL, 0, &len);
    if (*rc != SP_E_BUFFER) return NULL;
    char *buf = malloc(len + 1);
    size_t len2 = 0;
    *rc = sp_chat_apply(m, p, msgs, n, buf, len + 1, &len2);
    if (*rc != SP_OK || len2 != len) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Show where two strings first differ. */
static void show_diff(const char *name, const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    fprintf(stderr, "  %s: differs at byte %zu\n    want: ", name, i);
    for (size_t k = i > 20 ? i - 20 : 0; want[k] && k < i + 40; k++) fputc(want[k] == '\n' ? '|' : want[k], stderr);
    fprintf(stderr, "\n    got:  ");
    for (size_t k = i > 20 ? i - 20 : 0; got[k] && k < i + 40; k++) fputc(got[k] == '\n' ? '|' : got[k], stderr);
    fputc('\n', stderr);
}

/* ---- the peer's vectors ------------------------------------------------------------ */

static void test_cases(void) {
    const char *path = need_fixture("peer-tests/chat-template/cases.json");
    if (!path) return;
    char *text = test_read_file(path, NULL);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECKF(root != NULL, "cannot read %s", path);
    if (!root) {
        free(text);
        return;
    }
    const cJSON *conv = cJSON_GetObjectItem(root, "conversation"), *cases = cJSON_GetObjectItem(root, "cases");
    CHECK(cJSON_IsArray(conv) && cJSON_IsArray(cases));
    int n_cases = 0, recognised = 0, named_ok = 0, jinja_cases = 0, jinja_ok = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        n_cases++;
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
        const char *tmpl = cJSON_GetStringValue(cJSON_GetObjectItem(c, "template"));
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(c, "expected_output"));
        const char *want_j = cJSON_GetStringValue(cJSON_GetObjectItem(c, "expected_output_jinja"));
        const char *bos = cJSON_GetStringValue(cJSON_GetObjectItem(c, "bos_token"));
        const char *eos = cJSON_GetStringValue(cJSON_GetObjectItem(c, "eos_token"));
        const bool jinja = cJSON_IsTrue(cJSON_GetObjectItem(c, "supported_with_jinja"));
        const cJSON *extra = cJSON_GetObjectItem(c, "extra_conversation");
        if (!name || !tmpl || !want || !want_j || !bos || !eos) {
            CHECKF(0, "case %d is missing a field", n_cases);
            continue;
        }
        struct sp_chat_message msgs[32];
        size_t n = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, conv) if (n < 32) msgs[n++] = (struct sp_chat_message){
            cJSON_GetStringValue(cJSON_GetObjectItem(m, "role")), cJSON_GetStringValue(cJSON_GetObjectItem(m, "content"))};
        cJSON_ArrayForEach(m, extra) if (n < 32) msgs[n++] = (struct sp_chat_message){
            cJSON_GetStringValue(cJSON_GetObjectItem(m, "role")), cJSON_GetStringValue(cJSON_GetObjectItem(m, "content"))};

        struct sp_chat_params p = sp_chat_default_params();
        p.tmpl = tmpl;
        p.bos_token = bos;
        p.eos_token = eos;
        sp_status rc;
        const char *fam = sp_chat_detect_template(tmpl);
        if (fam) {
            recognised++;
            p.engine = SP_CHAT_NAMED;
            char *got = render(NULL, &p, msgs, n, &rc);
            if (got && strcmp(got, want) == 0) {
                named_ok++;
            } else {
                fprintf(stderr, "named %s (%s): %s\n", name, fam, got ? "wrong output" : sp_last_error());
                if (got) show_diff(name, want, got);
            }
            free(got);
        } else {
            fprintf(stderr, "named %s: not recognised\n", name);
        }
        if (jinja) {
            jinja_cases++;
            p.engine = SP_CHAT_JINJA;
            const char *w = *want_j ? want_j : want;
            char *got = render(NULL, &p, msgs, n, &rc);
            if (got && strcmp(got, w) == 0) {
                jinja_ok++;
            } else {
                fprintf(stderr, "jinja %s: %s\n", name, got ? "wrong output" : sp_last_error());
                if (got) show_diff(name, w, got);
            }
            free(got);
        }
    }
    printf("chat-template cases: %d; named formatters recognise %d (need >= 20) and reproduce %d of those; "
           "Jinja reproduces %d of %d supported_with_jinja (need >= 22)\n",
           n_cases, recognised, named_ok, jinja_ok, jinja_cases);
    CHECKF(n_cases == 24, "%d cases", n_cases);
    CHECKF(recognised >= 20, "named formatters recognise %d of %d", recognised, n_cases);
    CHECKF(named_ok == recognised, "named formatters reproduce %d of the %d they recognise", named_ok, recognised);
    CHECKF(jinja_ok >= 22, "Jinja reproduces %d of %d", jinja_ok, jinja_cases);
    cJSON_Delete(root);
    free(text);
}


/* ---- the interpreter, feature by feature ------------------------------------------- */

/* Render src with the variables of vars_json (a JSON object, or NULL) under
 * lim (NULL = defaults).  Returns the output (malloc'd) or NULL with *err. */
static char *jinja(const char *src, const char *vars_json, const struct sp_jinja_limits *lim,
                   struct sp_jinja_error *err) {
    struct sp_jinja_program *p = NULL;
    memset(err, 0, sizeof *err);
    if (sp_jinja_parse(src, strlen(src), lim, &p, err) != SP_OK) return NULL;
    struct sp_jinja_ctx ctx;
    char *out = NULL, *copy = NULL;
    size_t len = 0;
    if (sp_jinja_ctx_init(&ctx, lim)) {
        struct sp_jv v;
        bool ok = true;
        if (vars_json) {
            ok = sp_jv_parse_json(&ctx.arena, vars_json, strlen(vars_json), "vars", &v, err) && v.type == SP_JV_DICT;
            for (size_t i = 0; ok && i < v.u.d->n; i++) ok = sp_jdict_set(&ctx.arena, ctx.vars, v.u.d->keys[i], v.u.d->vals[i]);
        }
        if (ok && sp_jinja_render(p, &ctx, &out, &len, err) == SP_OK) {
            copy = malloc(len + 1);
            memcpy(copy, out, len + 1);
        }
        sp_free(out);
        sp_jinja_ctx_free(&ctx);
    }
    sp_jinja_program_free(p);
    return copy;
}

static const struct {
    const char *src, *vars, *want;
} k_features[] = {
    /* expressions, operators, literals */
    {"{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 2 ** 10 }}|{{ 7 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}",
     NULL, "7|9|1024|3.5|3|-4|1|2"},
    {"{{ 'a' ~ 1 ~ none }}|{{ [1, 2] + [3] }}|{{ 'ab' * 2 }}|{{ -3|abs }}", NULL, "a1None|[1, 2, 3]|abab|3"},
    {"{{ true }} {{ false }} {{ none }} {{ 1.0 }} {{ 0.1 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 2.50 }}", NULL,
     "True False None 1.0 0.1 1e+20 1.5e-07 2.5"},
    {"{{ {'a': 1, 'b': 'x\\'y'} }}|{{ ['q', \"it's\"] }}|{{ (1, 2)|length }}", NULL, "{'a': 1, 'b': \"x'y\"}|['q', \"it's\"]|2"},
    {"{{ 'a\\nb\\t\\u00e9\\x41' }}", NULL, "a\nb\t\xc3\xa9" "A"},
    {"{{ 1 < 2 < 3 }}{{ 3 < 2 < 1 }}{{ 'b' > 'a' }}{{ 1 == 1.0 }}{{ [1, [2]] == [1, [2]] }}", NULL, "TrueFalseTrueTrueTrue"},
    {"{{ none or 'x' }}|{{ 'a' and 'b' }}|{{ 0 or 0 }}|{{ not 0 }}", NULL, "x|b|0|True"},
    {"{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}{{ 'z' in 'abc' }}", NULL,
     "TrueTrueTrueTrueFalse"},
    {"{{ 'y' if x else 'n' }}{{ 'y' if not x else 'n' }}[{{ 'a' if false }}]", "{\"x\": 1}", "yn[]"},
    {"{{ '%s-%d-%.2f' % ('a', 3, 1.5) }}|{{ '%05d' % 42 }}|{{ '%(n)s!' % {'n': 'hi'} }}|{{ '{} {}'.format(1, 'b') }}",
     NULL, "a-3-1.50|00042|hi!|1 b"},
    /* undefined is lenient: empty output, chains stay undefined */
    {"[{{ x }}][{{ x.y.z }}]{{ x is defined }}{{ d['a'] is defined }}{{ d.k }}", "{\"d\": {\"k\": 5}}", "[][]FalseFalse5"},
    /* statements */
    {"{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %}", "{\"x\": 2}", "two"},
    {"{% for i in range(3) %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
     "{{ loop.revindex }};{% endfor %}",
     NULL, "01TrueFalse33;12FalseFalse32;23FalseTrue31;"},
    {"{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in range(10) if x is odd %}{{ x }}{% endfor %}", NULL,
     "empty|13579"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
     "{\"d\": {\"a\": 1, \"b\": 2}}", "a=1,b=2,ab"},
    {"{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}"
     "{{ i }}{% endfor %}",
     NULL, "0134"},
    {"{% for i in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{{ loop.previtem }}{% endfor %}", NULL, "ab1a2"},
    {"{% set x = 1 %}{% for i in range(2) %}{% set x = 5 %}{% endfor %}{{ x }}", NULL, "1"},
    {"{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", NULL, "6"},
    {"{% set a, b = [1, 2] %}{{ b }}{{ a }}{% set s %}a{{ 1 }}b{% endset %}[{{ s }}]", NULL, "21[a1b]"},
    {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }}",
     NULL, "Hi A! Hi B?"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", NULL, "321"},
    {"{% set l = [] %}{% set _ = l.append(1) %}{% do l.append(2) %}{{ l }}{{ l.pop() }}{{ l }}", NULL, "[1, 2]2[1]"},
    {"{% filter upper %}abc{% endfilter %}{% raw %}{{ x }}{% endraw %}{% generation %}g{% endgeneration %}", NULL,
     "ABC{{ x }}g"},
    /* whitespace control, trim_blocks, lstrip_blocks, comments */
    {"a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc"},
    {"{% if true %}\nx\n{% endif %}\ny", NULL, "x\ny"},
    {"a\n    {% if true %}\nb\n    {% endif %}\nc", NULL, "a\nb\nc"},
    {"a\n  {{ 'v' }}\n", NULL, "a\n  v\n"},
    {"{% if true +%}\nx{% endif %}|  {%+ if true %}y{% endif %}", NULL, "\nx|  y"},
    {"a{# comment #}b\n  {# c #}\nc{#- d -#}  e", NULL, "ab\nce"},
    /* tests */
    {"{{ x is defined }}{{ y is defined }}{{ none is none }}{{ 'a' is string }}{{ 3 is number }}{{ [1] is iterable }}"
     "{{ {} is mapping }}{{ 4 is divisibleby 2 }}{{ 3 is even }}{{ not y is defined }}{{ x is not none }}"
     "{{ 2 is gt(1) }}{{ 'ab' is lower }}{{ true is boolean }}{{ 1.5 is float }}",
     "{\"x\": 1}", "TrueFalseTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrue"},
    /* filters */
    {"{{ '  hi  '|trim }}|{{ 'ab'|upper }}|{{ 'AB'|lower }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|"
     "{{ [1,2,3]|length }}|{{ 'h\xc3\xa9llo'|length }}|{{ 'xxhixx'|trim('x') }}",
     NULL, "hi|AB|ab|Hello World|Hello|3|5|hi"},
    {"{{ [1,2,3]|join(', ') }}|{{ x|default('d') }}|{{ none|default('d') }}|{{ ''|default('d', true) }}|"
     "{{ [3,1,2]|sort|list }}|{{ 'abc'|list }}|{{ [1,2]|first }}{{ [1,2]|last }}|{{ 42|string }}|{{ '42'|int + 1 }}|"
     "{{ '1.5'|float }}|{{ 'x'|int }}",
     NULL, "1, 2, 3|d|None|d|[1, 2, 3]|['a', 'b', 'c']|12|42|43|1.5|0"},
    {"{{ {'a': [1, 2.5, 'x\"y', true, none]}|tojson }}|{{ 'caf\xc3\xa9\\n'|tojson }}|{{ [1, 2]|tojson }}", NULL,
     "{\"a\": [1, 2.5, \"x\\\"y\", true, null]}|\"caf\xc3\xa9\\n\"|[1, 2]"},
    {"{{ {'a': [1], 'b': {}}|tojson(indent=2) }}", NULL, "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}"},
    {"{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ d|tojson }}", "{\"d\": {\"n\": 72, \"f\": 72.0, \"s\": \"\\u00e9\"}}",
     "{\"a\": 2, \"b\": 1}|{\"n\": 72, \"f\": 72.0, \"s\": \"\xc3\xa9\"}"},
    {"{{ m|selectattr('role', 'equalto', 'user')|map(attribute='c')|list }}|{{ m|rejectattr('role', 'eq', 'user')|list|length }}|"
     "{{ m|map(attribute='role')|join(',') }}|{{ [1, 0, 2]|select|list }}|{{ ['a', 'b']|map('upper')|list }}|"
     "{{ m|selectattr('x')|list|length }}|{{ [1,2,3,4]|select('odd')|list }}",
     "{\"m\": [{\"role\": \"user\", \"c\": 1}, {\"role\": \"assistant\", \"c\": 2}, {\"role\": \"user\", \"c\": 3}]}",
     "[1, 3]|1|user,assistant,user|[1, 2]|['A', 'B']|0|[1, 3]"},
    {"{{ [1,2,3,4][1:] }}|{{ [1,2,3,4][:-1] }}|{{ [1,2,3,4][::-1] }}|{{ [1,2,3,4][::2] }}|{{ 'hello'[1:3] }}|"
     "{{ 'hello'[-1] }}|{{ [1,2,3][-1] }}|{{ 'h\xc3\xa9llo'[1] }}|{{ [1][5] is defined }}",
     NULL, "[2, 3, 4]|[1, 2, 3]|[4, 3, 2, 1]|[1, 3]|el|o|3|\xc3\xa9|False"},
    {"{{ 'a\\nb'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ range(1, 10, 3)|list }}|{{ 2.5|round }}|"
     "{{ 3.14159|round(2) }}|{{ 'a b c'|wordcount }}|{{ ['a', 'A', 'b']|unique|list }}|{{ [3,1,2]|min }}{{ [3,1,2]|max }}|"
     "{{ [1,2,3]|sum }}|{{ {'b': 1, 'a': 2}|dictsort }}|{{ 'abc'|reverse }}{{ [1,2]|reverse|list }}|"
     "{{ 'aaa'|replace('a', 'b', 2) }}|{{ '<a&b>'|e }}|{{ {'a': 1}|attr('a') }}|{{ {'a': 1}|items|list }}|"
     "{{ ['b', 'A', 'c']|sort(reverse=true)|join }}|{{ m|sort(attribute='n')|map(attribute='n')|join }}",
     "{\"m\": [{\"n\": 2}, {\"n\": 1}]}",
     "a\n  b|  a\n  b|[1, 4, 7]|3.0|3.14|3|['a', 'b']|13|6|[['a', 2], ['b', 1]]|cba[2, 1]|bba|&lt;a&amp;b&gt;|1|"
     "[['a', 1]]|cbA|12"},
    /* string, dict and list methods */
    {"{{ ' x '.strip() }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'a,b,,c'.split(',') }}|"
     "{{ ' a  b '.split() }}|{{ 'aXbXc'.replace('X', '-') }}|{{ 'abc'.upper() }}|{{ 'xxhixx'.strip('x') }}|"
     "{{ 'a b'.title() }}|{{ 'abcabc'.find('c') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a.b.c'.rsplit('.', 1) }}|"
     "{{ '  x'.lstrip() }}{{ 'x  '.rstrip() }}|{{ 'ab'.count('b') }}|{{ '12'.isdigit() }}|{{ 'a\\nb'.splitlines() }}",
     NULL,
     "x|True|True|['a', 'b', '', 'c']|['a', 'b']|a-b-c|ABC|hi|A B|2|a-b|['a.b', 'c']|xx|1|True|['a', 'b']"},
    {"{{ d.get('a') }}{{ d.get('z', 'none') }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list }}",
     "{\"d\": {\"a\": 1, \"b\": 2}}", "1none['a', 'b'][1, 2][['a', 1], ['b', 2]]"},
    {"{{ dict(a=1, b=2)|tojson }}|{{ namespace(x=1).x }}|{{ strftime_now('%Y')|length }}", NULL, "{\"a\": 1, \"b\": 2}|1|4"},
    {"{{ messages[0]['content'] }}{{ messages[0].role }}{{ messages|length }}{{ messages[1:]|length }}",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "hiuser21"},
};

static void test_features(void) {
    int ok = 0;
    for (size_t i = 0; i < SP_ARRAY_LEN(k_features); i++) {
        struct sp_jinja_error e;
        char *got = jinja(k_features[i].src, k_features[i].vars, NULL, &e);
        const bool pass = got && strcmp(got, k_features[i].want) == 0;
        CHECKF(pass, "feature %zu: %s", i, got ? "wrong output" : e.msg);
        if (got && !pass) show_diff(k_features[i].src, k_features[i].want, got);
        if (!got) fprintf(stderr, "  at line %u, column %u: %s\n", e.line, e.col, k_features[i].src);
        ok += pass;
        free(got);
    }
    printf("interpreter features: %d of %zu templates render as Jinja2 does\n", ok, SP_ARRAY_LEN(k_features));
}

/* ---- hostile templates -------------------------------------------------------------- */

static char *repeat_str(const char *unit, int n, const char *middle) {
    const size_t u = strlen(unit), m = strlen(middle);
    char *s = malloc(u * (size_t)n * 2 + m + 1), *o = s;
    for (int i = 0; i < n; i++, o += u) memcpy(o, unit, u);
    memcpy(o, middle, m);
    o += m;
    *o = '\0';
    return s;
}

static void expect_error(const char *what, const char *src, const struct sp_jinja_limits *lim, uint32_t line,
                         uint32_t col, const char *msg_part) {
    struct sp_jinja_error e;
    char *got = jinja(src, NULL, lim, &e);
    CHECKF(!got, "%s: rendered instead of failing", what);
    CHECKF(e.line >= 1 && e.col >= 1, "%s: no position (%s)", what, e.msg);
    if (line) CHECKF(e.line == line && e.col == col, "%s: at %u:%u, want %u:%u (%s)", what, e.line, e.col, line, col, e.msg);
    if (msg_part) CHECKF(strstr(e.msg, msg_part) != NULL, "%s: message '%s' lacks '%s'", what, e.msg, msg_part);
    CHECKF(e.st == SP_E_FORMAT || e.st == SP_E_UNSUPPORTED, "%s: status %d", what, e.st);
    free(got);
}

static void test_hostile(void) {
    const struct sp_jinja_limits small = {.max_output = 1 << 20, .max_memory = 16 << 20, .max_iterations = 10000, .max_depth = 100};
    expect_error("unclosed if", "ab\n{% if x %}abc", NULL, 2, 4, "never closed");
    expect_error("unclosed for", "{% for x in y %}{% if x %}{% endif %}", NULL, 1, 4, "'for' block is never closed");
    expect_error("unclosed macro", "{% macro m() %}x", NULL, 1, 4, "endmacro");
    expect_error("unclosed tag", "x {{ y ", NULL, 1, 3, "never closed");
    expect_error("unclosed comment", "\n\n  {# c", NULL, 3, 3, "comment");
    expect_error("unterminated string", "{{ 'abc }}", NULL, 1, 4, "unterminated");
    expect_error("unknown filter", "line1\n  {{ x|nosuchfilter }}", NULL, 2, 8, "unknown filter 'nosuchfilter'");
    expect_error("unknown test", "{{ x is nosuchtest }}", NULL, 1, 6, "unknown test");
    expect_error("unknown tag", "{% frobnicate %}", NULL, 1, 4, "unknown tag");
    expect_error("stray end", "a{% endif %}", NULL, 1, 5, "endif");
    expect_error("else outside", "{% else %}", NULL, 0, 0, "else");
    expect_error("include", "{% include 'x.j2' %}", NULL, 1, 4, "not supported");
    expect_error("extends", "{% extends 'base' %}", NULL, 0, 0, "not supported");
    expect_error("break outside loop", "{% break %}", NULL, 1, 4, "outside");
    expect_error("bad expression", "{{ x.( }}", NULL, 0, 0, NULL);
    expect_error("missing operand", "{{ 1 + }}", NULL, 0, 0, "expected an expression");
    expect_error("control byte", "{{ \x01 }}", NULL, 1, 4, "unexpected byte");
    expect_error("raise_exception", "{% if true %}\n {{ raise_exception('no system role') }}{% endif %}", NULL, 2, 5,
                 "no system role");
    expect_error("division by zero", "{{ 1 / 0 }}", NULL, 1, 6, "division by zero");
    expect_error("bad operands", "{{ 'a' + 1 }}", NULL, 1, 8, "unsupported operand");
    expect_error("unknown function", "{{ open('/etc/passwd') }}", NULL, 0, 0, "unknown function");
    expect_error("unknown method", "{{ 'x'.nosuch() }}", NULL, 0, 0, "no method");
    /* runaway loops and recursion */
    expect_error("runaway loop", "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", &small,
                 1, 30, "iterations");
    expect_error("huge range", "{{ range(100000000)|length }}", &small, 0, 0, "iteration limit");
    expect_error("quadratic work", "{% set l = range(5000)|list %}{% for i in range(5000) %}{% if i in l %}{% endif %}"
                 "{% endfor %}", &small, 1, 65, "too much work");
    expect_error("recursion", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", &small, 0, 0, "nested");
    /* deep nesting */
    char *paren = repeat_str("(", 5000, "1"), *close = repeat_str(")", 5000, " }}");
    char *ptag = malloc(strlen(paren) + strlen(close) + 8);
    sprintf(ptag, "{{ %s%s", paren, close);
    free(close);
    expect_error("deep parentheses", ptag, &small, 0, 0, "nested");
    free(ptag);
    free(paren);
    char *ifs = repeat_str("{% if true %}", 3000, "x");
    expect_error("deep ifs", ifs, &small, 0, 0, "nested");
    free(ifs);
    char *lists = repeat_str("[", 5000, "");
    char *tag = malloc(strlen(lists) + 8);
    sprintf(tag, "{{ %s", lists);
    expect_error("deep lists", tag, &small, 0, 0, NULL);
    free(tag);
    free(lists);
    /* huge outputs */
    expect_error("huge output", "{% for i in range(9999) %}{{ 'x' * 1000 }}{% endfor %}", &small, 0, 0, "output");
    expect_error("huge string", "{{ 'x' * 1000000000000 }}", &small, 1, 8, "longer than");
    expect_error("doubling", "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                 &small, 0, 0, NULL);
    expect_error("cycle", "{% set l = [] %}{% do l.append(l) %}{{ l }}", &small, 1, 37, "cycle");
    expect_error("cycle tojson", "{% set l = [] %}{% do l.append(l) %}{{ l|tojson }}", &small, 0, 0, "tojson");
    /* what the loop-snapshot case renders */
    struct sp_jinja_error e;
    char *got = jinja("{% set l = [1] %}{% for x in l %}{% do l.append(x) %}{% endfor %}{{ l|length }}", NULL, &small, &e);
    CHECKF(got && strcmp(got, "2") == 0, "loop over a growing list: %s", got ? got : e.msg);
    free(got);
}

/* A reasoning + tool-calling template of the shape Qwen3-style models use
 * (written for this test): the last user query found by a reversed loop
 * with a namespace, <think> blocks split out of earlier answers, tool calls
 * as JSON, consecutive tool results merged into one turn, enable_thinking. */
static const char k_tools_tmpl[] =
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}\n"
    "{%- set ns = namespace(last_user=-1) %}\n"
    "{%- for m in messages[::-1] %}\n"
    "    {%- set i = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if m.role == 'user' and ns.last_user < 0 %}{% set ns.last_user = i %}{% endif %}\n"
    "{%- endfor %}\n"
    "{%- for m in messages %}\n"
    "    {%- set content = m.content if m.content is string else '' %}\n"
    "    {%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}\n"
    "        {{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' }}\n"
    "    {%- elif m.role == 'assistant' %}\n"
    "        {%- set think = '' %}\n"
    "        {%- if '</think>' in content %}\n"
    "            {%- set think = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_start|>assistant\n' }}\n"
    "        {%- if think and loop.index0 > ns.last_user %}{{ '<think>' + think + '</think>' }}{% endif %}\n"
    "        {{- content }}\n"
    "        {%- for call in m.tool_calls | default([]) %}\n"
    "            {%- set call = call.function if call.function is defined else call %}\n"
    "            {{- ('\n' if content or not loop.first else '') + '<tool_call>' }}\n"
    "            {{- {'name': call.name, 'arguments': call.arguments}|tojson }}\n"
    "            {{- '</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\n' }}\n"
    "    {%- elif m.role == 'tool' %}\n"
    "        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{% endif %}\n"
    "        {{- '\n<tool_response>' + content + '</tool_response>' }}\n"
    "        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{% endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{% endif %}\n"
    "{%- endif %}\n";

static void test_tool_template(void) {
    struct sp_chat_params p = sp_chat_default_params();
    p.tmpl = k_tools_tmpl;
    p.messages_json =
        "[{\"role\": \"system\", \"content\": \"You are Q.\"}, {\"role\": \"user\", \"content\": \"Weather?\"},"
        " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get\","
        " \"arguments\": {\"city\": \"NYC\", \"days\": 2}}}, {\"name\": \"time\", \"arguments\": {}}]},"
        " {\"role\": \"tool\", \"content\": \"72F\"}, {\"role\": \"tool\", \"content\": \"noon\"},"
        " {\"role\": \"assistant\", \"content\": \"<think>\\nwarm\\n</think>\\n\\nIt is 72F.\"},"
        " {\"role\": \"user\", \"content\": \"Thanks\"}]";
    p.vars_json = "{\"enable_thinking\": false}";
    static const char want[] =
        "<|im_start|>system\nYou are Q.<|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>{\"name\": \"get\", \"arguments\": {\"city\": \"NYC\", \"days\": 2}}</tool_call>"
        "\n<tool_call>{\"name\": \"time\", \"arguments\": {}}</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>72F</tool_response>\n<tool_response>noon</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nIt is 72F.<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    sp_status rc;
    char *got = render(NULL, &p, NULL, 0, &rc);
    CHECKF(got && strcmp(got, want) == 0, "tool template: %s", got ? "wrong output" : sp_last_error());
    if (got && strcmp(got, want) != 0) show_diff("tool template", want, got);
    free(got);
    /* the last answer after the last user turn keeps its reasoning */
    p.messages_json = "[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"<think>hm</think>Yo\"}]";
    p.vars_json = NULL;
    p.add_assistant = false;
    got = render(NULL, &p, NULL, 0, &rc);
    CHECKF(got && strcmp(got, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>hm</think>Yo<|im_end|>\n") == 0,
           "tool template, reasoning kept: %s", got ? got : sp_last_error());
    free(got);
}

/* ---- the API: buffers, names, engines, variables ---------------------------------------- */

static void test_api(void) {
    const struct sp_chat_message conv[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
    char buf[512];
    size_t len = 0;
    /* buffer contract: a size query, then exactly len + 1 bytes */
    CHECK(sp_chat_apply_template(NULL, "chatml", conv, 4, true, NULL, 0, &len) == SP_E_BUFFER && len > 0);
    const size_t need = len;
    CHECK(sp_chat_apply_template(NULL, "chatml", conv, 4, true, buf, need, &len) == SP_E_BUFFER && len == need);
    CHECK(sp_chat_apply_template(NULL, "chatml", conv, 4, true, buf, need + 1, &len) == SP_OK && len == need &&
          buf[len] == '\0');
    CHECK(strcmp(buf, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                      "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n") == 0);
    CHECK(sp_chat_apply_template(NULL, "chatml", conv, 4, false, buf, sizeof buf, &len) == SP_OK &&
          strstr(buf, "Bye<|im_end|>\n") && !strstr(buf, "Bye<|im_end|>\n<|im_start|>"));
    CHECK(sp_chat_apply_template(NULL, NULL, conv, 4, true, buf, sizeof buf, &len) == SP_E_INVALID);
    CHECK(sp_chat_apply_template(NULL, "chatml", NULL, 1, true, buf, sizeof buf, &len) == SP_E_INVALID);
    CHECK(sp_chat_apply_template(NULL, "chatml", conv, 0, true, buf, sizeof buf, &len) == SP_OK &&
          strcmp(buf, "<|im_start|>assistant\n") == 0);

    /* the names: llama.cpp's 54 and dots1, sorted, each recognised as itself */
    const int32_t n = sp_chat_builtin_templates(NULL, 0);
    CHECKF(n == 55, "%d built-in templates", n);
    const char *names[64];
    CHECK(sp_chat_builtin_templates(names, 64) == n);
    static const char *const must[] = {"chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1",
                                       "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "llama3", "llama4",
                                       "phi3", "phi4", "gemma", "deepseek", "deepseek2", "deepseek3", "command-r", "vicuna",
                                       "vicuna-orca", "zephyr", "openchat", "monarch", "orion", "granite", "chatglm3", "chatglm4",
                                       "glmedge", "minicpm", "megrez", "gigachat", "yandex", "bailing", "seed_oss", "exaone3",
                                       "falcon3", "gpt-oss", "kimi-k2", "solar-open"};
    for (size_t i = 0; i < SP_ARRAY_LEN(must); i++) {
        bool found = false;
        for (int32_t k = 0; k < n && !found; k++) found = strcmp(names[k], must[i]) == 0;
        CHECKF(found, "no built-in template '%s'", must[i]);
    }
    for (int32_t k = 0; k < n; k++) {
        const char *d = sp_chat_detect_template(names[k]);
        CHECKF(d && strcmp(d, names[k]) == 0, "'%s' detected as %s", names[k], d ? d : "nothing");
        if (k) CHECKF(strcmp(names[k - 1], names[k]) < 0, "names not sorted at %s", names[k]);
        /* every family renders without failing, with and without the assistant opening */
        CHECKF(sp_chat_apply_template(NULL, names[k], conv, 4, true, buf, sizeof buf, &len) == SP_OK && len > 0,
               "%s: %s", names[k], sp_last_error());
    }
    CHECK(sp_chat_detect_template("{{ messages }}") == NULL);

    /* engines: --no-jinja refuses what no formatter recognises, --jinja runs it */
    struct sp_chat_params p = sp_chat_default_params();
    p.tmpl = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}";
    p.engine = SP_CHAT_NAMED;
    CHECK(sp_chat_apply(NULL, &p, conv, 2, buf, sizeof buf, &len) == SP_E_UNSUPPORTED);
    CHECK(strstr(sp_last_error(), "no named formatter") != NULL);
    p.engine = SP_CHAT_JINJA;
    CHECK(sp_chat_apply(NULL, &p, conv, 2, buf, sizeof buf, &len) == SP_OK &&
          strcmp(buf, "[system:Be brief.][user:Hi]") == 0);
    /* a template error through the API: line and column in the message */
    p.tmpl = "ok\n{{ messages|frobnicate }}";
    CHECK(sp_chat_apply(NULL, &p, conv, 2, buf, sizeof buf, &len) == SP_E_UNSUPPORTED);
    CHECKF(strstr(sp_last_error(), "line 2, column 13") != NULL, "message: %s", sp_last_error());
    p.tmpl = "{{ raise_exception('roles must alternate') }}";
    CHECK(sp_chat_apply(NULL, &p, conv, 2, buf, sizeof buf, &len) == SP_E_FORMAT);
    CHECKF(strstr(sp_last_error(), "line 1, column 4") && strstr(sp_last_error(), "roles must alternate"), "message: %s",
           sp_last_error());

    /* variables from the caller, tools, bos/eos, add_generation_prompt */
    p.tmpl = "{{ bos_token }}{% if tools %}{{ tools|tojson }}{% endif %}{{ enable_thinking }}{{ add_generation_prompt }}"
             "{{ who }}{{ eos_token }}";
    p.bos_token = "<s>";
    p.eos_token = "</s>";
    p.vars_json = "{\"tools\": [{\"name\": \"f\"}], \"enable_thinking\": false, \"who\": \"me\"}";
    CHECK(sp_chat_apply(NULL, &p, conv, 2, buf, sizeof buf, &len) == SP_OK &&
          strcmp(buf, "<s>[{\"name\": \"f\"}]FalseTrueme</s>") == 0);
    p.vars_json = "[1]";
    CHECK(sp_chat_apply(NULL, &p, conv, 2, buf, sizeof buf, &len) == SP_E_FORMAT);
    p.vars_json = "{\"a\": ";
    CHECK(sp_chat_apply(NULL, &p, conv, 2, buf, sizeof buf, &len) == SP_E_FORMAT);
    p.vars_json = NULL;
    p.add_assistant = false;
    CHECK(sp_chat_apply(NULL, &p, conv, 2, buf, sizeof buf, &len) == SP_OK && strcmp(buf, "<s>TrueFalse</s>") == 0);
    p.add_assistant = true;

    /* messages as JSON: extra fields reach the template; content parts are joined */
    p.tmpl = "{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}"
             "{% endif %};{% endfor %}";
    p.messages_json = "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"image\"},"
                      " {\"type\": \"text\", \"text\": \"b\"}]}, {\"role\": \"assistant\", \"content\": null, "
                      "\"tool_calls\": [{\"function\": {\"name\": \"get\"}}]}, {\"role\": \"developer\", \"content\": \"d\"}]";
    CHECK(sp_chat_apply(NULL, &p, NULL, 0, buf, sizeof buf, &len) == SP_OK &&
          strcmp(buf, "user:a\nb;assistant:Noneget;system:d;") == 0);
    p.engine = SP_CHAT_NAMED;
    p.tmpl = "chatml";
    CHECK(sp_chat_apply(NULL, &p, NULL, 0, buf, sizeof buf, &len) == SP_OK &&
          strncmp(buf, "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n<|im_end|>", 60) == 0);
    p.messages_json = "[{\"content\": \"x\"}]";
    CHECK(sp_chat_apply(NULL, &p, NULL, 0, buf, sizeof buf, &len) == SP_E_FORMAT);
    p.messages_json = "{}";
    CHECK(sp_chat_apply(NULL, &p, NULL, 0, buf, sizeof buf, &len) == SP_E_FORMAT);

    /* limits from the caller */
    p = sp_chat_default_params();
    p.tmpl = "{% for i in range(100) %}{{ i }}{% endfor %}";
    p.max_iterations = 50;
    CHECK(sp_chat_apply(NULL, &p, conv, 1, buf, sizeof buf, &len) == SP_E_FORMAT && strstr(sp_last_error(), "line 1"));
    p.max_iterations = 0;
    p.max_output = 20;
    CHECK(sp_chat_apply(NULL, &p, conv, 1, buf, sizeof buf, &len) == SP_E_FORMAT && strstr(sp_last_error(), "output"));
}

/* ---- the model's own template ------------------------------------------------------------ */

/* A vocabulary-only GGUF: the metadata of a peer vocabulary plus
 * tokenizer.chat_template (longer than the 200 characters the display getter
 * shows). */
static bool write_model(const char *vocab_rel, const char *tmpl, const char *out) {
    const char *path = need_fixture(vocab_rel);
    if (!path) return false;
    struct sp_model_file *mf = NULL;
    struct sp_gguf_writer *w = NULL;
    bool ok = sp_model_file_open(path, NULL, true, &mf) == SP_OK && sp_gguf_writer_open(out, 32, &w) == SP_OK;
    for (uint64_t i = 0; ok && i < mf->n_meta; i++)
        if (strcmp(mf->meta[i].key, "tokenizer.chat_template") != 0)
            ok = sp_gguf_writer_set(w, mf->meta[i].key, &mf->meta[i].value) == SP_OK;
    ok = ok && sp_gguf_writer_set_str(w, "tokenizer.chat_template", tmpl) == SP_OK && sp_gguf_writer_finish(w) == SP_OK;
    CHECKF(ok, "writing %s: %s", out, sp_last_error());
    sp_gguf_writer_free(w);
    sp_model_file_free(mf);
    return ok;
}

static void test_model_template(void) {
    /* a chatml-style template that starts with bos_token and ends turns with </s> */
    char tmpl[2048];
    snprintf(tmpl, sizeof tmpl,
             "{#- %s -#}\n{{ bos_token }}{%% for m in messages %%}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}"
             "{%% endfor %%}{%% if add_generation_prompt %%}<|assistant|>{%% endif %%}",
             "a comment that makes the template longer than two hundred characters, so that a getter that cuts "
             "strings at 200 characters would lose the end of it: the whole program has to come back");
    char path[4096];
    snprintf(path, sizeof path, "%s/test_chat_%d.gguf", scratch_dir(), (int)getpid());
    if (!write_model("peer-tests/tokenizer/ggml-vocab-llama-spm.gguf", tmpl, path)) return;
    struct sp_model_params mp = sp_model_default_params();
    mp.vocab_only = true;
    struct sp_model *m = NULL;
    CHECKF(sp_model_load(path, &mp, &m) == SP_OK, "load %s: %s", path, sp_last_error());
    unlink(path);
    if (!m) return;
    /* the full template, with the SP_E_BUFFER size query */
    size_t len = 0;
    CHECK(sp_model_meta_str(m, "tokenizer.chat_template", NULL, 0, &len) == SP_E_BUFFER && len == strlen(tmpl));
    char *t = malloc(len + 1);
    CHECK(sp_model_meta_str(m, "tokenizer.chat_template", t, len, &len) == SP_E_BUFFER);
    CHECK(sp_model_meta_str(m, "tokenizer.chat_template", t, len + 1, &len) == SP_OK && strcmp(t, tmpl) == 0);
    free(t);
    char small[64];
    CHECK(sp_model_meta_str(m, "tokenizer.ggml.model", small, sizeof small, &len) == SP_OK && strcmp(small, "llama") == 0);
    CHECK(sp_model_meta_str(m, "tokenizer.ggml.bos_token_id", small, sizeof small, &len) == SP_OK && strcmp(small, "1") == 0);
    CHECK(sp_model_meta_str(m, "no.such.key", small, sizeof small, &len) == SP_E_INVALID);
    CHECK(sp_model_meta_str(m, "tokenizer.ggml.tokens", small, sizeof small, &len) == SP_E_INVALID);

    /* rendered with the model's template and BOS/EOS text; the vocabulary adds
     * BOS itself, so the leading "<s>" is dropped unless keep_bos */
    const struct sp_chat_message conv[] = {{"user", "Hello"}, {"assistant", "Hi"}};
    char buf[512];
    CHECK(sp_chat_apply_template(m, NULL, conv, 2, true, buf, sizeof buf, &len) == SP_OK);
    CHECKF(strcmp(buf, "<|user|>Hello</s><|assistant|>Hi</s><|assistant|>") == 0, "got '%s'", buf);
    struct sp_chat_params p = sp_chat_default_params();
    p.keep_bos = true;
    CHECK(sp_chat_apply(m, &p, conv, 2, buf, sizeof buf, &len) == SP_OK &&
          strcmp(buf, "<s><|user|>Hello</s><|assistant|>Hi</s><|assistant|>") == 0);
    p.engine = SP_CHAT_NAMED; /* no named formatter knows this template */
    CHECK(sp_chat_apply(m, &p, conv, 2, buf, sizeof buf, &len) == SP_E_UNSUPPORTED);

    /* the prompt tokenized with special tokens parsed: </s> becomes EOS (2) */
    CHECK(sp_chat_apply_template(m, NULL, conv, 2, true, buf, sizeof buf, &len) == SP_OK);
    int32_t ids[128], n = 0, n_plain = 0, plain[128];
    CHECK(sp_tokenize(m, buf, len, SP_TOKENIZE_ADD_BOS | SP_TOKENIZE_PARSE_SPECIAL, ids, 128, &n) == SP_OK);
    CHECK(sp_tokenize(m, buf, len, SP_TOKENIZE_ADD_BOS, plain, 128, &n_plain) == SP_OK);
    int eos_special = 0, eos_plain = 0, bos = 0;
    for (int32_t i = 0; i < n; i++) eos_special += ids[i] == 2, bos += ids[i] == 1;
    for (int32_t i = 0; i < n_plain; i++) eos_plain += plain[i] == 2;
    CHECKF(eos_special == 2 && eos_plain == 0 && bos == 1 && ids[0] == 1, "EOS %d (plain %d), BOS %d", eos_special,
           eos_plain, bos);
    sp_model_free(m);

    /* a model without a template: SP_E_UNSUPPORTED, and a given template still works */
    const char *stories = need_fixture("models/stories260K/stories260K-f32.gguf");
    if (!stories || sp_model_load(stories, &mp, &m) != SP_OK) return;
    CHECK(sp_chat_apply_template(m, NULL, conv, 2, true, buf, sizeof buf, &len) == SP_E_UNSUPPORTED);
    CHECK(strstr(sp_last_error(), "no chat template") != NULL);
    CHECK(sp_chat_apply_template(m, "llama2", conv, 2, true, buf, sizeof buf, &len) == SP_OK);
    sp_model_free(m);
}

int main(void) {
    sp_log_set(quiet, NULL);
    test_cases();
    test_features();
    test_hostile();
    test_tool_template();
    test_api();
    test_model_template();
    printf("%d checks, %d failed\n", test_checks, test_failures);
    return test_failures ? 1 : 0;
}
