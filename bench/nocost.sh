#!/bin/sh
# nocost.sh MODEL [REPS] [BUDGET] -- the memory budget costs nothing when the
# model fits: `sparrow bench` with and without --mem-budget, alternating, REPS
# times each (default 5), and the median ratio of decode and prefill tok/s
# (budget / no budget).  BUDGET defaults to the file size + 4 GiB, so the
# planner keeps everything resident.
#
# Environment: SPARROW (default build/sparrow), THREADS (2), N_PROMPT (128),
# N_GEN (32), KEEP (a folder for the raw JSON).  Needs python3.
set -eu
[ $# -ge 1 ] && [ $# -le 3 ] || { echo "usage: $0 MODEL [REPS] [BUDGET]" >&2; exit 2; }
MODEL=$1
REPS=${2:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
THREADS=${THREADS:-2}
N_PROMPT=${N_PROMPT:-128}
N_GEN=${N_GEN:-32}
[ -x "$SPARROW" ] || { echo "nocost.sh: no sparrow binary at '$SPARROW'" >&2; exit 2; }
[ -r "$MODEL" ] || { echo "nocost.sh: cannot read '$MODEL'" >&2; exit 2; }
command -v python3 >/dev/null || { echo "nocost.sh: python3 is needed" >&2; exit 2; }
BUDGET=${3:-$(( $(stat -c %s "$MODEL") + 4294967296 ))}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sparrow-nocost.XXXXXX")
cleanup() {
    if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$tmp"/* "$KEEP"/ 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
echo "nocost: $MODEL, $REPS alternating repetitions, threads $THREADS, prompt $N_PROMPT, gen $N_GEN, budget $BUDGET bytes"
i=1
while [ "$i" -le "$REPS" ]; do
    "$SPARROW" bench -m "$MODEL" -p "$N_PROMPT" -n "$N_GEN" -r 1 -t "$THREADS" --json > "$tmp/none.$i.json"
    "$SPARROW" bench -m "$MODEL" -p "$N_PROMPT" -n "$N_GEN" -r 1 -t "$THREADS" --mem-budget "$BUDGET" --json \
        > "$tmp/budget.$i.json"
    i=$((i + 1))
done
python3 - "$tmp" "$REPS" <<'EOF'
import json, statistics, sys
tmp, reps = sys.argv[1], int(sys.argv[2])
rows = []
for i in range(1, reps + 1):
    a = json.load(open("%s/none.%d.json" % (tmp, i)))
    b = json.load(open("%s/budget.%d.json" % (tmp, i)))
    rows.append((a, b))
print("| rep | decode tok/s none | decode tok/s budget | ratio | prefill none | prefill budget | ratio | peak RSS MiB none / budget |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
dr, pr = [], []
for i, (a, b) in enumerate(rows, 1):
    dr.append(b["decode_tps"] / a["decode_tps"])
    pr.append(b["prefill_tps"] / a["prefill_tps"])
    print("| %d | %.2f | %.2f | %.3f | %.2f | %.2f | %.3f | %.0f / %.0f |" % (i, a["decode_tps"], b["decode_tps"], dr[-1],
          a["prefill_tps"], b["prefill_tps"], pr[-1], a["peak_rss_bytes"] / 1048576, b["peak_rss_bytes"] / 1048576))
print()
print("median ratio (budget / none): decode %.3f, prefill %.3f" % (statistics.median(dr), statistics.median(pr)))
EOF
