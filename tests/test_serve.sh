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
if ! command -v npm >/dev/null 2>&1; then
    echo "SKIP the openai client part: npm is not installed"
elif ! openai_install "$npmdir"; then
    if timeout 20 npm ping >/dev/null 2>&1; then
        bad "npm install openai@$OPENAI_VERSION failed though the registry answers" "$(tail -n 5 "$npmdir/npm.log")"
    else
        echo "SKIP the openai client part: npm cannot reach the registry ($(tail -n 1 "$npmdir/npm.log"))"
    fi
else
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
harness_report
