/*
 * test_convert.c -- files that store resident layouts (sp_convert, issue 21).
 *
 * For Q4_0 and Q4_K_M files (stories260K-pad256: rows of 256, so they have
 * resident layouts), mem4's native g4 types, a Q8_0 file (no layout) and a
 * llama2.c checkpoint:
 *  1. sp_convert (layout auto) stores exactly the matrices a LOAD of the
 *     original repacks, in the same layouts, never the input embedding;
 *  2. the converted file is mapped (MMAP), not copied, and gives the
 *     original's logits bit for bit over 16 greedy steps;
 *  3. converted back (layout none) it is byte for byte what the original
 *     converted with layout none is; layout resident equals auto here when
 *     the CPU reads every layout;
 *  4. under a budget that streams nearly everything, the converted file
 *     (streamed in its stored layouts) gives its unbudgeted logits;
 *  5. the fallback: the same binary re-run with SPARROW_REPACK=0 (a kernel
 *     table without the layouts) loads the converted files, un-repacking
 *     every stored layout to its file type, with the original's logits
 *     (unbudgeted, and streamed under the budget: slots un-repacked as they
 *     are read), and converts them back to the same bytes.
 * Corrupt and truncated files and the CLI: test_convert.sh.
 */
#include "sparrow.h"
#include "test_budget.h"
#include "test_util.h"

#include "mem/pager.h"
#include "model/model.h"
#include "quant/native.h"
#include "quant/quant.h"

#include <errno.h>
#include <sys/wait.h>

static char dir[4096];

static const char *in_dir(const char *name) {
    return test_path(dir, name);
}

struct input {
    const char *name;   /* files in dir: NAME.gguf (made), NAME-conv.gguf, NAME-none.gguf */
    const char *fixture;/* a fixture, or the F32 file a policy quantizes */
    const char *policy; /* NULL: the fixture itself; "mem4" or a policy file's text ("* Q4_0\n") */
    bool layouts;       /* it has matrices with resident layouts */
    uint64_t budget;    /* weight bytes for the streaming check, 0 = none */
};

static const struct input inputs[] = {
    {"q4_0", "models/stories260K-pad256/stories260K-pad256-f32.gguf", "* Q4_0\n", true, 384 * 1024},
    {"q4_k_m", "models/stories260K-pad256/stories260K-pad256-q4_k_m.gguf", NULL, true, 384 * 1024},
    {"mem4", "models/stories260K-pad256/stories260K-pad256-f32.gguf", "mem4", true, 384 * 1024},
    {"q8_0", "models/stories260K/stories260K-q8_0.gguf", NULL, false, 0},
    {"llama2c", "models/stories260K/stories260K.bin", NULL, false, 0},
};

/* The original of input x: the fixture or the file quantized from it. */
static const char *original(const struct input *x) {
    static char buf[4096];
    if (!x->policy) {
        snprintf(buf, sizeof buf, "%s", fixture(x->fixture));
        return buf;
    }
    snprintf(buf, sizeof buf, "%s", in_dir(x->name));
    size_t n = strlen(buf);
    snprintf(buf + n, sizeof buf - n, ".gguf");
    return buf;
}

static bool make_original(const struct input *x) {
    if (!need_fixture(x->fixture)) return false;
    if (!x->policy) return true;
    struct sp_quantize_params p = sp_quantize_default_params();
    char src[4096], pol[4200], out[4096];
    snprintf(src, sizeof src, "%s", fixture(x->fixture));
    snprintf(out, sizeof out, "%s", original(x));
    p.input = src;
    p.output = out;
    if (strchr(x->policy, ' ')) {
        snprintf(pol, sizeof pol, "%s.policy", out);
        FILE *f = fopen(pol, "w");
        CHECK(f && fputs(x->policy, f) >= 0 && fclose(f) == 0);
        p.policy_file = pol;
    } else {
        p.policy = x->policy;
    }
    const sp_status rc = sp_quantize(&p, NULL);
    CHECKF(rc == SP_OK, "quantizing %s: %s", x->name, sp_last_error());
    return rc == SP_OK;
}

static const char *derived(const struct input *x, const char *suffix) {
    char name[128];
    snprintf(name, sizeof name, "%s-%s.gguf", x->name, suffix);
    return in_dir(name);
}

static sp_status convert(const char *in, const char *out, enum sp_layout l, struct sp_convert_result *res) {
    struct sp_convert_params p = sp_convert_default_params();
    char tok[4096];
    p.input = in;
    p.output = out;
    p.layout = l;
    if (tokenizer_for(in)) {
        snprintf(tok, sizeof tok, "%s", tokenizer_for(in));
        p.tokenizer_path = tok;
    }
    const sp_status rc = sp_convert(&p, res);
    CHECKF(rc == SP_OK, "convert %s -> %s (%s): %s", in, out, sp_layout_name(l), sp_last_error());
    return rc;
}

static struct sp_model *load(const char *path) {
    struct sp_model_params mp = sp_model_default_params();
    mp.tokenizer_path = tokenizer_for(path);
    struct sp_model *m = NULL;
    const sp_status rc = sp_model_load(path, &mp, &m);
    CHECKF(rc == SP_OK, "load %s: %s", path, sp_last_error());
    return rc ? NULL : m;
}

/* 16 greedy steps after an 8-token prompt: the same logits, bit for bit. */
static void same_logits(struct sp_model *a, struct sp_model *b, const char *what) {
    struct sp_session_params sp = test_session();
    struct sp_session *sa = NULL, *sb = NULL;
    if (sp_session_init(a, &sp, &sa) || sp_session_init(b, &sp, &sb)) {
        CHECKF(0, "%s: session: %s", what, sp_last_error());
        sp_session_free(sa);
        return;
    }
    struct sp_model_info info;
    sp_model_get_info(a, &info);
    int32_t prompt[8] = {1, 403, 407, 261, 378, 13, 60, 29};
    sp_status ra = sp_decode(sa, prompt, 8), rb = sp_decode(sb, prompt, 8);
    int diff = 0, steps = 0;
    for (; steps < 16 && ra == SP_OK && rb == SP_OK; steps++) {
        diff += memcmp(sp_get_logits(sa), sp_get_logits(sb), (size_t)info.n_vocab * sizeof(float)) != 0;
        int32_t ta = 0, tb = 0;
        sp_sample(sa, &ta);
        sp_sample(sb, &tb);
        CHECK(ta == tb);
        ra = sp_decode(sa, &ta, 1);
        rb = sp_decode(sb, &tb, 1);
    }
    CHECKF(ra == SP_OK && rb == SP_OK && steps == 16, "%s: decode: %s", what, sp_last_error());
    CHECKF(diff == 0, "%s: logits differ at %d of %d steps", what, diff, steps);
    sp_session_free(sa);
    sp_session_free(sb);
}

static enum sp_weight_mode mode_of(const struct sp_model *m) {
    struct sp_pager_stats st;
    sp_pager_get_stats(m->pager, &st);
    return st.mode;
}

/* 1-3 (and 4) for input x. */
static void test_input(const struct input *x) {
    if (!make_original(x)) return;
    char orig[4096], conv[4096];
    snprintf(orig, sizeof orig, "%s", original(x));
    snprintf(conv, sizeof conv, "%s", derived(x, "conv"));
    struct sp_convert_result res;
    if (convert(orig, conv, SP_LAYOUT_AUTO, &res)) return;
    struct sp_model *a = load(orig), *b = load(conv);
    if (a && b) {
        CHECKF(mode_of(b) == SP_WEIGHTS_MMAP, "%s: the converted file is not mapped", x->name);
        /* the stored layouts are what a LOAD of the original repacks */
        uint32_t stored = 0, differ = 0;
        for (uint32_t i = 0; i < b->mf->n_tensors; i++) {
            const struct sp_tensor_desc *t = &b->mf->tensors[i], *o = sp_model_file_find(a->mf, t->name);
            CHECKF(o, "%s: tensor %s missing from the original", x->name, t->name);
            if (!o) continue;
            stored += sp_qtype_resident_from(t->type) != 0;
            differ += sp_pager_wtype(a->pager, o) != t->type || sp_pager_wtype(b->pager, t) != t->type;
            CHECKF(t != b->tok_embd || !sp_qtype_resident_from(t->type), "%s: the embedding is stored as %s", x->name,
                   sp_qtype_name(t->type));
        }
        CHECKF(differ == 0, "%s: %u tensors are not stored as a LOAD of the original holds them", x->name, differ);
        CHECKF(stored == (uint32_t)res.n_layout, "%s: %u tensors in layouts, convert said %d", x->name, stored, (int)res.n_layout);
#if defined(__x86_64__)
        if (x->layouts && sp_qtype_layout_here(SP_QTYPE_Q4_0_G8)) CHECKF(stored > 0, "%s: nothing stored in a layout", x->name);
#endif
        if (!x->layouts) CHECK(stored == 0);
        same_logits(a, b, x->name);
        printf("  %s: %d tensors, %d in resident layouts (%.1f KiB), mapped; logits as the original's\n", x->name,
               (int)res.n_tensors, (int)res.n_layout, res.layout_bytes / 1024.0);
    }
    sp_model_free(a);
    sp_model_free(b);
    /* back to the file types: the bytes of the original converted that way */
    char none_a[4096], none_b[4096], resident[4096];
    snprintf(none_a, sizeof none_a, "%s", derived(x, "none"));
    snprintf(none_b, sizeof none_b, "%s", derived(x, "conv-none"));
    snprintf(resident, sizeof resident, "%s", derived(x, "resident"));
    if (!convert(orig, none_a, SP_LAYOUT_NONE, NULL) && !convert(conv, none_b, SP_LAYOUT_NONE, NULL))
        CHECKF(test_same_file(none_a, none_b), "%s: converted back, not the bytes of the original's layout-none file", x->name);
    if (!convert(orig, resident, SP_LAYOUT_RESIDENT, NULL) && sp_qtype_layout_here(SP_QTYPE_Q4_0_G8) &&
        sp_qtype_layout_here(SP_QTYPE_Q4_K_G8) && sp_qtype_layout_here(SP_QTYPE_I4_B64_G4))
        CHECKF(test_same_file(conv, resident), "%s: layout resident differs from auto on a CPU that reads every layout", x->name);
    if (x->budget) {
        char label[64];
        snprintf(label, sizeof label, "converted %s", x->name);
        forward_under_budget(conv, label, x->budget);
    }
}

/* 5, in the child run with SPARROW_REPACK=0. */
static void test_fallback(const struct input *x) {
    char orig[4096], conv[4096];
    snprintf(orig, sizeof orig, "%s", original(x));
    snprintf(conv, sizeof conv, "%s", derived(x, "conv"));
    struct sp_model *a = load(orig), *b = load(conv);
    if (a && b) {
        uint32_t unpacked = 0, wrong = 0;
        for (uint32_t i = 0; i < b->mf->n_tensors; i++) {
            const struct sp_tensor_desc *t = &b->mf->tensors[i];
            if (!sp_qtype_resident_from(t->type)) continue;
            unpacked++;
            wrong += sp_pager_wtype(b->pager, t) != sp_qtype_resident_from(t->type);
        }
        CHECKF(!x->layouts || unpacked > 0, "%s: the converted file stores no layout", x->name);
        CHECKF(wrong == 0, "%s: %u stored layouts not read back as their file types", x->name, wrong);
        CHECKF(!unpacked || mode_of(b) == SP_WEIGHTS_LOAD, "%s: mapped although its layouts are not read here", x->name);
        same_logits(a, b, x->name);
        printf("  fallback %s: %u tensors un-repacked at load; logits as the original's\n", x->name, unpacked);
    }
    sp_model_free(a);
    sp_model_free(b);
    char back[4096];
    snprintf(back, sizeof back, "%s", derived(x, "fallback-none"));
    if (!convert(conv, back, SP_LAYOUT_NONE, NULL))
        CHECKF(test_same_file(back, derived(x, "none")), "%s: the fallback's layout-none file differs", x->name);
    if (x->budget) {
        char label[64];
        snprintf(label, sizeof label, "fallback %s", x->name);
        forward_under_budget(conv, label, x->budget);
    }
}

int main(int argc, char **argv) {
    sp_log_set(NULL, NULL);
    sp_init();
    if (argc == 3 && strcmp(argv[1], "--fallback") == 0) {
        snprintf(dir, sizeof dir, "%s", argv[2]);
        for (size_t i = 0; i < SP_ARRAY_LEN(inputs); i++) test_fallback(&inputs[i]);
        return test_report("test_convert --fallback");
    }
    snprintf(dir, sizeof dir, "%s/sparrow-convert.XXXXXX", scratch_dir());
    if (!mkdtemp(dir)) {
        fprintf(stderr, "cannot create a folder under %s: %s\n", scratch_dir(), strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < SP_ARRAY_LEN(inputs); i++) test_input(&inputs[i]);
    /* 5: the same files through a kernel table without the layouts */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "SPARROW_REPACK=0 '%s' --fallback '%s'", argv[0], dir);
    const int st = system(cmd);
    CHECKF(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the fallback run failed (status %d)", st);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_report("test_convert");
}
