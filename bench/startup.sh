#!/bin/sh
# startup.sh -- issue 21, acceptance 1: start-up of a converted (resident
# layout) file against the original GGUF and llama-completion, in one run.
#   sh bench/startup.sh ORIGINAL.gguf [CONVERTED.gguf]
# Environment: SPARROW (default build/sparrow), LLAMA_COMPLETION (the peer's
# llama-completion; its part is skipped when unset), RUNS (warm runs per
# command, default 5; medians are reported), THREADS (default 2), COLD=1
# (also a cold start: drops the page cache, needs root), PROMPT.
# CONVERTED is made with `sparrow convert` into $SPARROW_SCRATCH when not
# given (and removed at the end).  Reports, for warm page cache:
#   - wall time of the whole process `sparrow run -m FILE -p PROMPT -n 1`
#     for the converted and the original file, timed from outside;
#   - llama-completion's own "load time" (-n 4, its load plus warm-up);
#   - decode tok/s of both files (`sparrow bench -p 16 -n 32`);
#   - RssAnon of a second process on the converted file while a first runs;
# and with COLD=1 the cold wall time against the storage bound (file bytes
# over the sequential read speed `dd` measures, cache dropped) plus the
# prompt time the run reports.  A measurement: quiet machine, not niced.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
RUNS=${RUNS:-5}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-Once upon a time}
[ $# -ge 1 ] || { echo "usage: sh bench/startup.sh ORIGINAL.gguf [CONVERTED.gguf]" >&2; exit 2; }
orig=$1
[ -r "$orig" ] || { echo "startup.sh: cannot read '$orig'" >&2; exit 2; }
tmp=$(mktemp -d)
made=
cleanup() { [ -n "$made" ] && rm -f "$made"; rm -rf "$tmp"; }
trap cleanup EXIT
if [ $# -ge 2 ]; then
    conv=$2
else
    conv=${SPARROW_SCRATCH:-$tmp}/startup-converted.$$.gguf
    echo "converting $orig -> $conv"
    "$SPARROW" convert "$orig" "$conv" >/dev/null
    made=$conv
fi

now() { date +%s.%N; }
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
wall() { # FILE LOG: one timed `sparrow run`, prints seconds
    t0=$(now)
    "$SPARROW" run -m "$1" -p "$PROMPT" -n 1 -t "$THREADS" --seed 1 >/dev/null 2>"$2" ||
        { echo "startup.sh: sparrow run -m $1 failed:" >&2; tail -n 3 "$2" >&2; exit 1; }
    t1=$(now)
    echo "$t0 $t1" | awk '{ printf "%.3f\n", $2 - $1 }'
}
warm() { cat "$1" >/dev/null; }

echo "original  $orig ($(stat -c %s "$orig") bytes)"
echo "converted $conv ($(stat -c %s "$conv") bytes)"
lscpu | grep -E '^Model name|^CPU\(s\)' | tr -s ' '
echo "before: $(uptime)"

warm "$orig"; warm "$conv"
: >"$tmp/conv"; : >"$tmp/orig"
i=0
while [ $i -lt "$RUNS" ]; do # alternate, so drift hits both
    wall "$conv" "$tmp/log" >>"$tmp/conv"
    wall "$orig" "$tmp/log" >>"$tmp/orig"
    i=$((i + 1))
done
w_conv=$(median <"$tmp/conv")
w_orig=$(median <"$tmp/orig")
echo "warm wall, sparrow run -n 1 (median of $RUNS): converted $w_conv s [$(tr '\n' ' ' <"$tmp/conv")], original $w_orig s [$(tr '\n' ' ' <"$tmp/orig")]"

if [ -n "${LLAMA_COMPLETION:-}" ]; then
    : >"$tmp/peer"
    i=0
    while [ $i -lt "$RUNS" ]; do
        "$LLAMA_COMPLETION" -m "$orig" -p "$PROMPT" -n 4 -t "$THREADS" -no-cnv --seed 1 </dev/null >/dev/null 2>"$tmp/plog" ||
            { echo "startup.sh: llama-completion failed:" >&2; tail -n 3 "$tmp/plog" >&2; exit 1; }
        sed -n 's/.*load time = *\([0-9.]*\) ms.*/\1/p' "$tmp/plog" | head -n 1 | awk '{ printf "%.3f\n", $1 / 1000 }' >>"$tmp/peer"
        i=$((i + 1))
    done
    [ -s "$tmp/peer" ] || { echo "startup.sh: no 'load time' in llama-completion's output" >&2; exit 1; }
    l_peer=$(median <"$tmp/peer")
    echo "llama-completion load time (median of $RUNS): $l_peer s [$(tr '\n' ' ' <"$tmp/peer")]"
    echo "converted wall / llama-completion load: x$(echo "$w_conv $l_peer" | awk '{ printf "%.3f", $1 / $2 }') (target <= 0.5)"
fi

dec() { # FILE: decode tok/s
    "$SPARROW" bench -m "$1" -p 16 -n 32 -r 3 -t "$THREADS" --json 2>/dev/null |
        sed -n 's/.*"decode_tps": *\([0-9.]*\).*/\1/p' | head -n 1
}
d_conv=$(dec "$conv")
d_orig=$(dec "$orig")
echo "decode tok/s (bench -p 16 -n 32 -r 3): converted $d_conv, original $d_orig: x$(echo "$d_conv $d_orig" | awk '{ printf "%.3f", $1 / $2 }') (target >= 0.97)"

# two processes, one file: the second's private memory
"$SPARROW" run -m "$conv" -p "$PROMPT" -n 400 -t 1 --seed 1 >/dev/null 2>&1 &
p1=$!
sleep 2
"$SPARROW" run -m "$conv" -p "$PROMPT" -n 400 -t 1 --seed 2 >/dev/null 2>&1 &
p2=$!
sleep 4
kill -0 "$p2" 2>/dev/null || { echo "startup.sh: the second process ended before it was sampled (a bigger model or more tokens)" >&2; exit 1; }
anon=$(awk '/^RssAnon/ { print $2 }' "/proc/$p2/status")
file=$(awk '/^RssFile/ { print $2 }' "/proc/$p2/status")
kill "$p1" "$p2" 2>/dev/null || true
wait "$p1" 2>/dev/null || true
wait "$p2" 2>/dev/null || true
size=$(stat -c %s "$conv")
echo "second process on the converted file: RssAnon $anon KiB, RssFile $file KiB: $(echo "$anon $size" | awk '{ printf "%.2f", 100 * $1 * 1024 / $2 }')% of the file (target < 10%)"

if [ "${COLD:-0}" = 1 ]; then
    sync; echo 3 >/proc/sys/vm/drop_caches
    t0=$(now); dd if="$conv" of=/dev/null bs=16M 2>/dev/null; t1=$(now)
    bw=$(echo "$t0 $t1 $size" | awk '{ printf "%.1f", $3 / ($2 - $1) / 1e6 }')
    sync; echo 3 >/proc/sys/vm/drop_caches
    c=$(wall "$conv" "$tmp/log")
    pt=$(sed -n 's/.*prompt [0-9]* tokens in \([0-9.]*\) s.*/\1/p' "$tmp/log" | head -n 1)
    bound=$(echo "$size $bw" | awk '{ printf "%.3f", $1 / ($2 * 1e6) }')
    echo "cold: sequential read $bw MB/s, storage bound $bound s, prompt $pt s; cold wall $c s = x$(echo "$c $bound $pt" | awk '{ printf "%.3f", $1 / ($2 * 1.3 + $3) }') of (1.3 x bound + prompt) (target <= 1)"
fi
echo "after: $(uptime)"
