#!/bin/sh
# bench/soak.sh DURATION [BUDGET] -- continuous generation over many turns on
# synthetic llama-7b Q4_0 under a memory budget (default 3G: about a third of
# the weights stream every token), sampling the resident set, open
# descriptors and threads every 10 s (tests/test_soak.c: turns alternate
# between a conversation with context shift and a fresh session per turn).
# After the first turn (its prompt fills the context) and a warm-up (a tenth
# of the run, at least 60 s) descriptors and
# threads must stay flat and the resident set within 1%; exits 1 if not.
# DURATION in seconds, or with s/m/h (e.g. 1h).  The model is
# $SPARROW_SCRATCH/llama-7b-q4_0.gguf (default ../scratch), written with
# `sparrow synth` if absent.  Runs niced (other work shares the machine);
# prints the machine's load and CPU first and last, then one line a sample.
# The short version CI runs (a tiny model, 8 s, under LeakSanitizer in the
# ASan build) is test_soak itself.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
[ $# -ge 1 ] || { echo "usage: bench/soak.sh DURATION [BUDGET]" >&2; exit 2; }
d=$1
case "$d" in
*h) secs=$((${d%h} * 3600)) ;;
*m) secs=$((${d%m} * 60)) ;;
*s) secs=${d%s} ;;
*) secs=$d ;;
esac
budget=${2:-3G}
case "$budget" in
*G) bytes=$(awk -v g="${budget%G}" 'BEGIN { printf "%.0f", g * 1073741824 }') ;;
*M) bytes=$(awk -v m="${budget%M}" 'BEGIN { printf "%.0f", m * 1048576 }') ;;
*) bytes=$budget ;;
esac
scratch=${SPARROW_SCRATCH:-$root/../scratch}
model=$scratch/llama-7b-q4_0.gguf
[ -x "$root/$BUILD/tests/test_soak" ] || make -C "$root" -j2 "$BUILD/tests/test_soak" >/dev/null
if [ ! -f "$model" ]; then
    echo "soak: writing $model"
    nice "$root/$BUILD/sparrow" synth --shape llama-7b --type q4_0 -q -o "$model"
fi
warm=$((secs / 10))
[ "$warm" -ge 60 ] || warm=60
echo "soak: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $(uptime)"
rc=0
nice "$root/$BUILD/tests/test_soak" --model "$model" --budget "$bytes" --seconds "$secs" --every 10 --warmup "$warm" \
    --ctx 512 --tokens 48 --threads 2 || rc=$?
echo "soak: done; $(uptime)"
exit "$rc"
