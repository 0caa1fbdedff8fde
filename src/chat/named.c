/*
 * named.c -- hand-written formatters for the chat-template families that
 * llama.cpp's built-in formatter knows (its src/llama-chat.cpp at the
 * goldens' commit lists 54 names; "dots1" is recognised there by substring
 * only and is selectable by name here), each reproducing that formatter's
 * output byte for byte, and the substring rules that recognise a family
 * from a template's Jinja source.  No Jinja is run here; the interpreter is
 * in jinja_*.c.  tests/test_chat.c checks the formatters against
 * llama.cpp's renderings (../shared/peer-tests/chat-template/cases.json).
 */
#include "chat/chat.h"

#include <stdio.h>

enum fam {
    BAILING, BAILING_THINK, BAILING2, CHATGLM3, CHATGLM4, CHATML, COMMAND_R, DEEPSEEK, DEEPSEEK_OCR, DEEPSEEK2,
    DEEPSEEK3, DOTS1, EXAONE_MOE, EXAONE3, EXAONE4, FALCON3, GEMMA, GIGACHAT, GLMEDGE, GPT_OSS, GRANITE,
    GRANITE_40, GRANITE_41, GROK2, HUNYUAN_DENSE, HUNYUAN_MOE, HUNYUAN_VL, KIMI_K2, LLAMA2, LLAMA2_SYS,
    LLAMA2_SYS_BOS, LLAMA2_SYS_STRIP, LLAMA3, LLAMA4, MEGREZ, MINICPM, MISTRAL_V1, MISTRAL_V3, MISTRAL_V3_TEKKEN,
    MISTRAL_V7, MISTRAL_V7_TEKKEN, MONARCH, OPENCHAT, ORION, PANGU_EMBED, PHI3, PHI4, RWKV_WORLD, SEED_OSS,
    SMOLVLM, SOLAR_OPEN, VICUNA, VICUNA_ORCA, YANDEX, ZEPHYR, FAM_COUNT
};

/* Sorted by name (the order sp_chat_builtin_templates lists them in). */
static const char *const k_names[FAM_COUNT] = {
    [BAILING] = "bailing",           [BAILING_THINK] = "bailing-think", [BAILING2] = "bailing2",
    [CHATGLM3] = "chatglm3",         [CHATGLM4] = "chatglm4",           [CHATML] = "chatml",
    [COMMAND_R] = "command-r",       [DEEPSEEK] = "deepseek",           [DEEPSEEK_OCR] = "deepseek-ocr",
    [DEEPSEEK2] = "deepseek2",       [DEEPSEEK3] = "deepseek3",         [DOTS1] = "dots1",
    [EXAONE_MOE] = "exaone-moe",     [EXAONE3] = "exaone3",             [EXAONE4] = "exaone4",
    [FALCON3] = "falcon3",           [GEMMA] = "gemma",                 [GIGACHAT] = "gigachat",
    [GLMEDGE] = "glmedge",           [GPT_OSS] = "gpt-oss",             [GRANITE] = "granite",
    [GRANITE_40] = "granite-4.0",    [GRANITE_41] = "granite-4.1",      [GROK2] = "grok-2",
    [HUNYUAN_DENSE] = "hunyuan-dense", [HUNYUAN_MOE] = "hunyuan-moe",   [HUNYUAN_VL] = "hunyuan-vl",
    [KIMI_K2] = "kimi-k2",           [LLAMA2] = "llama2",               [LLAMA2_SYS] = "llama2-sys",
    [LLAMA2_SYS_BOS] = "llama2-sys-bos", [LLAMA2_SYS_STRIP] = "llama2-sys-strip", [LLAMA3] = "llama3",
    [LLAMA4] = "llama4",             [MEGREZ] = "megrez",               [MINICPM] = "minicpm",
    [MISTRAL_V1] = "mistral-v1",     [MISTRAL_V3] = "mistral-v3",       [MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [MISTRAL_V7] = "mistral-v7",     [MISTRAL_V7_TEKKEN] = "mistral-v7-tekken", [MONARCH] = "monarch",
    [OPENCHAT] = "openchat",         [ORION] = "orion",                 [PANGU_EMBED] = "pangu-embedded",
    [PHI3] = "phi3",                 [PHI4] = "phi4",                   [RWKV_WORLD] = "rwkv-world",
    [SEED_OSS] = "seed_oss",         [SMOLVLM] = "smolvlm",             [SOLAR_OPEN] = "solar-open",
    [VICUNA] = "vicuna",             [VICUNA_ORCA] = "vicuna-orca",     [YANDEX] = "yandex",
    [ZEPHYR] = "zephyr",
};

/* How many named formatters there are (the 54 of llama.cpp and dots1). */
int sp_chat_named_count(void) {
    return FAM_COUNT;
}

/* The name of family i (static), NULL out of range. */
const char *sp_chat_named_name(int i) {
    return i >= 0 && i < FAM_COUNT ? k_names[i] : NULL;
}

/* The family named exactly name[0..n), or -1. */
int sp_chat_named_find(const char *name, size_t n) {
    for (int i = 0; i < FAM_COUNT; i++)
        if (strlen(k_names[i]) == n && memcmp(k_names[i], name, n) == 0) return i;
    return -1;
}

/* ---- recognising a family ---------------------------------------------------- */

struct src {
    const char *s;
    size_t n;
};

static bool has(const struct src *t, const char *needle) {
    const size_t k = strlen(needle);
    return k <= t->n && memmem(t->s, t->n, needle, k) != NULL;
}

/* The llama2 / mistral branch: templates with [INST] (or starting "mistral"). */
static int detect_inst(const struct src *t) {
    if (has(t, "[SYSTEM_PROMPT]")) return MISTRAL_V7;
    if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
        if (has(t, " [INST]")) return MISTRAL_V1;
        if (has(t, "\"[INST]\"")) return MISTRAL_V3_TEKKEN;
        return MISTRAL_V3;
    }
    if (has(t, "content.strip()")) return LLAMA2_SYS_STRIP;
    if (has(t, "bos_token + '[INST]")) return LLAMA2_SYS_BOS;
    if (has(t, "<<SYS>>")) return LLAMA2_SYS;
    return LLAMA2;
}

/* Ordered rules after the [INST] branch: the first whose substrings all
 * occur names the family. */
static const struct rule {
    int fam;
    const char *all[3];
} k_rules[] = {
    {PHI3, {"<|assistant|>", "<|end|>"}},
    {CHATGLM4, {"[gMASK]<sop>"}},
    {EXAONE_MOE, {"<|assistant|>", "<|user|>", "<|tool_declare|>"}},
    {FALCON3, {"<|assistant|>", "<|user|>", "</s>"}},
    {GLMEDGE, {"<|assistant|>", "<|user|>"}},
    {GLMEDGE, {"<|{{ item['role'] }}|>", "<|begin_of_image|>"}},
    {ZEPHYR, {"<|user|>", "<|endoftext|>"}},
    {MONARCH, {"bos_token + message['role']"}},
    {GEMMA, {"<start_of_turn>"}},
    {ORION, {"'\\n\\nAssistant: ' + eos_token"}},
    {OPENCHAT, {"GPT4 Correct "}},
    {VICUNA_ORCA, {"USER: ", "ASSISTANT: ", "SYSTEM: "}},
    {VICUNA, {"USER: ", "ASSISTANT: "}},
    {DEEPSEEK, {"### Instruction:", "<|EOT|>"}},
    {COMMAND_R, {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"}},
    {LLAMA3, {"<|start_header_id|>", "<|end_header_id|>"}},
    {CHATGLM3, {"[gMASK]sop"}},
    {MINICPM, {"<用户>"}},
    {DEEPSEEK2, {"'Assistant: ' + message['content'] + eos_token"}},
    {DEEPSEEK3, {"<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"}},
    {EXAONE4, {"[|system|]", "[|assistant|]", "[|tool|]"}}, /* needs [|endofturn|] too: checked below */
    {EXAONE3, {"[|system|]", "[|assistant|]", "[|endofturn|]"}},
    {RWKV_WORLD, {"rwkv-world"}},
    {RWKV_WORLD, {"{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"}},
    {GRANITE_40, {"<|start_of_role|>", "g4_default_system_message"}}, /* with <tool_call> or <tools>: below */
    {GRANITE_41, {"<|start_of_role|>"}},                              /* with <tool_call> or <tools>: below */
    {GRANITE, {"<|start_of_role|>"}},
    {GIGACHAT, {"message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]"}},
    {MEGREZ, {"<|role_start|>"}},
    {YANDEX, {" Ассистент:"}},
    {BAILING, {"<role>ASSISTANT</role>", "'HUMAN'"}},
    {BAILING_THINK, {"<role>ASSISTANT</role>", "\"HUMAN\"", "<think>"}},
    {BAILING2, {"<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"}},
    {LLAMA4, {"<|header_start|>", "<|header_end|>"}},
    {DOTS1, {"<|endofuserprompt|>"}},
    {HUNYUAN_MOE, {"<|extra_0|>", "<|extra_4|>"}},
    {GPT_OSS, {"<|start|>", "<|channel|>"}},
    {HUNYUAN_VL, {"<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"}},
    {HUNYUAN_DENSE, {"<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"}},
    {KIMI_K2, {"<|im_assistant|>assistant<|im_middle|>"}},
    {SEED_OSS, {"<seed:bos>"}},
    {GROK2, {"'Assistant: '  + message['content'] + '<|separator|>"}},
    {PANGU_EMBED, {"[unused9]系统：[unused10]"}},
    {SOLAR_OPEN, {"<|begin|>", "<|end|>", "<|content|>"}},
};

/* The family a template is recognised as (see chat.h), or -1. */
int sp_chat_named_detect(const char *tmpl, size_t n) {
    if (!tmpl) return -1;
    const int named = sp_chat_named_find(tmpl, n);
    if (named >= 0) return named;
    const struct src t = {tmpl, n};
    if (has(&t, "<|im_start|>")) return has(&t, "<|im_sep|>") ? PHI4 : has(&t, "<end_of_utterance>") ? SMOLVLM : CHATML;
    if ((n >= 7 && memcmp(tmpl, "mistral", 7) == 0) || has(&t, "[INST]")) return detect_inst(&t);
    const bool exaone_turns = has(&t, "[|endofturn|]");
    const bool granite_tools = has(&t, "<tool_call>") || has(&t, "<tools>");
    for (size_t i = 0; i < SP_ARRAY_LEN(k_rules); i++) {
        const struct rule *r = &k_rules[i];
        bool ok = true;
        for (int k = 0; k < 3 && r->all[k] && ok; k++) ok = has(&t, r->all[k]);
        if (!ok) continue;
        if (r->fam == EXAONE4 && !exaone_turns) continue;
        if ((r->fam == GRANITE_40 || r->fam == GRANITE_41) && !granite_tools) continue;
        return r->fam;
    }
    return -1;
}

/* ---- formatting ---------------------------------------------------------------- */

static void put(struct sp_jbuf *b, const char *s) {
    sp_jbuf_put(b, s, strlen(s));
}

static void put_n(struct sp_jbuf *b, const char *s, size_t n) {
    sp_jbuf_put(b, s, n);
}

static bool c_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* content with ASCII whitespace trimmed on both ends */
static void put_trim(struct sp_jbuf *b, const struct sp_chat_msg *m) {
    size_t s = 0, e = m->content_len;
    while (s < e && c_space(m->content[s])) s++;
    while (e > s && c_space(m->content[e - 1])) e--;
    put_n(b, m->content + s, e - s);
}

static void content(struct sp_jbuf *b, const struct sp_chat_msg *m) {
    put_n(b, m->content, m->content_len);
}

static void role(struct sp_jbuf *b, const struct sp_chat_msg *m) {
    put_n(b, m->role, m->role_len);
}

static bool is_role(const struct sp_chat_msg *m, const char *r) {
    return m->role_len == strlen(r) && memcmp(m->role, r, m->role_len) == 0;
}

/* The role in upper case, "user" as "HUMAN" (the bailing families). */
static void role_upper_human(struct sp_jbuf *b, const struct sp_chat_msg *m) {
    if (is_role(m, "user")) {
        put(b, "HUMAN");
        return;
    }
    for (size_t i = 0; i < m->role_len; i++) {
        const char c = m->role[i];
        sp_jbuf_putc(b, c >= 'a' && c <= 'z' ? (char)(c - 32) : c);
    }
}

/* Families of the form  PRE role MID content POST  per message, then ASSIST. */
static const struct wrap {
    int fam;
    const char *pre, *mid, *post, *assist;
} k_wraps[] = {
    {CHATML, "<|im_start|>", "\n", "<|im_end|>\n", "<|im_start|>assistant\n"},
    {PHI3, "<|", "|>\n", "<|end|>\n", "<|assistant|>\n"},
    {PHI4, "<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>"},
    {FALCON3, "<|", "|>\n", "\n", "<|assistant|>\n"},
    {ZEPHYR, "<|", "|>\n", "<|endoftext|>\n", "<|assistant|>\n"},
    {GLMEDGE, "<|", "|>\n", "", "<|assistant|>"},
    {MEGREZ, "<|role_start|>", "<|role_end|>", "<|turn_end|>", "<|role_start|>assistant<|role_end|>"},
    {SOLAR_OPEN, "<|begin|>", "<|content|>", "<|end|>", "<|begin|>assistant"},
};

/* [SYS] content [/SYS] style families: one prefix/suffix per role. */
struct roles {
    const char *sys_pre, *sys_post, *user_pre, *user_post, *asst_pre, *asst_post;
};

static void by_role(struct sp_jbuf *b, const struct sp_chat_msg *m, const struct roles *r, bool trim) {
    const char *pre, *post;
    if (is_role(m, "system")) {
        pre = r->sys_pre;
        post = r->sys_post;
    } else if (is_role(m, "user")) {
        pre = r->user_pre;
        post = r->user_post;
    } else if (is_role(m, "assistant")) {
        pre = r->asst_pre;
        post = r->asst_post;
    } else {
        return;
    }
    put(b, pre);
    if (trim)
        put_trim(b, m);
    else
        content(b, m);
    put(b, post);
}

/* Append the conversation as family fam formats it (see chat.h). */
void sp_chat_named_apply(int fam, const struct sp_chat_msg *msgs, size_t n, bool add_ass, struct sp_jbuf *b) {
    for (size_t w = 0; w < SP_ARRAY_LEN(k_wraps); w++) {
        if (k_wraps[w].fam != fam) continue;
        for (size_t i = 0; i < n; i++) {
            put(b, k_wraps[w].pre);
            role(b, &msgs[i]);
            put(b, k_wraps[w].mid);
            content(b, &msgs[i]);
            put(b, k_wraps[w].post);
        }
        if (add_ass) put(b, k_wraps[w].assist);
        return;
    }
    switch (fam) {
    case MISTRAL_V7:
    case MISTRAL_V7_TEKKEN: {
        const char *sp = fam == MISTRAL_V7 ? " " : "";
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (is_role(m, "system")) {
                put(b, "[SYSTEM_PROMPT]");
                put(b, sp);
                content(b, m);
                put(b, "[/SYSTEM_PROMPT]");
            } else if (is_role(m, "user")) {
                put(b, "[INST]");
                put(b, sp);
                content(b, m);
                put(b, "[/INST]");
            } else {
                put(b, sp);
                content(b, m);
                put(b, "</s>");
            }
        }
        return;
    }
    case MISTRAL_V1:
    case MISTRAL_V3:
    case MISTRAL_V3_TEKKEN: {
        const char *lead = fam == MISTRAL_V1 ? " " : "", *trail = fam == MISTRAL_V3_TEKKEN ? "" : " ";
        bool in_turn = false;
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (!in_turn) {
                put(b, lead);
                put(b, "[INST]");
                put(b, trail);
                in_turn = true;
            }
            if (is_role(m, "system")) {
                content(b, m);
                put(b, "\n\n");
            } else if (is_role(m, "user")) {
                content(b, m);
                put(b, lead);
                put(b, "[/INST]");
            } else {
                put(b, trail);
                if (fam == MISTRAL_V3)
                    put_trim(b, m);
                else
                    content(b, m);
                put(b, "</s>");
                in_turn = false;
            }
        }
        return;
    }
    case LLAMA2:
    case LLAMA2_SYS:
    case LLAMA2_SYS_BOS:
    case LLAMA2_SYS_STRIP: {
        bool in_turn = true;
        put(b, "[INST] ");
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (!in_turn) {
                in_turn = true;
                put(b, fam == LLAMA2_SYS_BOS ? "<s>[INST] " : "[INST] ");
            }
            const bool sys = is_role(m, "system");
            if (sys && fam != LLAMA2) put(b, "<<SYS>>\n");
            if (fam == LLAMA2_SYS_STRIP)
                put_trim(b, m);
            else
                content(b, m);
            if (sys) {
                put(b, fam != LLAMA2 ? "\n<</SYS>>\n\n" : "\n");
            } else if (is_role(m, "user")) {
                put(b, " [/INST]");
            } else {
                put(b, "</s>");
                in_turn = false;
            }
        }
        return;
    }
    case MONARCH:
        for (size_t i = 0; i < n; i++) {
            if (i) put(b, "<s>");
            role(b, &msgs[i]);
            put(b, "\n");
            content(b, &msgs[i]);
            put(b, "</s>\n");
        }
        if (add_ass) put(b, "<s>assistant\n");
        return;
    case GEMMA:
    case ORION: {
        /* no system turn: system text waits for the next user turn */
        struct sp_jbuf sys = {.limit = b->limit};
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (is_role(m, "system")) {
                if (fam == GEMMA) {
                    size_t s = 0, e = m->content_len;
                    while (s < e && c_space(m->content[s])) s++;
                    while (e > s && c_space(m->content[e - 1])) e--;
                    put_n(&sys, m->content + s, e - s);
                } else {
                    put_n(&sys, m->content, m->content_len);
                }
                continue;
            }
            if (fam == GEMMA) {
                const bool model = is_role(m, "assistant");
                put(b, "<start_of_turn>");
                if (model)
                    put(b, "model");
                else
                    role(b, m);
                put(b, "\n");
                if (sys.n && !model) {
                    put_n(b, sys.p, sys.n);
                    put(b, "\n\n");
                    sys.n = 0;
                }
                put_trim(b, m);
                put(b, "<end_of_turn>\n");
            } else if (is_role(m, "user")) {
                put(b, "Human: ");
                if (sys.n) {
                    put_n(b, sys.p, sys.n);
                    put(b, "\n\n");
                    sys.n = 0;
                }
                content(b, m);
                put(b, "\n\nAssistant: </s>");
            } else {
                content(b, m);
                put(b, "</s>");
            }
        }
        if (sys.over) b->over = true;
        sp_jbuf_free(&sys);
        if (fam == GEMMA && add_ass) put(b, "<start_of_turn>model\n");
        return;
    }
    case OPENCHAT:
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (!is_role(m, "system")) {
                put(b, "GPT4 Correct ");
                if (m->role_len) {
                    const char c = m->role[0];
                    sp_jbuf_putc(b, c >= 'a' && c <= 'z' ? (char)(c - 32) : c);
                    put_n(b, m->role + 1, m->role_len - 1);
                }
                put(b, ": ");
            }
            content(b, m);
            put(b, "<|end_of_turn|>");
        }
        if (add_ass) put(b, "GPT4 Correct Assistant:");
        return;
    case VICUNA:
    case VICUNA_ORCA: {
        const struct roles r = {fam == VICUNA_ORCA ? "SYSTEM: " : "", fam == VICUNA_ORCA ? "\n" : "\n\n", "USER: ", "\n",
                                "ASSISTANT: ", "</s>\n"};
        for (size_t i = 0; i < n; i++) by_role(b, &msgs[i], &r, false);
        if (add_ass) put(b, "ASSISTANT:");
        return;
    }
    case DEEPSEEK: {
        const struct roles r = {"", "", "### Instruction:\n", "\n", "### Response:\n", "\n<|EOT|>\n"};
        for (size_t i = 0; i < n; i++) by_role(b, &msgs[i], &r, false);
        if (add_ass) put(b, "### Response:\n");
        return;
    }
    case COMMAND_R: {
        const struct roles r = {"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                                "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                                "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"};
        for (size_t i = 0; i < n; i++) by_role(b, &msgs[i], &r, true);
        if (add_ass) put(b, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
        return;
    }
    case LLAMA3:
    case LLAMA4: {
        const bool l3 = fam == LLAMA3;
        for (size_t i = 0; i < n; i++) {
            put(b, l3 ? "<|start_header_id|>" : "<|header_start|>");
            role(b, &msgs[i]);
            put(b, l3 ? "<|end_header_id|>\n\n" : "<|header_end|>\n\n");
            put_trim(b, &msgs[i]);
            put(b, l3 ? "<|eot_id|>" : "<|eot|>");
        }
        if (add_ass) put(b, l3 ? "<|start_header_id|>assistant<|end_header_id|>\n\n" : "<|header_start|>assistant<|header_end|>\n\n");
        return;
    }
    case CHATGLM3:
    case CHATGLM4:
        put(b, fam == CHATGLM3 ? "[gMASK]sop" : "[gMASK]<sop>");
        for (size_t i = 0; i < n; i++) {
            put(b, "<|");
            role(b, &msgs[i]);
            put(b, fam == CHATGLM3 ? "|>\n " : "|>\n");
            content(b, &msgs[i]);
        }
        if (add_ass) put(b, fam == CHATGLM3 ? "<|assistant|>" : "<|assistant|>\n");
        return;
    case MINICPM:
        for (size_t i = 0; i < n; i++) {
            const bool user = is_role(&msgs[i], "user");
            if (user) put(b, "<用户>");
            put_trim(b, &msgs[i]);
            if (user) put(b, "<AI>");
        }
        return;
    case DEEPSEEK2:
    case DEEPSEEK3: {
        const struct roles r2 = {"", "\n\n", "User: ", "\n\n", "Assistant: ", "<｜end▁of▁sentence｜>"};
        const struct roles r3 = {"", "\n\n", "<｜User｜>", "", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"};
        for (size_t i = 0; i < n; i++) by_role(b, &msgs[i], fam == DEEPSEEK2 ? &r2 : &r3, false);
        if (add_ass) put(b, fam == DEEPSEEK2 ? "Assistant:" : "<｜Assistant｜>");
        return;
    }
    case DEEPSEEK_OCR:
        for (size_t i = 0; i < n; i++) content(b, &msgs[i]);
        return;
    case EXAONE3:
    case EXAONE4: {
        const struct roles r = {"[|system|]", "[|endofturn|]\n", "[|user|]", "\n", "[|assistant|]", "[|endofturn|]\n"};
        for (size_t i = 0; i < n; i++) {
            if (fam == EXAONE4 && is_role(&msgs[i], "tool")) {
                put(b, "[|tool|]");
                put_trim(b, &msgs[i]);
                put(b, "[|endofturn|]\n");
            } else {
                by_role(b, &msgs[i], &r, true);
            }
        }
        if (add_ass) put(b, "[|assistant|]");
        return;
    }
    case EXAONE_MOE:
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (!is_role(m, "system") && !is_role(m, "user") && !is_role(m, "assistant") && !is_role(m, "tool"))
                continue;
            put(b, "<|");
            role(b, m);
            put(b, "|>\n");
            put_trim(b, m);
            put(b, "<|endofturn|>\n");
        }
        if (add_ass) put(b, "<|assistant|>\n");
        return;
    case RWKV_WORLD: {
        const struct roles r = {"System: ", "\n\n", "User: ", "\n\n", "Assistant: ", "\n\n"};
        for (size_t i = 0; i < n; i++) {
            by_role(b, &msgs[i], &r, true);
            if (i + 1 == n && is_role(&msgs[i], "user")) put(b, "Assistant:");
        }
        return;
    }
    case GRANITE:
    case GRANITE_40:
    case GRANITE_41:
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            const bool call = is_role(m, "assistant_tool_call");
            put(b, "<|start_of_role|>");
            if (call && fam != GRANITE)
                put(b, "assistant");
            else
                role(b, m);
            put(b, "<|end_of_role|>");
            if (call) put(b, "<|tool_call|>");
            content(b, m);
            put(b, "<|end_of_text|>\n");
        }
        if (add_ass) put(b, "<|start_of_role|>assistant<|end_of_role|>");
        return;
    case GIGACHAT: {
        const bool sys = n > 0 && is_role(&msgs[0], "system");
        put(b, "<s>");
        if (sys) {
            content(b, &msgs[0]);
            put(b, "<|message_sep|>");
        }
        for (size_t i = sys ? 1 : 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (is_role(m, "user")) {
                put(b, "user<|role_sep|>");
                content(b, m);
                put(b, "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>");
            } else if (is_role(m, "assistant")) {
                put(b, "assistant<|role_sep|>");
                content(b, m);
                put(b, "<|message_sep|>");
            }
        }
        if (add_ass) put(b, "assistant<|role_sep|>");
        return;
    }
    case YANDEX: {
        const struct roles r = {NULL, NULL, " Пользователь: ", "\n\n", " Ассистент: ", "\n\n"};
        for (size_t i = 0; i < n; i++)
            if (!is_role(&msgs[i], "system")) by_role(b, &msgs[i], &r, false);
        if (add_ass) put(b, " Ассистент:[SEP]");
        return;
    }
    case BAILING:
    case BAILING_THINK:
    case BAILING2:
        if (fam == BAILING2 && !(n > 0 && is_role(&msgs[0], "system")))
            put(b, "<role>SYSTEM</role>detailed thinking off<|role_end|>");
        for (size_t i = 0; i < n; i++) {
            put(b, "<role>");
            role_upper_human(b, &msgs[i]);
            put(b, "</role>");
            content(b, &msgs[i]);
            if (fam == BAILING2) put(b, "<|role_end|>");
        }
        if (add_ass) put(b, fam == BAILING_THINK ? "<role>ASSISTANT</role><think>" : "<role>ASSISTANT</role>");
        return;
    case SMOLVLM:
        put(b, "<|im_start|>");
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (is_role(m, "system")) {
                content(b, m);
                put(b, "\n\n");
            } else {
                put(b, is_role(m, "user") ? "User: " : "Assistant: ");
                content(b, m);
                put(b, "<end_of_utterance>\n");
            }
        }
        if (add_ass) put(b, "Assistant:");
        return;
    case DOTS1:
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            const bool sys = is_role(m, "system"), user = is_role(m, "user");
            put(b, sys ? "<|system|>" : user ? "<|userprompt|>" : "<|response|>");
            content(b, m);
            put(b, sys ? "<|endofsystem|>" : user ? "<|endofuserprompt|>" : "<|endofresponse|>");
        }
        if (add_ass) put(b, "<|response|>");
        return;
    case HUNYUAN_MOE:
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            const bool asst = is_role(m, "assistant");
            if (!asst) put(b, "<|startoftext|>");
            content(b, m);
            put(b, asst ? "<|eos|>" : is_role(m, "system") ? "<|extra_4|>" : "<|extra_0|>");
        }
        return;
    case GPT_OSS:
        for (size_t i = 0; i < n; i++) {
            put(b, "<|start|>");
            role(b, &msgs[i]);
            put(b, "<|message|>");
            content(b, &msgs[i]);
            put(b, is_role(&msgs[i], "assistant") ? "<|return|>" : "<|end|>");
        }
        if (add_ass) put(b, "<|start|>assistant");
        return;
    case HUNYUAN_DENSE:
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (i == 0 && is_role(m, "system")) {
                content(b, m);
                put(b, "<｜hy_place▁holder▁no▁3｜>");
            }
            if (is_role(m, "assistant")) {
                put(b, "<｜hy_Assistant｜>");
                content(b, m);
                put(b, "<｜hy_place▁holder▁no▁2｜>");
            } else if (is_role(m, "user")) {
                put(b, "<｜hy_User｜>");
                content(b, m);
                put(b, "<｜hy_Assistant｜>");
            }
        }
        return;
    case HUNYUAN_VL:
        put(b, "<｜hy_begin▁of▁sentence｜>");
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (i == 0 && is_role(m, "system")) {
                content(b, m);
                put(b, "<｜hy_place▁holder▁no▁3｜>");
            } else if (is_role(m, "user") || is_role(m, "assistant")) {
                content(b, m);
                put(b, is_role(m, "user") ? "<｜hy_User｜>" : "<｜hy_Assistant｜>");
            }
        }
        return;
    case KIMI_K2:
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (is_role(m, "system")) put(b, "<|im_system|>system<|im_middle|>");
            else if (is_role(m, "user")) put(b, "<|im_user|>user<|im_middle|>");
            else if (is_role(m, "assistant")) put(b, "<|im_assistant|>assistant<|im_middle|>");
            else if (is_role(m, "tool")) put(b, "<|im_system|>tool<|im_middle|>");
            content(b, m);
            put(b, "<|im_end|>");
        }
        if (add_ass) put(b, "<|im_assistant|>assistant<|im_middle|>");
        return;
    case SEED_OSS:
        for (size_t i = 0; i < n; i++) {
            put(b, "<seed:bos>");
            role(b, &msgs[i]);
            put(b, "\n");
            if (is_role(&msgs[i], "assistant"))
                put_trim(b, &msgs[i]);
            else
                content(b, &msgs[i]);
            put(b, "<seed:eos>");
        }
        if (add_ass) put(b, "<seed:bos>assistant\n");
        return;
    case GROK2:
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            const struct roles r = {"System: ", "<|separator|>\n\n", "Human: ", "<|separator|>\n\n", "Assistant: ",
                                    "<|separator|>\n\n"};
            by_role(b, m, &r, !is_role(m, "assistant"));
        }
        if (add_ass) put(b, "Assistant:");
        return;
    case PANGU_EMBED: {
        static const char *const roles[][2] = {{"system", "系统"}, {"user", "用户"}, {"assistant", "助手"},
                                               {"tool", "工具"},   {"function", "方法"}};
        for (size_t i = 0; i < n; i++) {
            const struct sp_chat_msg *m = &msgs[i];
            if (i == 0 && !is_role(m, "system")) put(b, "[unused9]系统：[unused10]");
            for (size_t k = 0; k < SP_ARRAY_LEN(roles); k++) {
                if (!is_role(m, roles[k][0])) continue;
                put(b, "[unused9]");
                put(b, roles[k][1]);
                put(b, "：");
                content(b, m);
                put(b, "[unused10]");
            }
        }
        if (add_ass) put(b, "[unused9]助手：");
        return;
    }
    default: return;
    }
}
