#!/bin/sh
# test_serve.sh -- `sparrow serve` as a black box (issue 17, acceptance 1):
# a server on an ephemeral loopback port over tiny-qwen3, driven by the
# official `openai` npm package (pinned 4.x, installed once into
# $SPARROW_SCRATCH/npm-openai) through tests/serve/client.mjs -- chat
# completions streamed and not, completions, models, errors, four streams
# at once -- and by curl: the SSE framing byte for byte, the error objects
# and status codes (malformed JSON 400, oversized body 413, unknown route
# 404, a prompt over the context 400), /health and /slots.  The test stops
# the server (SIGTERM: exit 0).  Skips the npm part only when npm cannot
# reach the registry.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SPARROW_SHARED=${SPARROW_SHARED:-$root/../shared}
SPARROW_SCRATCH=${SPARROW_SCRATCH:-$root/../scratch}

name=serve
. "$root/tests/lib/harness.sh"
. "$root/tests/serve/lib.sh"

model=$SPARROW_SHARED/models/tiny-qwen/tiny-qwen3-q8_0.gguf
[ -x "$SPARROW" ] || { bad "binary $SPARROW not found (run make first)"; harness_report; }
[ -f "$model" ] || { bad "missing fixture: $model"; harness_report; }
for tool in curl node; do
    command -v $tool >/dev/null 2>&1 || { bad "$tool not found: the test needs it"; harness_report; }
done
trap 'serve_stop; rm -rf "$tmp"' EXIT

# ---- usage ---------------------------------------------------------------------------
sp serve
t_rc "no model" 2
sp serve -m "$model" --port 70000
t_rc "port out of range" 2

if ! serve_start "$tmp/server.log" "$SPARROW" serve -m "$model" --port 0 -np 4 -c 512 -t 2 --max-body 65536; then
    bad "the server did not start" "$(tail -n 5 "$tmp/server.log")"
    harness_report
fi
ok "listening at $serve_url"
case "$serve_url" in http://127.0.0.1:*) ok "loopback by default";; *) bad "bound to $serve_url";; esac

# cu NAME STATUS ARGS...: curl, the body in $tmp/body, the status checked
cu() {
    _n=$1 _want=$2; shift 2
    _got=$(curl -s -o "$tmp/body" -w '%{http_code}' --max-time 30 "$@")
    if [ "$_got" = "$_want" ]; then ok "$_n: HTTP $_want"; else bad "$_n: HTTP $_got, want $_want" "$(head -c 300 "$tmp/body")"; fi
}
# has NAME STRING: the last body holds STRING
has() { if grep -qF -e "$2" "$tmp/body"; then ok "$1: has $2"; else bad "$1: lacks $2" "$(head -c 300 "$tmp/body")"; fi; }

cu "health" 200 "$serve_url/health"
has "health" '{"status":"ok"}'
cu "models" 200 "$serve_url/v1/models"
has "models" '"object":"list"'
cu "unknown route" 404 "$serve_url/v1/nothing"
has "unknown route" '"type":"not_found_error"'
has "unknown route" '"code":404'
cu "wrong method" 405 "$serve_url/v1/models" -d '{}'
cu "malformed JSON" 400 "$serve_url/v1/chat/completions" -H 'Content-Type: application/json' -d '{"messages": [}'
has "malformed JSON" '"type":"invalid_request_error"'
has "malformed JSON" '"code":400'
head -c 100000 /dev/zero | tr '\0' 'a' >"$tmp/big"
cu "oversized body" 413 "$serve_url/v1/completions" -H 'Content-Type: application/json' --data-binary @"$tmp/big"
cu "n = 3" 400 "$serve_url/v1/completions" -d '{"prompt": "Hi", "n": 3}'
has "n = 3" "'n' must be 1"
awk 'BEGIN { printf "{\"prompt\": \""; for (i = 0; i < 3000; i++) printf "cat "; printf "\"}" }' >"$tmp/long"
cu "prompt over the context" 400 "$serve_url/v1/completions" --data-binary @"$tmp/long"
has "prompt over the context" '"type":"exceed_context_size_error"'

# jv EXPR: EXPR (JavaScript, b = the last body parsed as JSON) printed
jv() { node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); const v = eval(process.argv[2]);
    process.stdout.write(typeof v === "string" ? v : JSON.stringify(v))' "$tmp/body" "$1" 2>/dev/null; }
# is NAME EXPR WANT: jv EXPR prints WANT
is() { _v=$(jv "$2"); if [ "$_v" = "$3" ]; then ok "$1"; else bad "$1: $2 = '$_v', want '$3'" "$(head -c 300 "$tmp/body")"; fi; }

# ---- llama-server's endpoints: tokenize, detokenize, apply-template, props ----------------
cu "tokenize" 200 "$serve_url/tokenize" -d '{"content": "Once upon a time"}'
is "tokenize: ids" 'b.tokens.length > 2 && b.tokens.every(Number.isInteger)' true
toks=$(jv 'JSON.stringify(b.tokens)')
cu "tokenize add_special" 200 "$serve_url/tokenize" -d '{"content": "Once upon a time", "add_special": true}'
is "tokenize add_special: BOS first, then the same ids" \
    "b.tokens.length === $toks.length + 1 && JSON.stringify(b.tokens.slice(1)) === '$toks'" true
cu "tokenize with_pieces" 200 "$serve_url/tokenize" -d '{"content": "Once upon a time", "with_pieces": true}'
is "tokenize with_pieces: ids and pieces" \
    "JSON.stringify(b.tokens.map((t) => t.id)) === '$toks' && b.tokens.map((t) => t.piece).join('').trim() === 'Once upon a time'" true
cu "tokenize parse_special" 200 "$serve_url/tokenize" -d '{"content": "a</s>"}'
is "tokenize: special-token text is its token by default (</s> = EOS, 2)" 'b.tokens.includes(2)' true
cu "tokenize parse_special false" 200 "$serve_url/tokenize" -d '{"content": "a</s>", "parse_special": false}'
is "tokenize parse_special false: plain text" '!b.tokens.includes(2) && b.tokens.length > 2' true
cu "tokenize without content" 400 "$serve_url/tokenize" -d '{"text": "x"}'
has "tokenize without content" "'content' is required"
cu "tokenize malformed" 400 "$serve_url/tokenize" -d '{"content": '
cu "tokenize GET" 405 "$serve_url/tokenize"
cu "detokenize" 200 "$serve_url/detokenize" -d "{\"tokens\": $toks}"
is "detokenize gives the text back" 'b.content.trim()' "Once upon a time"
cu "detokenize a bad id" 400 "$serve_url/detokenize" -d '{"tokens": [1, 99999999]}'
has "detokenize a bad id" "'tokens[1]'"
cu "detokenize not an array" 400 "$serve_url/detokenize" -d '{"tokens": "1 2"}'
msgs='[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]'
cu "apply-template" 200 "$serve_url/apply-template" -d "{\"messages\": $msgs}"
is "apply-template: chatml" 'b.prompt' "$(printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n')"
node -e 'process.stdout.write(JSON.stringify({content: JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).prompt, add_special: true}))' \
    "$tmp/body" >"$tmp/tokreq"
cu "tokenize the rendered prompt" 200 "$serve_url/tokenize" --data-binary @"$tmp/tokreq"
n_rendered=$(jv 'b.tokens.length')
cu "chat of the same messages" 200 "$serve_url/v1/chat/completions" -d "{\"messages\": $msgs, \"max_tokens\": 2}"
is "apply-template + tokenize count the chat's prompt tokens" 'b.usage.prompt_tokens' "$n_rendered"
cu "apply-template without messages" 400 "$serve_url/apply-template" -d '{}'
has "apply-template without messages" "'messages' is required"
cu "props" 200 "$serve_url/props"
is "props: total_slots" 'b.total_slots' 4
is "props: n_ctx of a slot" 'b.default_generation_settings.n_ctx' 512
is "props: model_path" 'b.model_path' "$model"
is "props: chat_template" 'b.chat_template' chatml
is "props: build_info" 'b.build_info.startsWith("sparrow ")' true
is "props: generation defaults" 'typeof b.default_generation_settings.params.temperature' number
# presence_penalty / frequency_penalty (OpenAI's, over the last repeat_last_n tokens) change greedy text
pq='"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0, "ignore_eos": true'
cu "greedy completion" 200 "$serve_url/v1/completions" -d "{$pq}"
plain=$(jv 'b.choices[0].text')
cu "greedy completion, penalties 0" 200 "$serve_url/v1/completions" -d "{$pq, \"presence_penalty\": 0, \"frequency_penalty\": 0}"
is "penalties of 0 change nothing" 'b.choices[0].text' "$plain"
cu "greedy completion with penalties" 200 "$serve_url/v1/completions" -d "{$pq, \"presence_penalty\": 1, \"frequency_penalty\": 2}"
if [ "$(jv 'b.choices[0].text')" != "$plain" ]; then ok "presence_penalty and frequency_penalty change greedy text"; else
    bad "the penalties did not change greedy text: $plain"; fi
cu "frequency_penalty out of range" 400 "$serve_url/v1/completions" -d "{$pq, \"frequency_penalty\": 2.5}"
has "frequency_penalty out of range" "'frequency_penalty'"
cu "repeat_penalty 0" 400 "$serve_url/v1/completions" -d "{$pq, \"repeat_penalty\": 0}"
has "repeat_penalty 0" "'repeat_penalty'"
cu "repeat_last_n out of range" 400 "$serve_url/v1/completions" -d "{$pq, \"repeat_last_n\": 100000}"
cu "metrics without --metrics" 501 "$serve_url/metrics"
has "metrics without --metrics" '"type":"not_supported_error"'
cu "slot save without --slot-save-path" 501 "$serve_url/slots/0?action=save" -d '{"filename": "a"}'
has "slot save without --slot-save-path" '"type":"not_supported_error"'

# ---- the SSE framing byte for byte ---------------------------------------------------------
req='{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12, "temperature": 0, "stream": true}'
curl -sN -D "$tmp/headers" --max-time 30 "$serve_url/v1/chat/completions" -d "$req" >"$tmp/sse"
if grep -qi '^content-type: text/event-stream' "$tmp/headers"; then ok "SSE content type"; else bad "SSE content type" "$(cat "$tmp/headers")"; fi
# every event is exactly "data: " + one JSON object + "\n\n"; the last one "data: [DONE]\n\n"
if node -e '
    const s = require("fs").readFileSync(process.argv[1], "latin1");
    if (!/^(data: \{[^\n]*\}\n\n)+data: \[DONE\]\n\n$/.test(s)) { console.error("framing: " + JSON.stringify(s.slice(0, 300))); process.exit(1); }
    const ev = s.split("\n\n").slice(0, -2).map((e) => JSON.parse(Buffer.from(e.slice(6), "latin1").toString("utf8")));
    const fail = (m) => { console.error(m); process.exit(1); };
    if (ev[0].choices[0].delta.role !== "assistant") fail("the first delta has no role");
    if (!ev.every((e) => e.id === ev[0].id && e.object === "chat.completion.chunk")) fail("ids or objects differ");
    const last = ev[ev.length - 1].choices[0];
    if (!["stop", "length"].includes(last.finish_reason)) fail("no finish_reason at the end");
    if (!ev.slice(0, -1).every((e) => e.choices[0].finish_reason === null)) fail("finish_reason before the end");
    process.stdout.write(ev.map((e) => e.choices[0].delta.content ?? "").join(""));
' "$tmp/sse" >"$tmp/sse_text" 2>"$tmp/sse_err"; then ok "SSE framing: every event data: JSON and a blank line, the last data: [DONE]"; else bad "SSE framing" "$(cat "$tmp/sse_err")"; fi
curl -s --max-time 30 "$serve_url/v1/chat/completions" -d "$(printf '%s' "$req" | sed 's/"stream": true/"stream": false/')" >"$tmp/whole"
node -e 'process.stdout.write(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).choices[0].message.content)' \
    "$tmp/whole" >"$tmp/whole_text" 2>/dev/null
if cmp -s "$tmp/sse_text" "$tmp/whole_text" && [ -s "$tmp/whole_text" ]; then ok "streamed deltas join to the whole answer"; else
    bad "streamed and whole answers differ" "stream: $(head -c 200 "$tmp/sse_text")" "whole:  $(head -c 200 "$tmp/whole_text")"; fi
# completions stream: text chunks, then [DONE]
curl -sN --max-time 30 "$serve_url/v1/completions" -d '{"prompt": "Once", "max_tokens": 4, "stream": true}' >"$tmp/sse2"
if node -e 'const s = require("fs").readFileSync(process.argv[1], "latin1");
    process.exit(/^(data: \{"id":"cmpl-[^\n]*"object":"text_completion"[^\n]*\}\n\n)+data: \[DONE\]\n\n$/.test(s) ? 0 : 1)' "$tmp/sse2"; then
    ok "completions SSE framing"; else bad "completions SSE framing" "$(head -c 300 "$tmp/sse2")"; fi

# ---- the official client ------------------------------------------------------------------------
npmdir=$SPARROW_SCRATCH/npm-openai
have_openai=0
if ! command -v npm >/dev/null 2>&1; then
    echo "SKIP the openai client part: npm is not installed"
elif ! openai_install "$npmdir"; then
    if timeout 20 npm ping >/dev/null 2>&1; then
        bad "npm install openai@$OPENAI_VERSION failed though the registry answers" "$(tail -n 5 "$npmdir/npm.log")"
    else
        echo "SKIP the openai client part: npm cannot reach the registry ($(tail -n 1 "$npmdir/npm.log"))"
    fi
else
    have_openai=1
    if timeout 120 node "$root/tests/serve/client.mjs" "$serve_url" "$npmdir" >"$tmp/client" 2>&1; then
        ok "openai@$OPENAI_VERSION client: $(grep -c '^ok:' "$tmp/client") checks"
        grep 'concurrent' "$tmp/client"
    else
        bad "openai client" "$(tail -n 8 "$tmp/client")"
    fi
fi

# ---- slots idle, clean stop -------------------------------------------------------------------------
cu "slots" 200 "$serve_url/slots"
if grep -q '"is_processing":true' "$tmp/body"; then bad "a slot is still busy" "$(cat "$tmp/body")"; else ok "every slot idle"; fi
serve_stop
if [ "$serve_rc" -eq 0 ]; then ok "SIGTERM: exit 0"; else bad "server exit $serve_rc" "$(tail -n 5 "$tmp/server.log")"; fi

# ---- a second server: --api-key-file, --slot-save-path, --metrics --------------------------------------
printf 'first-key\n\n  second-key \r\n' >"$tmp/keys"
: >"$tmp/nokeys"
sp serve -m "$model" --api-key-file "$tmp/nokeys"
t_rc "an empty key file" 2
sp serve -m "$model" --api-key-file "$tmp/missing-keys"
t_rc "a missing key file" 2
mkdir "$tmp/slots"
if ! serve_start "$tmp/server2.log" "$SPARROW" serve -m "$model" --port 0 -np 2 -c 256 -t 2 \
        --api-key-file "$tmp/keys" --slot-save-path "$tmp/slots" --metrics; then
    bad "the second server did not start" "$(tail -n 5 "$tmp/server2.log")"
    harness_report
fi
k1='Authorization: Bearer first-key'
cu "no key" 401 "$serve_url/v1/models"
has "no key" '"type":"authentication_error"'
cu "a wrong key" 401 "$serve_url/props" -H 'Authorization: Bearer first'
cu "health needs no key" 200 "$serve_url/health"
cu "the file's first key" 200 "$serve_url/v1/models" -H "$k1"
cu "the file's second key (blanks and CR trimmed)" 200 "$serve_url/v1/models" -H 'Authorization: Bearer second-key'
cu "metrics need the key" 401 "$serve_url/metrics"
if [ $have_openai -eq 1 ]; then
    # the official client sends its apiKey as the bearer token
    if timeout 60 node --input-type=module -e '
        import { createRequire } from "node:module";
        const [base, dir] = process.argv.slice(1);
        const OpenAI = createRequire(dir + "/")("openai");
        const good = new OpenAI({ baseURL: base + "/v1", apiKey: "second-key", maxRetries: 0 });
        if ((await good.models.list()).data.length !== 1) throw new Error("models with the key");
        try {
            await new OpenAI({ baseURL: base + "/v1", apiKey: "nope", maxRetries: 0 }).models.list();
            throw new Error("a wrong key was accepted");
        } catch (e) {
            if (!(e instanceof OpenAI.AuthenticationError) || e.status !== 401) throw e;
        }
    ' "$serve_url" "$npmdir" >"$tmp/keyclient" 2>&1; then ok "openai client: a key from the file works, a wrong one is AuthenticationError"; else
        bad "openai client with keys" "$(tail -n 5 "$tmp/keyclient")"; fi
fi

# a conversation saved, erased, restored: the restored slot continues it as if never erased
req='{"prompt": "Once upon a time there was a little", "max_tokens": 8, "temperature": 0}'
cu "completion before the save" 200 "$serve_url/v1/completions" -H "$k1" -d "$req"
text1=$(jv 'b.choices[0].text')
cu "slots" 200 "$serve_url/slots" -H "$k1"
slot=$(jv 'b.findIndex((s) => s.n_requests > 0)')
cu "slot save" 200 "$serve_url/slots/$slot?action=save" -H "$k1" -d '{"filename": "story.session"}'
is "slot save: id_slot" 'b.id_slot' "$slot"
is "slot save: filename" 'b.filename' story.session
n_saved=$(jv 'b.n_saved')
is "slot save: the prompt and the answer's tokens" "b.n_saved >= 9 && b.n_written > 0 && typeof b.timings.save_ms === 'number'" true
if [ -f "$tmp/slots/story.session" ] && [ "$(ls "$tmp/slots" | wc -l)" -eq 1 ]; then ok "slot save: the file, and no temporary left"; else
    bad "slot save: the folder holds" "$(ls -la "$tmp/slots")"; fi
for f in '../story.session' 'a/b' '' '..' 'a\\b'; do
    cu "slot save refuses '$f'" 400 "$serve_url/slots/$slot?action=save" -H "$k1" -d "{\"filename\": \"$f\"}"
done
cu "slot save without a filename" 400 "$serve_url/slots/$slot?action=save" -H "$k1" -d '{}'
cu "slot restore of a missing file" 400 "$serve_url/slots/$slot?action=restore" -H "$k1" -d '{"filename": "none.session"}'
cu "a slot that is not there" 400 "$serve_url/slots/2?action=erase" -H "$k1" -X POST
cu "a slot id that is not a number" 400 "$serve_url/slots/x?action=erase" -H "$k1" -X POST
cu "an unknown action" 400 "$serve_url/slots/0?action=drop" -H "$k1" -X POST
cu "no action" 400 "$serve_url/slots/0" -H "$k1" -X POST
cu "slot actions are POST" 405 "$serve_url/slots/0?action=erase" -H "$k1"
cu "slot erase" 200 "$serve_url/slots/$slot?action=erase" -H "$k1" -X POST
is "slot erase: n_erased" 'b.id_slot + "/" + b.n_erased' "$slot/$n_saved"
cu "slot erase again: nothing left" 200 "$serve_url/slots/$slot?action=erase" -H "$k1" -X POST
is "slot erase again: n_erased" 'b.n_erased' 0
cu "metrics" 200 "$serve_url/metrics" -H "$k1"
cached0=$(awk '$1 == "sparrow:prompt_tokens_cached_total" { print $2 }' "$tmp/body")
for s2 in 0 1; do # both slots hold the conversation: the next request finds it either way
    cu "slot $s2 restore" 200 "$serve_url/slots/$s2?action=restore" -H "$k1" -d '{"filename": "story.session"}'
    is "slot $s2 restore: n_restored" 'b.id_slot + "/" + b.n_restored + "/" + (b.n_read > 0) + "/" + (typeof b.timings.restore_ms)' \
        "$s2/$n_saved/true/number"
done
cu "the same completion after the restore" 200 "$serve_url/v1/completions" -H "$k1" -d "$req"
is "the restored slot gives the same answer" 'b.choices[0].text' "$text1"

# metrics: Prometheus text, llama-server's names; the restored prompt came from the cache
curl -s -D "$tmp/mheaders" -o "$tmp/body" --max-time 10 "$serve_url/metrics" -H "$k1"
if grep -qi '^content-type: text/plain; version=0.0.4' "$tmp/mheaders"; then ok "metrics: content type"; else bad "metrics: content type" "$(cat "$tmp/mheaders")"; fi
if node -e '
    const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n");
    if (lines.pop() !== "") throw "no final newline";
    const typed = new Set(), seen = new Set();
    for (const l of lines) {
        let m;
        if ((m = /^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) \S.*$/.exec(l))) continue;
        if ((m = /^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge)$/.exec(l))) { typed.add(m[1]); continue; }
        if ((m = /^([a-zA-Z_:][a-zA-Z0-9_:]*) (-?[0-9.e+-]+)$/.exec(l)) && typed.has(m[1]) && !seen.has(m[1]) && isFinite(+m[2])) { seen.add(m[1]); continue; }
        throw "bad line: " + l;
    }
    for (const n of ["llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_processing",
                     "llamacpp:requests_deferred", "llamacpp:n_decode_total", "llamacpp:kv_cache_tokens"])
        if (!seen.has(n)) throw "missing " + n;
' "$tmp/body" 2>"$tmp/merr"; then ok "metrics: every line HELP, TYPE or one sample of a typed metric; llama-server's names"; else
    bad "metrics format" "$(cat "$tmp/merr")"; fi
m() { awk -v n="$1" '$1 == n { print $2 }' "$tmp/body"; }
if [ "$(m llamacpp:tokens_predicted_total)" -ge 16 ] && [ "$(m llamacpp:prompt_tokens_total)" -ge 9 ]; then
    ok "metrics: tokens counted ($(m llamacpp:prompt_tokens_total) prompt, $(m llamacpp:tokens_predicted_total) predicted)"; else
    bad "metrics: counts" "$(grep -v '^#' "$tmp/body")"; fi
if [ "$(m llamacpp:requests_processing)" = 0 ] && [ "$(m llamacpp:requests_deferred)" = 0 ]; then ok "metrics: nothing running or waiting"; else
    bad "metrics: requests" "$(grep requests_ "$tmp/body")"; fi
cached1=$(m sparrow:prompt_tokens_cached_total)
if [ "$cached1" -ge $((cached0 + 8)) ]; then ok "metrics: the restored prompt was cached ($cached0 -> $cached1 tokens)"; else
    bad "metrics: the restored prompt was not reused ($cached0 -> $cached1)"; fi
if [ "$(m sparrow:slot_actions_total)" -ge 5 ]; then ok "metrics: slot actions counted"; else bad "metrics: slot actions $(m sparrow:slot_actions_total)"; fi
# an action on a busy slot waits for its request to end (no step decodes a slot while it is saved)
curl -s --max-time 60 "$serve_url/v1/completions" -H "$k1" -o "$tmp/long" \
    -d '{"prompt": "Once upon a time", "max_tokens": 240, "ignore_eos": true, "temperature": 0}' &
long_pid=$!
busy=-1 i=0
while [ $i -lt 200 ] && [ "$busy" = -1 ]; do
    curl -s --max-time 5 "$serve_url/slots" -H "$k1" -o "$tmp/body"
    busy=$(jv 'b.findIndex((s) => s.is_processing)')
    [ -n "$busy" ] || busy=-1
    i=$((i + 1))
done
if [ "$busy" = -1 ]; then
    echo "note: the long request ended before /slots saw it: the busy-slot save is not exercised"
    wait $long_pid
else
    cu "slot save of a busy slot" 200 "$serve_url/slots/$busy?action=save" -H "$k1" -d '{"filename": "busy.session"}'
    n_busy=$(jv 'b.n_saved')
    wait $long_pid
    n_all=$(node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); process.stdout.write(String(b.usage.total_tokens - 1))' "$tmp/long")
    if [ "$n_busy" = "$n_all" ]; then ok "slot save of a busy slot waited for the request: $n_busy tokens"; else
        bad "slot save of a busy slot saved $n_busy tokens, the request ended with $n_all"; fi
fi
# a file from another model (or another slot size) is refused, and the slot stays usable
printf 'not a session' >"$tmp/slots/junk.session"
cu "slot restore of a corrupt file" 400 "$serve_url/slots/0?action=restore" -H "$k1" -d '{"filename": "junk.session"}'
cu "the slot still serves" 200 "$serve_url/v1/completions" -H "$k1" -d "$req"
# SIGTERM with a save waiting for a busy slot (sparrow:slot_actions_waiting
# says when it does): the request ends (an error), the save is still done
curl -s --max-time 60 "$serve_url/v1/completions" -H "$k1" -o "$tmp/long2" \
    -d '{"prompt": "Once upon a time", "max_tokens": 240, "ignore_eos": true, "temperature": 0}' &
long_pid=$!
busy=-1 i=0
while [ $i -lt 200 ] && [ "$busy" = -1 ]; do
    curl -s --max-time 5 "$serve_url/slots" -H "$k1" -o "$tmp/body"
    busy=$(jv 'b.findIndex((s) => s.is_processing)')
    [ -n "$busy" ] || busy=-1
    i=$((i + 1))
done
curl -s --max-time 60 -o "$tmp/exitsave" -w '%{http_code}' "$serve_url/slots/$((busy < 0 ? 0 : busy))?action=save" -H "$k1" \
    -d '{"filename": "at-exit.session"}' >"$tmp/exitsave_code" &
save_pid=$!
i=0 # until the save waits for its slot (or the request is over already); on a loaded
# machine the background curl can take seconds to connect: SIGTERM before the server
# has its request would test nothing (and answer nothing), so wait up to ~60 s
while [ $i -lt 3000 ]; do
    w=$(curl -s --max-time 5 "$serve_url/metrics" -H "$k1" | awk '$1 == "sparrow:slot_actions_waiting" { print $2 }')
    [ "$w" = 1 ] && break
    [ -s "$tmp/exitsave_code" ] && break
    sleep 0.01; i=$((i + 1))
done
serve_stop
wait $long_pid $save_pid
if [ "$(cat "$tmp/exitsave_code")" = 200 ] && [ -f "$tmp/slots/at-exit.session" ]; then
    ok "a save asked for before SIGTERM is done ($(head -c 120 "$tmp/exitsave"))"; else
    bad "the save asked for before SIGTERM: HTTP $(cat "$tmp/exitsave_code")" "$(head -c 300 "$tmp/exitsave")"; fi
if [ "$serve_rc" -eq 0 ]; then ok "second server: SIGTERM: exit 0"; else bad "second server exit $serve_rc" "$(tail -n 5 "$tmp/server2.log")"; fi
harness_report
