#!/bin/sh
# serve.sh -- issue 17, acceptance 2: `sparrow serve` against llama-server
# with the same client (bench/serve-client.mjs): one streaming client, then
# CLIENTS at once, TOKENS tokens each, on MODEL; aggregate decode tok/s and
# time to first token per client for each engine, and the ratios.
#   LLAMA_SERVER=/work/peer/llama.cpp/build/bin/llama-server sh bench/serve.sh
# A measurement: run it on a quiet machine (not niced), note lscpu and uptime.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
MODEL=${MODEL:-/work/scratch/llama-7b-q4_0.gguf}
CLIENTS=${CLIENTS:-4}
TOKENS=${TOKENS:-64}
THREADS=${THREADS:-$(nproc)}
CTX=${CTX:-512}   # per slot
. "$root/tests/serve/lib.sh"
tmp=$(mktemp -d)
trap 'serve_stop; rm -rf "$tmp"' EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_health() {
    i=0
    while [ $i -lt 1200 ]; do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$1/health")" = 200 ] && return 0
        kill -0 "$serve_pid" 2>/dev/null || return 1
        sleep 0.1; i=$((i + 1))
    done
    return 1
}
measure() { # ENGINE URL
    node "$root/bench/serve-client.mjs" "$2" 1 8 >/dev/null # warm-up
    one=$(node "$root/bench/serve-client.mjs" "$2" 1 "$TOKENS")
    many=$(node "$root/bench/serve-client.mjs" "$2" "$CLIENTS" "$TOKENS")
    echo "$1 1 client:  $one"
    echo "$1 $CLIENTS clients: $many"
    r1=$(printf '%s' "$one" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).decode_tok_s))')
    rn=$(printf '%s' "$many" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).decode_tok_s))')
    echo "$1: aggregate decode $rn tok/s with $CLIENTS clients, $r1 tok/s with one: x$(echo "$rn $r1" | awk '{ printf "%.2f", $1 / $2 }')"
    eval "agg_$1=$rn"
}

echo "model $MODEL, $CLIENTS clients x $TOKENS tokens, $THREADS threads; $(uptime)"
lscpu | grep -E '^Model name|^CPU\(s\)' | tr -s ' '
serve_start "$tmp/sparrow.log" "$SPARROW" serve -m "$MODEL" --port 0 -np "$CLIENTS" -c "$CTX" -t "$THREADS" ||
    { echo "sparrow serve did not start"; tail -n 5 "$tmp/sparrow.log"; exit 1; }
measure sparrow "$serve_url"
serve_stop
if [ -n "${LLAMA_SERVER:-}" ]; then
    port=$(free_port)
    "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$port" -np "$CLIENTS" -c $((CTX * CLIENTS)) -t "$THREADS" \
        >"$tmp/llama.log" 2>&1 &
    serve_pid=$!
    wait_health "http://127.0.0.1:$port" || { echo "llama-server did not start"; tail -n 5 "$tmp/llama.log"; exit 1; }
    measure llama "http://127.0.0.1:$port"
    serve_stop
    echo "sparrow / llama-server aggregate with $CLIENTS clients: x$(echo "$agg_sparrow $agg_llama" | awk '{ printf "%.2f", $1 / $2 }')"
fi
echo "after: $(uptime)"
