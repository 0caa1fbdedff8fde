#!/bin/sh
# test_template.sh -- `sparrow template` as a black box: usage errors (exit 2),
# every case of ../shared/peer-tests/chat-template/cases.json rendered with
# --no-jinja and --jinja byte for byte against llama.cpp's output, template
# errors with line and column (exit 1), variables and BOS/EOS options, and a
# model's own template (-m) with `sparrow tokenize --special` on the result.
# Run by tests/run.sh with SPARROW = the binary.  Needs python3 (to read the
# cases and write a tiny GGUF).
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SPARROW_SHARED=${SPARROW_SHARED:-$root/../shared}

name=template
. "$root/tests/lib/harness.sh"

if [ ! -x "$SPARROW" ]; then
    bad "binary $SPARROW not found (run make first)"
    harness_report
fi
if ! command -v python3 >/dev/null 2>&1; then
    bad "python3 not found: it is needed to read the cases and write a test model"
    harness_report
fi

# ---- usage ------------------------------------------------------------------------------
printf '[{"role": "user", "content": "Hi"}]' >"$tmp/one.json"
sp template --help
t_rc "--help" 0
t_out_has "--help" "--template-file" "--chat-template" "--messages" "--no-jinja" "--no-generation-prompt" "chatml" "llama3"
t_usage "no template" template --messages "$tmp/one.json"
t_usage "no messages" template --chat-template chatml
t_usage "two templates" template --chat-template chatml --template-file x --messages "$tmp/one.json"
t_usage "unknown name" template --chat-template nosuch --messages "$tmp/one.json"
t_usage "unknown option" template --chat-template chatml --messages "$tmp/one.json" --frob
t_usage "stray argument" template --chat-template chatml --messages "$tmp/one.json" extra
t_usage "flag with value" template --chat-template chatml --messages "$tmp/one.json" --no-jinja=1

# ---- a named formatter, exactly ---------------------------------------------------------
printf '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]' >"$tmp/two.json"
printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n' >"$tmp/want"
sp template --chat-template chatml --messages "$tmp/two.json"
t_rc "chatml" 0
t_file "chatml" "$tmp/want"
t_empty_err "chatml"
printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n' >"$tmp/want"
sp template --chat-template chatml --messages "$tmp/two.json" --no-generation-prompt
t_file "chatml --no-generation-prompt" "$tmp/want"
sp template --chat-template chatml --messages - <"$tmp/two.json" --no-generation-prompt
t_file "messages from stdin" "$tmp/want"

# ---- llama.cpp's renderings of 24 real templates ----------------------------------------
fx=$SPARROW_SHARED/peer-tests/chat-template/cases.json
if [ -f "$fx" ]; then
    mkdir -p "$tmp/cases"
    if python3 - "$fx" "$tmp/cases" <<'EOF'
import json, os, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
out = sys.argv[2]
for i, c in enumerate(d["cases"]):
    p = os.path.join(out, "%02d" % i)
    msgs = d["conversation"] + c["extra_conversation"]
    files = {"tmpl": c["template"], "messages.json": json.dumps(msgs, ensure_ascii=False),
             "named": c["expected_output"], "jinja": c["expected_output_jinja"] or c["expected_output"],
             "bos": c["bos_token"], "eos": c["eos_token"], "name": c["name"],
             "supported": "1" if c["supported_with_jinja"] else "0"}
    for k, v in files.items():
        with open(p + "." + k, "wb") as f:
            f.write(v.encode("utf-8"))
EOF
    then
        n_named=0; n_jinja=0; n_cases=0
        for t in "$tmp"/cases/*.tmpl; do
            c=${t%.tmpl}
            n_cases=$((n_cases + 1))
            label=$(cat "$c.name")
            "$SPARROW" template --template-file "$t" --messages "$c.messages.json" --bos "$(cat "$c.bos")" \
                --eos "$(cat "$c.eos")" --no-jinja >"$tmp/out" 2>"$tmp/err"
            if [ $? -eq 0 ] && cmp -s "$tmp/out" "$c.named"; then n_named=$((n_named + 1)); else
                bad "--no-jinja $label" "$(show_err)"; fi
            if [ "$(cat "$c.supported")" = 1 ]; then
                "$SPARROW" template --template-file "$t" --messages "$c.messages.json" --bos "$(cat "$c.bos")" \
                    --eos "$(cat "$c.eos")" >"$tmp/out" 2>"$tmp/err"
                if [ $? -eq 0 ] && cmp -s "$tmp/out" "$c.jinja"; then n_jinja=$((n_jinja + 1)); else
                    bad "--jinja $label" "$(show_err)"; fi
            fi
        done
        echo "cases: $n_cases, --no-jinja matches $n_named, --jinja matches $n_jinja"
        if [ "$n_cases" -eq 24 ] && [ "$n_named" -ge 20 ] && [ "$n_jinja" -ge 22 ]; then
            ok "peer cases: $n_named/24 named, $n_jinja/23 Jinja"
        else
            bad "peer cases: $n_cases cases, $n_named named, $n_jinja Jinja (need 24, >= 20, >= 22)"
        fi
    else
        bad "could not read $fx"
    fi
else
    bad "missing fixture: $fx"
fi

# ---- Jinja files: variables, errors, engines ------------------------------------------------
cat >"$tmp/t.jinja" <<'EOF'
{{- bos_token }}
{%- for m in messages %}
    {{- '[' + m.role + '] ' + m.content|trim + eos_token }}
{%- endfor %}
{%- if enable_thinking is false %}(no thinking){% endif %}
{%- if add_generation_prompt %}[assistant]{% endif %}
EOF
printf '<s>[system] Be brief.</s>[user] Hi</s>(no thinking)[assistant]' >"$tmp/want"
sp template --template-file "$tmp/t.jinja" --messages "$tmp/two.json" --bos '<s>' --eos '</s>' \
    --chat-template-kwargs '{"enable_thinking": false}'
t_rc "jinja file" 0
t_file "jinja file" "$tmp/want"
sp template --template-file "$tmp/t.jinja" --messages "$tmp/two.json" --no-jinja
t_rc "--no-jinja, unrecognised" 1
t_err_has "--no-jinja, unrecognised" "no named formatter"
t_empty_out "--no-jinja, unrecognised"
sp template --template-file "$tmp/t.jinja" --messages "$tmp/two.json" --chat-template-kwargs '[1]'
t_rc "kwargs not an object" 1
printf 'ok\n{%% for m in messages %%}{{ m.content|frobnicate }}{%% endfor %%}' >"$tmp/bad1.jinja"
sp template --template-file "$tmp/bad1.jinja" --messages "$tmp/two.json"
t_rc "unknown filter" 1
t_err_one_line "unknown filter"
t_err_has "unknown filter" "line 2, column 37" "frobnicate"
t_empty_out "unknown filter"
printf '{%% if true %%}\n  {%% for m in messages %%}x' >"$tmp/bad2.jinja"
sp template --template-file "$tmp/bad2.jinja" --messages "$tmp/two.json"
t_rc "unclosed block" 1
t_err_has "unclosed block" "line 2, column 6" "never closed"
printf '{{ raise_exception("Only user and assistant roles are supported!") }}' >"$tmp/bad3.jinja"
sp template --template-file "$tmp/bad3.jinja" --messages "$tmp/two.json"
t_rc "raise_exception" 1
t_err_has "raise_exception" "line 1, column 4" "Only user and assistant roles are supported!"
printf '{%% for i in range(100000) %%}{%% for j in range(100000) %%}{%% endfor %%}{%% endfor %%}' >"$tmp/bad4.jinja"
sp template --template-file "$tmp/bad4.jinja" --messages "$tmp/two.json"
t_rc "runaway loop" 1
t_err_has "runaway loop" "line 1, column" "iterations"
printf '[{"role": "user", "content": "Hi"' >"$tmp/bad.json"
sp template --chat-template chatml --messages "$tmp/bad.json"
t_rc "bad messages JSON" 1
t_err_has "bad messages JSON" "messages" "JSON"
sp template --chat-template chatml --messages "$tmp/nosuch.json"
t_rc "missing messages file" 1
t_err_has "missing messages file" "cannot open"

# ---- a model's own template -------------------------------------------------------------------
# A vocabulary-only GGUF v3 whose tokenizer.chat_template starts with bos_token.
if python3 - "$tmp/m.gguf" <<'EOF'
import struct, sys
def s(x):
    b = x.encode("utf-8")
    return struct.pack("<Q", len(b)) + b
kv = []
def add(key, typ, payload):
    kv.append(s(key) + struct.pack("<I", typ) + payload)
tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "\u2581b"]
add("tokenizer.ggml.model", 8, s("llama"))
add("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(tokens)) + b"".join(s(t) for t in tokens))
add("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, len(tokens)) + b"".join(struct.pack("<f", 0.0) for _ in tokens))
add("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(tokens)) + struct.pack("<8i", 2, 3, 3, 1, 1, 1, 1, 1))
add("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1))
add("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2))
add("tokenizer.ggml.add_bos_token", 7, struct.pack("<B", 1))
add("tokenizer.chat_template", 8, s("{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"))
with open(sys.argv[1], "wb") as f:
    f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(kv))
EOF
then
    printf '[{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]' >"$tmp/ab.json"
    sp template -m "$tmp/m.gguf" --messages "$tmp/ab.json"
    t_rc "-m" 0
    printf 'a</s>b</s>' >"$tmp/want"
    t_file "-m (BOS dropped: the vocabulary adds it)" "$tmp/want"
    sp template -m "$tmp/m.gguf" --messages "$tmp/ab.json" --keep-bos
    printf '<s>a</s>b</s>' >"$tmp/want"
    t_file "-m --keep-bos" "$tmp/want"
    sp template -m "$tmp/m.gguf" --messages "$tmp/ab.json" --chat-template llama2-sys
    t_rc "-m --chat-template" 0
    printf '[INST] <<SYS>>\na\n<</SYS>>\n\nb [/INST]' >"$tmp/want"
    t_file "-m --chat-template" "$tmp/want"
    sp template -m "$tmp/m.gguf" --messages "$tmp/ab.json" --no-jinja
    t_rc "-m --no-jinja, unrecognised" 1
    # the rendered prompt, tokenized with special tokens parsed: </s> is EOS (2)
    "$SPARROW" template -m "$tmp/m.gguf" --messages "$tmp/ab.json" >"$tmp/prompt" 2>"$tmp/err"
    sp tokenize -m "$tmp/m.gguf" --special --file "$tmp/prompt"
    t_line "tokenize --special" "1 6 2 7 2"
    sp tokenize -m "$tmp/m.gguf" --file "$tmp/prompt"
    if grep -q ' 2\( \|$\)' "$tmp/out"; then bad "tokenize without --special gives EOS" "$(show_out)"; else
        ok "tokenize without --special: no EOS id"; fi
else
    bad "could not write a test model"
fi
if need models/stories260K/stories260K-f32.gguf; then
    sp template -m "$fx" --messages "$tmp/two.json"
    t_rc "-m without a template" 1
    t_err_has "-m without a template" "no chat template"
fi

harness_report
