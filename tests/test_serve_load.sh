#!/bin/sh
# test_serve_load.sh -- `sparrow serve` under load and faults (issue 17,
# acceptance 3), the short version the suite runs (also under ASan):
# CLIENTS clients x REQUESTS requests in a bounded loop (tests/serve/load.mjs:
# a third of the streams cut mid-stream, malformed JSON and oversized bodies
# mixed in) after four streams at once whose first chunks must all come
# before any [DONE].  Then: the server is alive, every slot idle (/slots),
# memory kept from midway to the end (the first round's warm-up, new code
# paths, connection threads' stacks and the allocator's first growth, is
# over by then): the private resident set (RssAnon) within 2% (at least
# 256 KiB), the heap in use (by glibc's
# count, through /metrics) within 32 KiB, the heap's free bytes at most
# 1 MiB (none of these under ASan, whose quarantine keeps freed memory);
# p50/p99 time to first token printed, a clean SIGTERM.  bench/serve-load.sh runs
# the full 8 x 50 by setting the variables below.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SPARROW_SHARED=${SPARROW_SHARED:-$root/../shared}
MODEL=${MODEL:-$SPARROW_SHARED/models/tiny-qwen/tiny-qwen3-q8_0.gguf}
CLIENTS=${CLIENTS:-8}
REQUESTS=${REQUESTS:-30}   # per client, the first round's included
FIRST=${FIRST:-3}          # requests per client in the first round
MAX_TOKENS=${MAX_TOKENS:-12}
SLOTS=${SLOTS:-4}
CTX=${CTX:-256}
THREADS=${THREADS:-2}

name=serve-load
. "$root/tests/lib/harness.sh"
. "$root/tests/serve/lib.sh"

[ -x "$SPARROW" ] || { bad "binary $SPARROW not found (run make first)"; harness_report; }
[ -f "$MODEL" ] || { bad "missing fixture: $MODEL"; harness_report; }
command -v node >/dev/null 2>&1 || { bad "node not found: the test needs it"; harness_report; }
trap 'serve_stop; rm -rf "$tmp"' EXIT
asan=0
ldd "$SPARROW" 2>/dev/null | grep -q libasan && asan=1

if ! serve_start "$tmp/server.log" "$SPARROW" serve -m "$MODEL" --port 0 -np "$SLOTS" -c "$CTX" -t "$THREADS" --max-body 1048576 --metrics; then
    bad "the server did not start" "$(tail -n 5 "$tmp/server.log")"
    harness_report
fi
ok "listening at $serve_url"
rss() { awk '/^RssAnon/ { print $2 }' "/proc/$serve_pid/status"; } # private memory: file pages (code, the model) touched later are no growth
# metric NAME: its value from /metrics (empty if absent)
metric() { curl -s --max-time 5 "$serve_url/metrics" | awk -v n="$1" '$1 == n { printf "%d\n", $2 }'; }

if timeout 300 node "$root/tests/serve/load.mjs" "$serve_url" "$CLIENTS" "$FIRST" "$MAX_TOKENS" "$tmp/ttft" >"$tmp/r1" 2>&1; then
    ok "first round: $(tail -n 1 "$tmp/r1")"
    grep 'four streams' "$tmp/r1"
else
    bad "first round" "$(tail -n 6 "$tmp/r1")" "$(tail -n 3 "$tmp/server.log")"
fi
rss1=$(rss)
# the rest in two halves: the heap midway against the end is the creep test
# (memory kept per request shows there; the first rounds' warm-up does not)
rest=$((REQUESTS - FIRST))
half=$((rest / 2))
if timeout 900 node "$root/tests/serve/load.mjs" "$serve_url" "$CLIENTS" "$half" "$MAX_TOKENS" "$tmp/ttft" --no-concurrency >"$tmp/r2" 2>&1; then
    ok "the middle rounds: $(tail -n 1 "$tmp/r2")"
else
    bad "the middle rounds" "$(tail -n 6 "$tmp/r2")" "$(tail -n 3 "$tmp/server.log")"
fi
sleep 0.2
rss_mid=$(rss)
heap_mid=$(metric sparrow:heap_in_use_bytes)
if timeout 900 node "$root/tests/serve/load.mjs" "$serve_url" "$CLIENTS" "$((rest - half))" "$MAX_TOKENS" "$tmp/ttft" --no-concurrency >"$tmp/r3" 2>&1; then
    ok "the last rounds: $(tail -n 1 "$tmp/r3")"
else
    bad "the last rounds" "$(tail -n 6 "$tmp/r3")" "$(tail -n 3 "$tmp/server.log")"
fi
if kill -0 "$serve_pid" 2>/dev/null; then ok "the server is alive"; else bad "the server died" "$(tail -n 8 "$tmp/server.log")"; harness_report; fi

# cut streams free their slots within a step: give them a moment
idle=0 i=0
while [ $i -lt 50 ]; do
    curl -s --max-time 5 "$serve_url/slots" >"$tmp/slots"
    if [ -s "$tmp/slots" ] && ! grep -q '"is_processing":true' "$tmp/slots"; then idle=1; break; fi
    sleep 0.1; i=$((i + 1))
done
if [ $idle -eq 1 ]; then ok "every slot idle at the end"; else bad "slots still busy" "$(cat "$tmp/slots")"; fi

rss2=$(rss)
n_late=$((CLIENTS * (rest - half)))
if [ $asan -eq 1 ]; then
    echo "private resident set (RssAnon): $rss1 KiB after the first round, $rss_mid KiB midway, $rss2 KiB at the end (not checked under ASan)"
else
    # midway, not after the first round: a first round that happened to
    # reach fewer paths or threads (CI saw 4320 KiB there, 4624 KiB at the
    # end, with the heap flat) measured warm-up, not creep
    echo "private resident set (RssAnon): $rss1 KiB after the first round"
    if [ "$rss2" -le $((rss_mid + (rss_mid / 50 > 256 ? rss_mid / 50 : 256))) ]; then
        ok "private resident set (RssAnon) at the end $rss2 KiB within 2% (at least 256 KiB) of $rss_mid KiB midway"
    else
        bad "private resident set (RssAnon) grew: $rss_mid KiB midway, $rss2 KiB after $n_late more requests"
    fi
    # memory kept, whether by the server (in use: a request's leftovers held
    # somewhere, which LeakSanitizer does not see while they are reachable)
    # or by the allocator (free in the heap: pages later requests make
    # resident again); glibc's figures, through /metrics
    heap_end=$(metric sparrow:heap_in_use_bytes)
    heap_free=$(metric sparrow:heap_free_bytes)
    if [ -z "$heap_mid" ] || [ -z "$heap_end" ]; then
        echo "heap figures not in /metrics (not glibc): not checked"
    else
        if [ "$heap_end" -le $((heap_mid + 32768)) ]; then
            ok "heap in use $heap_end bytes at the end, $heap_mid midway (within 32 KiB)"
        else
            bad "heap in use grew: $heap_mid bytes midway, $heap_end after $n_late more requests"
        fi
        if [ "$heap_free" -le 1048576 ]; then
            ok "heap free $heap_free bytes at the end (at most 1 MiB kept by the allocator)"
        else
            bad "the allocator keeps $heap_free free bytes in the heap (over 1 MiB)"
        fi
    fi
fi
sort -n "$tmp/ttft" | awk '{ v[NR] = $1 } END { if (NR) { a = int(NR * 0.5) + 1; b = int(NR * 0.99) + 1; if (b > NR) b = NR
    printf "ttft over %d streams: p50 %.1f ms, p99 %.1f ms\n", NR, v[a], v[b] } }'
serve_stop
if [ "$serve_rc" -eq 0 ]; then ok "SIGTERM: exit 0"; else bad "server exit $serve_rc" "$(tail -n 5 "$tmp/server.log")"; fi
harness_report
