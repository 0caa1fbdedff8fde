#!/bin/sh
# startup-budget.sh -- issue 21, acceptance 2: time to first token of a
# budgeted start-up, an old binary against a new one, in one run.
#   sh bench/startup-budget.sh OLD_SPARROW NEW_SPARROW MODEL [BUDGET] [LIMIT]
# Each binary runs `run -m MODEL --mem-budget BUDGET -p PROMPT -n 1 -t THREADS`
# inside a fresh memory cgroup of LIMIT bytes (bench/cgroup.sh; v2 or v1),
# cold (page cache dropped first: needs root) and then warm, alternating old
# and new RUNS times (default 2); the wall time of the process (start to exit
# after one token) is reported with its median.  BUDGET default 7.5G, LIMIT
# default 8 GiB; COLD=0 skips the cold runs.  -v logs of the last runs are
# kept in $KEEP when set.
# A measurement: quiet machine, not niced.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/cgroup.sh"
[ $# -ge 3 ] || { echo "usage: sh bench/startup-budget.sh OLD NEW MODEL [BUDGET] [LIMIT]" >&2; exit 2; }
old=$1 new=$2 model=$3
budget=${4:-7.5G}
limit=${5:-8589934592}
RUNS=${RUNS:-2}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-Once upon a time}
cg_init sparrow-startup || { echo "startup-budget.sh: no memory cgroup controller" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'cg_remove; rm -rf "$tmp"' EXIT
now() { date +%s.%N; }
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
one() { # BIN TAG COLD: one timed run in a fresh cgroup, prints seconds
    [ "$3" = 1 ] && { sync; echo 3 >/proc/sys/vm/drop_caches; }
    cg_make "$limit"
    t0=$(now)
    sh -c "$(cg_enter)" "$CG" "$1" run -m "$model" --mem-budget "$budget" -p "$PROMPT" -n 1 -t "$THREADS" --seed 1 -v \
        >"$tmp/$2.out" 2>"$tmp/$2.log" || { echo "startup-budget.sh: $1 failed:" >&2; tail -n 5 "$tmp/$2.log" >&2; exit 1; }
    t1=$(now)
    [ "$(cg_oom)" = 0 ] || echo "startup-budget.sh: $2: OOM kill in the cgroup" >&2
    peak=$(cg_peak)
    cg_remove
    [ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$tmp/$2.log" "$KEEP/$2.log"
    echo "$t0 $t1 $peak" | awk '{ printf "%.3f %d\n", $2 - $1, $3 / 1048576 }'
}
lscpu | grep -E '^Model name|^CPU\(s\)' | tr -s ' '
echo "model $model ($(stat -c %s "$model") bytes), budget $budget, cgroup v$CGV limit $limit; before: $(uptime)"
modes="cold warm"; [ "${COLD:-1}" = 0 ] && modes=warm
for mode in $modes; do
    c=0; [ $mode = cold ] && c=1
    : >"$tmp/old.$mode"; : >"$tmp/new.$mode"
    [ $mode = warm ] && cat "$model" >/dev/null
    i=0
    while [ $i -lt "$RUNS" ]; do
        r=$(one "$old" "old-$mode" $c); echo "  old $mode: $r (s, cgroup peak MiB)"; echo "${r%% *}" >>"$tmp/old.$mode"
        r=$(one "$new" "new-$mode" $c); echo "  new $mode: $r (s, cgroup peak MiB)"; echo "${r%% *}" >>"$tmp/new.$mode"
        i=$((i + 1))
    done
    o=$(median <"$tmp/old.$mode"); n=$(median <"$tmp/new.$mode")
    echo "$mode: old $o s, new $n s: new/old x$(echo "$n $o" | awk '{ printf "%.3f", $1 / $2 }') (target <= 0.5 cold)"
done
echo "after: $(uptime)"
