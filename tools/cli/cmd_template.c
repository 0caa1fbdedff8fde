/*
 * cmd_template.c -- `sparrow template`: a conversation (a JSON file of
 * messages) rendered with a chat template -- the model's own, a Jinja file,
 * or a named formatter -- printed as the exact prompt text, nothing else.
 * The rendering is the library's (sp_chat_apply); this file parses options.
 */
#include "cmds.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void help_template(FILE *f) {
    fprintf(f, "usage: sparrow template (-m MODEL | --template-file FILE | --chat-template NAME)\n"
               "                        --messages FILE.json [OPTIONS]\n"
               "\n"
               "Render a conversation with a chat template and print the prompt on stdout,\n"
               "byte for byte and nothing else (no newline is added).  FILE.json is an array\n"
               "of {\"role\": ..., \"content\": ...} objects; other fields (tool_calls, name, ...)\n"
               "reach Jinja templates as they are.  With -m the template is the model's\n"
               "tokenizer.chat_template and bos_token / eos_token are its tokens' text; when\n"
               "the vocabulary adds BOS itself, a leading BOS text is dropped (as llama.cpp\n"
               "does), so that tokenizing the prompt with BOS does not double it.  Only the\n"
               "vocabulary is loaded.  -m may be combined with --template-file or\n"
               "--chat-template, which then replace the model's template.\n"
               "\n"
               "options:\n"
               "  -m, --model FILE          model or vocabulary file (GGUF)\n"
               "      --template-file FILE  a Jinja template (or a family name) in a file\n"
               "      --chat-template NAME  a named formatter (list below)\n"
               "      --messages FILE       the conversation, a JSON array ('-' = stdin); required\n"
               "      --bos TEXT            the text bos_token stands for (default: the model's\n"
               "                            BOS token, or empty)\n"
               "      --eos TEXT            the same for eos_token\n"
               "      --jinja               run the template's Jinja program (the default)\n"
               "      --no-jinja            use the named formatter the template is recognised as;\n"
               "                            a template none recognises is an error\n"
               "      --no-generation-prompt  do not end with the opening of an assistant turn\n"
               "      --chat-template-kwargs JSON  a JSON object of extra template variables,\n"
               "                            e.g. '{\"enable_thinking\": false, \"tools\": [...]}'\n"
               "      --keep-bos            keep a leading BOS text even when the model adds BOS\n"
               "  -v, --verbose             print the library's log messages on stderr\n"
               "  -h, --help                print this help and exit\n"
               "\n"
               "named formatters:\n");
    const char *names[128];
    const int32_t n = sp_chat_builtin_templates(names, 128);
    size_t col = 0;
    for (int32_t i = 0; i < n && i < 128; i++) {
        const size_t w = strlen(names[i]);
        if (col && col + 1 + w > 78) {
            fputc('\n', f);
            col = 0;
        }
        fprintf(f, "%s%s", col ? " " : "  ", names[i]);
        col += (col ? 1 : 2) + w;
    }
    fputc('\n', f);
    fprintf(f, "\n"
               "exit status: 0 success, 1 runtime or library error (a template error names its\n"
               "line and column), 2 usage error.\n");
}

int cmd_template(int argc, char **argv) {
    struct argp a = {.cmd = "template", .argc = argc, .argv = argv};
    const char *model_path = NULL, *tmpl_file = NULL, *tmpl_name = NULL, *messages = NULL;
    struct sp_chat_params p = sp_chat_default_params();

    for (a.i = 1; a.i < argc; a.i++) {
        if (!is_option(argv[a.i])) usage_error(a.cmd, "unexpected argument '%s'", argv[a.i]);
        if (opt_is(&a, "-h", "--help")) {
            help_template(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-m", "--model")) {
            model_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--template-file")) {
            tmpl_file = opt_value(&a);
        } else if (opt_is(&a, NULL, "--chat-template")) {
            tmpl_name = opt_value(&a);
        } else if (opt_is(&a, NULL, "--messages")) {
            messages = opt_value(&a);
        } else if (opt_is(&a, NULL, "--bos")) {
            p.bos_token = opt_value(&a);
        } else if (opt_is(&a, NULL, "--eos")) {
            p.eos_token = opt_value(&a);
        } else if (opt_is(&a, NULL, "--jinja")) {
            opt_no_value(&a);
            p.engine = SP_CHAT_JINJA;
        } else if (opt_is(&a, NULL, "--no-jinja")) {
            opt_no_value(&a);
            p.engine = SP_CHAT_NAMED;
        } else if (opt_is(&a, NULL, "--no-generation-prompt")) {
            opt_no_value(&a);
            p.add_assistant = false;
        } else if (opt_is(&a, NULL, "--chat-template-kwargs")) {
            p.vars_json = opt_value(&a);
        } else if (opt_is(&a, NULL, "--keep-bos")) {
            opt_no_value(&a);
            p.keep_bos = true;
        } else {
            last_opt(&a, "see 'sparrow template --help'");
        }
    }
    if (!model_path && !tmpl_file && !tmpl_name)
        usage_error(a.cmd, "give -m MODEL, --template-file FILE or --chat-template NAME");
    if (tmpl_file && tmpl_name) usage_error(a.cmd, "--template-file and --chat-template exclude each other");
    if (!messages) usage_error(a.cmd, "--messages FILE.json is required (see 'sparrow template --help')");
    const char *named = tmpl_name ? sp_chat_detect_template(tmpl_name) : NULL;
    if (tmpl_name && (!named || strcmp(named, tmpl_name) != 0))
        usage_error(a.cmd, "unknown template name '%s' (see 'sparrow template --help' for the list)", tmpl_name);

    int ret = EXIT_RUNTIME;
    struct sp_model *model = NULL;
    char *msg_json = NULL, *tmpl = NULL, *out = NULL;
    size_t len = 0;
    sp_status rc;
    sp_log_set(cli_log, &log_verbose);

    if (read_all(a.cmd, messages, &msg_json, &len) != 0) goto done;
    if (strlen(msg_json) != len) {
        fprintf(stderr, "sparrow: template: '%s' holds a NUL byte\n", messages);
        goto done;
    }
    p.messages_json = msg_json;
    if (tmpl_file) {
        if (read_all(a.cmd, tmpl_file, &tmpl, &len) != 0) goto done;
        if (strlen(tmpl) != len) {
            fprintf(stderr, "sparrow: template: '%s' holds a NUL byte\n", tmpl_file);
            goto done;
        }
        p.tmpl = tmpl;
    } else if (tmpl_name) {
        p.tmpl = tmpl_name;
    }
    if (model_path) {
        rc = load_model(model_path, NULL, true, 0, NULL, &model);
        if (rc != SP_OK) {
            ret = lib_error("loading the vocabulary", rc);
            goto done;
        }
    }
    rc = sp_chat_apply(model, &p, NULL, 0, NULL, 0, &len);
    if (rc == SP_E_BUFFER) {
        if (!(out = malloc(len + 1))) {
            fprintf(stderr, "sparrow: template: out of memory\n");
            goto done;
        }
        rc = sp_chat_apply(model, &p, NULL, 0, out, len + 1, &len);
    }
    if (rc != SP_OK) {
        ret = lib_error("rendering the template", rc);
        goto done;
    }
    if (fwrite(out, 1, len, stdout) != len || fflush(stdout) != 0) {
        fprintf(stderr, "sparrow: template: cannot write to stdout: %s\n", strerror(errno));
        goto done;
    }
    ret = EXIT_OK;
done:
    free(out);
    free(tmpl);
    free(msg_json);
    sp_model_free(model);
    return ret;
}
